"""Probe lanes through the real worker and beat: one namespace's Proxies pointed at a tarpit
(a listener that accepts and never answers) do not stretch another namespace's probe interval."""

from __future__ import annotations

import time

import pytest

from app.store import keys as redis_keys

from app.serving import view as serving
from tests.health.conftest import NET
from tests.health.fleet import start_squid
from tests.health.servers import Blackhole
from tests.support.processes import celery_beat, celery_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TARPITS = 20
TARPIT_HEALTH = {"intervalSeconds": 10, "timeoutSeconds": 8}
HEALTHY_INTERVAL = 4
SWEEP = 1  # HEALTH_SWEEP_INTERVAL


def _probe_times(r, uids: list[str], seconds: float) -> dict[str, list[float]]:
    """Poll the serving records for ``seconds``; return each uid's distinct ``lastProbe`` starts."""
    seen: dict[str, list[float]] = {u: [] for u in uids}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for uid in uids:
            value = r.hget(redis_keys.proxy(uid), "lastProbe")
            if value and (not seen[uid] or float(value) != seen[uid][-1]):
                seen[uid].append(float(value))
        time.sleep(0.05)
    return seen


def test_a_namespace_of_tarpits_does_not_stretch_another_namespaces_interval(
        fake, fleet, redis_url, origin, squids, next_address, tmp_path):
    sq = squids(start_squid(next_address()))
    hole = Blackhole(NET.host(7))
    env = {"REDIS_URL": redis_url, "KUBECONFIG": fake.write_kubeconfig(str(tmp_path / "kubeconfig")),
           "EGRESS_ECHO_URL": origin.url("/ip"), "PROVIDERS_CONFIG": "", "PROBE_ALLOWED_RANGES": "127.0.0.0/8",
           "HEALTH_SWEEP_INTERVAL": str(SWEEP), "HEALTH_BATCH_SIZE": "5", "HEALTH_SLOW_SECONDS": "1",
           "HEALTH_SLOW_LANE_BATCHES": "1", "GC_INTERVAL": "3600", "RESYNC_INTERVAL": "3600"}
    # two prefork children, as the demo's health-worker: 20 tarpits in batches of 5 would hold both
    worker = celery_worker(env, queues="health", concurrency=2, name="health-worker").start()
    beat = celery_beat(env, str(tmp_path)).start()
    try:
        tarpits = [fleet.external(f"tarpit{i}", hole.address, hole.port, namespace="crawler-a",
                                  health=TARPIT_HEALTH) for i in range(TARPITS)]
        healthy = [fleet.external(f"ok{i}", sq.address, sq.port, namespace="crawler-b",
                                  health={"intervalSeconds": HEALTHY_INTERVAL, "timeoutSeconds": 2})
                   for i in range(2)]
        worker.wait_for_log("ready.", timeout=60)
        # every tarpit probed once (cut in the fast lane, or judged in the slow lane)
        deadline = time.monotonic() + 60
        while not all(serving.get(fleet.r, px.uid)["lastProbe"] for px in tarpits):
            assert time.monotonic() < deadline, f"tarpits never probed; worker log:\n{worker.log()[-4000:]}"
            time.sleep(0.2)

        seen = _probe_times(fleet.r, [px.uid for px in healthy], 3 * TARPIT_HEALTH["intervalSeconds"])

        intervals = [b - a for times in seen.values() for a, b in zip(times, times[1:])]
        assert len(intervals) >= 2 * 4, (seen, worker.log()[-4000:])
        # due after its interval, claimed by the next sweep (one sweep period late at most)
        bound = HEALTHY_INTERVAL + SWEEP + 1.0
        assert max(intervals) <= bound, (sorted(intervals), worker.log()[-4000:])
        assert sum(intervals) / len(intervals) <= HEALTHY_INTERVAL * 1.1 + SWEEP / 2
        for px in healthy:
            assert fleet.read("crawler-b", px.name).phase == "Ready"
        # the tarpits had their own lane: probed there with their own 8 s timeout and judged
        judged = [serving.get(fleet.r, px.uid) for px in tarpits]
        assert any(float(rec["latencyMs"]) >= 7000 and "slow lane" not in rec["lastMessage"] for rec in judged), \
            [(rec["latencyMs"], rec["lastMessage"]) for rec in judged]
    finally:
        beat.stop()
        worker.stop()
        hole.stop()
