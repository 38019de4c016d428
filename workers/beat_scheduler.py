"""Beat's scheduler: celery-redbeat's, made to ride out a Redis outage, restart or flush.

``celery -A workers beat -S workers.beat_scheduler.ResilientRedBeatScheduler``.

``redbeat.RedBeatScheduler`` keeps the schedule and an HA lock in Redis.  Left alone it ends
beat at the first Redis hiccup: its ``tick`` extends the lock and reads the schedule with no
error handling, so ``ConnectionError`` (Redis unreachable) or ``LockNotOwnedError`` (the lock
key vanished in a ``FLUSHALL`` or an empty restart) propagates out of Celery's beat loop and
the process exits.  And after a flush the schedule keys are gone, so even a restarted beat
would never find anything due again: redbeat writes them from code only at start-up.

:class:`ResilientRedBeatScheduler` keeps the process and redbeat's scheme, and adds:

* **Redis errors never end beat.**  A tick that meets one logs it, and the next tick comes
  after a capped exponential backoff (1 s doubling up to 5 s).
* **The lock is re-taken, never assumed.**  A lost lock (``LockError``/``LockNotOwnedError``
  from the extend, or no lock at all because Redis was down when beat started) turns this
  beat into a standby: each tick tries to take the lock without blocking and schedules nothing
  until it holds it again.  Two beats never schedule together for longer than one tick.
* **The schedule is re-seeded from code.**  The leader checks every tick that each entry of
  ``beat_schedule`` (``workers.beat``) still has its key and its place in the schedule; when one
  is missing it installs the schedule again (redbeat's own ``setup_schedule``: entries still
  present keep their ``last_run_at``) and makes the missing entries due at once, as entries
  that never ran: a flushed or emptied Redis gets a resync (which re-publishes the serving
  view) within a tick, not a resync period later.  Entries installed for the first time at
  start are due at once too, so the first provider-check round runs when beat starts.
* **Metrics** (served by workers/metrics_server.py on ``METRICS_BIND``):
  ``proxy_operator_beat_schedules_fired_total{entry}`` and ``proxy_operator_beat_lock_held``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis
from redbeat.decoder import RedBeatJSONEncoder, to_timestamp
from redbeat.schedulers import LUA_EXTEND_TO_SCRIPT, RedBeatScheduler, get_redis

from prometheus_client import Counter, Gauge
from app.backoff import capped_exponential
from app.errors import brief

# Beat's own metrics (docs/observability.md), defined here so only beat has them.
BEAT_FIRED = Counter("proxy_operator_beat_schedules_fired_total",
                     "Schedule entries beat sent as tasks, by entry name.", ["entry"])
BEAT_LOCK = Gauge("proxy_operator_beat_lock_held",
                  "1 while this beat holds the scheduler lock (it is the one scheduling), else 0.")

log = logging.getLogger("celery.beat")

#: First pause after a failed tick, seconds; doubles per consecutive failure up to
#: :data:`RETRY_MAX` (or ``max_interval`` if shorter), so beat notices a returned Redis soon.
RETRY_INITIAL = 1.0
RETRY_MAX = 5.0


class ResilientRedBeatScheduler(RedBeatScheduler):
    """``redbeat.RedBeatScheduler`` that survives Redis outages, restarts and flushes.

    Same constructor and settings as redbeat's (``redbeat_redis_url``, ``redbeat_key_prefix``,
    ``redbeat_lock_timeout``, ``beat_max_loop_interval``).  :meth:`tick` never raises a
    ``redis.RedisError``; it returns the seconds until the next tick.
    """

    lock: Any  # redbeat's scheduler lock (redis-py ``Lock``), ``None`` until taken
    _lock_lost = False
    _standby_logged = False
    _failures = 0
    _outage_logged = False

    # -- start-up --------------------------------------------------------------------------
    def setup_schedule(self):
        """Install ``beat_schedule`` into Redis (redbeat's), or leave it to the first tick
        that reaches Redis when it is unreachable now (beat starts anyway).

        Entries installed for the first time are due at once (redbeat would first run them one
        period later: Celery's ``ScheduleEntry`` starts ``last_run_at`` at now), so the first
        provider-check round, resync and sweeps run when the fleet starts; entries already in
        Redis keep their ``last_run_at``.
        """
        try:
            missing = self._missing_entries()
            super().setup_schedule()
            self._due_now(missing)
        except redis.RedisError as exc:
            log.warning("beat: cannot install the schedule now (Redis: %s); installing it when Redis answers",
                        brief(exc))

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        """Send ``entry``'s task (Celery's) and count it in ``proxy_operator_beat_schedules_fired_total``."""
        result = super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        BEAT_FIRED.labels(entry.name).inc()
        return result

    # -- the loop --------------------------------------------------------------------------
    def tick(self, min=min, **kwargs):
        """One pass: hold the lock, make sure the schedule is in Redis, send what is due.

        Returns:
            seconds until the next tick: redbeat's answer when the pass ran; the standby
            period (``max_interval``) while another beat holds the lock; a capped exponential
            backoff after a Redis error; almost nothing after re-taking a lost lock.
        """
        try:
            if self.lock_key and not self._hold_lock():
                self._redis_ok()
                return self.max_interval
            self._ensure_schedule()
            interval = super().tick(min=min, **kwargs)
        except redis.exceptions.LockError as exc:  # LockNotOwnedError included
            self._lock_lost = True
            BEAT_LOCK.set(0)
            log.warning("beat: lost the scheduler lock (%s); standing by until this beat holds it again",
                        brief(exc))
            return self._after_lock_loss()
        except redis.RedisError as exc:
            return self._redis_failed(exc)
        self._redis_ok()
        return interval

    def _after_lock_loss(self) -> float:
        """Try to take the lock back at once (it is free after a flush or an empty restart):
        tick again now if that worked, else stand by."""
        try:
            held = self._hold_lock()
        except redis.RedisError as exc:
            return self._redis_failed(exc)
        self._redis_ok()
        return 0.01 if held else self.max_interval

    def _hold_lock(self) -> bool:
        """Whether this beat holds the lock; takes it (without blocking) when it does not."""
        if self.lock is not None and not self._lock_lost:
            BEAT_LOCK.set(1)
            return True  # redbeat's tick extends it, and raises if it was lost meanwhile
        if self.lock is None:
            # Redis was unreachable when beat started (redbeat's beat_init hook gave up).
            self.lock = self._new_lock()
            self._lock_lost = True  # not held until acquired
        if not self.lock.acquire(blocking=False):
            BEAT_LOCK.set(0)
            if not self._standby_logged:
                self._standby_logged = True
                log.info("beat: another beat holds the scheduler lock; standing by")
            return False
        self._lock_lost = self._standby_logged = False
        BEAT_LOCK.set(1)
        log.info("beat: acquired the scheduler lock")
        return True

    def _new_lock(self):
        """The lock redbeat's ``beat_init`` hook makes (same key, timeout and extend script)."""
        client = get_redis(self.app)
        lock = client.lock(self.lock_key, timeout=self.lock_timeout, sleep=self.max_interval)
        lock.lua_extend = client.register_script(LUA_EXTEND_TO_SCRIPT)
        return lock

    def _missing_entries(self) -> list[str]:
        """Names of ``beat_schedule`` entries whose key or score is missing from Redis."""
        names = list(self.app.redbeat_conf.schedule)
        if not names:
            return []
        client = get_redis(self.app)
        schedule_key = self.app.redbeat_conf.schedule_key
        with client.pipeline(transaction=False) as pipe:
            for name in names:
                key = self.Entry.generate_key(self.app, name)
                pipe.exists(key)
                pipe.zscore(schedule_key, key)
            found = pipe.execute()
        return [name for name, exists, score in zip(names, found[::2], found[1::2], strict=True)
                if not exists or score is None]

    def _ensure_schedule(self) -> None:
        """Re-seed the schedule from ``beat_schedule`` if any entry's key or score is missing."""
        missing = self._missing_entries()
        if not missing:
            return
        log.warning("beat: schedule entries missing from Redis (%s); re-installing the schedule from code",
                    ", ".join(sorted(missing)))
        super().setup_schedule()
        self._due_now(missing)

    def _due_now(self, missing: list[str]) -> None:
        """Make the (just installed) entries ``missing`` due now."""
        if not missing:
            return
        client = get_redis(self.app)
        schedule_key = self.app.redbeat_conf.schedule_key
        # A (re-)created entry would first run one period from now; make it due now, the way
        # redbeat treats an entry that never ran (last_run_at null, scored now).
        now = to_timestamp(self.app.now())
        with client.pipeline(transaction=False) as pipe:
            for name in missing:
                key = self.Entry.generate_key(self.app, name)
                pipe.hset(key, "meta", json.dumps({"last_run_at": None}, cls=RedBeatJSONEncoder))
                pipe.zadd(schedule_key, {key: now})
            pipe.execute()

    # -- failures --------------------------------------------------------------------------
    def _retry_in(self) -> float:
        """The next backoff: 1 s doubling per consecutive failure, capped at ``max_interval``."""
        delay = capped_exponential(self._failures, RETRY_INITIAL, min(float(self.max_interval), RETRY_MAX))
        self._failures += 1
        return delay

    def _redis_failed(self, exc: redis.RedisError) -> float:
        delay = self._retry_in()
        if not self._outage_logged:
            log.warning("beat: Redis unavailable (%s); nothing is scheduled until it answers, retrying",
                        brief(exc))
            self._outage_logged = True
        else:
            log.debug("beat: Redis still unavailable (%s); next try in %.1fs", brief(exc), delay)
        return delay

    def _redis_ok(self) -> None:
        if self._outage_logged:
            log.info("beat: Redis answers again")
        self._outage_logged = False
        self._failures = 0

    # -- shutdown --------------------------------------------------------------------------
    def close(self):
        """Release the lock if held (redbeat's), even when Redis is unreachable at shutdown."""
        try:
            super().close()
        except redis.RedisError as exc:
            log.warning("beat: could not release the scheduler lock (%s); it expires by itself",
                        brief(exc))
            self.lock = None


__all__ = ["ResilientRedBeatScheduler"]
