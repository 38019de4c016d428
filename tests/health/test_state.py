"""Threshold rules (pure): results -> health, verdict, phase."""

from __future__ import annotations

from app.probes import probe as p
from app.probes.state import HEALTHY, UNHEALTHY_STATE, UNKNOWN, HealthState, Thresholds, advance, verdict

NOW = 1_000_000.0


def ok(egress=None):
    return p.ProbeResult("u", True, p.OK, "GET answered 204", 204, 3.0, NOW, egress)


def bad(reason=p.CONNECTION_REFUSED):
    return p.ProbeResult("u", False, reason, f"failed: {reason}", None, 1.0, NOW)


TH = Thresholds(success=2, failure=3)


def run(state, results, th=TH, *, now=NOW, deadline=600, outage=False):
    for res in results:
        state = advance(state, res, th, now=now, deadline=deadline, outage=outage)
    return state


def test_healthy_only_after_the_success_threshold():
    s = run(HealthState(running_since=NOW), [ok()])
    assert s.health == UNKNOWN and verdict(s).healthy is None and verdict(s).key() == ""
    s = run(s, [ok("192.0.2.1")])
    assert s.health == HEALTHY and s.ever_healthy and s.egress_ip == "192.0.2.1"
    v = verdict(s)
    assert (v.healthy, v.phase, v.reason, v.egress_ip) == (True, "Ready", p.OK, "192.0.2.1")


def test_a_failure_resets_the_success_count():
    s = run(HealthState(running_since=NOW), [ok(), bad(), ok()])
    assert s.health == UNKNOWN and s.successes == 1


def test_unhealthy_only_after_the_failure_threshold():
    s = run(HealthState(running_since=NOW), [ok(), ok()])
    s = run(s, [bad(), bad()])
    assert s.health == HEALTHY
    s = run(s, [bad(p.TIMEOUT)])
    assert s.health == UNHEALTHY_STATE
    v = verdict(s)
    assert (v.healthy, v.phase, v.reason) == (False, "Unhealthy", p.TIMEOUT)


def test_a_changed_reason_while_unhealthy_changes_the_verdict_key():
    s = run(HealthState(running_since=NOW), [ok(), ok(), bad(), bad(), bad(p.TIMEOUT)])
    k1 = verdict(s).key()
    s2 = run(s, [bad(p.TIMEOUT)])
    assert verdict(s2).key() == k1  # same verdict: no status write
    s3 = run(s2, [bad(p.CONNECTION_REFUSED)])
    assert verdict(s3).key() != k1 and verdict(s3).reason == p.CONNECTION_REFUSED


def test_a_new_egress_ip_while_healthy_changes_the_verdict_key():
    s = run(HealthState(running_since=NOW), [ok("192.0.2.1"), ok()])
    k = verdict(s).key()
    assert verdict(run(s, [ok()])).key() == k
    assert verdict(run(s, [ok("192.0.2.9")])).key() != k


def test_never_healthy_stays_in_its_phase_with_the_reason_then_fails_after_the_deadline():
    s = run(HealthState(running_since=NOW), [bad(), bad(), bad()])
    v = verdict(s)
    assert (v.healthy, v.phase, v.reason) == (False, None, p.CONNECTION_REFUSED)
    late = run(s, [bad(p.TIMEOUT)], now=NOW + 601)
    v = verdict(late)
    assert late.failed and (v.phase, v.reason) == ("Failed", p.TIMEOUT)
    assert "not healthy within 600s" in v.message


def test_once_healthy_never_goes_failed_by_the_deadline():
    s = run(HealthState(running_since=NOW), [ok(), ok()] + [bad()] * 5, now=NOW + 10_000)
    assert not s.failed and verdict(s).phase == "Unhealthy"


def test_outage_freezes_the_verdict_but_counts():
    healthy = run(HealthState(running_since=NOW), [ok(), ok()])
    s = run(healthy, [bad()] * 5, outage=True)
    assert s.health == HEALTHY and s.failures == 5
    young = run(HealthState(running_since=NOW), [bad()] * 3, now=NOW + 10_000, outage=True)
    assert not young.failed
