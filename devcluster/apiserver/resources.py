"""The resource types the fake serves, and how each behaves.

Each :class:`ResourceType` records what the API server knows about a type: its group,
version, plural and kind, whether it is namespaced, whether it has a status subresource
(then main-resource writes keep the stored status and ``/status`` writes change only
status), whether ``metadata.generation`` tracks spec changes (custom resources), whether
an unconditional PUT (no ``resourceVersion``) is allowed, whether DELETE returns the object
or a ``Status``, which field selectors it supports, and whether it has a ``scale`` subresource
(:class:`ScaleSubresource`: the JSON paths of a CRD's ``subresources.scale``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.resources import GROUP as CRAWL_GROUP
from app.resources import VERSION as CRAWL_VERSION

_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True)
class ScaleSubresource:
    """A custom resource's ``scale`` subresource (CRD ``subresources.scale``).

    Attributes:
        spec_replicas_path: ``specReplicasPath`` (``.spec.replicas``): what ``Scale.spec.replicas``
            reads and writes.
        status_replicas_path: ``statusReplicasPath``: what ``Scale.status.replicas`` reads.
        label_selector_path: ``labelSelectorPath`` (``""``: none): what ``Scale.status.selector`` reads.
    """

    spec_replicas_path: str = ".spec.replicas"
    status_replicas_path: str = ".status.replicas"
    label_selector_path: str = ""


@dataclass(frozen=True)
class ResourceType:
    """One served resource.

    Attributes:
        group: API group (``""`` for core).
        version: API version.
        plural / kind / short_names: names.
        namespaced: namespaced (True) or cluster-scoped.
        status_subresource: has ``/status`` with upstream's split of spec and status writes.
        track_generation: bump ``metadata.generation`` when anything but metadata/status changes.
        builtin: a built-in type (strategic merge patch accepted; missing kind defaulted).
        unconditional_update: PUT without ``metadata.resourceVersion`` is allowed.
        return_deleted_object: DELETE answers with the object instead of a ``Status``.
        field_selectors: field paths accepted in ``fieldSelector``.
        scale: the ``scale`` subresource (``autoscaling/v1`` ``Scale``), ``None`` when it has none.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = False
    track_generation: bool = False
    builtin: bool = True
    unconditional_update: bool = True
    return_deleted_object: bool = False
    field_selectors: frozenset[str] = _META_FIELDS
    short_names: tuple[str, ...] = field(default_factory=tuple)
    scale: ScaleSubresource | None = None

    @property
    def api_version(self) -> str:
        """``group/version`` (or just ``version`` for core)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        """``<Kind>List``."""
        return self.kind + "List"

    @property
    def qualified(self) -> str:
        """``plural.group`` (or just ``plural`` for core), as used in error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def base_path(self) -> str:
        """``/api/v1`` or ``/apis/<group>/<version>``."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


PODS = ResourceType("", "v1", "pods", "Pod", status_subresource=True, return_deleted_object=True,
                    field_selectors=_META_FIELDS | {"status.phase", "spec.nodeName", "status.podIP",
                                                    "spec.restartPolicy", "spec.schedulerName",
                                                    "spec.serviceAccountName"},
                    short_names=("po",))
SECRETS = ResourceType("", "v1", "secrets", "Secret", field_selectors=_META_FIELDS | {"type"})
CORE_EVENTS = ResourceType("", "v1", "events", "Event", short_names=("ev",),
                           field_selectors=_META_FIELDS | {"involvedObject.kind", "involvedObject.name",
                                                           "involvedObject.namespace", "involvedObject.uid",
                                                           "reason", "type", "source"})
NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, status_subresource=True,
                          field_selectors=_META_FIELDS | {"status.phase"}, short_names=("ns",))
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "Lease")
NETWORK_POLICIES = ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=("netpol",))
EVENTS = ResourceType("events.k8s.io", "v1", "events", "Event", short_names=("ev",),
                      field_selectors=_META_FIELDS | {"regarding.kind", "regarding.name", "regarding.namespace",
                                                      "regarding.uid", "reason", "type",
                                                      "reportingController"})
PROXIES = ResourceType(CRAWL_GROUP, CRAWL_VERSION, "proxies", "Proxy", status_subresource=True,
                       track_generation=True, builtin=False, unconditional_update=False,
                       short_names=("px",))
PROVIDER_HEALTHS = ResourceType(CRAWL_GROUP, CRAWL_VERSION, "providerhealths", "ProviderHealth",
                                namespaced=False, status_subresource=True, track_generation=True,
                                builtin=False, unconditional_update=False)
PROXY_POOLS = ResourceType(CRAWL_GROUP, CRAWL_VERSION, "proxypools", "ProxyPool", status_subresource=True,
                           track_generation=True, builtin=False, unconditional_update=False,
                           short_names=("pxp",),
                           scale=ScaleSubresource(".spec.replicas", ".status.replicas", ".status.selector"))

DEFAULT_TYPES: tuple[ResourceType, ...] = (PODS, SECRETS, CORE_EVENTS, NAMESPACES, LEASES, EVENTS,
                                           PROXIES, PROVIDER_HEALTHS, PROXY_POOLS, NETWORK_POLICIES)
