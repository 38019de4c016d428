"""The process's Kubernetes client: its configuration, one ``ApiClient`` per process, and the
typed API groups over it that every per-resource part of the gateway uses.

:func:`api_client` loads ``KUBECONFIG`` (or ``~/.kube/config``) when present, else the
in-cluster service account, once per process (a forked child builds its own).  The watcher's
stream and leader election and the kubernetes provider (injected by :mod:`app.wiring`) use the
same client.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, TypeVar, cast

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from app.lazy import per_process
from app.resources import GROUP, VERSION

T = TypeVar("T")

#: Seconds between two runs of the kubernetes client's credential refresh hook (see :func:`_refresh_at_most_every`).
REFRESH_HOOK_SECONDS = 1.0


def load_configuration() -> k8s.Configuration:
    """Return a client configuration from ``KUBECONFIG``/``~/.kube/config``, else in-cluster.

    Returns:
        the configuration, its credential refresh hook (when it has one) run at most every
        :data:`REFRESH_HOOK_SECONDS`.
    Raises:
        kubernetes.config.ConfigException: neither is available.
    """
    cfg = k8s.Configuration()
    kubeconfig = (os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")).split(os.pathsep)[0]
    if os.path.exists(kubeconfig):
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        k8s_config.load_incluster_config(client_configuration=cfg)
    if cfg.refresh_api_key_hook is not None:
        _refresh_at_most_every(cfg, REFRESH_HOOK_SECONDS)
    return cfg


def _refresh_at_most_every(cfg: k8s.Configuration, seconds: float) -> None:
    """Make the client's ``refresh_api_key_hook`` on ``cfg`` run at most once per ``seconds``.

    Args:
        cfg: a configuration whose loader installed a refresh hook.
        seconds: the least time between two runs of the hook.
    """
    # The loaders' hook runs before every request and re-reads every proxy variable of the
    # environment (about 1 ms of CPU a request); each run of the kubeconfig loader's hook
    # installs a new hook, which becomes the one wrapped.
    inner = cast(Callable[[Any], None], cfg.refresh_api_key_hook)
    last = float("-inf")

    def refresh(configuration: Any) -> None:
        nonlocal inner, last
        now = time.monotonic()
        if now - last < seconds:
            return
        last = now
        inner(configuration)
        again = configuration.refresh_api_key_hook
        if again is not refresh and again is not None:
            inner = again
            configuration.refresh_api_key_hook = refresh

    cfg.refresh_api_key_hook = cast(Any, refresh)


@per_process
def api_client() -> k8s.ApiClient:
    """Return this process's :class:`kubernetes.client.ApiClient`, created on first use.

    A forked child (Celery prefork) gets its own client: connection pools must not be
    shared across ``fork`` (:func:`app.lazy.per_process`).

    Raises:
        kubernetes.config.ConfigException: no kubeconfig and not in a cluster.
    """
    return k8s.ApiClient(load_configuration())


def reply(obj: object) -> dict[str, Any]:
    """Type a custom-object call's reply as the parsed JSON object the client returns.

    Args:
        obj: what a ``CustomObjectsApi`` method returned (a ``dict``; the client types it ``object``).
    Returns:
        ``obj`` itself.
    """
    return cast("dict[str, Any]", obj)


def or_none(call: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Return ``call(*args, **kwargs)``, or ``None`` when the API answers 404 Not Found.

    Args:
        call: a client method reading one object.
        args / kwargs: its arguments.
    Returns:
        what ``call`` returned; ``None`` on 404.
    Raises:
        kubernetes.client.ApiException: any other status.
    """
    try:
        return call(*args, **kwargs)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def existed(call: Callable[..., object], *args: Any, **kwargs: Any) -> bool:
    """Run ``call(*args, **kwargs)`` (a delete); return ``False`` when the API answers 404 Not Found.

    Args:
        call: a client method deleting one object.
        args / kwargs: its arguments.
    Returns:
        ``True`` when the object existed.
    Raises:
        kubernetes.client.ApiException: any other status.
    """
    try:
        call(*args, **kwargs)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


class ApiGroups:
    """The ``CustomObjectsApi`` and ``CoreV1Api`` over one ``ApiClient``, rebuilt when it changes.

    The base of every per-resource part of :class:`app.kube.gateway.KubernetesGateway`.

    Args:
        client: a :class:`kubernetes.client.ApiClient`; default: this process's
            (:func:`api_client`, looked up on every call, so an object made before a fork is
            still safe to use after it).
    """

    def __init__(self, client: k8s.ApiClient | None = None) -> None:
        self._fixed = client
        self._apis: tuple[k8s.ApiClient, k8s.CustomObjectsApi, k8s.CoreV1Api] | None = None

    @property
    def client(self) -> k8s.ApiClient:
        """The :class:`kubernetes.client.ApiClient` used now."""
        return self._fixed or api_client()

    def _api(self) -> tuple[k8s.CustomObjectsApi, k8s.CoreV1Api]:
        client = self.client
        apis = self._apis
        if apis is None or apis[0] is not client:
            apis = self._apis = (client, k8s.CustomObjectsApi(client), k8s.CoreV1Api(client))
        return apis[1], apis[2]

    def read_namespaced(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return the operator's custom object ``namespace/name`` of ``plural`` as parsed JSON.

        Args:
            plural: the resource (``proxies``, ``proxypools``).
            namespace / name: the object.
        Returns:
            the object; ``None`` when it does not exist (404).
        Raises:
            kubernetes.client.ApiException: any other status.
        """
        obj = or_none(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name)
        return None if obj is None else reply(obj)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        """``CustomObjectsApi`` on :attr:`client`."""
        return self._api()[0]

    @property
    def core(self) -> k8s.CoreV1Api:
        """``CoreV1Api`` on :attr:`client`."""
        return self._api()[1]


__all__ = ["REFRESH_HOOK_SECONDS", "ApiGroups", "api_client", "existed", "load_configuration", "or_none", "reply"]
