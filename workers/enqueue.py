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
if cur and tonumber(cur) <= tonumber(ARGV[1]) + 1 then return 0 end
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
             dedup: bool = True) -> bool:
        """Queue ``action`` for ``ref`` on ``queue`` after ``delay`` seconds.

        Returns:
            whether a message was sent (``False`` when an earlier one is already queued).
        """
        eta = time.time() + max(0.0, delay)
        if dedup:
            ttl_ms = int((max(0.0, delay) + self.stale_after) * 1000)
            if not self._claim(keys=[dedup_key(action, ref.uid)], args=[f"{eta:.3f}", ttl_ms]):
                return False
        options = {"queue": queue}
        if delay > 0:
            options["countdown"] = delay
        self.app.send_task(TASKS[action], args=[ref.namespace, ref.name, ref.uid, attempt], **options)
        log.debug("queued %s %s/%s on %s in %.1fs", action, ref.namespace, ref.name, queue, delay)
        return True

    def started(self, action: str, uid: str) -> None:
        """Clear the dedup mark of ``action`` for ``uid`` (called when the task starts)."""
        self.redis.delete(dedup_key(action, uid))
