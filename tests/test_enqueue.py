"""De-duplicated enqueueing and own-write recognition, against real Redis and a real broker."""

from __future__ import annotations

import json

from celery import Celery

from app.dispatch.proxies import Enqueuer, OwnWrites, dedup_key
from app.proxy.reconcile import Ref

REF = Ref("ns", "p", "uid-1")


def queued(redis_client, queue="proxies") -> list[dict]:
    return [json.loads(m) for m in redis_client.lrange(queue, 0, -1)]


def test_send_is_deduplicated_by_eta(redis_client, redis_url):
    app = Celery(broker=redis_url)
    enq = Enqueuer(lambda task, args, queue, countdown=None: app.send_task(task, args=args, queue=queue,
                                                                            countdown=countdown), redis_client)
    assert enq.send("create", REF, queue="proxies", delay=30)
    assert not enq.send("create", REF, queue="proxies", delay=60)  # later than the one queued
    assert enq.send("create", REF, queue="proxies", delay=0)       # earlier: sent
    assert not enq.send("create", REF, queue="proxies", delay=0)
    assert not enq.send("create", REF, queue="proxies", delay=-5, only_if_idle=True)  # resync: queued already
    assert enq.send("poll", REF, queue="proxies")                   # another action
    enq.started("create", REF.uid)
    assert redis_client.get(dedup_key("create", REF.uid)) is None
    assert enq.send("create", REF, queue="proxies")
    messages = queued(redis_client)
    assert len(messages) == 4
    # The payload is references only: namespace, name, uid, attempt.
    assert all(m["headers"]["argsrepr"] in ("['ns', 'p', 'uid-1', 0]",) for m in messages)


def test_own_writes_are_recognised_and_real_changes_are_not(redis_client):
    own = OwnWrites(redis_client)
    assert own.observe("u", "10") == "send"
    own.begin("u", 30)
    assert own.observe("u", "11") == "deferred"   # our finalizer write, seen mid-task
    assert own.observe("u", "12") == "deferred"   # our status write
    assert not own.finish("u", ["11", "12"])        # all parked events were ours
    assert own.observe("u", "12") == "skip"
    assert own.observe("u", "13") == "send"         # somebody else's change

    own.begin("u", 30)
    assert own.observe("u", "14") == "deferred"   # a user's edit while the task runs
    assert own.observe("u", "15") == "deferred"
    assert own.finish("u", ["15"])                  # 14 was not ours: look again
