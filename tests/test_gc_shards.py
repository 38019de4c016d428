"""Sharded GC (one listing task per KVM host): the last shard decides for the whole provider."""

from __future__ import annotations

from datetime import datetime, timezone

from app import gc, naming
from app.providers.base import Instance, InstanceState, ListResult

OLD = datetime(2020, 1, 1, tzinfo=timezone.utc)


def inst(host: str, uid: str) -> Instance:
    return Instance(f"hosts/{host}/domains/d-{uid}", f"d-{uid}", InstanceState.RUNNING, created=OLD,
                    tags={naming.TAG_MANAGED_BY: naming.MANAGED_BY, naming.TAG_PROXY_UID: uid}, zone=host)


def test_only_the_last_shard_gets_the_merged_listing(redis_client):
    assert gc.record_shard(redis_client, "kvm:1", "h1", 2, ListResult([inst("h1", "a")])) is None
    merged = gc.record_shard(redis_client, "kvm:1", "h2", 2, ListResult([inst("h2", "b")]))
    assert not merged.partial
    assert sorted(i.provider_id for i in merged.instances) == ["hosts/h1/domains/d-a", "hosts/h2/domains/d-b"]
    assert merged.instances[0].created == OLD and merged.instances[0].tags[naming.TAG_PROXY_UID] in ("a", "b")
    assert [i.zone for i in gc.orphans(merged.instances, {"a"}, set(), datetime.now(timezone.utc), 60)] == ["h2"]


def test_one_unreachable_host_makes_the_whole_sweep_partial(redis_client):
    gc.record_shard(redis_client, "kvm:2", "h1", 2, ListResult([inst("h1", "gone")]))
    merged = gc.record_shard(redis_client, "kvm:2", "h2", 2, None, error="h2: SSH handshake: timed out")
    assert merged.partial and merged.errors == ["h2: SSH handshake: timed out"]
    report = gc.sweep("kvm", None, merged, set(), set(), 60)
    assert report.skipped_partial and report.deleted == []
