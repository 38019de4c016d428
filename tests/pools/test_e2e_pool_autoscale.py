"""ProxyPool autoscaling and clean-up end to end, on the same stack as
``tests/pools/test_e2e_pools.py`` (real watcher, Celery worker, beat and API processes; the API
fake with its kubelet stand-in running a real Squid per member; a private Redis).

* Crawlers asking for more leases than the pool holds (refused requests count as demand) grow
  it to ``maxReplicas``; the count only rises while they keep asking and stands still under the
  steady load that follows; once every lease is released it shrinks to ``minReplicas`` in one
  step, no sooner than ``scaleDownDelaySeconds`` later.
* A deleted pool leaves nothing behind: no member Proxy, no Pod, no running Squid, no serving
  record, no live lease, no demand count or autoscaler history in Redis.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests
from kubernetes import client as k8s

from app.store import keys as redis_keys
from app.providers.kubernetes.provider import LABEL_PROXY_UID
from app.resources import GROUP, POOL_PLURAL, VERSION
from tests.api.served import TOKEN
from tests.pools.test_e2e_pools import NS, stack  # noqa: F401 - the module-scoped stack fixture
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CRAWLERS = 6  # 3 members x maxLeases 2: the pool at maxReplicas holds them all
DELAY = 10  # scaleDownDelaySeconds


class _Crawlers:
    """``n`` crawler threads, each holding one lease of ``pool`` and retrying about once a second
    while refused (``503``), as the SDK does; :meth:`release_all` ends every lease."""

    def __init__(self, api_url: str, pool: str, n: int) -> None:
        self.api_url, self.pool = api_url, pool
        self.held: dict[int, str] = {}
        self.refused = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def start(self) -> "_Crawlers":
        for t in self._threads:
            t.start()
        return self

    def _run(self, i: int) -> None:
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {TOKEN}"
        while not self._stop.is_set():
            if i not in self.held:
                try:
                    got = http.post(f"{self.api_url}/v1/leases", json={"pool": self.pool, "ttlSeconds": 600},
                                    timeout=10)
                except requests.RequestException:
                    got = None
                if got is not None and got.status_code == 201:
                    with self._lock:
                        self.held[i] = got.json()["leaseId"]
                    continue
                with self._lock:
                    self.refused += 1
            self._stop.wait(1.0)

    def release_all(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {TOKEN}"
        for lease_id in list(self.held.values()):
            res = http.delete(f"{self.api_url}/v1/leases/{lease_id}", timeout=10)
            assert res.status_code == 200, res.text
        self.held.clear()


class _Sampler:
    """``spec.replicas`` and the ``ScalingLimited`` reason of a pool, sampled every 0.3 s."""

    def __init__(self, stack, name: str) -> None:
        self.stack, self.name = stack, name
        self.samples: list[tuple[float, int]] = []
        self.limited: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "_Sampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            pool = self.stack.pool(self.name)
            if pool is not None:
                self.samples.append((time.monotonic(), int(pool["spec"].get("replicas", 0))))
                for c in (pool.get("status") or {}).get("conditions") or ():
                    if c["type"] == "ScalingLimited" and c["status"] == "True":
                        self.limited.add(c["reason"])
            self._stop.wait(0.3)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def values(self, since: float = 0.0, until: float = float("inf")) -> list[int]:
        return [v for t, v in self.samples if since <= t <= until]


def _changes(values: list[int]) -> list[tuple[int, int]]:
    return [(a, b) for a, b in zip(values, values[1:]) if a != b]


def test_autoscale_grows_to_max_under_load_holds_steady_and_shrinks_after_the_delay(stack):
    stack.create_pool("auto", 1, autoscale={"minReplicas": 1, "maxReplicas": 3, "targetLeaseUtilization": "70%",
                                            "scaleDownDelaySeconds": DELAY})
    wait_for(lambda: stack.settled("auto", 1), 150, "the first member leasable")
    sampler = _Sampler(stack, "auto").start()
    crawlers = _Crawlers(stack.api_url, "auto", CRAWLERS).start()
    try:
        try:
            wait_for(lambda: stack.settled("auto", 3) and len(crawlers.held) == CRAWLERS, 180,
                     "3 members leasable and every crawler holding a lease")
        except AssertionError:
            raise AssertionError(f"{stack.pool('auto')}\nheld {len(crawlers.held)}\n{stack.logs()}") from None
        grown = time.monotonic()
        assert crawlers.refused > 0  # the growth came from refused requests
        # steady load: every crawler served, nobody refused; the count stands for longer than the delay
        time.sleep(DELAY + 5)
        steady_end = time.monotonic()
        assert stack.settled("auto", 3)
    finally:
        crawlers.release_all()
    released = time.monotonic()
    try:
        wait_for(lambda: stack.settled("auto", 1), DELAY + 90, "shrunk to minReplicas")
    finally:
        sampler.stop()
    loading = sampler.values(until=steady_end)
    assert loading[0] == 1 and max(loading) == 3
    assert all(b > a for a, b in _changes(loading)), f"the count fell under load: {loading}"
    assert set(sampler.values(grown, steady_end)) == {3}, "the count moved under steady load"
    assert "TooManyReplicas" in sampler.limited  # 6 crawlers at 70 % of 2 leases call for 5
    after = sampler.values(since=released)
    assert _changes(after) == [(3, 1)], f"not one step down to minReplicas: {after}"
    first_down = min(t for t, v in sampler.samples if t >= released and v < 3)
    assert first_down - released >= DELAY - 2, f"shrunk {first_down - released:.1f} s after the release"


def test_a_deleted_pool_leaves_nothing_behind(stack):
    stack.create_pool("leaky", 3, autoscale={"minReplicas": 3, "maxReplicas": 3, "scaleDownDelaySeconds": DELAY})
    pool = wait_for(lambda: stack.settled("leaky", 3), 150, "3 members leasable")
    members = stack.members(pool)
    uids = {m["metadata"]["uid"] for m in members}
    # a live lease and a refused-then-served history at the time of the deletion
    got = stack.http.post(f"{stack.api_url}/v1/leases", json={"pool": "leaky", "ttlSeconds": 600}, timeout=10)
    assert got.status_code == 201, got.text
    core = k8s.CoreV1Api(stack.client)
    pods = {p.metadata.name for p in core.list_namespaced_pod(NS).items
            if (p.metadata.labels or {}).get(LABEL_PROXY_UID) in uids}
    assert len(pods) == 3 and all(stack.cluster.kubelet.squid_of(NS, n) is not None for n in pods)
    squids_before = stack.cluster.kubelet.running()
    assert stack.r.exists(redis_keys.pool_scale(pool["metadata"]["uid"]))
    assert stack.r.hexists(redis_keys.POOLS, f"{NS}/leaky")

    stack.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "leaky")
    wait_for(lambda: stack.pool("leaky") is None, 60, "the pool gone")

    def leftovers() -> dict:
        r = stack.r
        return {
            "proxies": [p["metadata"]["name"] for p in stack.proxies() if p["metadata"]["uid"] in uids],
            "pods": [p.metadata.name for p in core.list_namespaced_pod(NS).items
                     if (p.metadata.labels or {}).get(LABEL_PROXY_UID) in uids],
            "squids": [n for n in pods if stack.cluster.kubelet.squid_of(NS, n) is not None],
            "records": [u for u in uids if r.exists(redis_keys.proxy(u)) or r.sismember(redis_keys.PROXIES, u)],
            "live leases": [u for u in uids if r.exists(redis_keys.proxy_leases(u))],
            "lease expiry": [m for m in r.zrange(redis_keys.LEASE_EXPIRY, 0, -1) if any(u in m for u in uids)],
            "health": [u for u in uids if r.zscore(redis_keys.HEALTH_DUE, u) is not None
                       or r.sismember(redis_keys.HEALTH_OK, u) or r.sismember(redis_keys.HEALTH_FAILING, u)],
            "credentials": [u for u in uids if r.exists(redis_keys.auth(u))],
            "lease index": [u for u in uids if r.zscore(redis_keys.LOAD, u) is not None or any(
                r.sismember(k, u) for k in (redis_keys.FULL, redis_keys.UNHEALTHY, redis_keys.DRAINING))],
            "demand": [k for k in (redis_keys.pool_demand(NS, "leaky"), redis_keys.pool_demand_read(NS, "leaky"),
                                   redis_keys.pool_scale(pool["metadata"]["uid"])) if r.exists(k)]
                      + ([f"{NS}/leaky"] if r.hexists(redis_keys.POOLS, f"{NS}/leaky") else []),
        }

    try:
        wait_for(lambda: not any(leftovers().values()), 120, "nothing of the pool left")
    except AssertionError:
        raise AssertionError(f"{leftovers()}\n{stack.logs()}") from None
    assert stack.cluster.kubelet.running() == squids_before - len(pods)
    # lease records are kept until their TTL (a late release still reports its outcome): none without one
    for key in stack.r.scan_iter(redis_keys.LEASE_PREFIX + "*"):
        assert stack.r.ttl(key) > 0, key
