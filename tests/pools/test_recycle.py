"""A ProxyPool's recycle policy (app.pools.recycle): a member whose egress IP enough sites banned,
or whose targeted leases ended in a ban too often (reported through the real lease scripts), is
replaced by the normal rollout, never below the pool's floor, and an Event names the sites; bans
from before a member was made are not its own.  On a provider whose replacement keeps the egress
IP (kubernetes behind node SNAT, the type's default) a burned member is drained in place instead,
within maxUnavailable, and takes leases again once its bans age out.
Against the API fake (the real CRDs) and real Redis, in-process, as tests/pools/test_controller.py."""

from __future__ import annotations

import dataclasses
import time

import pytest
import requests
from kubernetes import client as k8s

from app.kube.gateway import KubernetesGateway
from app.pools import controller
from app.pools.controller import PoolRef
from app.pools import recycle
from app.pools.model import BURNED_IN_PLACE, Member, PoolSpec, PoolSpecError, Recycle
from app.resources import DRAINING_REASON_ANNOTATION, GROUP, POOL_PLURAL, VERSION
from app.serving import leases, view as serving
from app.store import keys as redis_keys
from app.serving.bans import BanSettings, Target
from devcluster.cluster import FakeCluster
from tests.pools.test_controller import CONFIGS, NS, SETTINGS, TEMPLATE, custom, make_pool, pool_obj, proxies, ready

pytestmark = pytest.mark.timeout(60)
BANS = BanSettings(refusal_ips=0)
#: The pool's provider as a cluster whose Pods leave through their own IPs (replacementEgressIP: new).
FRESH_IP = {"k8s-local": dataclasses.replace(CONFIGS["k8s-local"], replacement_keeps_ip=False)}


def run(api, r, ref: PoolRef, configs=None) -> controller.Outcome:
    """One pass of the pool controller; the provider gives replacements a new egress IP unless
    ``configs`` says otherwise (``CONFIGS``: the kubernetes type's default, the same IP)."""
    return controller.run(KubernetesGateway(api), r, configs or FRESH_IP, ref=ref, lock_timeout=30)


@pytest.fixture()
def api():
    with FakeCluster(kubelet=False) as cluster:
        client = cluster.fake.api_client()
        yield client
        client.close()


def _leasable(api, r, egress: dict[str, str]) -> None:
    """Make every member Ready and healthy, leaving from the address ``egress`` gives its name
    (the next free one of 198.51.100.x for a new member)."""
    for p in proxies(api):
        if p.name not in egress:
            egress[p.name] = f"198.51.100.{len(egress) + 1}"
        ready(api, r, p)
        r.hset(redis_keys.proxy(p.uid), "egressIP", egress[p.name])


def _ban(r, uid: str, site: str, outcome: str = "blocked") -> None:
    """A crawler's lease for ``site`` through member ``uid``, released with ``outcome`` (the real
    scripts; the other members' leases taken on the way are held meanwhile, then released ``ok``)."""
    held = []
    try:
        for _ in range(10):
            lease = leases.acquire(r, f"crawler-{len(held)}", leases.Filters(pool="web"), ttl=60, settings=SETTINGS,
                                   target=Target.of(site, BANS), bans=BANS)
            if lease.uid == uid:
                leases.release(r, lease_client(held), lease.id, outcome=outcome, settings=SETTINGS, bans=BANS)
                return
            held.append(lease)
        raise AssertionError(f"no lease on {uid} for {site}")
    finally:
        for n, other in enumerate(held):
            leases.release(r, f"crawler-{n}", other.id, outcome="ok", settings=SETTINGS, bans=BANS)


def lease_client(held: list) -> str:
    """The client name :func:`_ban` used for its latest lease."""
    return f"crawler-{len(held)}"


def _events(api, reason: str) -> list:
    return [e for e in k8s.CoreV1Api(api).list_namespaced_event(NS).items if e.reason == reason]


def test_the_recycle_policy_is_read_and_checked():
    spec = PoolSpec.from_dict({"template": TEMPLATE, "recycle": {"bannedTargets": 3}})
    assert spec.recycle is not None and spec.recycle.banned_targets == 3 and spec.recycle.window == 3600
    with pytest.raises(PoolSpecError, match="spec.recycle: needs bannedTargets.*maxBanPercent"):
        PoolSpec.from_dict({"template": TEMPLATE, "recycle": {"windowSeconds": 60}})
    with pytest.raises(PoolSpecError, match="spec.recycle.maxBanPercent: must be at most 99"):
        PoolSpec.from_dict({"template": TEMPLATE, "recycle": {"maxBanPercent": 100}})


def test_the_ban_ratio_holds_a_member_drained_in_place_until_its_bans_leave_the_window():
    """minLeases keeps a few leases from making a verdict, but a member drained in place takes no
    lease, so its count only falls: it stays burned while any ban is in the window."""
    policy = Recycle(max_ban_percent=50, min_leases=4)
    now_ms = int(time.time() * 1000)
    bucket = now_ms // redis_keys.OUTCOME_BUCKET_MS
    few = {f"l{bucket}": "2", f"b{bucket}": "2"}
    assert recycle.judge(policy, ["a.example"], few, since=now_ms / 1000 - 600) is None
    held = recycle.judge(policy, ["a.example"], few, since=now_ms / 1000 - 600, parked=True)
    assert held is not None and "2 of its 2 targeted leases" in held.why
    # its oldest bans left the window before its leases: the ratio dips under maxBanPercent, yet a
    # ban is still in the window, so it stays drained
    dipped = {f"l{bucket - 5}": "9", f"b{bucket}": "1"}
    assert recycle.judge(policy, [], dipped, since=now_ms / 1000 - 600) is None
    still = recycle.judge(policy, [], dipped, since=now_ms / 1000 - 600, parked=True)
    assert still is not None and "stays drained while any of its bans is in the window" in still.why
    gone = {f"l{bucket - 20}": "9", f"b{bucket - 20}": "9", f"l{bucket}": "1"}  # the bans left the window
    assert recycle.judge(policy, [], gone, since=now_ms / 1000 - 600, parked=True) is None


def test_a_member_banned_by_many_sites_names_the_latest_and_counts_them_all(redis_client):
    members = [Member(uid="u1", name="m1", created=0.0)]
    key = redis_keys.ip_ban_times("198.51.100.66")
    now = time.time()
    redis_client.zadd(key, {f"site{i:02d}.example": int((now - 100 + i) * 1000) for i in range(30)})
    [marked] = recycle.mark(redis_client, Recycle(banned_targets=5, window=600), members,
                            {"u1": {"egressIP": "198.51.100.66"}}, now=now)
    assert "banned by 30 targets" in marked.burned
    assert marked.burned_targets == tuple(f"site{i:02d}.example" for i in range(20, 30))


def test_a_burned_member_is_replaced_without_dropping_below_the_floor(api, redis_client):
    ref = make_pool(api, replicas=2, recycle={"bannedTargets": 2, "windowSeconds": 600})
    run(api, redis_client, ref)
    egress: dict[str, str] = {}
    _leasable(api, redis_client, egress)
    burned, kept = proxies(api)
    time.sleep(1.1)  # bans in a member's first second are not counted (whole-second creation times)
    _ban(redis_client, burned.uid, "shop.example.com")
    assert run(api, redis_client, ref).plan.actions == 0  # one site: not burned yet
    _ban(redis_client, burned.uid, "news.example.org")

    # a replacement first (maxSurge 1, maxUnavailable 0): the burned member keeps serving meanwhile
    first = run(api, redis_client, ref)
    assert len(first.plan.creates) == 1 and first.plan.drains == ()
    assert len(proxies(api)) == 3
    assert redis_client.zscore("po:load", burned.uid) is not None  # still leasable
    status = pool_obj(api)["status"]
    assert status["burnedReplicas"] == 1 and "1 outdated (1 burned: spec.recycle)" in str(status["conditions"])

    # once the replacement is leasable, the burned member drains (reason Burned), the other stays
    _leasable(api, redis_client, egress)
    second = run(api, redis_client, ref)
    [drain] = second.plan.drains
    assert (drain.uid, drain.reason, drain.targets) == (burned.uid, "Burned", ("example.com", "example.org"))
    marked = {p.name: p.annotations.get(DRAINING_REASON_ANNOTATION) for p in KubernetesGateway(api).list_proxies_in(NS)}
    assert marked[burned.name] == "Burned" and marked[kept.name] is None
    [event] = _events(api, "MemberBurned")
    assert burned.name in event.message and "banned by example.com, example.org" in event.message
    assert "spec.recycle.bannedTargets 2" in event.message
    assert pool_obj(api)["status"]["recycledReplicas"] == 1
    # the drain is counted once: later passes (the member still draining, then deleted) add nothing
    for p in proxies(api):
        if p.uid != burned.uid:
            ready(api, redis_client, p)
    run(api, redis_client, ref)
    run(api, redis_client, ref)
    assert pool_obj(api)["status"]["recycledReplicas"] == 1
    # kubectl get pxp: the Recycled column
    table = requests.get(f"{api.configuration.host}/apis/{GROUP}/{VERSION}/namespaces/{NS}/{POOL_PLURAL}", timeout=5,
                         headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}).json()
    names = [c["name"] for c in table["columnDefinitions"]]
    [row] = table["rows"]
    assert row["cells"][names.index("Recycled")] == 1


def test_bans_from_before_a_member_was_made_are_not_its_own(api, redis_client):
    """A replacement that leaves from the same egress IP (Pods behind one node's SNAT) is not
    replaced again for its predecessor's bans."""
    ref = make_pool(api, replicas=1, recycle={"bannedTargets": 1, "windowSeconds": 600})
    run(api, redis_client, ref)
    [old] = proxies(api)
    _leasable(api, redis_client, {old.name: "198.51.100.50"})
    time.sleep(1.1)
    _ban(redis_client, old.uid, "shop.example.com")
    run(api, redis_client, ref)  # the replacement
    egress = {p.name: "198.51.100.50" for p in proxies(api)}  # every member leaves from the same IP
    _leasable(api, redis_client, egress)
    out = run(api, redis_client, ref)
    assert [d.uid for d in out.plan.drains] == [old.uid]  # the old one goes, the new one stays
    out = run(api, redis_client, ref)
    assert out.plan.drains == () and out.plan.creates == ()


def test_a_member_whose_leases_end_in_bans_too_often_is_burned(api, redis_client):
    """spec.recycle.maxBanPercent: the ban ratio over the member's targeted leases, judged once it
    had minLeases of them; each ban from a different site, so bannedTargets alone would wait."""
    ref = make_pool(api, replicas=2, recycle={"maxBanPercent": 50, "minLeases": 4, "windowSeconds": 600})
    run(api, redis_client, ref)
    egress: dict[str, str] = {}
    _leasable(api, redis_client, egress)
    victim, _ = proxies(api)
    time.sleep(1.1)
    _ban(redis_client, victim.uid, "a.example")
    _ban(redis_client, victim.uid, "b.example")
    _ban(redis_client, victim.uid, "ok.example", outcome="ok")
    assert run(api, redis_client, ref).plan.actions == 0  # 2 of 3: fewer than minLeases say nothing
    _ban(redis_client, victim.uid, "ok.example", outcome="ok")
    assert run(api, redis_client, ref).plan.actions == 0  # 2 of 4: 50 %, not more
    _ban(redis_client, victim.uid, "c.example")
    first = run(api, redis_client, ref)  # 3 of 5: 60 %
    assert len(first.plan.creates) == 1 and pool_obj(api)["status"]["burnedReplicas"] == 1
    _leasable(api, redis_client, egress)
    [drain] = run(api, redis_client, ref).plan.drains
    assert (drain.uid, drain.reason) == (victim.uid, "Burned")
    [event] = _events(api, "MemberBurned")
    assert "3 of its 5 targeted leases" in event.message and "maxBanPercent 50%" in event.message


def test_a_burned_member_is_drained_in_place_where_a_replacement_keeps_the_ip(api, redis_client):
    """The kubernetes type's default (Pods behind their node's address): replacing a burned member
    would bring back the same IP, so it is drained in place (nothing created, nothing deleted),
    the status and an Event say why, and it takes leases again once its bans age out."""
    ref = make_pool(api, replicas=2, rollout={"maxUnavailable": 1},
                    recycle={"bannedTargets": 1, "windowSeconds": 3})
    run(api, redis_client, ref, CONFIGS)
    _leasable(api, redis_client, {})
    victim, other = proxies(api)
    time.sleep(1.1)
    _ban(redis_client, victim.uid, "shop.example.com")
    banned_at = time.time()
    out = run(api, redis_client, ref, CONFIGS)
    [drain] = out.plan.drains
    assert (drain.uid, drain.reason, drain.targets) == (victim.uid, BURNED_IN_PLACE, ("example.com",))
    assert out.plan.creates == () and out.plan.deletes == ()
    assert redis_client.zscore("po:load", victim.uid) is None  # no new lease through it
    assert redis_client.zscore("po:load", other.uid) is not None
    status = pool_obj(api)["status"]
    assert status["burnedReplicas"] == 1 and status["replicas"] == 2 and status.get("recycledReplicas") is None
    [progressing] = [c for c in status["conditions"] if c["type"] == "Progressing"]
    assert progressing["reason"] == "BurnedInPlace" and "1 burned, drained in place" in progressing["message"]
    [event] = _events(api, "MemberBurned")
    assert f"draining {victim.name} in place, not replacing it" in event.message
    assert "banned by 1 target within" in event.message
    assert "same egress IP" in event.message and "example.com" in event.message
    # it holds no lease, yet it is not deleted, and nothing is made in its place
    again = run(api, redis_client, ref, CONFIGS)
    assert again.plan.actions == 0 and len(proxies(api)) == 2

    time.sleep(max(0.0, banned_at + 3.2 - time.time()))  # the ban leaves the window
    back = run(api, redis_client, ref, CONFIGS)
    assert [u.uid for u in back.plan.unparks] == [victim.uid] and back.plan.creates == ()
    marked = {p.name: p.annotations.get(DRAINING_REASON_ANNOTATION) for p in KubernetesGateway(api).list_proxies_in(NS)}
    assert marked[victim.name] is None
    assert redis_client.zscore("po:load", victim.uid) is not None  # leasable again
    assert _events(api, "MemberUnburned")
    run(api, redis_client, ref, CONFIGS)
    status = pool_obj(api)["status"]
    assert status["burnedReplicas"] == 0 and status["leasableReplicas"] == 2
    assert [c["reason"] for c in status["conditions"] if c["type"] == "Progressing"] == ["PoolComplete"]


def test_draining_in_place_keeps_the_pool_at_its_floor(api, redis_client):
    """maxUnavailable 0 (the default): a burned member of such a provider keeps serving (no
    replacement would change its IP) and the status says so."""
    ref = make_pool(api, replicas=2, recycle={"bannedTargets": 1, "windowSeconds": 600})
    run(api, redis_client, ref, CONFIGS)
    _leasable(api, redis_client, {})
    victim, _ = proxies(api)
    time.sleep(1.1)
    _ban(redis_client, victim.uid, "shop.example.com")
    out = run(api, redis_client, ref, CONFIGS)
    assert out.plan.actions == 0
    assert redis_client.zscore("po:load", victim.uid) is not None
    status = pool_obj(api)["status"]
    assert status["burnedReplicas"] == 1 and status["leasableReplicas"] == 2
    assert "1 burned kept serving" in str(status["conditions"]) and "maxUnavailable" in str(status["conditions"])


def test_a_member_drained_in_place_still_rolls_out_with_a_new_template(api, redis_client):
    ref = make_pool(api, replicas=1, rollout={"maxUnavailable": 1}, recycle={"bannedTargets": 1, "windowSeconds": 600})
    run(api, redis_client, ref, CONFIGS)
    _leasable(api, redis_client, {})
    [victim] = proxies(api)
    time.sleep(1.1)
    _ban(redis_client, victim.uid, "shop.example.com")
    assert [d.reason for d in run(api, redis_client, ref, CONFIGS).plan.drains] == [BURNED_IN_PLACE]
    template = {**TEMPLATE, "metadata": {"labels": {"app": "web", "rev": "2"}}}
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"template": template}})
    out = run(api, redis_client, ref, CONFIGS)
    assert [(d.uid, d.reason) for d in out.plan.drains] == [(victim.uid, "Outdated")]
    assert len(out.plan.creates) == 1


def test_a_member_drained_in_place_follows_a_changed_policy_or_provider(api, redis_client):
    """The provider entry now gives replacements a new IP: the member drained in place is
    replaced (drain reason Burned); the recycle policy removed: it takes leases again."""
    ref = make_pool(api, replicas=2, rollout={"maxUnavailable": 1}, recycle={"bannedTargets": 1, "windowSeconds": 600})
    run(api, redis_client, ref, CONFIGS)
    _leasable(api, redis_client, {})
    victim, _ = proxies(api)
    time.sleep(1.1)
    _ban(redis_client, victim.uid, "shop.example.com")
    assert [d.reason for d in run(api, redis_client, ref, CONFIGS).plan.drains] == [BURNED_IN_PLACE]
    switched = run(api, redis_client, ref, FRESH_IP)
    assert [(d.uid, d.reason) for d in switched.plan.drains] == [(victim.uid, "Burned")]
    assert len(switched.plan.creates) == 1

    ref2 = make_pool(api, name="web2", replicas=1, rollout={"maxUnavailable": 1},
                     recycle={"bannedTargets": 1, "windowSeconds": 600})
    run(api, redis_client, ref2, CONFIGS)
    [other] = [p for p in proxies(api) if p.labels.get("crawl.example.com/pool") == "web2"]
    ready(api, redis_client, other)
    redis_client.hset(redis_keys.proxy(other.uid), "egressIP", "198.51.100.77")
    time.sleep(1.1)
    got = leases.acquire(redis_client, "c", leases.Filters(pool="web2"), ttl=60, settings=SETTINGS,
                         target=Target.of("shop.example.com", BANS), bans=BANS)
    leases.release(redis_client, "c", got.id, outcome="blocked", settings=SETTINGS, bans=BANS)
    assert [d.reason for d in run(api, redis_client, ref2, CONFIGS).plan.drains] == [BURNED_IN_PLACE]
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web2", {"spec": {"recycle": None}})
    back = run(api, redis_client, ref2, CONFIGS)
    assert [u.uid for u in back.plan.unparks] == [other.uid]
    assert redis_client.zscore("po:load", other.uid) is not None
def _park(api, r, ref, *, replicas: int = 2) -> tuple:
    """A pool of a provider that keeps the egress IP (maxUnavailable 1) whose first member is
    burned and drained in place; returns ``(victim, other)``."""
    run(api, r, ref, CONFIGS)
    _leasable(api, r, {})
    victim, other = proxies(api)[:2]
    time.sleep(1.1)
    _ban(r, victim.uid, "shop.example.com")
    assert [(d.uid, d.reason) for d in run(api, r, ref, CONFIGS).plan.drains] == [(victim.uid, BURNED_IN_PLACE)]
    return victim, other


def _reasons(api) -> dict[str, str | None]:
    return {p.name: p.annotations.get(DRAINING_REASON_ANNOTATION) for p in KubernetesGateway(api).list_proxies_in(NS)}


def test_a_member_drained_in_place_is_not_replaced_while_its_provider_is_not_ready(api, redis_client):
    """Not leasable because it is drained in place, not because its zone is broken: a provider
    check that fails for a while (kubernetes: one target for every zone) neither drains it for
    a replacement (which would come back with the same burned IP and none of its bans) nor
    deletes it."""
    from app.providers.base import TargetVerdict
    from app.providers.checks import record_round

    ref = make_pool(api, replicas=2, rollout={"maxUnavailable": 1},
                    recycle={"bannedTargets": 1, "windowSeconds": 600})
    victim, other = _park(api, redis_client, ref)
    record_round(redis_client, "k8s-local", [TargetVerdict("cluster", False, "Unreachable", "down")], elapsed=0.1)
    for _ in range(2):
        out = run(api, redis_client, ref, CONFIGS)
        assert out.plan.drains == () and out.plan.deletes == () and out.plan.unparks == ()
    assert _reasons(api) == {victim.name: BURNED_IN_PLACE, other.name: None}
    assert len(proxies(api)) == 2


def test_a_member_drained_in_place_stays_so_while_its_serving_record_is_gone(api, redis_client):
    """The instance of a member drained in place is lost and made again (its serving record
    withdrawn meanwhile): with no record its bans cannot be judged, which is no sign that they
    aged out: it is not taken out of its drain (no MemberUnburned), and once published again it
    still takes no lease."""
    ref = make_pool(api, replicas=2, rollout={"maxUnavailable": 1},
                    recycle={"bannedTargets": 1, "windowSeconds": 600})
    victim, other = _park(api, redis_client, ref)
    serving.withdraw(redis_client, victim.uid)  # app.proxy.poll: instance lost, recreating
    out = run(api, redis_client, ref, CONFIGS)
    assert out.plan.unparks == () and out.plan.drains == () and out.plan.deletes == ()
    assert _reasons(api)[victim.name] == BURNED_IN_PLACE and not _events(api, "MemberUnburned")
    # published again (the reconciler copies the mark from the Proxy), not probed yet: its
    # egress IP is not known yet, which is no sign either
    [proxy] = [p for p in proxies(api) if p.uid == victim.uid]
    serving.publish(redis_client, proxy, address="203.0.113.9", port=3128, phase="Ready")
    out = run(api, redis_client, ref, CONFIGS)
    assert out.plan.unparks == () and _reasons(api)[victim.name] == BURNED_IN_PLACE
    # probed: healthy, leaving from its burned IP again: still no lease through it
    _leasable(api, redis_client, {victim.name: "198.51.100.1", other.name: "198.51.100.2"})
    assert redis_client.zscore("po:load", victim.uid) is None
    out = run(api, redis_client, ref, CONFIGS)
    assert out.plan.unparks == () and _reasons(api)[proxy.name] == BURNED_IN_PLACE


def test_a_member_drained_in_place_comes_back_once_its_provider_no_longer_keeps_the_ip(api, redis_client):
    """The providers config changes to replacementEgressIP: new (or spec.recycle is removed):
    a member drained in place that is no longer burned takes leases again rather than staying
    drained, neither leaving nor serving, for ever."""
    ref = make_pool(api, replicas=2, rollout={"maxUnavailable": 1},
                    recycle={"bannedTargets": 1, "windowSeconds": 600})
    victim, other = _park(api, redis_client, ref)
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"recycle": None}})
    out = run(api, redis_client, ref)  # FRESH_IP: the provider now gives a new IP
    assert [u.uid for u in out.plan.unparks] == [victim.uid] and out.plan.creates == ()
    assert _reasons(api) == {victim.name: None, other.name: None}
    assert redis_client.zscore("po:load", victim.uid) is not None


def test_a_member_drained_in_place_is_not_counted_as_leaving_by_the_gauges(api, redis_client):
    """proxy_operator_pool_draining_replicas counts members leaving the pool: one drained in
    place stays, in the pass that drains it as in the later ones."""
    import json

    from app.store import keys as redis_keys

    ref = make_pool(api, replicas=2, rollout={"maxUnavailable": 1},
                    recycle={"bannedTargets": 1, "windowSeconds": 600})
    _park(api, redis_client, ref)
    doc = json.loads(redis_client.hget(redis_keys.POOL_STATS, "crawl/web"))
    assert (doc["draining"], doc["replicas"]) == (0, 2)
    run(api, redis_client, ref, CONFIGS)
    doc = json.loads(redis_client.hget(redis_keys.POOL_STATS, "crawl/web"))
    assert (doc["draining"], doc["replicas"], doc["leasable"]) == (0, 2, 1)


def test_a_member_drained_in_place_still_counts_toward_on_demand_replicas(api, redis_client):
    """spec.onDemandReplicas: an on-demand member drained in place stays a member, so new
    members (a scale-up in the pass that drains it, or later) are spot, not one more on-demand
    instance the pool keeps paying for."""
    ref = make_pool(api, replicas=2, onDemandReplicas=1, rollout={"maxUnavailable": 2},
                    recycle={"bannedTargets": 1, "windowSeconds": 600})
    run(api, redis_client, ref, CONFIGS)
    _leasable(api, redis_client, {})
    [victim] = [p for p in proxies(api) if p.spec.capacity == "OnDemand"]
    time.sleep(1.1)
    _ban(redis_client, victim.uid, "shop.example.com")
    for replicas in (3, 4):
        custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web",
                                                   {"spec": {"replicas": replicas}})
        out = run(api, redis_client, ref, CONFIGS)
        assert len(out.plan.creates) == 1 and _reasons(api)[victim.name] == BURNED_IN_PLACE
        assert sorted(p.spec.capacity for p in proxies(api)) == ["OnDemand"] + ["Spot"] * (replicas - 1)


def test_a_burned_member_draining_for_scale_down_is_not_reclaimed(api, redis_client):
    """A scale-up takes back members draining for ScaleDown, but not one whose IP is burned: a new
    member is made instead."""
    ref = make_pool(api, replicas=2, recycle={"bannedTargets": 1, "windowSeconds": 600})
    run(api, redis_client, ref)
    egress: dict[str, str] = {}
    _leasable(api, redis_client, egress)
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"replicas": 1}})
    [drain] = run(api, redis_client, ref).plan.drains
    assert drain.reason == "ScaleDown"
    [leaving] = [p for p in proxies(api) if p.uid == drain.uid]
    time.sleep(1.1)
    # a site banned its IP meanwhile (as lease_release.lua records it)
    redis_client.zadd(redis_keys.ip_ban_times(egress[leaving.name]), {"shop.example.com": int(time.time() * 1000)})
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"replicas": 2}})
    out = run(api, redis_client, ref)
    assert out.plan.reclaims == () and len(out.plan.creates) == 1
    assert pool_obj(api)["status"]["burnedReplicas"] == 0  # draining: not counted as burned
