"""``instance.retire`` waiting for a busy per-Proxy lock, through a real Celery worker process.

A replaced Pod (managed by the kubernetes provider, tagged with the UID of a Proxy that no
longer exists) is retired while the Proxy's lock (:func:`app.store.keys.proxy_lock`) is held in
Redis for more than ``max_retries`` (8) lock waits, ``POLL_INITIAL`` (0.2 s here) apart.  The
waits are not failures: once the lock is released the Pod is deleted, the worker never logs
``MaxRetriesExceededError``, and Transient failures of the delete right after are still retried
with the task's whole error budget (the waits did not use it up).  A lock that stays busy for
twice its timeout makes the task leave the Pod to GC with a warning, never an error.
"""

from __future__ import annotations

import re
import time

import pytest
import redis as redis_lib
from celery import Celery
from kubernetes import client as k8s

from app.store import keys as redis_keys
from tests.support.processes import celery_worker
from tests.support.retire import replaced_pod, retire_pattern, send_retire, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: Lock waits seen before the lock is released: more than the task's max_retries (8).
WAITS = 12


def _retries(log: str) -> int:
    """How many times the worker logged a retry of ``instance.retire``."""
    return len(re.findall(r"instance\.retire\[[^\]]+\] retry: Retry in", log))


def _replaced_pod_under_a_busy_lock(core, r, holder: str) -> str:
    """Create ``default/replaced-pod`` (:func:`tests.support.retire.replaced_pod`) and hold its
    Proxy UID's per-Proxy lock as ``holder``; return the UID."""
    uid = replaced_pod(core)
    r.set(redis_keys.proxy_lock(uid), holder, ex=110)
    return uid


def test_retire_outlasts_a_lock_held_through_more_waits_than_max_retries(kube, kube_client, redis_url, tmp_path):
    env = worker_env(kube, redis_url, tmp_path, POLL_INITIAL="0.2", POLL_MAX="1", RETRY_INITIAL="0.2",
                     RETRY_MAX="0.5", TASK_SOFT_TIME_LIMIT="8", TASK_TIME_LIMIT="10")
    core = k8s.CoreV1Api(kube_client)
    r = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    uid = _replaced_pod_under_a_busy_lock(core, r, "a-step-of-the-proxy")  # the lock a running step holds

    def pod_exists() -> bool:
        return any(p.metadata.name == "replaced-pod" for p in core.list_namespaced_pod("default").items)

    worker = celery_worker(env, queues="proxies", concurrency=1, name="retire-worker").start()
    client = Celery("test-client", broker=redis_url)
    try:
        worker.wait_for_log("ready.", timeout=60)
        send_retire(client, uid)
        deadline = time.monotonic() + 60
        while _retries(worker.log()) < WAITS and "MaxRetriesExceededError" not in worker.log():
            assert time.monotonic() < deadline, f"{WAITS} lock waits not seen; log:\n{worker.log()[-4000:]}"
            time.sleep(0.2)
        assert "MaxRetriesExceededError" not in worker.log(), worker.log()[-4000:]
        assert pod_exists(), "deleted while the Proxy's lock was held"

        # The lock is released; the next two deletes fail Transiently (503): retried, not given up.
        kube.fail_next("delete", "pods", code=503, reason="ServiceUnavailable", times=2)
        r.delete(redis_keys.proxy_lock(uid))
        deadline = time.monotonic() + 30
        while pod_exists():
            assert time.monotonic() < deadline, f"the Pod was not deleted; log:\n{worker.log()[-4000:]}"
            time.sleep(0.2)
        log = worker.log()
        assert "MaxRetriesExceededError" not in log
        assert "giving up" not in log and "stayed busy" not in log, log[-4000:]
        assert len(re.findall(retire_pattern("default/replaced-pod") + " Transient", log)) == 2, log[-4000:]
        # the first failure backs off as a first failure (at most RETRY_INITIAL), not as the 13th
        delays = [float(d) for d in re.findall(r"Transient; retrying in \S+\n[^\n]*retry: Retry in ([0-9.]+)s", log)]
        assert len(delays) == 2 and delays[0] <= 0.2, delays
    finally:
        worker.stop()
        client.close()
        r.close()


def test_retire_leaves_the_instance_to_gc_when_the_lock_stays_busy(kube, kube_client, redis_url, tmp_path):
    # lock timeout = TASK_TIME_LIMIT + 10 = 12 s: twice that at 2 s a try is 12 waits (~30 s)
    env = worker_env(kube, redis_url, tmp_path, POLL_INITIAL="2", POLL_MAX="2", TASK_SOFT_TIME_LIMIT="1.5",
                     TASK_TIME_LIMIT="2")
    core = k8s.CoreV1Api(kube_client)
    r = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    uid = _replaced_pod_under_a_busy_lock(core, r, "a-stuck-holder")
    worker = celery_worker(env, queues="proxies", concurrency=1, name="retire-worker").start()
    client = Celery("test-client", broker=redis_url)
    try:
        worker.wait_for_log("ready.", timeout=60)
        send_retire(client, uid)
        worker.wait_for_log("stayed busy through 13 tries", timeout=80)
        time.sleep(1.0)  # nothing after the give-up: no further retry
        log = worker.log()
        assert _retries(log) == 12, log[-4000:]
        assert "MaxRetriesExceededError" not in log and " ERROR " not in log, log[-4000:]
        assert re.search(r"instance\.retire\[[^\]]+\] succeeded", log), log[-4000:]
        assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["replaced-pod"]
    finally:
        worker.stop()
        client.close()
        r.close()
