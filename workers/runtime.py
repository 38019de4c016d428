"""Per-process runtime of a worker: the reconcile :class:`~app.proxy.reconcile.Context` and the
:class:`~app.dispatch.proxies.Dispatcher`, built lazily.

Built on first use in each process (after Celery's fork; :func:`app.lazy.per_process`), so no
connection or SSH session is shared between prefork children.
"""

from __future__ import annotations

from app.dispatch.proxies import RETIRE_TASK, Dispatcher
from app.dispatch.pools import PoolDispatcher
from app.kube.gateway import KubernetesGateway
from app.lazy import per_process
from app.proxy.reconcile import Context, Ref
from app.store.client import client_from_url
from app.config.settings import Settings
from app.wiring import build_registry, load_config, router


@per_process
def context() -> Context:
    """Return this process's reconcile context (config loaded and validated on first use).

    Raises:
        app.config.validation.ConfigError: the providers config is invalid.
    """
    settings = Settings.from_env()
    config = load_config(settings.providers_config)
    return Context(
        kube=KubernetesGateway(),  # records its writes: the tasks publish them (OwnWrites)
        registry=build_registry(config),
        tenancy=config.tenancy,
        # timeouts: a Redis gone silent fails a call instead of hanging the task or the watcher
        redis=client_from_url(settings.redis_url, decode_responses=True, socket_timeout=10,
                                  socket_connect_timeout=5, socket_keepalive=True),
        settings=settings,
        retire=_queue_retire,
    )


@per_process
def dispatcher() -> Dispatcher:
    """Return this process's :class:`~app.dispatch.proxies.Dispatcher` (shares the context's Redis client).

    It publishes through ``workers.celery_app.send`` and routes from the providers config of
    the context's registry.

    Raises:
        app.config.validation.ConfigError: the providers config is invalid (building the context).
    """
    from workers.celery_app import send

    ctx = context()
    return Dispatcher(ctx.redis, router(ctx.registry.configs.values()), send)


@per_process
def pool_dispatcher() -> PoolDispatcher:
    """Return this process's :class:`~app.dispatch.pools.PoolDispatcher` (the context's Redis,
    publishing through ``workers.celery_app.send``).

    Raises:
        app.config.validation.ConfigError: the providers config is invalid (building the context).
    """
    from workers.celery_app import send

    return PoolDispatcher(context().redis, send)


def preload() -> None:
    """Import, in a worker's main process before it forks its pool, what every task needs.

    Without it each prefork child imports on its first task the ``kubernetes`` client's API
    classes (``CoreV1Api`` alone pulls in some 250 pydantic models: about 1 s of CPU), the
    providers' modules and SDKs and Celery's publishing side: all children at once, right when
    the first messages arrive, so the first seconds of work queued behind them (docs/performance.md,
    "Pipeline").  Imported once in the parent, they are shared by every child (copy on write).

    No connection or thread is made here (each child builds its own clients, :func:`context`):
    the unconfigured API client the validators are built with and the registry built to import
    the providers' modules are dropped (constructors never dial).  Never raises: whatever fails
    here fails again, with its message, on the first task that needs it.
    """
    import logging

    try:
        from kubernetes import client as k8s

        # The client's lazy imports, and the argument validator pydantic builds for an API method
        # on its first call (about 15 ms each): a call without arguments builds it and fails
        # validation before anything is sent.  The methods of the reconcile steps and probes.
        unbound = k8s.ApiClient(k8s.Configuration())
        for api, methods in ((k8s.CustomObjectsApi, PRELOADED_CUSTOM), (k8s.CoreV1Api, PRELOADED_CORE)):
            instance = api(unbound)
            for method in methods:
                try:
                    getattr(instance, method)()
                except Exception:  # noqa: BLE001 - pydantic's ValidationError, as intended
                    pass
        from workers.celery_app import celery_app

        celery_app.amqp, celery_app.backend  # noqa: B018 - the publishing side (task messages, followups)
        build_registry(load_config(Settings.from_env().providers_config))
    except Exception as exc:  # noqa: BLE001 - see the docstring
        logging.getLogger(__name__).debug("preload: %s: %s", type(exc).__name__, exc)


#: ``CustomObjectsApi`` and ``CoreV1Api`` methods whose validators :func:`preload` builds.
PRELOADED_CUSTOM = ("get_namespaced_custom_object", "patch_namespaced_custom_object",
                    "patch_namespaced_custom_object_status", "list_cluster_custom_object")
PRELOADED_CORE = ("create_namespaced_pod", "read_namespaced_pod", "delete_namespaced_pod", "patch_namespaced_pod",
                  "create_namespaced_event", "read_namespaced_secret", "create_namespaced_secret")


def _queue_retire(provider_name: str, provider_id: str, ref: Ref) -> None:
    """Queue the deletion of a replaced instance on the queue of the place it lives in.

    Sent by name (task :data:`~app.dispatch.proxies.RETIRE_TASK`), so building a context never imports
    the task module.
    """
    dispatcher().retire(provider_name, provider_id, ref)


__all__ = ["RETIRE_TASK", "context", "dispatcher", "pool_dispatcher", "preload"]
