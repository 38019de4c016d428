"""The one gateway to the Kubernetes API: :class:`KubeGateway` and :class:`KubernetesGateway`.

:class:`KubeGateway` is every read and write the product makes through the API, composed of one
small protocol per resource kind: Proxies (:mod:`app.kube.proxies`), ProxyPools
(:mod:`app.kube.proxypools`), Events (:mod:`app.kube.events`), Secrets (:mod:`app.kube.secrets`)
and ProviderHealth objects (:mod:`app.kube.provider_health`).  :class:`KubernetesGateway`
implements it over the official ``kubernetes`` client, one process-wide client
(:func:`app.kube.client.api_client`).  Callers get typed values, never the client's dicts or
models.  API errors other than the ones a method documents as handled propagate as
:class:`kubernetes.client.ApiException` with the HTTP status (in-memory fakes raise that type too).

Custom objects are written with JSON merge patches (RFC 7386), status only through the status
subresource.  *What* a status write contains is decided by :mod:`app.kube.status_writer`; who
may use a Secret by :mod:`app.kube.credentials`.  The watcher's stream and leader election use
the client directly; this package imports no provider.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from kubernetes import client as k8s

from app.kube.client import api_client, load_configuration
from app.kube.events import EventApi, KubernetesEvents
from app.kube.owners import OwnerReference
from app.kube.provider_health import KubernetesProviderHealth, ProviderHealthApi, ProviderHealthObject
from app.kube.proxies import KubernetesProxies, ProxyApi
from app.kube.proxypools import KubernetesProxyPools, ProxyPoolApi
from app.kube.secrets import KubernetesSecrets, Secret, SecretApi


@runtime_checkable
class KubeGateway(ProxyApi, ProxyPoolApi, EventApi, SecretApi, ProviderHealthApi, Protocol):
    """Every Kubernetes API operation the operator makes (see the module docstring).

    Errors: :class:`kubernetes.client.ApiException` with the HTTP status, for anything a
    method does not document as handled (409 Conflict on a stale ``resourceVersion``, 404 on a
    write to an object that is gone, 5xx ...).
    """


class KubernetesGateway(KubernetesProxies, KubernetesProxyPools, KubernetesEvents, KubernetesSecrets,
                        KubernetesProviderHealth):
    """:class:`KubeGateway` over the official ``kubernetes`` client.

    Args:
        client: a :class:`kubernetes.client.ApiClient`; default: this process's
            (:func:`api_client`, looked up on every call, so a gateway made before a fork is
            still safe to use after it).
        record_writes: remember the resourceVersion of every Proxy write per thread, for
            :meth:`take_written` (the reconcile tasks publish them so the watcher drops the events
            its own writes cause).  Off for a writer nobody takes them from (the health engine).
    """

    def __init__(self, client: k8s.ApiClient | None = None, *, record_writes: bool = True) -> None:
        super().__init__(client, record_writes=record_writes)


__all__ = ["KubeGateway", "KubernetesGateway", "OwnerReference", "ProviderHealthObject", "Secret",
           "api_client", "load_configuration"]
