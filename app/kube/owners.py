"""Owner references (``metadata.ownerReferences``, Kubernetes docs "Owners and Dependents") as a
dataclass, and their wire form, for the Proxies a pool creates and the Secrets a Proxy owns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OwnerReference:
    """One ``metadata.ownerReferences`` entry (Kubernetes docs, "Owners and Dependents").

    Attributes:
        api_version / kind / name / uid: the owner.
        controller: whether the owner is the managing controller.
        block_owner_deletion: whether foreground deletion of the owner waits for the dependent.
    """

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False
    block_owner_deletion: bool = False

    @classmethod
    def from_model(cls, ref: Any) -> "OwnerReference":
        """Build from the client's ``V1OwnerReference``.

        Args:
            ref: a :class:`kubernetes.client.V1OwnerReference`.
        Returns:
            the reference (``controller`` and ``blockOwnerDeletion`` ``False`` when unset).
        """
        return cls(api_version=ref.api_version, kind=ref.kind, name=ref.name, uid=ref.uid,
                   controller=bool(ref.controller), block_owner_deletion=bool(ref.block_owner_deletion))

    def to_dict(self) -> dict[str, Any]:
        """Return the reference as ``metadata.ownerReferences`` holds it (camelCase keys)."""
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid,
                "controller": self.controller, "blockOwnerDeletion": self.block_owner_deletion}


__all__ = ["OwnerReference"]
