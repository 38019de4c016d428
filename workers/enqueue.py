"""Sending reconcile tasks: references only, de-duplicated in Redis.

Payloads are ``(namespace, name, uid, attempt)``: never a spec, user-data, token or key
(Flower shows task arguments).  A Redis key per (action, uid) holds the ETA of the message
already queued; a new request is sent only when none is queued or it would run earlier, so
a burst of watch events or a resync that overlaps a pending retry sends one message.  The
task clears the key when it starts, so a change seen while it runs queues another pass.
"""

from __future__ import annotations

import logging
import time

from app.reconcile import Ref

log = logging.getLogger(__name__)

TASKS = {"create": "proxy.create", "poll": "proxy.poll", "delete": "proxy.delete"}

_CLAIM = """
local cur = redis.call('GET', KEYS[1])
if cur and (ARGV[3] == 'idle' or tonumber(cur) <= tonumber(ARGV[1]) + 1) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


def dedup_key(action: str, uid: str) -> str:
    """Return the Redis key marking a queued ``action`` for Proxy ``uid``."""
    return f"po:queued:{action}:{uid}"


class Enqueuer:
    """Sends ``proxy.create/poll/delete`` tasks.

    Args:
        celery_app: the Celery app.
        redis: ``redis.Redis`` for de-duplication.
        stale_after: seconds after which a dedup mark is ignored even if never cleared (a lost
            message must not block work forever).
    """

    def __init__(self, celery_app, redis, stale_after: float = 300.0) -> None:
        self.app, self.redis, self.stale_after = celery_app, redis, stale_after
        self._claim = redis.register_script(_CLAIM)

    def send(self, action: str, ref: Ref, *, queue: str, delay: float = 0.0, attempt: int = 0,
             only_if_idle: bool = False) -> bool:
        """Queue ``action`` for ``ref`` on ``queue`` after ``delay`` seconds.

        Args:
            only_if_idle: send only when no message for this action is queued at all (the
                resync uses this, so it never cuts a scheduled backoff short); by default a
                message is also sent when it would run earlier than the queued one.
        Returns:
            whether a message was sent.
        Raises:
            redis.RedisError / kombu.exceptions.OperationalError: Redis or the broker is
                unreachable; the de-duplication mark is then released (best effort), so a
                retry or the resync sends the message instead of finding it "already queued".
        """
        eta = time.time() + max(0.0, delay)
        ttl_ms = int((max(0.0, delay) + self.stale_after) * 1000)
        mode = "idle" if only_if_idle else "earlier"
        key = dedup_key(action, ref.uid)
        if not self._claim(keys=[key], args=[f"{eta:.3f}", ttl_ms, mode]):
            return False
        options = {"queue": queue}
        if delay > 0:
            options["countdown"] = delay
        try:
            self.app.send_task(TASKS[action], args=[ref.namespace, ref.name, ref.uid, attempt], **options)
        except Exception:
            try:
                self.redis.delete(key)
            except Exception:  # noqa: BLE001 - Redis down too: the mark expires after stale_after
                pass
            raise
        log.debug("queued %s %s/%s on %s in %.1fs", action, ref.namespace, ref.name, queue, delay)
        return True

    def started(self, action: str, uid: str) -> None:
        """Clear the dedup mark of ``action`` for ``uid`` (called when the task starts)."""
        self.redis.delete(dedup_key(action, uid))


# -- recognising the events our own writes cause ----------------------------------------------
#
# Every status or finalizer write by a task makes the watcher receive a MODIFIED event.  Those
# events carry nothing new: the task already decided what comes next.  While a task works on a
# Proxy it is marked busy; an event arriving then is parked (its resourceVersion kept).  When
# the task ends it publishes the resourceVersions it wrote; parked events that are not among
# them are real changes and cause one more dispatch.  Events arriving after the task ended are
# skipped when their resourceVersion is one the task wrote.  Both sides are single Lua
# scripts, so no event falls between the checks.

_OBSERVE = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 'skip' end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return 'deferred'
end
return 'send'
"""

_FINISH = """
for i = 2, #ARGV do redis.call('SADD', KEYS[1], ARGV[i]) end
if #ARGV > 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
redis.call('DEL', KEYS[2])
local parked = redis.call('SMEMBERS', KEYS[3])
redis.call('DEL', KEYS[3])
local real = 0
for _, rv in ipairs(parked) do
  if redis.call('SISMEMBER', KEYS[1], rv) == 0 then real = real + 1 end
end
return real
"""


class OwnWrites:
    """Tells the watcher which Proxy events were caused by the operator's own writes.

    Args:
        redis: ``redis.Redis``.
        ttl: seconds the written resourceVersions and busy marks are kept.
    """

    def __init__(self, redis, ttl: float = 300.0) -> None:
        self.redis, self.ttl_ms = redis, int(ttl * 1000)
        self._observe = redis.register_script(_OBSERVE)
        self._finish = redis.register_script(_FINISH)

    @staticmethod
    def _keys(uid: str) -> list[str]:
        return [f"po:own:{uid}", f"po:busy:{uid}", f"po:parked:{uid}"]

    def park(self, uid: str, what: str) -> None:
        """Record that work for ``uid`` arrived while a task held its lock (re-checked at finish)."""
        pipe = self.redis.pipeline()
        pipe.sadd(f"po:parked:{uid}", what)
        pipe.pexpire(f"po:parked:{uid}", self.ttl_ms)
        pipe.execute()

    def begin(self, uid: str, ttl: float) -> None:
        """Mark a task as working on ``uid`` for at most ``ttl`` seconds."""
        self.redis.set(f"po:busy:{uid}", "1", px=int(ttl * 1000))

    def finish(self, uid: str, written: list[str]) -> bool:
        """Publish the resourceVersions the task wrote; return whether a parked event was a real change."""
        return bool(self._finish(keys=self._keys(uid), args=[self.ttl_ms, *written]))

    def observe(self, uid: str, resource_version: str) -> str:
        """Classify a watch event: ``"skip"`` (our own write), ``"deferred"`` (a task is busy) or ``"send"``."""
        result = self._observe(keys=self._keys(uid), args=[resource_version, self.ttl_ms])
        return result.decode() if isinstance(result, bytes) else result
