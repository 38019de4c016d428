"""Per-process runtime of a worker: the reconcile :class:`~app.reconcile.Context` and the
:class:`~app.dispatch.Dispatcher`, built lazily.

Built on first use in each process (after Celery's fork), so no connection or SSH session
is shared between prefork children.
"""

from __future__ import annotations

import os
import threading

import redis as redis_lib

from app.dispatch import RETIRE_TASK, Dispatcher
from app.kube import KubernetesGateway
from app.reconcile import Context, Ref
from app.settings import Settings
from app.wiring import load_registry, router

_lock = threading.Lock()
_ctx: Context | None = None
_pid: int | None = None
_dispatcher: Dispatcher | None = None


def context() -> Context:
    """Return this process's reconcile context (config loaded and validated on first use).

    Raises:
        app.validation.ConfigError: the providers config is invalid.
    """
    global _ctx, _pid
    with _lock:
        if _ctx is None or _pid != os.getpid():
            settings = Settings.from_env()
            _ctx = Context(
                kube=KubernetesGateway(),  # records its writes: the tasks publish them (OwnWrites)
                registry=load_registry(settings.providers_config),
                # timeouts: a Redis gone silent fails a call instead of hanging the task or the watcher
                redis=redis_lib.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=10,
                                               socket_connect_timeout=5, socket_keepalive=True),
                settings=settings,
                retire=_queue_retire,
            )
            _pid = os.getpid()
        return _ctx


def dispatcher() -> Dispatcher:
    """Return this process's :class:`~app.dispatch.Dispatcher` (shares the context's Redis client).

    It publishes through ``workers.celery_app.send`` and routes from the providers config of
    the context's registry.

    Raises:
        app.validation.ConfigError: the providers config is invalid (building the context).
    """
    global _dispatcher
    ctx = context()
    with _lock:
        if _dispatcher is None or _dispatcher.redis is not ctx.redis:
            from workers.celery_app import send

            _dispatcher = Dispatcher(ctx.redis, router(ctx.registry.configs.values()), send)
        return _dispatcher


def _queue_retire(provider_name: str, provider_id: str, ref: Ref) -> None:
    """Queue the deletion of a replaced instance on the queue of the place it lives in.

    Sent by name (task :data:`~app.dispatch.RETIRE_TASK`), so building a context never imports
    the task module.
    """
    dispatcher().retire(provider_name, provider_id, ref)


__all__ = ["RETIRE_TASK", "context", "dispatcher"]
