"""ProxyPool objects through the gateway: get, list, the status and scale subresources.

The pool's members are Proxies (:mod:`app.kube.proxies`); its Events go through
:mod:`app.kube.events`.
"""

from __future__ import annotations

from typing import Protocol

from app.kube.client import ApiGroups, reply
from app.pools.model import Pool
from app.resources import GROUP, POOL_PLURAL, VERSION


class ProxyPoolApi(Protocol):
    """The gateway's ProxyPool objects (crawl.example.com/v1alpha1, namespaced)."""

    def get_pool(self, namespace: str, name: str) -> Pool | None:
        """The ProxyPool ``namespace/name``; ``None`` when it does not exist (404)."""

    def list_pools(self) -> list[Pool]:
        """Every ProxyPool in every namespace."""

    def patch_pool_status(self, pool: Pool, status: dict) -> Pool:
        """Merge-patch ``status`` through the status subresource (RFC 7386); the pool as written."""

    def scale_pool(self, pool: Pool, replicas: int) -> None:
        """Set ``spec.replicas`` through the scale subresource (a merge patch of the Scale)."""


class KubernetesProxyPools(ApiGroups):
    """:class:`ProxyPoolApi` over the ``kubernetes`` client (a part of :class:`app.kube.gateway.KubernetesGateway`)."""

    def get_pool(self, namespace: str, name: str) -> Pool | None:
        """Return the ProxyPool ``namespace/name``, ``None`` on 404 (any other status raises ``ApiException``)."""
        obj = self.read_namespaced(POOL_PLURAL, namespace, name)
        return None if obj is None else Pool.from_dict(obj)

    def list_pools(self) -> list[Pool]:
        """Return every ProxyPool in every namespace (one list call, cluster scope).

        Raises:
            kubernetes.client.ApiException: the list failed.
        """
        items = reply(self.custom.list_cluster_custom_object(GROUP, VERSION, POOL_PLURAL)).get("items") or []
        return [Pool.from_dict(o) for o in items]

    def patch_pool_status(self, pool: Pool, status: dict) -> Pool:
        """Merge-patch ``status`` of ``pool`` through the status subresource; return the pool as
        written.

        No resourceVersion precondition: the controller is the pool status's only writer, one
        pass per pool at a time.  Use :func:`app.kube.status_writer.write_pool`, which sends
        only what changed.

        Raises:
            kubernetes.client.ApiException: 404 (gone), others.
        """
        obj = self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, pool.namespace, POOL_PLURAL, pool.name, {"status": status})
        return Pool.from_dict(reply(obj))

    def scale_pool(self, pool: Pool, replicas: int) -> None:
        """Set ``spec.replicas`` of ``pool`` through its scale subresource (what ``kubectl scale``
        and the HPA write).

        Raises:
            kubernetes.client.ApiException: 404 (gone), others.
        """
        self.custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, pool.namespace, POOL_PLURAL, pool.name, {"spec": {"replicas": int(replicas)}})


__all__ = ["KubernetesProxyPools", "ProxyPoolApi"]
