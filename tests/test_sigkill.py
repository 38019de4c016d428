"""A worker or beat killed with SIGKILL (an OOM kill, a lost node): its work is taken up again
within the documented bound (docs/architecture.md, "Faults"), through the real processes.

The whole process group of the worker (the Celery parent and its prefork children) is SIGKILLed
mid-create, mid-delete and mid-pool-pass (the API fake holds the request the step is waiting on,
so the kill lands inside the step), a fresh worker is started, and:

* the dead worker's messages are put back (its heartbeat gone, ``HOLDER_TTL``) within
  :data:`TAKEN_UP_S` of the fresh worker being ready, and the locks it held are taken over;
* the Proxy (or the pool) converges within :data:`TAKEN_UP_S` + :data:`STEP_S`, with exactly one
  instance per Proxy (no duplicate Pod, no duplicate member).

Task time limits are long here (60 s: the per-Proxy lock lives 70 s) and the broker's visibility
timeout is the default hour, so neither can be what brings the work back.  A beat SIGKILLed while
it holds the scheduler lock: a new beat schedules within ``BEAT_LOCK_TIMEOUT`` + 5 s.
"""

from __future__ import annotations

import time

import pytest
import yaml
from kubernetes import client as k8s

from app.providers.kubernetes.provider import LABEL_MANAGED_BY
from app.resources import GROUP, PLURAL, POOL_PLURAL, VERSION
from tests.pools.env import pool_operator_env
from tests.support.origin import origin_server
from tests.support.processes import ROOT, celery_beat, celery_worker, watcher
from tests.support.waiting import wait_for
from tests.support.stack_fixtures import cluster  # noqa: F401 - pytest fixtures

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

NS = "default"
SAMPLE = ROOT / "deploy" / "samples" / "proxy_kubernetes.yaml"
#: Heartbeat TTL of the holders in these tests, seconds (``HOLDER_TTL``).
HOLDER_TTL = 3
#: workers/broker.py REAP_INTERVAL: how often a worker reaps dead holders' messages.
REAP_INTERVAL = 2
#: The documented bound, from a worker being up: the dead holder's heartbeat expires (HOLDER_TTL),
#: the reaping worker has beaten for HOLDER_TTL itself, then reaps within REAP_INTERVAL.
TAKEN_UP_S = 2 * HOLDER_TTL + REAP_INTERVAL
#: The step itself once taken up (a Pod create and its Squid, a poll, a delete), on a loaded 2-core machine.
STEP_S = 15
#: Beat's lock in these tests (``BEAT_LOCK_TIMEOUT``); a new beat schedules within it + the 5 s loop interval.
BEAT_LOCK_TIMEOUT = 10
BEAT_BOUND_S = BEAT_LOCK_TIMEOUT + 5


@pytest.fixture()
def env(cluster, redis_url, tmp_path):
    """The operator's environment: long task limits, the default visibility timeout, short holder TTL."""
    return {**pool_operator_env(tmp_path, cluster, redis_url),
            "TASK_SOFT_TIME_LIMIT": "50", "TASK_TIME_LIMIT": "60", "BROKER_VISIBILITY_TIMEOUT": "3600",
            "HOLDER_TTL": str(HOLDER_TTL), "BEAT_LOCK_TIMEOUT": str(BEAT_LOCK_TIMEOUT),
            "POOL_RESYNC_INTERVAL": "2", "RESYNC_INTERVAL": "2"}


@pytest.fixture()
def fleet(env, tmp_path):
    """The victim worker, beat and the watcher (the test starts the replacement)."""
    procs = {"victim": celery_worker(env, name="victim").start(), "beat": celery_beat(env, str(tmp_path)).start(),
             "watcher": watcher(env).start()}
    procs["victim"].wait_for_log("ready", timeout=90)
    yield procs
    for p in procs.values():
        p.stop()


def custom(cluster) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(cluster.fake.api_client())


def create_proxy(cluster, name: str, origin: str | None = None) -> None:
    """Create the sample Proxy as ``name``; probed through the local ``origin`` when given."""
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["name"] = name
    if origin:
        body["spec"]["healthCheck"] = {"url": f"{origin}/generate_204", "intervalSeconds": 2, "timeoutSeconds": 1}
    custom(cluster).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)


def get(cluster, plural: str, name: str) -> dict | None:
    try:
        return custom(cluster).get_namespaced_custom_object(GROUP, VERSION, NS, plural, name)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def phase(cluster, name: str) -> str | None:
    return ((get(cluster, PLURAL, name) or {}).get("status") or {}).get("phase")


def pods(cluster) -> list:
    return k8s.CoreV1Api(cluster.fake.api_client()).list_pod_for_all_namespaces(
        label_selector=f"{LABEL_MANAGED_BY}=proxy-operator").items


def replace_victim(fleet, env):
    """SIGKILL the victim's process group, start a fresh worker; return it and when it was ready."""
    fleet["victim"].kill()
    replacement = celery_worker(env, name="replacement").start()
    fleet["replacement"] = replacement
    replacement.wait_for_log("ready", timeout=90)
    return replacement, time.monotonic()


def within(deadline_s: float, ready_at: float, check, what: str, log) -> None:
    """Assert ``check()`` turns true no later than ``deadline_s`` after ``ready_at``."""
    left = ready_at + deadline_s - time.monotonic()
    try:
        wait_for(check, max(left, 0.1), what)
    except AssertionError as exc:
        raise AssertionError(f"{exc} within {deadline_s} s of the fresh worker's start; its log:\n"
                             f"{log()[-4000:]}") from None


PROVISIONED = {"Running", "Ready", "Unhealthy"}


def test_worker_killed_mid_create_is_taken_up_within_the_bound(cluster, fleet, env):
    cluster.fake.delay_next("create", "pods", seconds=3)
    create_proxy(cluster, "px-create")
    wait_for(lambda: cluster.fake.request_count("create", "pods") >= 1, 30, "the Pod create to be sent")
    replacement, ready_at = replace_victim(fleet, env)
    within(TAKEN_UP_S, ready_at, lambda: "put back on their queues" in replacement.log(),
           "the dead worker's messages put back", replacement.log)
    within(TAKEN_UP_S + STEP_S, ready_at, lambda: phase(cluster, "px-create") in PROVISIONED,
           "the Proxy provisioned", replacement.log)
    assert len(pods(cluster)) == 1


def test_worker_killed_mid_delete_is_taken_up_within_the_bound(cluster, fleet, env):
    with origin_server() as origin:
        _killed_mid_delete(cluster, fleet, env, origin)


def _killed_mid_delete(cluster, fleet, env, origin):
    create_proxy(cluster, "px-delete", origin)
    wait_for(lambda: phase(cluster, "px-delete") == "Ready", 60, "the Proxy Ready")
    # The delete step's first write (phase Terminating) is held, so the worker dies inside the
    # step, holding the Proxy's lock, before it has seen the Pod.
    writes = cluster.fake.request_count(None, "proxies/status")
    cluster.fake.delay_next(None, "proxies/status", seconds=3)
    custom(cluster).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "px-delete")
    wait_for(lambda: cluster.fake.request_count(None, "proxies/status") > writes, 30, "the delete's status write")
    replacement, ready_at = replace_victim(fleet, env)
    within(TAKEN_UP_S + STEP_S, ready_at, lambda: get(cluster, PLURAL, "px-delete") is None,
           "the Proxy released", replacement.log)
    assert pods(cluster) == []


def test_worker_killed_mid_pool_pass_is_taken_up_within_the_bound(cluster, fleet, env):
    template = {"metadata": {"labels": {"app": "pool-kill"}}, "spec": {"provider": "k8s-local", "maxLeases": 2}}
    custom(cluster).create_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": "pool-kill", "namespace": NS},
        "spec": {"replicas": 0, "template": template}})
    wait_for(lambda: ((get(cluster, POOL_PLURAL, "pool-kill") or {}).get("status") or {}).get("observedGeneration"),
             30, "the empty pool observed")
    # The pass's first member create is held, so the worker dies inside the pass, holding its lock.
    cluster.fake.delay_next("create", "proxies", seconds=3)
    custom(cluster).patch_namespaced_custom_object_scale(GROUP, VERSION, NS, POOL_PLURAL, "pool-kill",
                                                         {"spec": {"replicas": 3}})
    wait_for(lambda: cluster.fake.request_count("create", "proxies") >= 1, 30, "the pass's first member create")
    replacement, ready_at = replace_victim(fleet, env)

    def members() -> list[dict]:
        return custom(cluster).list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]

    within(TAKEN_UP_S + STEP_S, ready_at, lambda: len(members()) >= 3, "the pool's three members", replacement.log)
    within(TAKEN_UP_S + 2 * STEP_S, ready_at, lambda: len(pods(cluster)) >= 3, "their three Pods", replacement.log)
    time.sleep(2 * REAP_INTERVAL)  # a duplicate pass or create would show by now
    assert len(members()) == 3
    assert len(pods(cluster)) == 3


def test_beat_killed_holding_its_lock_is_replaced_within_its_bound(env, redis_url, tmp_path):
    first = celery_beat(env, str(tmp_path)).start()
    second = None
    try:
        first.wait_for_log("Sending due task", timeout=60)
        first.kill()
        killed_at = time.monotonic()
        (tmp_path / "beat.pid").unlink(missing_ok=True)
        second = celery_beat(env, str(tmp_path)).start()
        second.wait_for_log("Sending due task", timeout=BEAT_BOUND_S + 30)
        took = time.monotonic() - killed_at
        assert took <= BEAT_BOUND_S + 5, f"the new beat first scheduled {took:.1f} s after the kill"  # +5: its start
    finally:
        for p in (first, second):
            if p is not None:
                p.stop()
