"""Per-process runtime of a worker: the reconcile :class:`~app.reconcile.Context`, built lazily.

Built on first use in each process (after Celery's fork), so no connection or SSH session
is shared between prefork children.
"""

from __future__ import annotations

import os
import threading

import redis as redis_lib

from app.kube import Kube
from app.reconcile import Context
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
                redis=redis_lib.Redis.from_url(settings.redis_url, decode_responses=True),
                settings=settings,
            )
            _pid = os.getpid()
        return _ctx
