"""The watcher's event handler: turns Proxy events into de-duplicated Celery tasks."""

from __future__ import annotations

import logging

from app import serving
from app.reconcile import LIVE_PHASES
from app.resources import Proxy

log = logging.getLogger(__name__)


def make_on_event():
    """Return ``on_event(event_type, obj)`` for :func:`watchers.main.run`.

    ``DELETED`` events need nothing (the finalizer guarantees we saw the deletion earlier).
    Events caused by the operator's own writes are skipped (see
    :class:`workers.enqueue.OwnWrites`); every other event queues what
    :func:`app.reconcile.decide` says the Proxy needs.  ``SYNC`` items from a (re)list are
    always dispatched.

    ``on_event`` raises ``redis.RedisError`` or ``kombu.exceptions.OperationalError`` while
    Redis is unreachable; the watcher's :class:`watchers.handoff.Handoff` retries the event.
    """
    from workers.tasks import context, dispatch, enqueuer, own_writes

    def on_event(event_type: str, obj: dict) -> None:
        if event_type == "DELETED":
            return
        try:
            proxy = Proxy.from_dict(obj)
        except ValueError as exc:
            log.warning("ignoring malformed Proxy event: %s", exc)
            return
        if event_type != "SYNC":
            verdict = own_writes().observe(proxy.uid, proxy.resource_version)
            if verdict != "send":
                log.debug("%s %s rv=%s: %s", event_type, proxy.key, proxy.resource_version, verdict)
                return
        ctx = context()
        action = dispatch(ctx, enqueuer(), proxy)
        if action is None and proxy.phase in LIVE_PHASES:
            # Labels, maxLeases and healthCheck change what the API hands out, not the instance.
            serving.refresh(ctx.redis, proxy)
        log.debug("%s %s -> %s", event_type, proxy.key, action)

    return on_event
