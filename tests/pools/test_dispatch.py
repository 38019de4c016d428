"""Pool dispatch (app.dispatch.pools): which watch events queue a ``pool.reconcile`` pass, on
which queue, with what payload, de-duplicated; and the watcher's handler wiring."""

from __future__ import annotations

import time

import pytest

from app.store import keys as redis_keys
from app.pools.controller import PoolRef
from app.dispatch.pools import MEMBER_DELAY, PoolDispatcher, pool_of
from app.pools.model import Pool


class Recorder:
    def __init__(self) -> None:
        self.sent = []

    def __call__(self, task, args, queue, countdown=None) -> None:
        self.sent.append((task, list(args), queue, countdown))


def pool_obj(generation: int = 1, observed: int | None = None, deleting: bool = False) -> dict:
    meta = {"namespace": "crawl", "name": "web", "uid": "pool-uid", "generation": generation, "resourceVersion": "7"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {} if observed is None else {"observedGeneration": observed}}


def member_obj(kind: str = "ProxyPool", controller: bool = True, api_version: str = "crawl.example.com/v1alpha1") -> dict:
    return {"metadata": {"namespace": "crawl", "name": "web-abcde", "uid": "m-uid",
                         "ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": "web",
                                              "uid": "pool-uid", "controller": controller}]}}


@pytest.fixture()
def pools(redis_client):
    rec = Recorder()
    d = PoolDispatcher(redis_client, rec)
    d.recorder = rec
    return d


def test_pool_events_queue_a_pass_by_reference(pools, redis_client):
    pools.on_pool_event("ADDED", pool_obj())
    assert pools.recorder.sent == [("pool.reconcile", ["crawl", "web", "pool-uid", 0], "proxies", None)]
    pools.on_pool_event("MODIFIED", pool_obj(generation=2, observed=1))  # already queued: de-duplicated
    assert len(pools.recorder.sent) == 1
    assert redis_client.exists(redis_keys.queued("pool", "pool-uid"))
    pools.started("pool-uid")  # the pass begins: a change from now on queues another
    pools.on_pool_event("MODIFIED", pool_obj(generation=2, observed=1))
    assert len(pools.recorder.sent) == 2


def test_own_status_writes_and_metadata_edits_queue_nothing(pools):
    pools.on_pool_event("MODIFIED", pool_obj(generation=3, observed=3))
    assert pools.recorder.sent == []
    pools.on_pool_event("MODIFIED", pool_obj(generation=3, observed=3, deleting=True))  # deletion begins
    pools.started("pool-uid")
    pools.on_pool_event("SYNC", pool_obj(generation=3, observed=3))
    pools.started("pool-uid")
    pools.on_pool_event("DELETED", pool_obj(generation=3, observed=3))
    assert len(pools.recorder.sent) == 3
    pools.on_pool_event("ADDED", {"metadata": {"name": "no-uid"}})  # malformed: ignored
    assert len(pools.recorder.sent) == 3


def test_member_events_queue_a_pass_over_their_pool_a_second_ahead(pools):
    assert pool_of(member_obj()) == PoolRef("crawl", "web", "pool-uid")
    pools.on_member_event("MODIFIED", member_obj())
    pools.on_member_event("MODIFIED", member_obj())  # a burst: one pass
    assert pools.recorder.sent == [("pool.reconcile", ["crawl", "web", "pool-uid", 0], "proxies", MEMBER_DELAY)]
    for other in (member_obj(kind="ReplicaSet"), member_obj(controller=False), member_obj(api_version="apps/v1"),
                  {"metadata": {"namespace": "crawl", "name": "alone", "uid": "u"}}):
        assert pool_of(other) is None
        pools.on_member_event("MODIFIED", other)
    assert len(pools.recorder.sent) == 1


def test_resync_sends_only_for_pools_with_nothing_queued_before_the_next_resync(pools):
    a = Pool.from_dict({"metadata": {"namespace": "n", "name": "a", "uid": "ua"}, "spec": {}})
    b = Pool.from_dict({"metadata": {"namespace": "n", "name": "b", "uid": "ub"}, "spec": {}})
    c = Pool.from_dict({"metadata": {"namespace": "n", "name": "c", "uid": "uc"}, "spec": {}})
    pools.enqueue(PoolRef("n", "a", "ua"), delay=20)  # due before the next resync: enough
    pools.enqueue(PoolRef("n", "c", "uc"), delay=300)  # a far drain deadline: does not hold the resync back
    assert pools.resync([a, b, c], within=30) == 2
    assert [(s[1][1], s[3]) for s in pools.recorder.sent] == [("a", 20), ("c", 300), ("b", None), ("c", None)]
    assert pools.resync([a, b, c], within=30) == 0  # all three now due within the period


def test_resync_takes_a_pass_overdue_by_two_periods_for_lost(pools, redis_client):
    # A pass a live worker had reserved when Redis restarted with its data never runs; its mark
    # (due 90 s ago here) must not hold the pool's passes back until the mark expires.
    a = Pool.from_dict({"metadata": {"namespace": "n", "name": "a", "uid": "ua"}, "spec": {}})
    b = Pool.from_dict({"metadata": {"namespace": "n", "name": "b", "uid": "ub"}, "spec": {}})
    redis_client.set(redis_keys.queued("pool", "ua"), f"{time.time() - 90:.3f}", px=300_000)
    redis_client.set(redis_keys.queued("pool", "ub"), f"{time.time() - 20:.3f}", px=300_000)  # late, not lost
    assert pools.resync([a, b], within=30) == 1
    assert [s[1][1] for s in pools.recorder.sent] == ["a"]
