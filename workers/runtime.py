"""Per-process runtime of a worker: the reconcile :class:`~app.reconcile.Context` and the
:class:`~app.dispatch.Dispatcher`, built lazily.

Built on first use in each process (after Celery's fork; :func:`app.lazy.per_process`), so no
connection or SSH session is shared between prefork children.
"""

from __future__ import annotations

import redis as redis_lib

from app.dispatch import RETIRE_TASK, Dispatcher
from app.pools.dispatch import PoolDispatcher
from app.kube import KubernetesGateway
from app.lazy import per_process
from app.reconcile import Context, Ref
from app.settings import Settings
from app.wiring import load_registry, router


@per_process
def context() -> Context:
    """Return this process's reconcile context (config loaded and validated on first use).

    Raises:
        app.validation.ConfigError: the providers config is invalid.
    """
    settings = Settings.from_env()
    return Context(
        kube=KubernetesGateway(),  # records its writes: the tasks publish them (OwnWrites)
        registry=load_registry(settings.providers_config),
        # timeouts: a Redis gone silent fails a call instead of hanging the task or the watcher
        redis=redis_lib.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=10,
                                       socket_connect_timeout=5, socket_keepalive=True),
        settings=settings,
        retire=_queue_retire,
    )


@per_process
def dispatcher() -> Dispatcher:
    """Return this process's :class:`~app.dispatch.Dispatcher` (shares the context's Redis client).

    It publishes through ``workers.celery_app.send`` and routes from the providers config of
    the context's registry.

    Raises:
        app.validation.ConfigError: the providers config is invalid (building the context).
    """
    from workers.celery_app import send

    ctx = context()
    return Dispatcher(ctx.redis, router(ctx.registry.configs.values()), send)


@per_process
def pool_dispatcher() -> PoolDispatcher:
    """Return this process's :class:`~app.pools.dispatch.PoolDispatcher` (the context's Redis,
    publishing through ``workers.celery_app.send``).

    Raises:
        app.validation.ConfigError: the providers config is invalid (building the context).
    """
    from workers.celery_app import send

    return PoolDispatcher(context().redis, send)


def _queue_retire(provider_name: str, provider_id: str, ref: Ref) -> None:
    """Queue the deletion of a replaced instance on the queue of the place it lives in.

    Sent by name (task :data:`~app.dispatch.RETIRE_TASK`), so building a context never imports
    the task module.
    """
    dispatcher().retire(provider_name, provider_id, ref)


__all__ = ["RETIRE_TASK", "context", "dispatcher", "pool_dispatcher"]
