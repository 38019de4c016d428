"""Sharded GC (one listing task per KVM host): the last shard decides for the whole provider."""

from __future__ import annotations

from datetime import datetime, timezone

from app.proxy import gc

from app.providers import naming
from app.providers.base import Instance, InstanceState, ListResult

OLD = datetime(2020, 1, 1, tzinfo=timezone.utc)


def inst(host: str, uid: str) -> Instance:
    return Instance(f"hosts/{host}/domains/d-{uid}", f"d-{uid}", InstanceState.RUNNING, created=OLD,
                    tags={naming.TAG_MANAGED_BY: naming.MANAGED_BY, naming.TAG_PROXY_UID: uid}, zone=host)


def test_only_the_last_shard_gets_the_merged_listing(redis_client):
    assert gc.record_shard(redis_client, "kvm:1", "h1", shards=2, listing=ListResult([inst("h1", "a")])) is None
    merged = gc.record_shard(redis_client, "kvm:1", "h2", shards=2, listing=ListResult([inst("h2", "b")]))
    assert not merged.partial
    assert sorted(i.provider_id for i in merged.instances) == ["hosts/h1/domains/d-a", "hosts/h2/domains/d-b"]
    assert merged.instances[0].created == OLD and merged.instances[0].tags[naming.TAG_PROXY_UID] in ("a", "b")
    assert [i.zone for i in gc.orphans(merged.instances, live_uids={"a"}, abandoned=set(), now=datetime.now(timezone.utc), grace_seconds=60)] == ["h2"]


def test_one_unreachable_host_makes_the_whole_sweep_partial(redis_client):
    gc.record_shard(redis_client, "kvm:2", "h1", shards=2, listing=ListResult([inst("h1", "gone")]))
    merged = gc.record_shard(redis_client, "kvm:2", "h2", shards=2, listing=None, error="h2: SSH handshake: timed out")
    assert merged.partial and merged.errors == ["h2: SSH handshake: timed out"]
    report = gc.sweep("kvm", None, merged, live_uids=set(), abandoned=set(), grace_seconds=60)
    assert report.skipped_partial and report.deleted == []


def _proxy(uid: str, status: dict):
    from app.resources import Proxy

    return Proxy.from_dict({"metadata": {"namespace": "ns", "name": f"p-{uid}", "uid": uid},
                            "spec": {"provider": "kvm"}, "status": status})


def test_instances_a_live_proxy_no_longer_names_are_superseded_after_the_grace():
    now = datetime.now(timezone.utc)
    proxies = [_proxy("a", {"providerID": "hosts/h2/domains/d-a", "provider": "kvm"}),  # moved h1 -> h2
               _proxy("b", {}),                                                       # being created
               _proxy("c", {"providerID": "projects/p/zones/z/instances/d-c", "provider": "gcp"})]  # other provider
    live, current = gc.current_instances(proxies, "kvm")
    listing = [inst("h1", "a"), inst("h2", "a"), inst("h1", "b"), inst("h1", "c")]
    picked = gc.orphans(listing, live_uids=live, abandoned=set(), now=now, grace_seconds=60, current=current)
    assert sorted(i.provider_id for i in picked) == ["hosts/h1/domains/d-a", "hosts/h1/domains/d-c"]
    # Within the grace period nothing is taken, superseded or not.
    assert gc.orphans(listing, live_uids=live, abandoned=set(), now=OLD, grace_seconds=60, current=current) == []
    # A sweep deletes them through the given delete and says why in the report.
    deleted = []
    report = gc.sweep("kvm", deleted.append, ListResult(listing), live_uids=live, abandoned=set(), grace_seconds=60, current=current)
    assert sorted(deleted) == sorted(report.deleted) == ["hosts/h1/domains/d-a", "hosts/h1/domains/d-c"]


def test_the_abandoned_tag_travels_through_the_shards(redis_client):
    marked = inst("h1", "kept")
    marked = Instance(marked.provider_id, marked.name, marked.state, created=OLD, zone="h1",
                      tags={**marked.tags, naming.TAG_ABANDONED: naming.ABANDONED})
    gc.record_shard(redis_client, "kvm:3", "h1", shards=2, listing=ListResult([marked]))
    merged = gc.record_shard(redis_client, "kvm:3", "h2", shards=2, listing=ListResult([inst("h2", "gone")]))
    redis_client.flushall()  # whatever Redis held about skip-cleanup is gone
    report = gc.sweep("kvm", lambda pid: None, merged, live_uids=set(), abandoned=set(), grace_seconds=60)
    assert report.deleted == ["hosts/h2/domains/d-gone"]
