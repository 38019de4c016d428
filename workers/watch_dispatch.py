"""The watcher's event handler: turns Proxy events into de-duplicated Celery tasks."""

from __future__ import annotations

import logging

from app.resources import Proxy

log = logging.getLogger(__name__)


def make_on_event():
    """Return ``on_event(event_type, obj)`` for :func:`watchers.main.run`.

    ``DELETED`` events need nothing (the finalizer guarantees we saw the deletion earlier);
    every other event queues what :func:`app.reconcile.decide` says the Proxy needs.
    """
    from workers.tasks import context, dispatch, enqueuer

    def on_event(event_type: str, obj: dict) -> None:
        if event_type == "DELETED":
            return
        try:
            proxy = Proxy.from_dict(obj)
        except ValueError as exc:
            log.warning("ignoring malformed Proxy event: %s", exc)
            return
        action = dispatch(context(), enqueuer(), proxy)
        log.debug("%s %s -> %s", event_type, proxy.key, action)

    return on_event
