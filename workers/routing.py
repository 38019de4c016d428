"""Celery's default routing by task name.

Queue names and routing by Proxy, provider and host live in :mod:`app.dispatch.proxies` (every task
that touches KVM host H of provider P runs on ``kvm.P.H``): the dispatcher knows the Proxy when
it enqueues and passes the queue explicitly; :func:`route_task` only supplies defaults by task
name.
"""

from __future__ import annotations

from app.store.queues import GC, HEALTH, PROXIES

_DEFAULTS = {"health.": HEALTH, "gc.": GC, "proxy.resync": GC}


def route_task(name, args, kwargs, options, task=None, **kw):
    """Celery router: default queue by task-name prefix when the caller gave none."""
    for prefix, queue in _DEFAULTS.items():
        if name.startswith(prefix):
            return {"queue": queue}
    return None


__all__ = ["GC", "HEALTH", "PROXIES", "route_task"]
