"""Kubernetes API access for the operator (the official ``kubernetes`` client).

:func:`api_client` loads ``KUBECONFIG`` (or ``~/.kube/config``) when present, else the
in-cluster service account.  The other functions read and write Proxy objects through the
custom-objects API; status always goes through the status subresource
(``patch_namespaced_custom_object_status``) as a JSON merge patch, which is the only patch
type the client sends for custom objects.
"""

from __future__ import annotations

import os
import threading

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from app.resources import GROUP, PLURAL, VERSION

_lock = threading.Lock()
_client: k8s.ApiClient | None = None


def load_configuration() -> k8s.Configuration:
    """Return a client configuration from ``KUBECONFIG``/``~/.kube/config``, else in-cluster.

    Raises:
        kubernetes.config.ConfigException: neither is available.
    """
    cfg = k8s.Configuration()
    kubeconfig = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if os.path.exists(kubeconfig.split(os.pathsep)[0]):
        k8s_config.load_kube_config(config_file=kubeconfig.split(os.pathsep)[0], client_configuration=cfg)
    else:
        k8s_config.load_incluster_config(client_configuration=cfg)
    return cfg


def api_client() -> k8s.ApiClient:
    """Return the process-wide :class:`kubernetes.client.ApiClient` (created on first use).

    After ``fork`` (Celery prefork) call :func:`reset` so each child builds its own pool.
    """
    global _client
    with _lock:
        if _client is None:
            _client = k8s.ApiClient(load_configuration())
        return _client


def reset() -> None:
    """Forget the process-wide client (call in a forked child)."""
    global _client
    with _lock:
        _client = None


def custom_objects() -> k8s.CustomObjectsApi:
    """Return a CustomObjectsApi bound to :func:`api_client`."""
    return k8s.CustomObjectsApi(api_client())


def get_proxy(namespace: str, name: str) -> dict | None:
    """Return the Proxy ``namespace/name`` as a dict, or ``None`` when it does not exist.

    Raises:
        kubernetes.client.ApiException: any error other than 404.
    """
    try:
        return custom_objects().get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def list_proxies() -> dict:
    """Return the cluster-wide Proxy list (``{"items": [...], "metadata": {"resourceVersion": ...}}``)."""
    return custom_objects().list_cluster_custom_object(GROUP, VERSION, PLURAL)


def patch_proxy(namespace: str, name: str, patch: dict) -> dict:
    """Merge-patch the Proxy's main resource (metadata/spec) and return the result."""
    return custom_objects().patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)


def patch_proxy_status(namespace: str, name: str, status: dict) -> dict:
    """Merge-patch ``status`` through the status subresource and return the result."""
    return custom_objects().patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status})
