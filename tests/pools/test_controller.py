"""The pool controller's pass (app.pools.controller) against the API fake (the real CRDs admit
pools and Proxies) and real Redis, in-process: what it creates, marks, deletes and writes.

Members are made Ready by hand here (phase patched, serving record published healthy), the way
the reconciler and the health engine would; tests/pools/test_e2e_pools.py runs the real processes.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client as k8s

from app.serving import leases, view as serving

from app.store import keys as redis_keys
from app.kube.gateway import KubernetesGateway
from app.pools import controller, wake
from app.pools.controller import PoolRef
from app.pools.model import LABEL_POOL, LABEL_TEMPLATE_HASH
from app.resources import DRAINING_ANNOTATION, DRAINING_REASON_ANNOTATION, GROUP, PLURAL, POOL_PLURAL, VERSION, Proxy
from devcluster.cluster import FakeCluster
from tests.support.contexts import k8s_provider

pytestmark = pytest.mark.timeout(60)
NS = "crawl"
SETTINGS = leases.LeaseSettings(default_ttl=60, max_ttl=600, cooldown=30, sticky_ttl=600, record_grace=60)
CONFIGS = {"k8s-local": k8s_provider("k8s-local")}
TEMPLATE = {"metadata": {"labels": {"app": "web"}}, "spec": {"provider": "k8s-local", "maxLeases": 2}}


@pytest.fixture()
def cluster():
    with FakeCluster(kubelet=False) as c:
        yield c


@pytest.fixture()
def api(cluster):
    client = cluster.fake.api_client()
    yield client
    client.close()


def custom(api) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


def make_pool(api, name: str = "web", **spec) -> PoolRef:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": name, "namespace": NS},
            "spec": {"template": TEMPLATE, **spec}}
    obj = custom(api).create_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, body)
    return PoolRef(NS, name, obj["metadata"]["uid"])


def pool_obj(api, name: str = "web") -> dict:
    return custom(api).get_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, name)


def proxies(api) -> list[Proxy]:
    return KubernetesGateway(api).list_proxies_in(NS)


def ready(api, r, proxy: Proxy) -> None:
    """What the reconciler and the health engine do for a member: Ready, published, healthy."""
    custom(api).patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, proxy.name,
                                                      {"status": {"phase": "Ready"}})
    serving.publish(r, proxy, address="203.0.113.9", port=3128, phase="Ready")
    r.hset(redis_keys.proxy(proxy.uid), mapping={"health": "healthy", "healthy": "1"})
    leases.reindex(r, proxy.uid)


def run(api, r, ref: PoolRef, **kw) -> controller.Outcome:
    return controller.run(KubernetesGateway(api), r, CONFIGS, ref=ref, lock_timeout=30, **kw)


def test_members_are_created_owned_labelled_and_reported(api, redis_client):
    ref = make_pool(api, replicas=3)
    out = run(api, redis_client, ref)
    assert out.state == "done" and len(out.plan.creates) == 3
    members = proxies(api)
    assert len(members) == 3
    from app.pools.model import Pool

    template_hash = Pool.from_dict(pool_obj(api)).spec.hash
    assert run(api, redis_client, ref).plan.actions == 0  # the members' events bring the next pass
    pool = pool_obj(api)
    for m in members:
        owner = m.raw["metadata"]["ownerReferences"]
        assert owner == [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "name": "web", "uid": ref.uid,
                          "controller": True, "blockOwnerDeletion": True}]
        assert m.labels["app"] == "web" and m.labels[LABEL_POOL] == "web"
        assert m.labels[LABEL_TEMPLATE_HASH] == template_hash
        assert m.name.startswith("web-") and m.spec.provider == "k8s-local" and m.spec.max_leases == 2
    status = pool["status"]
    assert (status["replicas"], status["readyReplicas"], status["leasableReplicas"], status["updatedReplicas"]) == (
        3, 0, 0, 3)
    assert status["observedGeneration"] == pool["metadata"]["generation"]
    assert status["selector"] == "crawl.example.com/pool=web"
    assert {c["type"]: c["reason"] for c in status["conditions"]} == {
        "Available": "TooFewLeasable", "Progressing": "WaitingForMembers", "ScalingLimited": "AutoscaleDisabled",
        "ZonesReady": "AllZonesReady"}
    assert "skippedZones" not in status
    # the pool is registered for demand counting
    assert redis_client.hget(redis_keys.POOLS, "crawl/web") == "1"
    # a second pass with nothing new writes nothing and creates nothing
    again = run(api, redis_client, ref)
    assert again.plan.actions == 0
    assert pool_obj(api)["metadata"]["resourceVersion"] == pool["metadata"]["resourceVersion"]
    for m in proxies(api):
        ready(api, redis_client, m)
    run(api, redis_client, ref)
    status = pool_obj(api)["status"]
    assert (status["readyReplicas"], status["leasableReplicas"]) == (3, 3)
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Progressing"] == "PoolComplete"


def test_a_hand_made_proxy_with_the_same_labels_is_not_adopted_nor_touched(api, redis_client):
    gw = KubernetesGateway(api)
    hand = gw.create_proxy(NS, "hand-made", spec={"provider": "k8s-local"}, labels={"app": "web"})
    other_owner = gw.create_proxy(NS, "other-owned", spec={"provider": "k8s-local"}, labels={"app": "web"},
                                  owners=(controller.OwnerReference("apps/v1", "ReplicaSet", "rs", "uid-rs", True,
                                                                    True),))
    ref = make_pool(api, replicas=1)
    run(api, redis_client, ref)
    names = {p.name for p in proxies(api)}
    assert {"hand-made", "other-owned"} <= names and len(names) == 3
    # scaled to 0: only its own member goes
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"replicas": 0}})
    run(api, redis_client, ref)  # marks its member draining
    run(api, redis_client, ref)  # no leases: deleted
    assert {p.name for p in proxies(api)} == {"hand-made", "other-owned"}
    assert gw.get_proxy(NS, "hand-made").uid == hand.uid and gw.get_proxy(NS, "other-owned").uid == other_owner.uid
    assert DRAINING_ANNOTATION not in gw.get_proxy(NS, "hand-made").annotations


def test_scale_down_drains_then_deletes_only_when_the_lease_is_released(api, redis_client):
    ref = make_pool(api, replicas=2, drain={"drainTimeoutSeconds": 600})
    run(api, redis_client, ref)
    for m in proxies(api):
        ready(api, redis_client, m)
    lease = leases.acquire(redis_client, "crawler", leases.Filters(pool="web"), ttl=300, settings=SETTINGS)
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"replicas": 1}})
    out = run(api, redis_client, ref)
    [drain] = out.plan.drains
    assert drain.uid != lease.uid  # the least-leased member leaves
    # make the leased one leave too: scale to 0
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"replicas": 0}})
    out = run(api, redis_client, ref)
    assert [d.uid for d in out.plan.deletes] == [drain.uid]  # the lease-less one is deleted
    assert [d.uid for d in out.plan.drains] == [lease.uid]
    marked = KubernetesGateway(api).get_proxy(NS, lease.name)
    assert marked.draining_until == pytest.approx(time.time() + 600, abs=5)
    assert redis_client.sismember(redis_keys.DRAINING, lease.uid)  # at once, not at the next event
    with pytest.raises(leases.LeaseError):
        leases.acquire(redis_client, "crawler", leases.Filters(pool="web"), ttl=60, settings=SETTINGS)
    assert leases.renew(redis_client, "crawler", lease.id, ttl=60, settings=SETTINGS).uid == lease.uid
    out = run(api, redis_client, ref)
    # the next pass comes when the lease expires (60 s, renewed above), not at the drain deadline
    assert out.plan.deletes == () and out.requeue_after == pytest.approx(61, abs=3)
    assert wake.take(redis_client) == []
    leases.release(redis_client, "crawler", lease.id, outcome="ok", settings=SETTINGS)
    # the release changed only Redis: it wakes the pool (pool.wake queues its pass at once)
    assert wake.take(redis_client) == [(NS, "web")] and wake.take(redis_client) == []
    out = run(api, redis_client, ref)
    assert [d.reason for d in out.plan.deletes] == ["Drained"]
    assert proxies(api) == [] or all(p.deleting for p in proxies(api))


def test_only_the_last_live_lease_of_a_draining_member_wakes_its_pool(api, redis_client):
    ref = make_pool(api, replicas=1, drain={"drainTimeoutSeconds": 600}, template={
        "metadata": {"labels": {"app": "web"}}, "spec": {"provider": "k8s-local", "maxLeases": 3}})
    run(api, redis_client, ref)
    [member] = proxies(api)
    ready(api, redis_client, member)
    a, b, c = (leases.acquire(redis_client, "crawler", leases.Filters(pool="web"), ttl=300, settings=SETTINGS)
               for _ in range(3))
    leases.release(redis_client, "crawler", a.id, outcome="ok", settings=SETTINGS)
    assert wake.take(redis_client) == []  # not draining: nothing waits for it
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"replicas": 0}})
    run(api, redis_client, ref)  # drains it
    leases.release(redis_client, "crawler", b.id, outcome="ok", settings=SETTINGS)
    assert wake.take(redis_client) == []  # c still holds it
    leases.release(redis_client, "crawler", c.id, outcome="blocked", settings=SETTINGS)
    woken = wake.take(redis_client)
    assert woken == [(NS, "web")]
    wake.put_back(redis_client, woken)  # a pool.wake whose passes failed to go out loses none
    assert wake.take(redis_client) == [(NS, "web")]


def test_a_renewal_that_ends_a_draining_members_last_lease_wakes_its_pool(api, redis_client):
    ref = make_pool(api, replicas=1, drain={"drainTimeoutSeconds": 600})
    run(api, redis_client, ref)
    [member] = proxies(api)
    ready(api, redis_client, member)
    held = leases.acquire(redis_client, "crawler", leases.Filters(pool="web"), ttl=300, settings=SETTINGS)
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"replicas": 0}})
    run(api, redis_client, ref)  # drains it
    redis_client.hset(redis_keys.proxy(member.uid), "healthy", "0")  # the probes turned it unhealthy
    with pytest.raises(leases.LeaseError) as ended:
        leases.renew(redis_client, "crawler", held.id, ttl=None, settings=SETTINGS)
    assert ended.value.code == leases.PROXY_UNAVAILABLE
    assert wake.take(redis_client) == [(NS, "web")]


def _kvm_like(name: str, hosts: list[str]):
    """A provider config whose targets are hosts (a kvm provider's config, parsed as the operator
    parses it; nothing is dialled), for zones_ready."""
    import dataclasses

    from app.wiring import parse_config

    [pc] = parse_config({"providers": [{"name": name, "type": "kvm", "kvm": {
        "ssh": {"user": "u", "keyFile": "/nonexistent/key", "knownHostsFile": "/nonexistent/known_hosts"},
        "hosts": [{"name": h, "address": "127.0.0.1"} for h in hosts]}}]}, "<pool-controller-test>").providers
    return dataclasses.replace(pc, check_interval=10, check_timeout=5)



def _zones_ready(r, pc, zones) -> dict[str, bool]:
    """Whether members may be placed in each zone, as the pass reads it (no why)."""
    return {zone: why is None for zone, why in controller.zone_health(r, pc, zones).items()}

def test_spread_places_members_by_zone_and_skips_a_zone_whose_target_is_down(api, redis_client):
    from app.providers.checks import record_target
    from app.providers.base import TargetVerdict

    configs = {"k8s-local": _kvm_like("k8s-local", ["z1", "z2"])}
    ref = make_pool(api, replicas=4, spread={"zones": ["z1", "z2"]})
    record_target(redis_client, "k8s-local", TargetVerdict("z1", True, "Ready"), elapsed=0.1)
    record_target(redis_client, "k8s-local", TargetVerdict("z2", False, "DialFailed", "down"), elapsed=0.1)
    out = controller.run(KubernetesGateway(api), redis_client, configs, ref=ref, lock_timeout=30)
    assert [c.zone for c in out.plan.creates] == ["z1"] * 4
    assert sorted(p.spec.zone for p in proxies(api)) == ["z1"] * 4
    record_target(redis_client, "k8s-local", TargetVerdict("z2", True, "Ready"), elapsed=0.1)
    assert _zones_ready(redis_client, configs["k8s-local"], ["z1", "z2", "z3"]) == {
        "z1": True, "z2": True, "z3": True}


def test_a_skipped_zone_is_told_in_the_status_and_by_one_event_each_way(api, redis_client):
    from app.providers.checks import record_target
    from app.providers.base import TargetVerdict

    configs = {"k8s-local": _kvm_like("k8s-local", ["z1", "z2"])}
    gw = KubernetesGateway(api)
    ref = make_pool(api, replicas=2, spread={"zones": ["z1", "z2"]})
    record_target(redis_client, "k8s-local", TargetVerdict("z1", True, "Ready"), elapsed=0.1)
    record_target(redis_client, "k8s-local", TargetVerdict("z2", False, "DialFailed", "ssh: connection refused"),
                  elapsed=0.1)
    for _ in range(3):  # a zone that stays down: one Event, not one per pass
        controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30)
    status = pool_obj(api)["status"]
    [skipped] = status["skippedZones"]
    assert {k: skipped[k] for k in ("zone", "target", "reason", "message")} == {
        "zone": "z2", "target": "z2", "reason": "DialFailed", "message": "ssh: connection refused"}
    zones = next(c for c in status["conditions"] if c["type"] == "ZonesReady")
    assert (zones["status"], zones["reason"]) == ("False", "ZonesNotReady")
    assert "z2 (DialFailed: ssh: connection refused)" in zones["message"]
    [down] = _events(api, "ZoneNotReady")
    assert down.type == "Warning" and "z2 (DialFailed: ssh: connection refused)" in down.message
    assert down.involved_object.kind == "ProxyPool" and down.involved_object.uid == ref.uid
    assert _events(api, "ZoneReady") == []
    # back: one Normal Event, the entry goes, ZonesReady True; further passes add none
    record_target(redis_client, "k8s-local", TargetVerdict("z2", True, "Ready"), elapsed=0.1)
    for _ in range(2):
        controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30)
    status = pool_obj(api)["status"]
    assert "skippedZones" not in status
    zones = next(c for c in status["conditions"] if c["type"] == "ZonesReady")
    assert (zones["status"], zones["reason"]) == ("True", "AllZonesReady")
    [up] = _events(api, "ZoneReady")
    assert up.type == "Normal" and "z2" in up.message
    assert len(_events(api, "ZoneNotReady")) == 1
    # down again with another reason: a second ZoneNotReady
    record_target(redis_client, "k8s-local", TargetVerdict("z2", False, "LibvirtDown", "libvirtd not answering"),
                  elapsed=0.1)
    controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30)
    again = _events(api, "ZoneNotReady")
    assert len(again) == 2 and any(e.message.endswith("z2 (LibvirtDown: libvirtd not answering)") for e in again)


def test_each_pass_leaves_the_pools_counts_for_the_gauges_and_a_deleted_pool_none(api, redis_client):
    import json

    from app.pools import stats
    from app.pools.stats import PoolCollector

    ref = make_pool(api, replicas=2)
    run(api, redis_client, ref)  # creates the members
    run(api, redis_client, ref)  # counts them
    doc = json.loads(redis_client.hget(redis_keys.POOL_STATS, "crawl/web"))
    assert {k: doc[k] for k in ("uid", "desired", "replicas", "ready", "leasable", "updated", "draining")} == {
        "uid": ref.uid, "desired": 2, "replicas": 2, "ready": 0, "leasable": 0, "updated": 2, "draining": 0}
    families = {f.name: f for f in PoolCollector(lambda: redis_client).collect()}
    [sample] = families["proxy_operator_pool_desired_replicas"].samples
    assert (sample.labels, sample.value) == ({"namespace": "crawl", "pool": "web"}, 2.0)
    # the lease utilization an HPA can target: live leases / capacity of the leasable members
    for m in proxies(api):
        ready(api, redis_client, m)
    leases.acquire(redis_client, "crawler", leases.Filters(pool="web"), ttl=300, settings=SETTINGS)
    run(api, redis_client, ref)
    families = {f.name: f for f in PoolCollector(lambda: redis_client).collect()}
    assert [s.value for s in families["proxy_operator_pool_leases"].samples] == [1.0]
    assert [s.value for s in families["proxy_operator_pool_lease_capacity"].samples] == [4.0]  # 2 x maxLeases 2
    doc = json.loads(redis_client.hget(redis_keys.POOL_STATS, "crawl/web"))
    del doc["leases"], doc["leaseCapacity"]  # an entry an earlier release wrote: read, the new gauges at 0
    redis_client.hset(redis_keys.POOL_STATS, "crawl/web", json.dumps(doc))
    families = {f.name: f for f in PoolCollector(lambda: redis_client).collect()}
    assert [s.value for s in families["proxy_operator_pool_leases"].samples] == [0.0]
    assert [s.value for s in families["proxy_operator_pool_replicas"].samples] == [2.0]
    # a pool re-created under the same name keeps its own counts when the old one is forgotten
    stats.forget(redis_client, "crawl", "web", uid="an-older-uid")
    assert redis_client.hexists(redis_keys.POOL_STATS, "crawl/web")
    # pool.resync drops what a missed deletion left
    redis_client.hset(redis_keys.POOL_STATS, "crawl/gone", json.dumps(doc))
    assert stats.prune(redis_client, [("crawl", "web")]) == 1
    assert redis_client.hkeys(redis_keys.POOL_STATS) == ["crawl/web"]
    # ...but keeps a pool created after its list was read, whose first pass already recorded
    listed_at = time.time()
    redis_client.hset(redis_keys.POOL_STATS, "crawl/newer", json.dumps(dict(doc, at=listed_at + 1)))
    redis_client.hset(redis_keys.POOL_STATS, "crawl/gone", json.dumps(dict(doc, at=listed_at - 1)))
    assert stats.prune(redis_client, [("crawl", "web")], listed_at=listed_at) == 1
    assert sorted(redis_client.hkeys(redis_keys.POOL_STATS)) == ["crawl/newer", "crawl/web"]
    redis_client.hdel(redis_keys.POOL_STATS, "crawl/newer")
    custom(api).delete_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web")
    assert run(api, redis_client, ref).state == "gone"
    assert not redis_client.exists(redis_keys.POOL_STATS)
    # Redis unreachable: the scrape goes on without the pool gauges
    import redis as redis_lib

    dead = redis_lib.Redis(port=1, socket_connect_timeout=0.2)
    assert list(PoolCollector(lambda: dead).collect()) == []


def test_zone_readiness_of_providers_checked_as_a_whole(redis_client):
    from app.providers.checks import record_round
    from app.providers.base import TargetVerdict

    pc = k8s_provider("k8s-local")  # one target: "cluster"
    assert _zones_ready(redis_client, pc, [None, "a"]) == {"": True, "a": True}  # CheckPending
    record_round(redis_client, "k8s-local", [TargetVerdict("cluster", False, "Unreachable")], elapsed=0.1)
    assert _zones_ready(redis_client, pc, [None, "a"]) == {"": False, "a": False}
    off = k8s_provider("k8s-off")
    off = type(off)(off.name, off.type, 0, off.check_timeout, off.settings)  # checkInterval 0: checks off
    assert _zones_ready(redis_client, off, [None]) == {"": True}


def test_invalid_and_unknown_provider_pools_say_why_and_do_nothing(api, redis_client):
    ref = make_pool(api, "elsewhere", replicas=2,
                    template={"metadata": {"labels": {"app": "x"}}, "spec": {"provider": "nowhere"}})
    out = run(api, redis_client, ref)
    assert out.state == "stalled" and proxies(api) == []
    [progressing] = [c for c in pool_obj(api, "elsewhere")["status"]["conditions"] if c["type"] == "Progressing"]
    assert (progressing["status"], progressing["reason"]) == ("False", "UnknownProvider")


def test_autoscaler_writes_spec_replicas_through_the_scale_subresource(api, redis_client):
    ref = make_pool(api, replicas=1, autoscale={"minReplicas": 1, "maxReplicas": 4,
                                                "targetLeaseUtilization": "50%", "scaleDownDelaySeconds": 60})
    run(api, redis_client, ref)
    for m in proxies(api):
        ready(api, redis_client, m)
    # one member, 2 leases each: both taken, then crawlers are refused
    for _ in range(2):
        leases.acquire(redis_client, "crawler", leases.Filters(pool="web"), ttl=300, settings=SETTINGS)
    for _ in range(6):
        with pytest.raises(leases.LeaseError):
            leases.acquire(redis_client, "crawler", leases.Filters(pool="web"), ttl=300, settings=SETTINGS)
    assert redis_client.get(redis_keys.pool_demand(NS, "web")) == "6"
    out = run(api, redis_client, ref)
    assert out.plan.scale_to is not None and out.plan.scale_to > 1
    pool = pool_obj(api)
    assert pool["spec"]["replicas"] == out.plan.scale_to  # through /scale
    assert redis_client.get(redis_keys.pool_demand(NS, "web")) is None  # read and reset
    assert len(proxies(api)) == out.plan.scale_to
    assert redis_client.get(redis_keys.pool_scale(ref.uid))  # the window's history


def test_another_writer_of_spec_replicas_on_an_autoscaled_pool_is_told_by_a_warning(api, redis_client):
    """An HPA (or kubectl scale) and spec.autoscale both writing spec.replicas: the pass that sees
    the other write records a ReplicasOverridden Warning, at most once per interval."""
    ref = make_pool(api, replicas=1, autoscale={"minReplicas": 1, "maxReplicas": 4, "scaleDownDelaySeconds": 0})
    now = time.time()
    run(api, redis_client, ref, now=now)
    for m in proxies(api):
        ready(api, redis_client, m)
    run(api, redis_client, ref, now=now + 1)
    assert _events(api, "ReplicasOverridden") == []  # its own writes are not another writer's
    scale = {"spec": {"replicas": 3}}  # what an HPA writes, through the scale subresource
    custom(api).patch_namespaced_custom_object_scale(GROUP, VERSION, NS, POOL_PLURAL, "web", scale)
    out = run(api, redis_client, ref, now=now + 2)
    [event] = _events(api, "ReplicasOverridden")
    assert event.type == "Warning"
    assert "spec.replicas was changed from 1 to 3 by another writer" in event.message
    assert "HorizontalPodAutoscaler" in event.message and "Use one of them" in event.message
    assert out.plan.scale_to == 1 and pool_obj(api)["spec"]["replicas"] == 1  # no load: back to 1
    custom(api).patch_namespaced_custom_object_scale(GROUP, VERSION, NS, POOL_PLURAL, "web", scale)
    run(api, redis_client, ref, now=now + 3)
    assert len(_events(api, "ReplicasOverridden")) == 1  # the same fight: not one Event per pass
    custom(api).patch_namespaced_custom_object_scale(GROUP, VERSION, NS, POOL_PLURAL, "web", scale)
    run(api, redis_client, ref, now=now + 3 + controller.OVERRIDE_EVENT_INTERVAL)
    assert len(_events(api, "ReplicasOverridden")) == 2


def test_a_failed_member_is_replaced_after_a_backoff_kept_in_the_status(api, redis_client):
    from app.pools.plan import FAILURE_BACKOFF_BASE

    ref = make_pool(api, replicas=1)
    t0 = time.time() - 100  # passes dated in the past: the replacement is really made after the failure
    run(api, redis_client, ref, now=t0)
    [m] = proxies(api)
    custom(api).patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, m.name,
                                                      {"status": {"phase": "Failed"}})
    out = run(api, redis_client, ref, now=t0 + 1)
    assert [d.reason for d in out.plan.deletes] == ["Failed"] and out.plan.creates == ()
    assert out.requeue_after == pytest.approx(FAILURE_BACKOFF_BASE, abs=1)
    failures = pool_obj(api)["status"]["memberFailures"]  # kept by the CRD's status schema
    assert failures["count"] == 1
    assert run(api, redis_client, ref, now=t0 + 2).plan.creates == ()
    out = run(api, redis_client, ref, now=t0 + 2 + FAILURE_BACKOFF_BASE)
    assert len(out.plan.creates) == 1
    [new] = [p for p in proxies(api) if not p.deleting]
    ready(api, redis_client, new)
    run(api, redis_client, ref, now=t0 + 3 + FAILURE_BACKOFF_BASE)
    assert "memberFailures" not in pool_obj(api)["status"]  # a new member works: the backoff is over


def test_a_deleted_pool_is_forgotten(api, redis_client):
    ref = make_pool(api, replicas=0)
    run(api, redis_client, ref)
    assert redis_client.hexists(redis_keys.POOLS, "crawl/web")
    custom(api).delete_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web")
    assert run(api, redis_client, ref).state == "gone"
    assert not redis_client.hexists(redis_keys.POOLS, "crawl/web")


def test_only_an_explicit_selector_filters_owned_members(api, redis_client):
    gw = KubernetesGateway(api)
    # derived selector: after a change of the template's labels, the older members are still
    # members (outdated ones), rolled over rather than forgotten
    ref = make_pool(api, replicas=1)
    run(api, redis_client, ref)
    [old] = proxies(api)
    ready(api, redis_client, old)
    template = {"metadata": {"labels": {"app": "web", "rev": "2"}}, "spec": TEMPLATE["spec"]}
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"template": template}})
    out = run(api, redis_client, ref)
    assert out.plan.outdated == (old.name,) and len(out.plan.creates) == 1
    # explicit selector: an owned Proxy relabelled out of it is released (its ownerReference
    # removed, as a ReplicaSet releases a Pod), not counted, and replaced; it is not deleted
    ref2 = make_pool(api, "sel", replicas=1, selector={"matchLabels": {"app": "web"}})
    run(api, redis_client, ref2)
    [mine] = [p for p in proxies(api) if p.labels.get("crawl.example.com/pool") == "sel"]
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, mine.name,
                                               {"metadata": {"labels": {"app": "elsewhere"}}})
    out = run(api, redis_client, ref2)
    assert out.released == (mine.name,)
    assert len(out.plan.creates) == 1 and not out.plan.drains and not out.plan.deletes
    left = gw.get_proxy(NS, mine.name)
    assert left is not None and left.uid == mine.uid and not left.deleting
    assert left.controller is None and left.pool == ""
    # no longer the pool's: the next pass neither releases nor counts it again
    out = run(api, redis_client, ref2)
    assert out.released == () and out.plan.actions == 0


def test_status_selector_lists_exactly_the_members_across_a_template_label_change(api, redis_client):
    """``kubectl get px -l "$(kubectl get pxp web -o jsonpath='{.status.selector}')"``: the pool's
    members, old template and new, and no hand-made Proxy with the template's labels."""
    def listed(selector: str) -> set[str]:
        items = custom(api).list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, label_selector=selector)
        return {i["metadata"]["name"] for i in items["items"]}

    custom(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
        "metadata": {"name": "look-alike", "namespace": NS, "labels": {"app": "web", "rev": "2"}},
        "spec": TEMPLATE["spec"]})
    ref = make_pool(api, replicas=2)
    run(api, redis_client, ref)
    old = [p for p in proxies(api) if p.controller]
    for p in old:
        ready(api, redis_client, p)
    run(api, redis_client, ref)
    before = pool_obj(api)["status"]["selector"]
    assert listed(before) == {p.name for p in old}
    template = {"metadata": {"labels": {"app": "web", "rev": "2"}}, "spec": TEMPLATE["spec"]}
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"template": template}})
    out = run(api, redis_client, ref)
    assert len(out.plan.creates) == 1 and set(out.plan.outdated) == {p.name for p in old}
    run(api, redis_client, ref)  # counts the new member (not leasable yet: nothing drains)
    status = pool_obj(api)["status"]
    members = {p.name for p in proxies(api) if p.controller and p.controller.get("uid") == ref.uid}
    assert len(members) == 3 and status["replicas"] == 3
    assert status["selector"] == before  # it does not follow the template's labels
    assert listed(status["selector"]) == members  # old and new members; not the look-alike
    # the scale subresource reports the same string (what an HPA reads)
    scale = custom(api).get_namespaced_custom_object_scale(GROUP, VERSION, NS, POOL_PLURAL, "web")
    assert scale["status"]["selector"] == before


def test_a_scale_up_reclaims_a_member_drained_for_scale_down_and_it_takes_leases_again(api, redis_client):
    ref = make_pool(api, replicas=2, drain={"drainTimeoutSeconds": 600}, rollout={"maxSurge": 0, "maxUnavailable": 1})
    run(api, redis_client, ref)
    for m in proxies(api):
        ready(api, redis_client, m)
    held = [leases.acquire(redis_client, f"crawler-{i}", leases.Filters(pool="web"), ttl=300, settings=SETTINGS)
            for i in range(2)]
    assert {h.uid for h in held} == {m.uid for m in proxies(api)}  # one lease on each
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"replicas": 1}})
    [drain] = run(api, redis_client, ref).plan.drains
    gw = KubernetesGateway(api)
    marked = gw.get_proxy(NS, drain.name)
    assert marked.draining_until and marked.annotations[DRAINING_REASON_ANNOTATION] == "ScaleDown"
    other = next(m for m in proxies(api) if m.uid != drain.uid)
    assert leases.acquire(redis_client, "crawler-2", leases.Filters(pool="web"), ttl=300,
                          settings=SETTINGS).uid == other.uid
    with pytest.raises(leases.LeaseError):  # the other is full, the drained one takes none
        leases.acquire(redis_client, "crawler-3", leases.Filters(pool="web"), ttl=300, settings=SETTINGS)
    # demand rises again before the drained member's lease ends
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"replicas": 2}})
    out = run(api, redis_client, ref)
    assert [c.uid for c in out.plan.reclaims] == [drain.uid]
    assert out.plan.creates == () and out.plan.deletes == ()
    back = gw.get_proxy(NS, drain.name)
    assert back.uid == drain.uid and back.draining_until is None
    assert DRAINING_ANNOTATION not in back.annotations and DRAINING_REASON_ANNOTATION not in back.annotations
    assert not redis_client.sismember(redis_keys.DRAINING, drain.uid)
    assert leases.acquire(redis_client, "crawler-3", leases.Filters(pool="web"), ttl=300,
                          settings=SETTINGS).uid == drain.uid
    [event] = _events(api, "MemberReclaimed")
    assert event.type == "Normal" and drain.name in event.message
    assert len(proxies(api)) == 2
    status = pool_obj(api)["status"]
    assert (status["replicas"], status["updatedReplicas"]) == (2, 2)
    assert run(api, redis_client, ref).plan.actions == 0
    assert pool_obj(api)["status"]["leasableReplicas"] == 2


def test_a_draining_mark_lost_from_the_serving_view_is_written_again(api, redis_client):
    ref = make_pool(api, replicas=1, drain={"drainTimeoutSeconds": 600})
    run(api, redis_client, ref)
    [m] = proxies(api)
    ready(api, redis_client, m)
    leases.acquire(redis_client, "crawler", leases.Filters(pool="web"), ttl=300, settings=SETTINGS)
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"replicas": 0}})
    run(api, redis_client, ref)
    assert redis_client.sismember(redis_keys.DRAINING, m.uid)
    # a re-publication from a read older than the mark (a poll racing the controller)
    serving.publish(redis_client, m, address="203.0.113.9", port=3128, phase="Ready")
    assert not redis_client.sismember(redis_keys.DRAINING, m.uid)
    run(api, redis_client, ref)
    assert redis_client.sismember(redis_keys.DRAINING, m.uid)


def _events(api, reason: str) -> list:
    return [e for e in k8s.CoreV1Api(api).list_namespaced_event(NS).items if e.reason == reason]


def test_a_released_proxy_loses_only_the_pools_owner_reference_and_keeps_running(api, cluster, redis_client):
    gw = KubernetesGateway(api)
    keeper = make_pool(api, "keeper", replicas=0)  # a second owner (not the controller) the release keeps
    ref = make_pool(api, "sel", replicas=1, selector={"matchLabels": {"app": "web"}},
                    drain={"drainTimeoutSeconds": 600})
    run(api, redis_client, ref)
    [mine] = proxies(api)
    other = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "name": "keeper", "uid": keeper.uid,
             "controller": False, "blockOwnerDeletion": False}
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, mine.name, {"metadata": {
        "ownerReferences": [*mine.raw["metadata"]["ownerReferences"], other]}})
    ready(api, redis_client, gw.get_proxy(NS, mine.name))
    # it was leaving the pool (a scale-down) when it was relabelled: the pool's mark goes with it
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "sel", {"spec": {"replicas": 0}})
    assert [d.uid for d in run(api, redis_client, ref).plan.drains] == [mine.uid]
    assert redis_client.sismember(redis_keys.DRAINING, mine.uid)
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "sel", {"spec": {"replicas": 1}})
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, mine.name,
                                               {"metadata": {"labels": {"app": "elsewhere"}}})
    out = run(api, redis_client, ref)
    assert out.released == (mine.name,) and len(out.plan.creates) == 1
    left = gw.get_proxy(NS, mine.name)
    assert left.uid == mine.uid and not left.deleting
    assert left.raw["metadata"]["ownerReferences"] == [other]  # only our reference went
    assert DRAINING_ANNOTATION not in left.annotations and left.labels["app"] == "elsewhere"
    [replacement] = [p for p in proxies(api) if p.uid != mine.uid]
    assert replacement.pool == "sel" and replacement.controller["uid"] == ref.uid
    [event] = _events(api, "MemberReleased")
    assert event.involved_object.uid == ref.uid and mine.name in event.message
    # the serving view: out of the pool at once, leasable as a standalone Proxy
    assert redis_client.hget(redis_keys.proxy(mine.uid), "pool") == ""
    assert not redis_client.sismember(redis_keys.DRAINING, mine.uid)
    with pytest.raises(leases.LeaseError):
        leases.acquire(redis_client, "crawler", leases.Filters(pool="sel", namespace=NS), ttl=60, settings=SETTINGS)
    lease = leases.acquire(redis_client, "crawler", leases.Filters(namespace=NS), ttl=60, settings=SETTINGS)
    assert lease.uid == mine.uid
    # a re-publication from the (now ownerless) Proxy keeps it out of the pool
    serving.publish(redis_client, left, address="203.0.113.9", port=3128, phase="Ready")
    assert redis_client.hget(redis_keys.proxy(mine.uid), "pool") == ""
    # not the pool's dependent any more: deleting the pool deletes its member, not the released Proxy
    custom(api).delete_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "sel")
    deadline = time.time() + 10
    while gw.get_proxy(NS, replacement.name) is not None and time.time() < deadline:
        time.sleep(0.05)
    assert gw.get_proxy(NS, replacement.name) is None
    cluster.fake.gc.collect()
    assert gw.get_proxy(NS, mine.name).uid == mine.uid and not gw.get_proxy(NS, mine.name).deleting


def test_a_release_refused_with_409_is_retried_by_the_next_pass(api, cluster, redis_client):
    gw = KubernetesGateway(api)
    ref = make_pool(api, "sel", replicas=1, selector={"matchLabels": {"app": "web"}})
    run(api, redis_client, ref)
    [mine] = proxies(api)
    relabelled = Proxy.from_dict(custom(api).patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, mine.name, {"metadata": {"labels": {"app": "elsewhere"}}}))
    # the gateway's precondition: a release computed from a stale read is refused, nothing changes
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, mine.name,
                                               {"metadata": {"annotations": {"note": "changed meanwhile"}}})
    with pytest.raises(k8s.ApiException) as err:
        gw.release_proxy(relabelled, ref.uid)
    assert err.value.status == 409
    assert gw.get_proxy(NS, mine.name).controller["uid"] == ref.uid
    # a pass whose release is refused leaves the Proxy as it is and asks for another pass soon
    cluster.fake.fail_next("patch", "proxies", code=409, reason="Conflict")
    out = run(api, redis_client, ref)
    assert out.released == () and out.requeue_after is not None and out.requeue_after <= controller.RELEASE_RETRY
    assert gw.get_proxy(NS, mine.name).controller["uid"] == ref.uid
    assert _events(api, "MemberReleased") == []
    out = run(api, redis_client, ref)
    assert out.released == (mine.name,)
    assert gw.get_proxy(NS, mine.name).controller is None
    assert len([p for p in proxies(api) if p.pool == "sel"]) == 1  # one replacement, whatever the retries


def test_a_pool_name_longer_than_a_label_value_is_refused_with_the_reason(api, redis_client):
    """A ProxyPool's name may have 253 characters, but it is the crawl.example.com/pool label of
    every member, and the API server refuses label values over 63: the pool says so instead of
    failing every create quietly."""
    gw = KubernetesGateway(api)
    with pytest.raises(k8s.ApiException) as refused:  # what the API server does with such a member
        gw.create_proxy(NS, "long-label", spec={"provider": "k8s-local"}, labels={LABEL_POOL: "p" * 64})
    assert refused.value.status == 422 and "must be no more than 63 characters" in refused.value.body
    longest = "p" * 63
    ok = make_pool(api, longest, replicas=1)
    assert run(api, redis_client, ok).state == "done"
    [member] = proxies(api)
    assert member.labels[LABEL_POOL] == longest
    too_long = "q" * 64
    ref = make_pool(api, too_long, replicas=2)
    out = run(api, redis_client, ref)
    assert out.state == "stalled" and [p.name for p in proxies(api)] == [member.name]
    [progressing] = [c for c in pool_obj(api, too_long)["status"]["conditions"] if c["type"] == "Progressing"]
    assert (progressing["status"], progressing["reason"]) == ("False", "InvalidSpec")
    assert progressing["message"].startswith("metadata.name: 64 characters, at most 63")
    assert LABEL_POOL in progressing["message"]


def test_a_zone_flapping_every_pass_is_told_by_a_bounded_number_of_events(api, redis_client):
    """A provider target that flips Ready / not Ready at every check round (an SSH dial that
    fails one time in two) must not make two Events per pass; the condition follows every flip,
    the Events are bounded per zone, and the state the zone settles in is told at the end."""
    from app.pools.controller import ZONE_EVENTS_PER_WINDOW, ZONE_EVENT_WINDOW
    from app.providers.checks import record_target
    from app.providers.base import TargetVerdict

    configs = {"k8s-local": _kvm_like("k8s-local", ["z1", "z2"])}
    gw = KubernetesGateway(api)
    ref = make_pool(api, replicas=0, spread={"zones": ["z1", "z2"]})
    t0 = time.time()
    passes = 40  # every 15 s: 10 minutes of flapping
    for i in range(passes):
        down = i % 2 == 0
        record_target(redis_client, "k8s-local", TargetVerdict("z1", True, "Ready"), elapsed=0.1, now=t0 + 15 * i)
        record_target(redis_client, "k8s-local", TargetVerdict("z2", not down, "DialFailed" if down else "Ready",
                                                                "ssh: connection refused" if down else ""),
                      elapsed=0.1, now=t0 + 15 * i)
        controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30, now=t0 + 15 * i)
        zones = next(c for c in pool_obj(api)["status"]["conditions"] if c["type"] == "ZonesReady")
        assert zones["status"] == ("False" if down else "True")  # the condition follows every flip
    told = _events(api, "ZoneNotReady") + _events(api, "ZoneReady")
    assert (ZONE_EVENTS_PER_WINDOW, ZONE_EVENT_WINDOW) == (3, 600.0)
    assert 2 <= len(told) <= 6, [e.reason for e in told]  # 40 flips in 10 minutes: at most 3 Events per 10 minutes
    # it settles down: once the window allows, the last state is told (a ZoneNotReady)
    settled = t0 + 15 * passes + ZONE_EVENT_WINDOW
    record_target(redis_client, "k8s-local", TargetVerdict("z1", True, "Ready"), elapsed=0.1, now=settled)
    record_target(redis_client, "k8s-local", TargetVerdict("z2", False, "DialFailed", "ssh: connection refused"),
                  elapsed=0.1, now=settled)
    controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30, now=settled)
    newest = max(_events(api, "ZoneNotReady") + _events(api, "ZoneReady"),
                 key=lambda e: int(e.metadata.resource_version))
    assert newest.reason == "ZoneNotReady" and "z2 (DialFailed" in newest.message
