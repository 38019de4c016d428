"""Per-process runtime of a worker: the reconcile :class:`~app.reconcile.Context`, built lazily.

Built on first use in each process (after Celery's fork), so no connection or SSH session
is shared between prefork children.
"""

from __future__ import annotations

import os
import threading

import redis as redis_lib

from app.kube import Kube
from app.reconcile import Context, Ref
from app.settings import Settings
from app.wiring import load_registry

_lock = threading.Lock()
_ctx: Context | None = None
_pid: int | None = None


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
                kube=Kube(),
                registry=load_registry(settings.providers_config),
                # timeouts: a Redis gone silent fails a call instead of hanging the task or the watcher
                redis=redis_lib.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=10,
                                               socket_connect_timeout=5, socket_keepalive=True),
                settings=settings,
                retire=_queue_retire,
            )
            _pid = os.getpid()
        return _ctx


#: Name of the task that deletes a replaced instance on its own queue (``workers.tasks``).
RETIRE_TASK = "instance.retire"


def _queue_retire(provider_name: str, provider_id: str, ref: Ref) -> None:
    """Queue the deletion of a replaced instance on the queue of the place it lives in.

    Sent by name, so building a context never imports the task module.
    """
    from workers import routing
    from workers.celery_app import celery_app

    try:
        queue = routing.queue_for_instance(context().registry.get(provider_name), provider_id)
    except Exception:  # noqa: BLE001 - a provider no longer configured: the task says so in its log
        queue = routing.PROXIES
    celery_app.send_task(RETIRE_TASK, args=[provider_name, provider_id, ref.namespace, ref.name, ref.uid],
                         queue=queue)
