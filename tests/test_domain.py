"""Pure domain rules: names, spec hash, conditions, decide(), GC orphan selection."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from app.kube import conditions

from app.proxy import gc

from app.providers import naming
from app.providers.base import Instance, InstanceState, ListResult
from app.proxy.reconcile import CREATE, DELETE, POLL, decide
from app.resources import FINALIZER, Proxy, spec_hash


def proxy(spec=None, status=None, **meta) -> Proxy:
    md = {"name": "p", "namespace": "ns", "uid": "u-1", "generation": 1, "finalizers": [FINALIZER]}
    md.update(meta)
    return Proxy.from_dict({"metadata": md, "spec": spec or {"provider": "k"}, "status": status or {}})


def test_instance_name_is_deterministic_rfc1035_and_distinct():
    names = {naming.instance_name(f"uid-{i}") for i in range(5000)}
    assert len(names) == 5000
    name = naming.instance_name("0b9d1c3e-7d4f-4c53-9f58-1f5f0c5c9b1a")
    assert name == naming.instance_name("0b9d1c3e-7d4f-4c53-9f58-1f5f0c5c9b1a")
    assert len(name) == 22 and name.startswith("proxy-") and naming.is_rfc1035_label(name)


def test_defaults_mirror_the_crd():
    p = proxy({"provider": "k"})
    assert p.spec.mode == "Managed" and p.spec.port == 3128 and p.spec.max_leases == 5
    assert p.spec.health.expected_status == 204 and p.spec.health.failure_threshold == 3
    assert proxy({"provider": "k", "maxLeases": 0}).spec.max_leases == 0


def test_spec_hash_changes_for_instance_shape_only():
    base = {"provider": "k", "placement": {"zone": "a"}}
    assert spec_hash(base) == spec_hash({**base, "maxLeases": 2, "healthCheck": {"url": "http://x/"}})
    assert spec_hash(base) != spec_hash({**base, "placement": {"zone": "b"}})
    assert spec_hash(base) != spec_hash({**base, "cloudInit": {"inline": "#cloud-config\n"}})


def test_condition_transition_time_changes_only_on_status_flip():
    c1 = conditions.set_condition([], "Healthy", "True", reason="ProbeOK", message="", generation=1, now="2026-01-01T00:00:00Z")
    c2 = conditions.set_condition(c1, "Healthy", "True", reason="ProbeOK", message="again", generation=2, now="2026-01-02T00:00:00Z")
    assert conditions.find(c2, "Healthy")["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert conditions.find(c2, "Healthy")["observedGeneration"] == 2
    c3 = conditions.set_condition(c2, "Healthy", "False", reason="Timeout", message="", generation=2, now="2026-01-03T00:00:00Z")
    assert conditions.find(c3, "Healthy")["lastTransitionTime"] == "2026-01-03T00:00:00Z"


def test_decide():
    h = spec_hash({"provider": "k"})
    assert decide(proxy(finalizers=[])) == CREATE
    assert decide(proxy(status={"observedGeneration": 1, "phase": "Provisioning", "providerID": "ns/x",
                                "specHash": h})) == POLL
    running = {"observedGeneration": 1, "phase": "Ready", "providerID": "ns/x", "specHash": h}
    assert decide(proxy(status=running)) is None
    assert decide(proxy(status=running), resync=True) == POLL
    assert decide(proxy(status=running, generation=2)) == CREATE
    assert decide(proxy(status={**running, "specHash": "other"})) == CREATE
    quota = {"phase": "Pending", "conditions": [{"type": "Provisioned", "status": "False", "reason": "QuotaExceeded",
                                                "observedGeneration": 1}]}
    assert decide(proxy(status=quota)) is None                 # a retry is scheduled: events wait for it
    assert decide(proxy(status=quota), resync=True) == CREATE  # the resync still heals a lost retry
    assert decide(proxy(status=quota, generation=2)) == CREATE  # a new generation goes at once
    failed = {"observedGeneration": 1, "phase": "Failed"}
    assert decide(proxy(status=failed)) is None
    assert decide(proxy(status=failed, generation=2)) == CREATE
    assert decide(proxy(status=running, deletionTimestamp="2026-01-01T00:00:00Z")) == DELETE
    assert decide(proxy(status=running, deletionTimestamp="2026-01-01T00:00:00Z", finalizers=[])) is None


def test_gc_orphans_respect_tags_grace_liveness_and_abandonment():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    old, young = now - timedelta(hours=1), now - timedelta(seconds=10)

    def inst(uid, created=old, managed=True):
        tags = {naming.TAG_PROXY_UID: uid}
        if managed:
            tags[naming.TAG_MANAGED_BY] = naming.MANAGED_BY
        return Instance(f"id-{uid}", f"n-{uid}", InstanceState.RUNNING, created=created, tags=tags)

    listing = [inst("live"), inst("gone"), inst("young", young), inst("foreign", managed=False),
               inst("abandoned"), inst("unknown-age", None)]
    picked = gc.orphans(listing, live_uids={"live"}, abandoned={"abandoned"}, now=now, grace_seconds=600)
    assert [i.provider_id for i in picked] == ["id-gone"]


def test_gc_never_picks_an_instance_tagged_abandoned_even_when_redis_forgot_it():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    tags = {naming.TAG_MANAGED_BY: naming.MANAGED_BY, naming.TAG_PROXY_UID: "released"}
    marked = Instance("id-marked", "n-marked", InstanceState.STOPPED, created=now - timedelta(days=30),
                      tags={**tags, naming.TAG_ABANDONED: naming.ABANDONED})
    unmarked = Instance("id-unmarked", "n-unmarked", InstanceState.RUNNING, created=now - timedelta(days=30),
                        tags=tags)
    assert naming.is_abandoned(marked.tags) and not naming.is_abandoned(unmarked.tags)
    assert not naming.is_abandoned({naming.TAG_ABANDONED: "false"}) and not naming.is_abandoned(None)
    picked = gc.orphans([marked, unmarked], live_uids=set(), abandoned=set(), now=now, grace_seconds=0)  # an empty Redis hint set
    assert [i.provider_id for i in picked] == ["id-unmarked"]


class RecordingProvider:
    def __init__(self):
        self.deleted = []

    def delete(self, provider_id):
        self.deleted.append(provider_id)


def test_gc_partial_listing_deletes_nothing():
    old = datetime(2020, 1, 1, tzinfo=timezone.utc)
    orphan = Instance("id-x", "x", InstanceState.RUNNING, created=old,
                      tags={naming.TAG_MANAGED_BY: naming.MANAGED_BY, naming.TAG_PROXY_UID: "gone"})
    provider = RecordingProvider()
    report = gc.sweep("kvm", provider.delete, ListResult([orphan], partial=True, errors=["lab2: dial"]),
                      live_uids=set(), abandoned=set(), grace_seconds=60)
    assert report.skipped_partial and provider.deleted == []
    report = gc.sweep("kvm", provider.delete, ListResult([orphan]), live_uids=set(), abandoned=set(), grace_seconds=60)
    assert provider.deleted == ["id-x"] and report.deleted == ["id-x"]
