"""A holder judges others only after its heartbeat has run without a gap for HOLDER_TTL, "after
a Redis outage every heartbeat may have expired, and the live holders need one period to beat
again" (app/store/holders.py).  A gap only Redis saw (a restart from a snapshot in which the
heartbeats had expired, a failover to a replica that lagged) must count as a gap too: else the
first holder to beat again takes the locks of every live holder that has not beaten yet."""

from __future__ import annotations

import time

from app.store import holders

from app.store import keys as redis_keys

TTL = 1.0


def test_a_heartbeat_redis_lost_is_a_gap_for_the_judge(redis_client):
    judge = holders.Holder(redis_client, TTL, holder_id="judge-a")
    live = holders.Holder(redis_client, TTL, holder_id="live-b")
    end = time.time() + TTL + 0.3
    while time.time() < end:  # both beat every third of their TTL, as their threads do
        judge.beat()
        live.beat()
        time.sleep(TTL / 3)
    assert holders.may_judge(redis_client, judge)
    assert holders.lock(redis_client, "po:lock:gap", timeout=300, holder=live).acquire(blocking=False)
    # Redis comes back without the heartbeats (they had expired in the snapshot it loaded)
    redis_client.delete(redis_keys.holder_heartbeat("judge-a"), redis_keys.holder_heartbeat("live-b"))
    judge.beat()  # the judge's thread beats first; live-b's beat is a third of a TTL away
    assert not holders.may_judge(redis_client, judge)
    assert not holders.lock(redis_client, "po:lock:gap", timeout=300, holder=judge).acquire(blocking=False)
    assert holders.holder_of(redis_client.get("po:lock:gap")) == "live-b"
