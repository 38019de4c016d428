"""ProviderHealth objects (cluster-scoped, deploy/crd/providerhealth.yaml) through the gateway.

What they say is decided by :mod:`app.providers.checks`; this module only reads and writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from app.kube.client import ApiGroups, existed, or_none, reply
from app.resources import GROUP, PROVIDER_HEALTH_KIND, PROVIDER_HEALTH_PLURAL, VERSION


@dataclass(frozen=True)
class ProviderHealthObject:
    """A cluster-scoped ``ProviderHealth`` object (deploy/crd/providerhealth.yaml).

    Attributes:
        name: the provider's name.
        generation: ``metadata.generation``.
        labels: ``metadata.labels``.
        status: the ``status`` dict (``{}`` when absent): conditions, targets, counts.
    """

    name: str
    generation: int
    labels: dict[str, str]
    status: dict[str, Any]

    @classmethod
    def from_dict(cls, obj: dict) -> "ProviderHealthObject":
        """Build from the object as the API returns it.

        Args:
            obj: the parsed JSON object.
        Returns:
            the object (generation 1 and empty labels and status when absent).
        """
        meta = obj.get("metadata") or {}
        return cls(name=meta.get("name", ""), generation=int(meta.get("generation") or 1),
                   labels=dict(meta.get("labels") or {}), status=dict(obj.get("status") or {}))


class ProviderHealthApi(Protocol):
    """The gateway's ProviderHealth objects (crawl.example.com/v1alpha1, cluster-scoped)."""

    def get_provider_health(self, name: str) -> ProviderHealthObject | None:
        """The ProviderHealth ``name``; ``None`` when it does not exist."""

    def create_provider_health(self, name: str, labels: dict[str, str]) -> ProviderHealthObject:
        """Create an empty ProviderHealth ``name`` with ``labels``."""

    def patch_provider_health_status(self, name: str, status: dict) -> ProviderHealthObject:
        """Merge-patch ``status`` through the status subresource (RFC 7386)."""

    def list_provider_health(self, label_selector: str | None = None) -> list[ProviderHealthObject]:
        """Every ProviderHealth (matching ``label_selector`` when given)."""

    def delete_provider_health(self, name: str) -> bool:
        """Delete the ProviderHealth ``name``; ``False`` when it did not exist."""


class KubernetesProviderHealth(ApiGroups):
    """:class:`ProviderHealthApi` over the ``kubernetes`` client (a part of
    :class:`app.kube.gateway.KubernetesGateway`)."""

    def get_provider_health(self, name: str) -> ProviderHealthObject | None:
        """Return the ProviderHealth ``name``, or ``None`` when it does not exist (404).

        Raises:
            kubernetes.client.ApiException: any status but 404.
        """
        obj = or_none(self.custom.get_cluster_custom_object, GROUP, VERSION, PROVIDER_HEALTH_PLURAL, name)
        return None if obj is None else ProviderHealthObject.from_dict(reply(obj))

    def create_provider_health(self, name: str, labels: dict[str, str]) -> ProviderHealthObject:
        """Create an empty ProviderHealth ``name`` carrying ``labels``.

        Raises:
            kubernetes.client.ApiException: 409 AlreadyExists, others.
        """
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": PROVIDER_HEALTH_KIND,
                "metadata": {"name": name, "labels": dict(labels)}}
        return ProviderHealthObject.from_dict(
            reply(self.custom.create_cluster_custom_object(GROUP, VERSION, PROVIDER_HEALTH_PLURAL, body)))

    def patch_provider_health_status(self, name: str, status: dict) -> ProviderHealthObject:
        """Merge-patch ``status`` of ProviderHealth ``name`` through the status subresource.

        No resourceVersion precondition: every writer publishes the whole snapshot it read from
        Redis (:mod:`app.providers.checks`), so the last write is as good as any.

        Raises:
            kubernetes.client.ApiException: 404 (gone), others.
        """
        return ProviderHealthObject.from_dict(reply(self.custom.patch_cluster_custom_object_status(
            GROUP, VERSION, PROVIDER_HEALTH_PLURAL, name, {"status": status})))

    def list_provider_health(self, label_selector: str | None = None) -> list[ProviderHealthObject]:
        """Return every ProviderHealth (those matching ``label_selector`` when given).

        Raises:
            kubernetes.client.ApiException: the list failed.
        """
        kwargs: dict[str, Any] = {"label_selector": label_selector} if label_selector else {}
        listed = reply(self.custom.list_cluster_custom_object(GROUP, VERSION, PROVIDER_HEALTH_PLURAL, **kwargs))
        return [ProviderHealthObject.from_dict(o) for o in listed.get("items") or ()]

    def delete_provider_health(self, name: str) -> bool:
        """Delete the ProviderHealth ``name``; ``False`` when it did not exist (404).

        Raises:
            kubernetes.client.ApiException: any status but 404.
        """
        return existed(self.custom.delete_cluster_custom_object, GROUP, VERSION, PROVIDER_HEALTH_PLURAL, name)


__all__ = ["KubernetesProviderHealth", "ProviderHealthApi", "ProviderHealthObject"]
