"""Losing Redis does not stop the fleet (docs/architecture.md, "Redis loss"): real watcher, worker, beat and API processes.

Each test runs its own private ``redis-server`` (so it can be flushed, killed and restarted on
the same port without touching the session's), the Kubernetes API fake with the real CRD's
admission and the kubelet stand-in (every Squid Pod is a real Squid on a loopback address of its own), and the
operator processes through their real commands with short intervals (resync every
``RESYNC_S`` seconds, health sweeps every second, probes every second).

* ``FLUSHALL`` while two Proxies are Ready: beat keeps running and re-seeds its schedule, a
  resync runs again, the serving view and the lease index come back and a lease is granted
  within one resync period; one Pod per Proxy.
* Redis down for ~10 s (killed, restarted empty on the same port) while a third Proxy is
  applied: the API answers 503 ``redis_unavailable`` with ``Retry-After`` meanwhile; no process
  exits; the watcher retries the new Proxy's event until Redis answers (never drops it); the
  new Proxy gets exactly one instance and becomes leasable within one resync period of
  Redis returning; one Pod per Proxy.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import redis as redis_lib
import requests
import yaml
from kubernetes import client as k8s

from app.providers.kubernetes.provider import LABEL_MANAGED_BY, LABEL_PROXY_UID
from app.resources import GROUP, PLURAL, VERSION
from devcluster.squid import LOOPBACK_SQUID_BLOCK
from tests.support.processes import BIN, Process, celery_beat, celery_worker, watcher
from devcluster.redis_server import RedisServer, free_port
from tests.support.waiting import wait_for, wait_until
from tests.support.stack_fixtures import cluster, origin  # noqa: F401 - pytest fixtures

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "deploy" / "samples" / "proxy_kubernetes.yaml"
TOKEN = "redis-loss-test-token-4c1f"
RESYNC_S = 10
#: After Redis is back, how long recovery may take: one resync period, as the issue asks.
#: Measured: 2-3 s after FLUSHALL (serving view and a lease back), 4-5 s after a 10 s outage
#: (including the create of the Proxy applied meanwhile, its Squid and its probes), on a loaded
#: 2-core machine; the period leaves twice that.
RECOVERY_S = RESYNC_S


@pytest.fixture()
def redis_server():
    """A private redis-server for this test only (flushed, killed and restarted by it)."""
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture()
def stack(cluster, redis_server, tmp_path):
    """watcher + worker + beat + API through their real commands; yields a dict of Processes."""
    providers = tmp_path / "providers.yaml"
    # the kubelet's Squids must reach the origin on loopback: declared like an operator would
    providers.write_text(yaml.safe_dump({"providers": [{"name": "k8s-local", "type": "kubernetes",
                                                        "checkInterval": "0s", "squid": LOOPBACK_SQUID_BLOCK}]}))
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"sharedNamespaces: [\"*\"]\nclients:\n  - {{name: crawler-a, token: {TOKEN}}}\n")
    env = {
        "KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig")),
        "REDIS_URL": redis_server.url, "PROVIDERS_CONFIG": str(providers), "API_TOKENS_FILE": str(tokens),
        "RESYNC_INTERVAL": str(RESYNC_S), "GC_INTERVAL": "3600", "POLL_INITIAL": "0.5", "POLL_MAX": "2",
        "RETRY_INITIAL": "0.5", "RETRY_MAX": "2", "TASK_SOFT_TIME_LIMIT": "8", "TASK_TIME_LIMIT": "10",
        "BROKER_VISIBILITY_TIMEOUT": "60", "HEALTH_SWEEP_INTERVAL": "1", "EGRESS_ECHO_URL": "",
        "WATCH_BACKOFF_MAX": "2", "LOG_LEVEL": "INFO",
        "PROBE_ALLOWED_RANGES": "127.0.0.0/8",  # the kubelet's Squids run on loopback
    }
    api_port = free_port()
    procs = {
        "worker": celery_worker(env).start(),
        "beat": celery_beat(env, str(tmp_path)).start(),
        "watcher": watcher(env).start(),
        "api": Process("api", [str(BIN / "proxy-operator"), "api", "--bind", f"127.0.0.1:{api_port}",
                               "--workers", "1"], env).start(),
    }
    procs["api"].url = f"http://127.0.0.1:{api_port}"
    try:
        procs["worker"].wait_for_log("ready", timeout=60)
        procs["beat"].wait_for_log("beat: Starting", timeout=30)
        wait_for(lambda: _get(procs["api"], "/healthz") is not None, 30, "the API to answer")
        yield procs
    finally:
        for p in procs.values():
            p.stop()


# -- helpers ---------------------------------------------------------------------------------
def _custom(cluster) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(cluster.fake.api_client())


def apply_proxy(cluster, name: str, origin: str) -> dict:
    """``kubectl apply`` of the sample, probed through the local origin every second."""
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["name"] = name
    # timeoutSeconds must be below intervalSeconds (the CRD)
    body["spec"]["healthCheck"] = {"url": f"{origin}/generate_204", "intervalSeconds": 2, "timeoutSeconds": 1}
    body["spec"]["maxLeases"] = 2
    return _custom(cluster).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)


def phase(cluster, name: str) -> str | None:
    obj = _custom(cluster).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    return (obj.get("status") or {}).get("phase")


def wait_ready(cluster, name: str, timeout: float) -> None:
    """Wait until the Proxy is Ready; on timeout the error shows its status."""
    try:
        wait_for(lambda: phase(cluster, name) == "Ready", timeout, f"{name} Ready")
    except AssertionError as exc:
        obj = _custom(cluster).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
        raise AssertionError(f"{exc}; status: {obj.get('status')}") from None


def _get(api: Process, path: str, timeout: float = 15) -> requests.Response | None:
    try:
        return requests.get(api.url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=timeout)
    except requests.RequestException:
        return None


def leasable(api: Process) -> set[str]:
    """Names of the proxies the API lists as healthy (empty while the API cannot answer)."""
    r = _get(api, "/v1/proxies?healthy=true")
    if r is None or r.status_code != 200:
        return set()
    return {item["name"] for item in r.json()["items"]}


def lease_once(api: Process) -> dict | None:
    """Take a lease and give it back; the lease document, or ``None`` when none was granted."""
    try:
        r = requests.post(api.url + "/v1/leases", json={"ttlSeconds": 30}, timeout=15,
                          headers={"Authorization": f"Bearer {TOKEN}"})
    except requests.RequestException:
        return None
    if r.status_code != 201:
        return None
    doc = r.json()
    requests.delete(f"{api.url}/v1/leases/{doc['leaseId']}?outcome=ok", timeout=15,
                    headers={"Authorization": f"Bearer {TOKEN}"})
    return doc


def pods_per_proxy(cluster) -> Counter:
    """How many managed Pods each Proxy uid has."""
    pods = k8s.CoreV1Api(cluster.fake.api_client()).list_pod_for_all_namespaces(
        label_selector=f"{LABEL_MANAGED_BY}=proxy-operator").items
    return Counter(p.metadata.labels[LABEL_PROXY_UID] for p in pods)


def assert_alive(procs: dict) -> None:
    for name, proc in procs.items():
        assert proc.alive(), f"{name} exited; log:\n{proc.log()[-5000:]}"


def two_ready_proxies(cluster, stack, origin) -> dict[str, str]:
    """Apply squid-a and squid-b and wait until the API leases both; return name -> uid."""
    uids = {name: apply_proxy(cluster, name, origin)["metadata"]["uid"] for name in ("squid-a", "squid-b")}
    for name in uids:
        wait_ready(cluster, name, 60)
    wait_for(lambda: leasable(stack["api"]) == set(uids), 30, "both proxies leasable")
    assert lease_once(stack["api"]) is not None
    return uids


# -- the tests -------------------------------------------------------------------------------
def test_flushall_while_ready_heals_within_one_resync_period(cluster, stack, redis_server, origin):
    uids = two_ready_proxies(cluster, stack, origin)
    r = redis_lib.Redis.from_url(redis_server.url, decode_responses=True)
    wait_for(lambda: r.exists("po:redbeat:schedule"), 10, "redbeat's schedule in Redis")
    worker_log_at = len(stack["worker"].log())
    beat_log_at = len(stack["beat"].log())

    r.flushall()  # the schedule, the lock, the queue bindings, the serving view, the index
    flushed_at = time.monotonic()

    # The serving view, the lease index and leasing come back without restarting anything.
    took = wait_until(lambda: leasable(stack["api"]) == set(uids) and lease_once(stack["api"]) is not None,
                      RECOVERY_S, "the serving view back and a lease granted after FLUSHALL", interval=0.2)
    assert all(r.sismember("po:proxies", uid) for uid in uids.values())
    # beat is still running and firing: it re-seeded its schedule and a resync ran after the flush
    assert r.exists("po:redbeat:schedule") and r.exists("po:redbeat:lock")
    wait_for(lambda: "resync queued" in stack["worker"].log()[worker_log_at:], RESYNC_S + 5,
             "a resync after the flush")
    beat_log = stack["beat"].log()[beat_log_at:]
    assert "re-installing the schedule from code" in beat_log, beat_log[-3000:]
    assert "acquired the scheduler lock" in beat_log, beat_log[-3000:]
    # one instance per Proxy: no duplicate, no leak
    assert pods_per_proxy(cluster) == Counter({uid: 1 for uid in uids.values()})
    assert_alive(stack)
    assert "proxy event handler failed" not in stack["watcher"].log()
    print(f"recovered {took:.1f}s after FLUSHALL ({time.monotonic() - flushed_at:.1f}s incl. checks)")


def test_redis_down_for_ten_seconds_loses_no_proxy_and_no_process(cluster, stack, redis_server, origin):
    uids = two_ready_proxies(cluster, stack, origin)

    redis_server.kill()
    down_at = time.monotonic()
    uids["squid-c"] = apply_proxy(cluster, "squid-c", origin)["metadata"]["uid"]

    # The API says Redis is unavailable, and when to come back.
    [response] = wait_for(lambda: (resp := _get(stack["api"], "/v1/proxies")) is not None and [resp], 15,
                          "an answer from the API")
    assert response.status_code == 503, response.text
    assert response.json()["error"] == "redis_unavailable" and response.headers.get("Retry-After")
    # The watcher tried to hand the new Proxy's event over and keeps it for a retry.
    stack["watcher"].wait_for_log("proxy event hand-off failed for ADDED default/squid-c", timeout=15)
    time.sleep(max(0.0, 10 - (time.monotonic() - down_at)))
    assert_alive(stack)

    redis_server.start()
    back_at = time.monotonic()
    wait_ready(cluster, "squid-c", RECOVERY_S)
    wait_until(lambda: leasable(stack["api"]) == set(uids) and lease_once(stack["api"]) is not None,
               RECOVERY_S - (time.monotonic() - back_at), "all three proxies leasable after Redis is back",
               interval=0.2)
    assert pods_per_proxy(cluster) == Counter({uid: 1 for uid in uids.values()})
    assert_alive(stack)
    watcher_log = stack["watcher"].log()
    assert "proxy event handler failed" not in watcher_log  # nothing was dropped
    assert "proxy event ADDED default/squid-c handed off after" in watcher_log
    print(f"recovered {time.monotonic() - back_at:.1f}s after Redis came back")


def test_beat_started_while_redis_is_down_waits_and_then_schedules(redis_server, tmp_path):
    providers = tmp_path / "providers.yaml"
    providers.write_text("providers: []\n")
    redis_server.kill()
    beat = celery_beat({"REDIS_URL": redis_server.url, "PROVIDERS_CONFIG": str(providers),
                        "HEALTH_SWEEP_INTERVAL": "1", "LOG_LEVEL": "INFO"}, str(tmp_path)).start()
    try:
        beat.wait_for_log("beat: Redis unavailable", timeout=30)
        time.sleep(2)
        assert beat.alive(), beat.log()[-3000:]
        redis_server.start()
        r = redis_lib.Redis.from_url(redis_server.url, decode_responses=True)
        wait_for(lambda: r.exists("po:redbeat:schedule") and r.exists("po:redbeat:lock"), 15,
                 "the schedule and the lock in Redis")
        beat.wait_for_log("Sending due task health-sweep", timeout=15)
        assert r.llen("health") >= 1  # the message reached its queue
        assert beat.alive()
    finally:
        beat.stop()


def test_two_beats_after_flushall_one_schedules_the_other_stands_by(redis_server, tmp_path):
    providers = tmp_path / "providers.yaml"
    providers.write_text("providers: []\n")
    env = {"REDIS_URL": redis_server.url, "PROVIDERS_CONFIG": str(providers), "HEALTH_SWEEP_INTERVAL": "1",
           "LOG_LEVEL": "INFO"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    beats = [celery_beat(env, str(tmp_path / "a")).start()]
    try:
        beats[0].wait_for_log("Sending due task health-sweep", timeout=30)
        beats.append(celery_beat(env, str(tmp_path / "b")).start())  # blocks in redbeat's acquire: standby
        time.sleep(3)
        assert "Sending due task" not in beats[1].log()
        r = redis_lib.Redis.from_url(redis_server.url, decode_responses=True)
        r.flushall()
        flushed_at = [len(b.log()) for b in beats]
        time.sleep(RESYNC_S + 2)  # the standby's acquire polls every 10 s (beat_max_loop_interval)
        senders = [b for b, at in zip(beats, flushed_at) if "Sending due task health-sweep" in b.log()[at:]]
        # after the flush, sweeps are sent again, by one beat only, and neither exited
        assert len(senders) == 1, [b.log()[at:][-2000:] for b, at in zip(beats, flushed_at)]
        assert all(b.alive() for b in beats)
        holder = r.get("po:redbeat:lock")
        assert holder
    finally:
        for b in beats:
            b.stop()
