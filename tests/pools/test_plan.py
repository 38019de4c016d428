"""The pool controller's decisions (app.pools.plan), rule by rule, and whole rollouts simulated
pass by pass (tests/pools/sim.py) with the invariants checked at every step."""

from __future__ import annotations

import dataclasses
import re

import pytest

from app.pools.autoscale import Demand
from app.pools.model import age_limit
from app.pools.model import parse_time
from app.pools.model import format_time
from app.pools.plan import FAILURE_BACKOFF_BASE, Create, failure_backoff, plan
from app.pools.zones import MAX_ZONE_MESSAGE, ZoneHealth
from tests.pools.sim import Sim, member, pool

NOW = 1_000_000.0


def cond(status: dict, ctype: str) -> dict:
    [c] = [c for c in status["conditions"] if c["type"] == ctype]
    return c


# -- scaling -------------------------------------------------------------------------------------
def test_scale_from_zero_creates_every_member_at_once():
    p = pool({"replicas": 5})
    result = plan(p, [], {}, now=NOW)
    assert result.creates == (Create(None),) * 5
    assert not result.drains and not result.deletes
    assert result.status["replicas"] == 0 and result.desired == 5
    assert result.scale_to is None  # no autoscaler: spec.replicas is the user's
    assert cond(result.status, "Progressing")["reason"] == "ScalingUp"
    assert cond(result.status, "Available")["status"] == "False"


def test_creates_use_the_templates_zone_without_a_spread():
    p = pool({"replicas": 2, "template": {"metadata": {"labels": {"app": "web"}},
                                          "spec": {"provider": "kvm", "placement": {"zone": "h1"}}}})
    assert plan(p, [], {}, now=NOW).creates == (Create("h1"),) * 2
    blocked = plan(p, [], {"h1": False}, now=NOW)
    assert blocked.creates == ()
    assert cond(blocked.status, "Progressing")["reason"] == "NoReadyZone"


def test_steady_pool_does_nothing_and_says_complete():
    p = pool({"replicas": 3})
    members = [member(p, leases=i) for i in range(3)]
    result = plan(p, members, {}, now=NOW)
    assert result.actions == 0
    assert cond(result.status, "Progressing")["reason"] == "PoolComplete"
    assert cond(result.status, "Available")["status"] == "True"
    assert result.status["leasableReplicas"] == 3 and result.status["updatedReplicas"] == 3
    assert result.requeue_after is None


def test_scale_down_drains_the_least_leased_and_not_leasable_first():
    p = pool({"replicas": 2, "drain": {"drainTimeoutSeconds": 90}})
    busy = member(p, leases=4)
    quiet = member(p, leases=0)
    some = member(p, leases=1)
    pending = member(p, leasable=False)
    busier = member(p, leases=3)
    result = plan(p, [busy, quiet, some, pending, busier], {}, now=NOW)
    assert [d.uid for d in result.drains] == [pending.uid, quiet.uid, some.uid]
    assert all(d.until == NOW + 90 and d.reason == "ScaleDown" for d in result.drains)
    assert not result.creates and not result.deletes


def test_scale_down_counts_members_already_draining_as_leaving():
    p = pool({"replicas": 3})
    staying = [member(p, leases=1) for _ in range(3)]
    leaving = [member(p, leases=2, draining_until=NOW + 60) for _ in range(2)]
    result = plan(p, staying + leaving, {}, now=NOW)
    assert not result.drains and not result.creates and not result.deletes
    assert result.status["replicas"] == 5
    assert "2 draining" in cond(result.status, "Progressing")["message"]
    assert result.requeue_after == pytest.approx(60)


def test_drained_members_are_deleted_when_their_leases_end_or_their_deadline_passes():
    p = pool({"replicas": 1})
    keep = member(p)
    empty = member(p, leases=0, draining_until=NOW + 500)
    held = member(p, leases=2, draining_until=NOW + 500)
    late = member(p, leases=2, draining_until=NOW - 1)
    result = plan(p, [keep, empty, held, late], {}, now=NOW)
    assert {(d.uid, d.reason) for d in result.deletes} == {(empty.uid, "Drained"), (late.uid, "DrainTimeout")}
    assert held.uid not in {d.uid for d in result.deletes}
    assert result.requeue_after == pytest.approx(500)


def test_a_scale_up_reclaims_members_draining_for_scale_down_before_creating():
    # replicas 5 -> 10 shortly after a scale-down: 5 staying, 5 drained for ScaleDown still
    # holding leases (maxSurge 1): the drained ones take leases again, nothing is created
    p = pool({"replicas": 10, "rollout": {"maxSurge": 1}})
    staying = [member(p, leases=1) for _ in range(5)]
    drained = [member(p, leases=2, draining_until=NOW + 300, drain_reason="ScaleDown") for _ in range(5)]
    result = plan(p, staying + drained, {}, now=NOW)
    assert {c.uid for c in result.reclaims} == {m.uid for m in drained}
    assert not result.creates and not result.deletes and not result.drains
    assert result.status["updatedReplicas"] == 10
    assert "wait for" not in cond(result.status, "Progressing")["message"]


def test_a_scale_up_reclaims_only_updated_scale_down_members_and_creates_the_rest_within_the_surge():
    p = pool({"replicas": 10, "rollout": {"maxSurge": 1}, "maxAge": "720h",
              "spread": {"zones": ["a", "b"]}})
    staying = [member(p, leases=1, zone="a") for _ in range(5)]
    back = [member(p, leases=2, zone="b", draining_until=NOW + 300, drain_reason="ScaleDown") for _ in range(3)]
    # not reclaimed: drained as Outdated (even with the current template), an old template,
    # a zone whose target is down, a zone no longer in the spread, unhealthy, past its deadline
    outdated = member(p, leases=2, zone="a", draining_until=NOW + 300, drain_reason="Outdated")
    old = member(p, leases=2, zone="a", template_hash="old", draining_until=NOW + 300, drain_reason="ScaleDown")
    down = member(p, leases=2, zone="c", draining_until=NOW + 300, drain_reason="ScaleDown")
    unhealthy = member(p, leasable=False, leases=1, zone="a", draining_until=NOW + 300, drain_reason="ScaleDown")
    late = member(p, leases=1, zone="a", draining_until=NOW - 1, drain_reason="ScaleDown")
    expired = member(p, leases=1, zone="b", created=NOW - 3_000_000, draining_until=NOW + 300,
                     drain_reason="ScaleDown")
    p2 = pool({"replicas": 10, "rollout": {"maxSurge": 1}, "maxAge": "720h",
               "spread": {"zones": ["a", "b", "c"]}})
    members = staying + back + [outdated, old, unhealthy, late, expired]
    result = plan(p, members + [down], {"b": True}, now=NOW)
    assert {c.uid for c in result.reclaims} == {m.uid for m in back}
    # 5 + 3 updated, 2 short; 6 draining still hold leases (late is deleted): the surge leaves
    # room for 10 + 1 - 8 - 6 < 0, so nothing is created yet
    assert not result.creates
    assert late.uid in {d.uid for d in result.deletes}
    # a zone not Ready keeps its drained member draining
    result = plan(p2, members + [down], {"c": False}, now=NOW)
    assert down.uid not in {c.uid for c in result.reclaims}
    result = plan(p2, members + [down], {}, now=NOW)
    assert down.uid in {c.uid for c in result.reclaims}
    # fewer draining with leases: the remainder is created, bounded by maxSurge
    result = plan(p, staying + back + [outdated, old], {}, now=NOW)
    assert len(result.reclaims) == 3 and len(result.creates) == 1  # 10 + 1 - (5 + 3) - 2 holding
    assert "1 member(s) wait for 2 draining member(s)" in cond(result.status, "Progressing")["message"]


def test_a_member_drained_with_no_leases_is_reclaimed_rather_than_deleted_and_replaced():
    p = pool({"replicas": 3})
    staying = [member(p) for _ in range(2)]
    idle = member(p, draining_until=NOW + 300, drain_reason="ScaleDown")
    result = plan(p, staying + [idle], {}, now=NOW)
    assert [c.uid for c in result.reclaims] == [idle.uid]
    assert not result.deletes and not result.creates


def test_scale_down_then_up_simulated_takes_the_drained_members_back():
    sim = Sim(pool({"replicas": 4, "rollout": {"maxSurge": 1}}), [])
    for _ in range(3):
        sim.step()
    sim.members = [dataclasses.replace(m, leases=1) for m in sim.members]
    sim.set_spec(replicas=2)
    sim.step()
    assert len(sim.active()) == 2 and len(sim.members) == 4
    sim.set_spec(replicas=4)
    result = sim.step()
    assert len(result.reclaims) == 2 and not result.creates
    assert sim.leasable() == 4 and len(sim.members) == 4 and not sim.created[4:]


def test_failed_members_are_deleted_and_replaced_after_a_backoff():
    p = pool({"replicas": 2})
    ok = member(p)
    broken = member(p, leasable=False, phase="Failed")
    result = plan(p, [ok, broken], {}, now=NOW)
    assert [(d.uid, d.reason) for d in result.deletes] == [(broken.uid, "Failed")]
    assert result.creates == ()  # not replaced at once
    failures = result.status["memberFailures"]
    assert failures["count"] == 1 and failures["templateHash"] == p.spec.hash
    assert parse_time(failures["retryAfter"]) - NOW == pytest.approx(FAILURE_BACKOFF_BASE, abs=1)
    assert result.requeue_after == pytest.approx(FAILURE_BACKOFF_BASE, abs=1)
    assert (cond(result.status, "Progressing")["status"], cond(result.status, "Progressing")["reason"]) == (
        "False", "FailureBackoff")
    # the next pass within the delay: still nothing; after it: the replacement
    p2 = pool({"replicas": 2}, status=result.status)
    assert plan(p2, [ok], {}, now=NOW + 5).creates == ()
    later = plan(p2, [ok], {}, now=NOW + FAILURE_BACKOFF_BASE + 1)
    assert later.creates == (Create(None),)
    assert later.status["memberFailures"] == failures  # kept until a new member works


def test_failure_backoff_doubles_per_pass_with_failures_up_to_the_cap():
    assert [failure_backoff(k) for k in range(0, 8)] == [0, 10, 20, 40, 80, 160, 300, 300]
    now, status, delays = NOW, {}, []
    for _ in range(7):  # a template that always fails: each replacement fails again
        current = pool({"replicas": 1}, status=status)
        result = plan(current, [member(current, leasable=False, phase="Failed", created=now - 1)], {}, now=now)
        assert result.creates == ()
        retry = parse_time(result.status["memberFailures"]["retryAfter"])
        delays.append(round(retry - now))
        status = result.status
        now = retry  # the replacement is made then, and fails at once
        assert plan(pool({"replicas": 1}, status=status), [], {}, now=now).creates == (Create(None),)
    assert delays == [10, 20, 40, 80, 160, 300, 300]


def test_failure_backoff_ends_when_a_new_member_works_or_the_template_changes():
    p = pool({"replicas": 2})
    first = plan(p, [member(p), member(p, leasable=False, phase="Failed")], {}, now=NOW)
    failed_at = parse_time(first.status["memberFailures"]["lastFailureTime"])
    p2 = pool({"replicas": 2}, status=first.status)
    # an older member that works does not end it; one made since the last failure does
    assert plan(p2, [member(p2, created=NOW - 100), member(p2, leasable=False, created=NOW + 20)], {},
                now=NOW + 30).status["memberFailures"] is not None
    done = plan(p2, [member(p2, created=NOW - 100), member(p2, created=failed_at + 20)], {}, now=NOW + 30)
    assert done.status["memberFailures"] is None
    assert cond(done.status, "Progressing")["reason"] == "PoolComplete"
    # a new template starts afresh: members are created at once
    new = pool({"replicas": 2, "template": {"metadata": {"labels": {"app": "web", "rev": "2"}},
                                            "spec": {"provider": "k8s", "maxLeases": 5}}}, status=first.status)
    fresh = plan(new, [], {}, now=NOW + 1)
    assert len(fresh.creates) == 2 and fresh.status["memberFailures"] is None


def test_members_being_deleted_are_ignored():
    p = pool({"replicas": 1})
    going = dataclasses.replace(member(p), deleting=True)
    result = plan(p, [going], {}, now=NOW)
    assert result.creates == (Create(None),)
    assert result.status["replicas"] == 0


def test_scale_0_to_5_to_2_simulated():
    sim = Sim(pool({"replicas": 0}), [])
    sim.step()
    assert sim.members == []
    sim.set_spec(replicas=5)
    for _ in range(3):
        sim.step()
    assert sim.leasable() == 5 and len(sim.members) == 5
    sim.set_spec(replicas=2)
    sim.step()
    assert sim.leasable() == 2 and len(sim.members) == 5  # three draining
    sim.step()  # no leases on them: deleted
    assert len(sim.members) == 2
    assert sim.step().actions == 0
    assert cond(sim.pool.status, "Progressing")["reason"] == "PoolComplete"


# -- spread --------------------------------------------------------------------------------------
def test_spread_places_members_evenly_in_list_order():
    p = pool({"replicas": 5, "spread": {"zones": ["a", "b", "c"]}})
    zones = [c.zone for c in plan(p, [], {}, now=NOW).creates]
    assert sorted(zones) == ["a", "a", "b", "b", "c"]


def test_spread_fills_the_emptiest_zone_first():
    p = pool({"replicas": 4, "spread": {"zones": ["a", "b", "c"]}})
    members = [member(p, zone="a"), member(p, zone="a")]
    assert [c.zone for c in plan(p, members, {}, now=NOW).creates] == ["b", "c"]


def test_a_zone_whose_provider_target_is_not_ready_gets_no_member_until_it_recovers():
    p = pool({"replicas": 4, "spread": {"zones": ["a", "b"]}})
    down = plan(p, [], {"a": False}, now=NOW)
    assert [c.zone for c in down.creates] == ["b"] * 4
    recovered = plan(p, [member(p, zone="b"), member(p, zone="b")], {"a": True}, now=NOW)
    assert [c.zone for c in recovered.creates] == ["a", "a"]
    none = plan(p, [], {"a": False, "b": False}, now=NOW)
    assert none.creates == ()
    c = cond(none.status, "Progressing")
    assert (c["status"], c["reason"]) == ("False", "NoReadyZone") and "a (NotReady); b (NotReady)" in c["message"]


def test_a_skipped_zone_is_named_with_its_provider_health_reason_and_keeps_its_since():
    p = pool({"replicas": 4, "spread": {"zones": ["a", "b", "c"]}})
    why = {"b": ZoneHealth("b", "HostUnreachable", "ssh: connect to 127.0.0.1:2222: connection refused")}
    first = plan(p, [], {"b": False}, now=NOW, zone_health=why)
    assert sorted(c.zone for c in first.creates) == ["a", "a", "c", "c"]
    assert first.status["skippedZones"] == [{
        "zone": "b", "target": "b", "reason": "HostUnreachable",
        "message": "ssh: connect to 127.0.0.1:2222: connection refused", "since": format_time(NOW)}]
    c = cond(first.status, "ZonesReady")
    assert (c["status"], c["reason"]) == ("False", "ZonesNotReady")
    assert c["message"] == ("1 of 3 zone(s) get no new member until their provider target is Ready: "
                            "b (HostUnreachable: ssh: connect to 127.0.0.1:2222: connection refused)")
    # still down a minute later: the same entry, the same since (the status is not rewritten)
    later = plan(pool({"replicas": 4, "spread": {"zones": ["a", "b", "c"]}}, status=first.status), [],
                 {"b": False}, now=NOW + 60, zone_health=why)
    assert later.status["skippedZones"] == first.status["skippedZones"]
    # recovered: no entry (the key is removed by the merge patch), ZonesReady True
    back = plan(pool({"replicas": 4, "spread": {"zones": ["a", "b", "c"]}}, status=first.status), [],
                {}, now=NOW + 120)
    assert back.status["skippedZones"] is None
    c = cond(back.status, "ZonesReady")
    assert (c["status"], c["reason"]) == ("True", "AllZonesReady") and "a, b, c" in c["message"]


def test_a_zone_following_the_provider_as_a_whole_names_the_target_that_is_down():
    p = pool({"replicas": 2, "spread": {"zones": ["europe-west1-b", "europe-west1-c"]}})
    why = ZoneHealth("my-project", "CheckFailed", "503 backendError")
    none = plan(p, [], {"europe-west1-b": False, "europe-west1-c": False}, now=NOW,
                zone_health={"europe-west1-b": why, "europe-west1-c": why})
    assert [z["zone"] for z in none.status["skippedZones"]] == ["europe-west1-b", "europe-west1-c"]
    c = cond(none.status, "Progressing")
    assert (c["status"], c["reason"]) == ("False", "NoReadyZone")
    assert "europe-west1-b (target my-project: CheckFailed: 503 backendError)" in c["message"]
    # no spread and no placement zone: the template's placement, zone ""
    bare = plan(pool({"replicas": 1}), [], {"": False}, now=NOW,
                zone_health={"": ZoneHealth("cluster", "Unreachable", "")})
    assert bare.status["skippedZones"][0] | {"since": None} == {
        "zone": "", "target": "cluster", "reason": "Unreachable", "message": "", "since": None}
    assert "the template's placement (target cluster: Unreachable)" in cond(bare.status, "ZonesReady")["message"]


def test_zone_messages_stay_bounded_with_many_zones_down_and_long_messages():
    zones = [f"host-{i:02d}" for i in range(64)]
    p = pool({"replicas": 1, "spread": {"zones": zones}})
    why = {z: ZoneHealth(z, "HostUnreachable", "x" * 5000) for z in zones}
    result = plan(p, [], {z: False for z in zones}, now=NOW, zone_health=why)
    assert len(result.status["skippedZones"]) == 64
    assert all(len(z["message"]) <= MAX_ZONE_MESSAGE for z in result.status["skippedZones"])
    for ctype in ("ZonesReady", "Progressing"):
        message = cond(result.status, ctype)["message"]
        assert len(message) < 1024, (ctype, len(message))  # never cut by the condition's own limit
        named = re.findall(r"(host-\d\d) \(HostUnreachable: x+\.\.\.\)", message)
        assert named and named == zones[:len(named)]
        assert message.endswith(f"; and {64 - len(named)} more zone(s)")
    # few zones, short messages: every zone named, nothing counted
    few = plan(pool({"replicas": 1, "spread": {"zones": zones[:10]}}), [], {z: False for z in zones[:10]}, now=NOW,
               zone_health={z: ZoneHealth(z, "HostUnreachable", "refused") for z in zones[:10]})
    assert cond(few.status, "ZonesReady")["message"].endswith("host-09 (HostUnreachable: refused)")


def test_a_member_that_is_not_leasable_in_a_dead_zone_is_replaced_elsewhere():
    p = pool({"replicas": 2, "spread": {"zones": ["a", "b"]}})
    sick = member(p, zone="a", leasable=False, phase="Unhealthy")
    fine = member(p, zone="b")
    result = plan(p, [sick, fine], {"a": False}, now=NOW)
    assert [d.uid for d in result.drains] == [sick.uid]  # serves nothing: leaves at once
    assert [c.zone for c in result.creates] == ["b"]
    # a leasable member in a zone whose check fails keeps serving
    working = member(p, zone="a")
    assert plan(p, [working, fine], {"a": False}, now=NOW).actions == 0


def test_members_of_a_zone_removed_from_the_spread_are_rolled_over():
    p = pool({"replicas": 2, "spread": {"zones": ["b"]}})
    old = member(p, zone="a")
    new = member(p, zone="b")
    result = plan(p, [old, new], {}, now=NOW)
    assert result.creates == (Create("b"),)
    assert not result.drains  # maxUnavailable 0: the old one waits for its replacement
    assert cond(result.status, "Progressing")["reason"] == "RollingOut"


# -- rollout -------------------------------------------------------------------------------------
def _rollout(spec: dict, *, leases: list[int] | None = None, ready_after: int = 2, max_steps: int = 60):
    """Start with ``replicas`` leasable members of an old template, change the template, run
    passes until nothing is left to do; yield the simulator after every pass."""
    p = pool(spec)
    n = p.spec.replicas
    old_hash = "0ld0ld0ld0"
    members = [member(p, template_hash=old_hash, leases=(leases or [0] * n)[i], created=float(i)) for i in range(n)]
    sim = Sim(p, members, ready_after=ready_after)
    sim.set_spec(template={"metadata": {"labels": {"app": "web"}}, "spec": {"provider": "k8s", "maxLeases": 5,
                                                                             "placement": {"image": "squid:6"}}})
    for _ in range(max_steps):
        result = sim.step()
        yield sim, result
        if result.actions == 0 and all(m.template_hash == sim.pool.spec.hash for m in sim.members) \
                and len(sim.members) == n and sim.leasable() == n:
            return
    raise AssertionError(f"the rollout did not finish in {max_steps} passes: {sim.members}")


def test_template_change_with_5_replicas_surge_1_unavailable_0_keeps_5_leasable_at_every_step():
    steps = 0
    max_active = 0
    for sim, result in _rollout({"replicas": 5, "rollout": {"maxSurge": 1, "maxUnavailable": 0}}):
        steps += 1
        assert sim.leasable() >= 5, f"pass {steps}: {sim.leasable()} leasable"
        max_active = max(max_active, len(sim.active()))
        assert len(sim.active()) <= 6, f"pass {steps}: {len(sim.active())} members not draining"
        assert len(result.creates) <= 1
        # a member starts draining only when a new one is leasable
        if result.drains:
            assert sim.leasable() >= 5
    assert max_active == 6
    assert steps > 5  # one member at a time


def _instances(sim) -> int:
    """Members whose instance runs: not draining, or draining with live leases (the others are
    deleted by the next pass)."""
    return sum(1 for m in sim.members if not m.draining or m.leases)


def test_rollout_with_live_leases_drains_the_least_leased_first_and_waits_for_their_release():
    drained_leases = []
    leases = [3, 0, 2, 1, 4]
    waited = 0
    for sim, result in _rollout({"replicas": 5, "drain": {"drainTimeoutSeconds": 10_000}}, leases=leases):
        drained_leases += [next(m.leases for m in sim.members if m.uid == d.uid) for d in result.drains]
        assert sim.leasable() >= 5
        # a draining member holding leases counts against maxSurge: never more than 6 instances
        assert _instances(sim) <= 6, sim.members
        holding = [m for m in sim.members if m.draining and m.leases]
        if holding and result.actions == 0:
            waited += 1
            if any(not m.draining and m.template_hash != sim.pool.spec.hash for m in sim.members):
                assert "1 member(s) wait for 1 draining member(s) still holding leases" in \
                    cond(result.status, "Progressing")["message"]
            sim.members = [dataclasses.replace(m, leases=0) if m.draining else m for m in sim.members]  # released
    assert drained_leases == sorted(leases)  # least leased first
    assert waited == 4  # the four old members with leases were waited for, one at a time


def test_a_rollout_waiting_for_held_leases_moves_on_at_the_drain_deadline():
    """Leases nobody releases hold a rollout back for drainTimeoutSeconds per step, never longer."""
    p = pool({"replicas": 2, "drain": {"drainTimeoutSeconds": 30}})
    old = [member(p, template_hash="0ld0ld0ld0", leases=5, created=float(i)) for i in range(2)]
    sim = Sim(p, old, ready_after=1)
    sim.set_spec(template={"metadata": {"labels": {"app": "web"}}, "spec": {"provider": "k8s", "maxLeases": 5,
                                                                             "placement": {"image": "squid:6"}}})
    for step in range(200):  # noqa: B007 - read after the loop
        result = sim.step(dt=5.0)
        assert sim.leasable() >= 2 and _instances(sim) <= 3
        if all(m.template_hash == sim.pool.spec.hash for m in sim.members) and len(sim.members) == 2 \
                and result.actions == 0:
            break
    else:
        raise AssertionError(f"the rollout stalled: {sim.members}")
    reasons = [d.reason for r in sim.plans for d in r.deletes]
    assert reasons == ["DrainTimeout", "DrainTimeout"]
    assert step * 5.0 <= 2 * 30 + 30  # about one drainTimeoutSeconds per old member


def test_in_place_replacement_with_no_surge_never_runs_more_than_replicas_instances():
    """The kvm sample's shape (a host with room for two): maxSurge 0, maxUnavailable 1, leases held."""
    for sim, result in _rollout({"replicas": 2, "rollout": {"maxSurge": 0, "maxUnavailable": 1}},
                                leases=[1, 2]):
        assert _instances(sim) <= 2, sim.members
        assert sim.leasable() >= 1
        if result.actions == 0:  # waiting for the draining member's leases: the crawlers release them
            sim.members = [dataclasses.replace(m, leases=0) if m.draining else m for m in sim.members]


def test_rollout_with_max_unavailable_1_and_no_surge():
    for sim, _result in _rollout({"replicas": 4, "rollout": {"maxSurge": 0, "maxUnavailable": 1}}):
        assert sim.leasable() >= 3
        assert len(sim.active()) <= 4


def test_rollout_with_percentages():
    for sim, _result in _rollout({"replicas": 10, "rollout": {"maxSurge": "20%", "maxUnavailable": "10%"}}):
        assert sim.leasable() >= 9
        assert len(sim.active()) <= 12


def test_rollout_while_scaling_down_drains_outdated_members_first():
    p = pool({"replicas": 2})
    old = [member(p, template_hash="x", leases=0) for _ in range(3)]
    new = [member(p, leases=1) for _ in range(2)]
    result = plan(p, old + new, {}, now=NOW)
    assert {d.uid for d in result.drains} == {m.uid for m in old}
    assert not result.creates


# -- age rotation --------------------------------------------------------------------------------
def test_members_older_than_their_jittered_age_limit_are_rotated_one_at_a_time():
    hours = 3600.0
    p = pool({"replicas": 5, "maxAge": "6h"})
    members = [member(p, created=0.0) for _ in range(5)]
    limits = sorted(age_limit(m.uid, 6 * hours) for m in members)
    assert len(set(limits)) == 5  # created together, due at different times
    young = plan(p, members, {}, now=0.74 * 6 * hours)
    assert young.actions == 0
    assert young.requeue_after == pytest.approx(limits[0] - 0.74 * 6 * hours)
    sim = Sim(p, members, ready_after=1, now=6 * hours)
    for _ in range(40):
        result = sim.step()
        assert sim.leasable() >= 5
        assert len(result.creates) <= 1 and len(result.drains) <= 1
        if result.actions == 0 and not any(m.created == 0.0 for m in sim.members):
            break
    assert not any(m.created == 0.0 for m in sim.members)
    assert len(sim.members) == 5


def test_an_expired_member_keeps_its_leases_while_draining():
    p = pool({"replicas": 1, "maxAge": "1h", "drain": {"drainTimeoutSeconds": 300}})
    old = member(p, created=0.0, leases=1)
    sim = Sim(p, [old], ready_after=1, now=3600.0)
    sim.step()  # replacement created
    sim.step()  # replacement leasable: the old one drains
    [drained] = [m for m in sim.members if m.draining]
    assert drained.uid == old.uid and drained.leases == 1
    sim.step(dt=100)
    assert any(m.uid == old.uid for m in sim.members)  # its lease is live: still there
    sim.release_all()
    sim.step()
    assert all(m.uid != old.uid for m in sim.members)


def test_draining_deadline_bounds_the_wait():
    p = pool({"replicas": 1, "maxAge": "1h", "drain": {"drainTimeoutSeconds": 30}})
    sim = Sim(p, [member(p, created=0.0, leases=2)], ready_after=1, now=3600.0)
    sim.step()
    sim.step()
    sim.step(dt=29)
    assert len(sim.members) == 2
    result = sim.step(dt=5)
    assert [d.reason for d in result.deletes] == ["DrainTimeout"]


# -- status --------------------------------------------------------------------------------------
def test_status_counts_and_selector():
    p = pool({"replicas": 3, "selector": {"matchLabels": {"app": "web"},
                                           "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}},
             generation=4)
    members = [member(p, leases=1), member(p, leasable=False), member(p, template_hash="old"),
               member(p, draining_until=NOW + 10, leases=1, leasable=False)]
    status = plan(p, members, {}, now=NOW).status
    assert status["replicas"] == 4
    assert status["readyReplicas"] == 2  # the two leasable ones (the draining one was marked not ready)
    assert status["leasableReplicas"] == 2
    assert status["updatedReplicas"] == 2
    assert status["observedGeneration"] == 4
    assert status["selector"] == "app=web,!tier,crawl.example.com/pool=web"
    assert [c["type"] for c in status["conditions"]] == ["Available", "Progressing", "ScalingLimited", "ZonesReady"]
    assert cond(status, "ScalingLimited")["reason"] == "AutoscaleDisabled"
    assert set(status) == {"replicas", "readyReplicas", "leasableReplicas", "updatedReplicas", "burnedReplicas",
                           "observedGeneration", "selector", "conditions", "memberFailures", "skippedZones"}  # what the CRD's status schema keeps
    assert status["memberFailures"] is None  # no backoff: the key is removed (merge patch)


def test_conditions_keep_their_transition_time_while_unchanged():
    p = pool({"replicas": 1})
    first = plan(p, [member(p)], {}, now=NOW).status
    again = plan(dataclasses.replace(p, status=first), [member(p)], {}, now=NOW + 3600).status
    assert cond(again, "Available")["lastTransitionTime"] == cond(first, "Available")["lastTransitionTime"]


def test_an_invalid_spec_refuses_to_plan():
    from app.pools.model import Pool
    from app.pools.status import invalid

    bad = Pool.from_dict({"metadata": {"name": "p", "namespace": "n", "uid": "u", "generation": 2},
                          "spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": {"mode": "External"}}}})
    with pytest.raises(ValueError, match="invalid spec"):
        plan(bad, [], {}, now=NOW)
    status = invalid(bad, NOW)
    c = cond(status, "Progressing")
    assert (c["status"], c["reason"]) == ("False", "InvalidSpec") and "spec.template.spec.mode" in c["message"]
    assert status["observedGeneration"] == 2


# -- autoscale through the plan ------------------------------------------------------------------
AUTO = {"minReplicas": 1, "maxReplicas": 6, "targetLeaseUtilization": 0.5, "scaleDownDelaySeconds": 300}


def test_autoscale_grows_on_refused_requests_and_records_its_state():
    p = pool({"replicas": 2, "autoscale": AUTO})
    members = [member(p, leases=5), member(p, leases=5)]  # full
    result = plan(p, members, {}, now=NOW, demand=Demand(refused=30, window=10))  # ~3 crawlers waiting
    # load 10 + 3 = 13 leases at 50 % of 5 per member: 6 members
    assert result.desired == 6
    assert len(result.creates) == 4
    assert result.scale_to == 6  # written to spec.replicas through the scale subresource
    assert result.history[-1]["replicas"] == 6
    assert result.utilization == pytest.approx(13 / 10)
    assert cond(result.status, "ScalingLimited")["status"] == "False"


def test_autoscale_limited_by_max_replicas_says_so():
    p = pool({"replicas": 2, "autoscale": AUTO})
    members = [member(p, leases=5), member(p, leases=5)]
    result = plan(p, members, {}, now=NOW, demand=Demand(refused=600, window=10))
    assert result.desired == 6
    c = cond(result.status, "ScalingLimited")
    assert (c["status"], c["reason"]) == ("True", "TooManyReplicas") and "maxReplicas 6" in c["message"]


def test_autoscale_scale_down_waits_for_the_delay_then_drains_the_least_leased():
    p = pool({"replicas": 4, "autoscale": AUTO})
    sim = Sim(p, [member(p, leases=n) for n in (3, 3, 2, 2)], now=NOW)  # 10 leases: 4 members at 50 %
    assert sim.step().scale_to is None
    assert sim.pool.spec.replicas == 4
    sim.members = [dataclasses.replace(m, leases=1 if i < 2 else 0) for i, m in enumerate(sim.members)]
    for _ in range(5):
        result = sim.step(dt=50)
        assert result.desired == 4 and not result.drains  # within the delay
    for _ in range(3):
        result = sim.step(dt=50)
        if result.drains:
            break
    assert result.desired == 1
    assert {m.leases for m in sim.members if m.draining} == {0, 1}
    assert [m.leases for m in sim.members if not m.draining] == [1]
