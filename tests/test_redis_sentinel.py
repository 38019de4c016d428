"""Redis Sentinel: the master killed under load, every process follows the promoted replica.

A real Sentinel-managed Redis on loopback (a master, two replicas, three ``redis-sentinel``
processes, ``down-after-milliseconds`` 1000: tests/support/redis_sentinel.py), the Kubernetes
API fake with the kubelet stand-in (real Squids on loopback), and the operator's watcher, worker,
beat and API through their real commands with ``REDIS_URL=redis+sentinel://...``.

What asynchronous replication loses is made certain rather than left to timing: before the
master is killed its replicas are cut off from it (they fail to authenticate to it, as in a
network partition between them) while it keeps taking writes: a lease granted then, and the
publish of a Proxy created then, exist only on the master that dies.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import redis as redis_lib
import requests

from app.store.client import client_from_url
from tests.support.redis_sentinel import SentinelRedis
from tests.test_redis_loss import (RESYNC_S, TOKEN, apply_proxy, assert_alive, leasable, lease_once,
                                   pods_per_proxy, two_ready_proxies, wait_ready)
from tests.test_redis_loss import stack  # noqa: F401 - the same processes, on redis_server below
from tests.support.waiting import wait_for, wait_until
from tests.support.stack_fixtures import cluster, origin  # noqa: F401 - pytest fixtures

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: From the master's death until the Sentinels name a new one: down-after (1 s), their
#: agreement, the election and the promotion.  Measured ~2-3 s on a loaded 2-core machine.
FAILOVER_S = 10
#: From the master's death until the API grants leases again on the new master (docs/redis.md,
#: "Redis Sentinel": the failover plus one reconnect).  Measured ~3 s.
FOLLOW_S = 15


@pytest.fixture()
def sentinel_redis():
    rig = SentinelRedis()
    yield rig
    rig.stop()


@pytest.fixture()
def redis_server(sentinel_redis):
    """What the shared ``stack`` fixture reads: an object whose ``url`` is the Sentinel URL."""
    return sentinel_redis


def _auth() -> dict:
    return {"Authorization": f"Bearer {TOKEN}"}


class Load:
    """Takes and releases leases in a loop on a thread; records ``(monotonic time, granted)``."""

    def __init__(self, api) -> None:
        self.api = api
        self.results: list[tuple[float, bool]] = []
        self.refusals: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.results.append((time.monotonic(), self._round()))
            time.sleep(0.05)

    def _round(self) -> bool:
        """Take a lease and give it back; whether both were answered as asked."""
        try:
            r = requests.post(self.api.url + "/v1/leases", json={"ttlSeconds": 30}, timeout=15, headers=_auth())
            if r.status_code != 201:
                self.refusals.append(f"{r.status_code} {r.text[:200]}")
                return False
            done = requests.delete(f"{self.api.url}/v1/leases/{r.json()['leaseId']}?outcome=ok", timeout=15,
                                   headers=_auth())
        except requests.RequestException as exc:
            self.refusals.append(type(exc).__name__)
            return False
        if done.status_code != 200:
            self.refusals.append(f"release {done.status_code} {done.text[:200]}")
        return done.status_code == 200

    def __enter__(self) -> "Load":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(20)

    def longest_outage(self, since: float) -> float:
        """Longest time since ``since`` between a failed round and the next granted one."""
        longest, first_failure = 0.0, None
        for at, ok in self.results:
            if at < since:
                continue
            if not ok and first_failure is None:
                first_failure = at
            elif ok and first_failure is not None:
                longest, first_failure = max(longest, at - first_failure), None
        return longest


def cut_replicas_off(rig: SentinelRedis) -> None:
    """Make the master's writes reach no replica: each replica fails to authenticate to it."""
    for replica in rig.replicas():
        rig.admin(replica).config_set("masteruser", "cut-off")
        rig.admin(replica).config_set("masterauth", "cut-off")
    rig.admin().client_kill_filter(_type="slave")
    wait_for(lambda: all(rig.admin(r).info("replication")["master_link_status"] == "down" for r in rig.replicas()),
             10, "the replicas cut off from the master")


def reconnect_replicas(replicas) -> None:
    """Let the replicas authenticate to whatever master they are told to follow again."""
    for replica in replicas:
        client = redis_lib.Redis(host="127.0.0.1", port=replica.port, socket_timeout=5)
        client.config_set("masterauth", "")
        client.config_set("masteruser", "")


def test_master_killed_under_load_every_process_follows_and_what_is_lost_heals(cluster, stack, sentinel_redis,
                                                                               origin):
    rig = sentinel_redis
    uids = two_ready_proxies(cluster, stack, origin)
    api = stack["api"]
    with Load(api) as load:
        time.sleep(1)
        old = rig.master()
        replicas = rig.replicas()
        cut_replicas_off(rig)
        # Written now, on the master only: a lease, and the publish of a Proxy being created.
        granted = requests.post(api.url + "/v1/leases", json={"ttlSeconds": 300}, headers=_auth(), timeout=15)
        assert granted.status_code == 201, granted.text
        lost_lease = granted.json()["leaseId"]
        uids["squid-c"] = apply_proxy(cluster, "squid-c", origin)["metadata"]["uid"]
        wait_for(lambda: rig.admin(old).sismember("po:proxies", uids["squid-c"]), 30,
                 "squid-c published on the master")

        old.kill()
        killed_at = time.monotonic()
        reconnect_replicas(replicas)
        wait_for(lambda: rig.master_port() not in (None, old.port), FAILOVER_S, "the Sentinels to promote a replica")
        promoted = time.monotonic() - killed_at
        new = rig.admin()
        # what asynchronous replication lost: the lease and the publish
        assert not new.exists(f"po:lease:{lost_lease}")
        assert not new.sismember("po:proxies", uids["squid-c"])

        # The API follows: leases are granted again on the new master.
        try:
            followed = wait_until(lambda: lease_once(api) is not None, FOLLOW_S - (time.monotonic() - killed_at),
                                  "a lease granted on the new master", interval=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; refusals: {load.refusals[-5:]}; API log:\n{api.log()[-3000:]}") from None
        followed_at = time.monotonic() - killed_at
        time.sleep(2)  # the load runs on the new master a little
    assert load.longest_outage(killed_at - 1) <= FOLLOW_S
    assert load.results[-1][1], f"the load's last round was refused: {load.refusals[-5:]}"

    # A lease lost in the failover is answered 404 on renew (the client takes a new one).
    renew = requests.post(f"{api.url}/v1/leases/{lost_lease}/renew", json={"ttlSeconds": 60}, headers=_auth(),
                          timeout=15)
    assert renew.status_code == 404, renew.text
    assert renew.json()["error"] == "lease_not_found"

    # The lost publish is made again by the resync (beat and the worker follow the new master)...
    wait_until(lambda: new.sismember("po:proxies", uids["squid-c"]), RESYNC_S + FOLLOW_S,
               "squid-c republished on the new master", interval=0.2)
    wait_ready(cluster, "squid-c", RESYNC_S + FOLLOW_S)
    # ... and a Proxy created after the failover goes through the watcher and the worker.
    uids["squid-d"] = apply_proxy(cluster, "squid-d", origin)["metadata"]["uid"]
    wait_ready(cluster, "squid-d", 60)
    wait_until(lambda: leasable(api) == set(uids), RESYNC_S + FOLLOW_S, "all four proxies leasable", interval=0.2)
    assert pods_per_proxy(cluster) == Counter({uid: 1 for uid in uids.values()})
    assert_alive(stack)
    assert "proxy event handler failed" not in stack["watcher"].log()
    print(f"promoted {promoted:.1f}s, API followed {followed_at:.1f}s ({followed:.1f}s after the promotion "
          f"check) after the master was killed; longest lease outage {load.longest_outage(killed_at - 1):.1f}s")


def test_sentinel_url_client_follows_the_promoted_master(sentinel_redis):
    """The one helper every process builds its clients with finds the master and follows a failover."""
    rig = sentinel_redis
    client = client_from_url(rig.url, decode_responses=True, socket_timeout=2, socket_connect_timeout=1)
    client.set("po:test", "1")
    old = rig.master()
    assert client.connection_pool.get_master_address()[1] == old.port
    old.kill()
    killed_at = time.monotonic()

    def written() -> bool:
        try:
            return client.set("po:test", "2") is True
        except redis_lib.RedisError:
            return False

    wait_until(written, FOLLOW_S, "a write on the new master", interval=0.1)
    assert rig.master_port() != old.port
    assert rig.admin().get("po:test") == "2"
    print(f"followed {time.monotonic() - killed_at:.1f}s after the master was killed")
