"""core/v1 Secrets through the gateway: read (data decoded), create, delete.

Who may use a Secret is decided by :mod:`app.kube.credentials`; the values are user data and
are never logged.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.kube.client import ApiGroups, existed, or_none
from app.kube.owners import OwnerReference


@dataclass(frozen=True)
class Secret:
    """A core/v1 Secret: decoded ``data`` (user data: never log the values).

    Attributes:
        namespace / name: identity.
        data: key -> decoded bytes (the API's ``data`` is base64).
        labels: ``metadata.labels``.
        owners: ``metadata.ownerReferences``.
        type: the Secret ``type`` (``Opaque``).
    """

    namespace: str
    name: str
    data: dict[str, bytes] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    owners: tuple[OwnerReference, ...] = ()
    type: str = "Opaque"


class SecretApi(Protocol):
    """The gateway's Secrets (core/v1)."""

    def read_secret(self, namespace: str, name: str) -> Secret | None:
        """The Secret ``namespace/name`` with its data decoded; ``None`` when it does not exist."""

    def create_secret(self, secret: Secret) -> None:
        """Create ``secret`` (409 AlreadyExists when one of that name exists)."""

    def delete_secret(self, namespace: str, name: str) -> bool:
        """Delete the Secret; ``False`` when it did not exist."""


class KubernetesSecrets(ApiGroups):
    """:class:`SecretApi` over the ``kubernetes`` client (a part of :class:`app.kube.gateway.KubernetesGateway`)."""

    def read_secret(self, namespace: str, name: str) -> Secret | None:
        """Return Secret ``namespace/name`` with ``data`` decoded, or ``None`` when it does not exist.

        The values are user data: never log them.

        Raises:
            kubernetes.client.ApiException: any status but 404.
        """
        obj = or_none(self.core.read_namespaced_secret, name, namespace)
        if obj is None:
            return None
        meta: Any = obj.metadata
        return Secret(namespace=meta.namespace or namespace, name=meta.name or name,
                      data={k: base64.b64decode(v) for k, v in (obj.data or {}).items()},
                      labels=dict(meta.labels or {}),
                      owners=tuple(OwnerReference.from_model(o) for o in (meta.owner_references or ())),
                      type=obj.type or "Opaque")

    def create_secret(self, secret: Secret) -> None:
        """Create ``secret`` (its data base64-encoded on the wire).

        Raises:
            kubernetes.client.ApiException: 409 AlreadyExists, others.
        """
        meta: dict[str, Any] = {"name": secret.name, "namespace": secret.namespace, "labels": dict(secret.labels)}
        if secret.owners:
            meta["ownerReferences"] = [o.to_dict() for o in secret.owners]
        body: Any = {
            "apiVersion": "v1", "kind": "Secret", "type": secret.type, "metadata": meta,
            "data": {k: base64.b64encode(v).decode() for k, v in secret.data.items()},
        }
        self.core.create_namespaced_secret(secret.namespace, body)

    def delete_secret(self, namespace: str, name: str) -> bool:
        """Delete Secret ``namespace/name``; ``False`` when it did not exist (404).

        Raises:
            kubernetes.client.ApiException: any status but 404.
        """
        return existed(self.core.delete_namespaced_secret, name, namespace)


__all__ = ["KubernetesSecrets", "Secret", "SecretApi"]
