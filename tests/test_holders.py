"""Locks and messages held by a dead process (app/store/holders.py), on a real Redis.

A lock whose holder's heartbeat is gone is taken over at once (not after its timeout), a live
holder's never; a holder that has not beaten for a whole TTL itself judges nobody (after a Redis
outage every heartbeat may have lapsed); the resync sends work for a Proxy whose lock holder is
gone; the reap hands a dead holder's delivery tags to ``restore`` once, and never a live one's.
The end-to-end version, with real workers SIGKILLed, is tests/test_sigkill.py.
"""

from __future__ import annotations

import time

import pytest

from app.store import holders

from app.store import keys as redis_keys
from app.dispatch.proxies import Dispatcher, Router
from app.wiring import PROVIDER_TYPES
from tests.test_dispatch import _proxy

TTL = 1.0


def _holder(redis_client, name: str) -> holders.Holder:
    return holders.Holder(redis_client, TTL, holder_id=name).start()


def _dead(redis_client, name: str) -> holders.Holder:
    """A holder that beat once and stopped (its heartbeat lapses after TTL)."""
    dead = _holder(redis_client, name)
    dead.stop()
    return dead


def _seasoned(redis_client, name: str) -> holders.Holder:
    """A holder that has beaten without a gap for its TTL (it may judge others)."""
    judge = _holder(redis_client, name)
    time.sleep(TTL + 0.2)
    assert holders.may_judge(redis_client, judge)
    return judge


def test_a_lock_whose_holder_is_gone_is_taken_over_before_its_timeout(redis_client):
    dead = _dead(redis_client, "dead")
    assert holders.lock(redis_client, "po:lock:x", timeout=300, holder=dead).acquire(blocking=False)
    judge = _seasoned(redis_client, "judge")  # meanwhile the dead holder's heartbeat lapsed
    lock = holders.lock(redis_client, "po:lock:x", timeout=300, blocking_timeout=0.5, holder=judge)
    assert lock.acquire()
    assert holders.holder_of(redis_client.get("po:lock:x")) == "judge"
    assert 299 <= redis_client.ttl("po:lock:x") <= 300
    lock.release()


def test_a_live_holders_lock_is_never_taken(redis_client):
    live = _holder(redis_client, "live")
    try:
        assert holders.lock(redis_client, "po:lock:y", timeout=300, holder=live).acquire(blocking=False)
        judge = _seasoned(redis_client, "judge")
        assert not holders.lock(redis_client, "po:lock:y", timeout=300, blocking_timeout=0.5, holder=judge).acquire()
        assert holders.holder_of(redis_client.get("po:lock:y")) == "live"
    finally:
        live.stop()


def test_a_holder_that_has_not_beaten_for_its_ttl_judges_nobody(redis_client):
    dead = _dead(redis_client, "dead")
    assert holders.lock(redis_client, "po:lock:z", timeout=300, holder=dead).acquire(blocking=False)
    time.sleep(TTL + 0.2)
    fresh = _holder(redis_client, "fresh")  # just (re)started: others may still be beating back
    try:
        assert not holders.may_judge(redis_client, fresh)
        assert not holders.lock(redis_client, "po:lock:z", timeout=300, holder=fresh).acquire(blocking=False)
        time.sleep(TTL + 0.2)
        assert holders.lock(redis_client, "po:lock:z", timeout=300, holder=fresh).acquire(blocking=False)
    finally:
        fresh.stop()


def test_a_plain_token_is_left_to_its_timeout(redis_client):
    assert redis_client.lock("po:lock:plain", timeout=300).acquire()
    judge = _seasoned(redis_client, "judge")
    assert holders.held_by_live(redis_client, "po:lock:plain")
    assert not holders.lock(redis_client, "po:lock:plain", timeout=300, holder=judge).acquire(blocking=False)


def test_the_resync_sends_work_for_a_proxy_whose_lock_holder_is_gone(redis_client):
    sent = []
    dispatcher = Dispatcher(redis_client, Router([], PROVIDER_TYPES), lambda *a: sent.append(a))
    busy, orphaned = _proxy("busy", phase="Provisioning", provisioned="False"), \
        _proxy("orphaned", phase="Provisioning", provisioned="False")
    live, dead = _holder(redis_client, "live"), _dead(redis_client, "dead")
    try:
        assert holders.lock(redis_client, redis_keys.proxy_lock(busy.uid), timeout=300, holder=live).acquire()
        assert holders.lock(redis_client, redis_keys.proxy_lock(orphaned.uid), timeout=300, holder=dead).acquire()
        time.sleep(TTL + 0.2)
        assert dispatcher.resync([busy, orphaned]) == 1
        assert [args[1] for _, args, _, _ in sent] == ["orphaned"]
    finally:
        live.stop()


def test_reap_restores_a_dead_holders_messages_once_and_never_a_live_ones(redis_client):
    live, _ = _holder(redis_client, "live"), _dead(redis_client, "dead")
    try:
        redis_client.sadd(redis_keys.holder_messages("live"), "tag-live")
        redis_client.sadd(redis_keys.holder_messages("dead"), "tag-1", "tag-2")
        judge = _seasoned(redis_client, "judge")
        restored: list[str] = []
        assert holders.reap(redis_client, restored.append, judge) == 2
        assert sorted(restored) == ["tag-1", "tag-2"]
        assert holders.reap(redis_client, restored.append, judge) == 0  # a second reaper finds nothing
        # (the session's Redis may hold other processes' live holders too: workers of other tests)
        holders_left = redis_client.smembers(redis_keys.HOLDERS)
        assert {"live", "judge"} <= holders_left and "dead" not in holders_left
        assert redis_client.smembers(redis_keys.holder_messages("live")) == {"tag-live"}
    finally:
        live.stop()


def test_a_malformed_holder_ttl_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("HOLDER_TTL", "0.2")
    with pytest.raises(ValueError, match="HOLDER_TTL"):
        holders.holder_ttl()


def test_a_beat_lock_timeout_below_ten_seconds_is_refused_naming_the_variable(monkeypatch):
    from app.config.settings import Settings

    monkeypatch.setenv("BEAT_LOCK_TIMEOUT", "5")
    with pytest.raises(ValueError, match="BEAT_LOCK_TIMEOUT"):
        Settings.from_env()
