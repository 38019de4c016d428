"""The Celery tasks through a real worker process: ``health.sweep`` enqueues
``health.probe_batch`` batches, and the batches turn the Proxies Ready."""

from __future__ import annotations

import json
import time

import pytest
from celery import Celery

from app.serving import view as serving
from app.probes.settings import HealthSettings
from tests.health.fleet import start_squid
from tests.support.processes import celery_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_sweep_and_probe_batch_in_a_worker(fake, fleet, redis_url, origin, squids, next_address, tmp_path):
    sq = squids(start_squid(next_address()))
    pxs = [fleet.external(f"t{i}", sq.address, sq.port) for i in range(3)]
    env = {"REDIS_URL": redis_url, "KUBECONFIG": fake.write_kubeconfig(str(tmp_path / "kubeconfig")),
           "EGRESS_ECHO_URL": origin.url("/ip"), "HEALTH_BATCH_SIZE": "2", "PROVIDERS_CONFIG": "",
           "PROBE_ALLOWED_RANGES": "127.0.0.0/8"}  # the Squid is on loopback
    worker = celery_worker(env, queues="health", concurrency=1, name="health-worker").start()
    client = Celery("test-client", broker=redis_url)
    try:
        worker.wait_for_log("ready.", timeout=60)
        client.send_task("health.sweep", queue="health")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(fleet.read("default", f"t{i}").phase == "Ready" for i in range(3)):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"proxies not Ready; worker log:\n{worker.log()[-4000:]}")
        for px in pxs:
            rec = serving.get(fleet.r, px.uid)
            assert rec["healthy"] == "1" and rec["egressIP"] == sq.address
        log = worker.log()
        assert "health.sweep" in log and "health.probe_batch" in log
    finally:
        worker.stop()
        client.close()


def test_beat_schedule_entry():
    from workers.probe_tasks import BEAT_SCHEDULE

    entry = BEAT_SCHEDULE["health-sweep"]
    assert entry["task"] == "health.sweep"
    assert entry["schedule"] == HealthSettings().sweep_interval
    assert entry["options"]["queue"] == "health"
    json.dumps(BEAT_SCHEDULE)  # plain data, mergeable into any schedule
