"""The ``Proxy`` custom resource as plain dataclasses.

:func:`Proxy.from_dict` reads an object as the API server returns it (a dict) and applies
the same defaults as the CRD's OpenAPI schema, so code behaves the same whether or not the
server defaulted the object (the HTTP fake and old objects may not have).  Nothing here
talks to the API; see :mod:`app.kube.gateway` (the gateway) for that.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

from app.timefmt import parse_rfc3339

GROUP = "crawl.example.com"
VERSION = "v1alpha1"
PLURAL = "proxies"
KIND = "Proxy"
API_VERSION = f"{GROUP}/{VERSION}"
FINALIZER = "crawl.example.com/cleanup"
SKIP_CLEANUP_ANNOTATION = "crawl.example.com/skip-cleanup"
#: On a ProxyPool member leaving its pool: RFC 3339 time until which it drains (no new leases,
#: live ones run out); written by the pool controller (:mod:`app.pools`), copied into the serving
#: record (``drainUntil``) by :func:`app.serving.view.publish` / :func:`app.serving.view.refresh`.
DRAINING_ANNOTATION = "crawl.example.com/draining-until"
#: On a draining ProxyPool member: why it drains (``ScaleDown`` or ``Outdated``), written with
#: :data:`DRAINING_ANNOTATION`; only a ``ScaleDown`` member may be reclaimed by a later scale-up
#: (:func:`app.pools.plan.plan`, rule 5).
DRAINING_REASON_ANNOTATION = "crawl.example.com/draining-reason"
#: The ``ProxyPool`` resource of the same group (:mod:`app.pools`): members carry a controller
#: ownerReference to it.
POOL_PLURAL = "proxypools"
POOL_KIND = "ProxyPool"
#: The cluster-scoped ``ProviderHealth`` resource of the same group (:mod:`app.providers.checks`).
PROVIDER_HEALTH_PLURAL = "providerhealths"
PROVIDER_HEALTH_KIND = "ProviderHealth"

MODE_MANAGED = "Managed"
MODE_EXTERNAL = "External"

# Phases (status.phase)
PENDING = "Pending"
PROVISIONING = "Provisioning"
RUNNING = "Running"
READY = "Ready"
UNHEALTHY = "Unhealthy"
FAILED = "Failed"
TERMINATING = "Terminating"
PHASES = (PENDING, PROVISIONING, RUNNING, READY, UNHEALTHY, FAILED, TERMINATING)

# Condition types
COND_PROVISIONED = "Provisioned"
COND_HEALTHY = "Healthy"
COND_READY = "Ready"

DEFAULT_PORT = 3128
#: ``spec.placement.capacity``: regular instances (the default) ...
CAPACITY_ON_DEMAND = "OnDemand"
#: ... or interruptible ones the cloud may reclaim at any time (AWS spot, GCE spot).
CAPACITY_SPOT = "Spot"
DEFAULT_MAX_LEASES = 5
DEFAULT_HEALTH_URL = "http://connectivitycheck.gstatic.com/generate_204"


@dataclass(frozen=True)
class HealthCheck:
    """``spec.healthCheck`` with defaults applied.

    Attributes:
        url: URL fetched through the proxy.
        expected_status: HTTP status that counts as success.
        interval_seconds / timeout_seconds: probe period and per-probe timeout, seconds.
        failure_threshold / success_threshold: consecutive results needed to flip Healthy.
        rate_limited: ``"Keep"`` (default: a ``429`` from the health URL still proves the proxy
            works, so it counts as a success, with reason ``RateLimited``) or ``"Withdraw"``
            (it counts as a failure, so ``failureThreshold`` of them withdraw the proxy).
    """

    url: str = DEFAULT_HEALTH_URL
    expected_status: int = 204
    interval_seconds: int = 30
    timeout_seconds: int = 10
    failure_threshold: int = 3
    success_threshold: int = 1
    rate_limited: str = "Keep"

    @classmethod
    def from_dict(cls, d: dict | None) -> "HealthCheck":
        """Build from ``spec.healthCheck`` (``None`` or partial dicts get the defaults)."""
        d = d or {}
        return cls(
            url=d.get("url") or DEFAULT_HEALTH_URL,
            expected_status=int(d.get("expectedStatus", 204)),
            interval_seconds=int(d.get("intervalSeconds", 30)),
            timeout_seconds=int(d.get("timeoutSeconds", 10)),
            failure_threshold=int(d.get("failureThreshold", 3)),
            success_threshold=int(d.get("successThreshold", 1)),
            rate_limited="Withdraw" if d.get("rateLimited") == "Withdraw" else "Keep",
        )


@dataclass(frozen=True)
class ProxySpec:
    """``spec`` of a Proxy with defaults applied.

    Attributes:
        mode: ``"Managed"`` or ``"External"``.
        provider: provider name (Managed) or ``None``.
        zone / image / machine_type: ``spec.placement`` fields or ``None``.
        capacity: ``spec.placement.capacity``: :data:`CAPACITY_ON_DEMAND` (default) or :data:`CAPACITY_SPOT`.
        cloud_init_inline: ``spec.cloudInit.inline`` or ``None``.  Never log it.
        cloud_init_secret: ``(name, key)`` of ``spec.cloudInit.secretRef`` or ``None``.
        vendor_data: ``spec.vendorData`` or ``None``.  Never log it.
        host: ``spec.endpoint.host`` (External) or ``None``.
        port: ``spec.endpoint.port`` (default 3128).
        health: :class:`HealthCheck`.
        max_leases: ``spec.maxLeases`` (default 5; 0 means drain).
    """

    mode: str = MODE_MANAGED
    provider: str | None = None
    zone: str | None = None
    image: str | None = None
    machine_type: str | None = None
    capacity: str = CAPACITY_ON_DEMAND
    cloud_init_inline: str | None = None
    cloud_init_secret: tuple[str, str] | None = None
    vendor_data: str | None = None
    host: str | None = None
    port: int = DEFAULT_PORT
    health: HealthCheck = field(default_factory=HealthCheck)
    max_leases: int = DEFAULT_MAX_LEASES

    @classmethod
    def from_dict(cls, d: dict | None) -> "ProxySpec":
        """Build from an object's ``spec`` dict (missing keys get the CRD defaults)."""
        d = d or {}
        placement = d.get("placement") or {}
        cloud_init = d.get("cloudInit") or {}
        endpoint = d.get("endpoint") or {}
        secret_ref = cloud_init.get("secretRef")
        max_leases = d.get("maxLeases")
        return cls(
            mode=d.get("mode") or MODE_MANAGED,
            provider=d.get("provider") or None,
            zone=placement.get("zone") or None,
            image=placement.get("image") or None,
            machine_type=placement.get("machineType") or None,
            capacity=placement.get("capacity") or CAPACITY_ON_DEMAND,
            cloud_init_inline=cloud_init.get("inline"),
            cloud_init_secret=(secret_ref.get("name"), secret_ref.get("key")) if secret_ref else None,
            vendor_data=d.get("vendorData"),
            host=endpoint.get("host") or None,
            port=int(endpoint.get("port") or DEFAULT_PORT),
            health=HealthCheck.from_dict(d.get("healthCheck")),
            max_leases=DEFAULT_MAX_LEASES if max_leases is None else int(max_leases),
        )

    @property
    def managed(self) -> bool:
        """Whether we create the instance (``mode: Managed``)."""
        return self.mode != MODE_EXTERNAL


def spec_hash(spec: dict | None) -> str:
    """Return a 16-hex-digit hash of the parts of ``spec`` that shape the instance.

    Changing any of mode, provider, placement, cloudInit, vendorData or endpoint.port
    changes the hash and makes the reconciler replace the instance; healthCheck and
    maxLeases do not (they never need a new instance).
    """
    s = ProxySpec.from_dict(spec)
    material = {
        "mode": s.mode, "provider": s.provider, "zone": s.zone, "image": s.image,
        "machineType": s.machine_type, "cloudInit": (spec or {}).get("cloudInit"),
        "vendorData": s.vendor_data, "port": s.port,
    }
    if s.capacity != CAPACITY_ON_DEMAND:  # absent by default: the hashes of existing Proxies stay as they were
        material["capacity"] = s.capacity
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class ObjectRef:
    """A reference to one namespaced object: all a task payload carries (decision 1).

    The step of a Proxy (:data:`app.proxy.step.Ref`) and the pass of a ProxyPool
    (:data:`app.pools.controller.PoolRef`) are queued with one.

    Attributes:
        namespace, name: where to read the object.
        uid: ``metadata.uid``; an object of that name with another UID is another object.
    """

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class ObjectIdentity:
    """What identifies a namespaced object as read from the API (the base of :class:`Proxy` and
    :class:`app.pools.model.Pool`).

    Attributes:
        namespace, name, uid: identity.
        generation: ``metadata.generation`` (bumped by the server on spec changes).
        resource_version: ``metadata.resourceVersion``.
        deleting: whether ``metadata.deletionTimestamp`` is set.
    """

    namespace: str
    name: str
    uid: str
    generation: int
    resource_version: str
    deleting: bool

    @staticmethod
    def fields(meta: Mapping[str, Any], kind: str) -> dict[str, Any]:
        """Return the identity fields read from ``metadata``, as keyword arguments.

        Args:
            meta: the object's ``metadata``.
            kind: the object's kind, for the error message.
        Raises:
            ValueError: ``metadata.name``/``namespace``/``uid`` is missing.
        """
        for key in ("name", "namespace", "uid"):
            if not meta.get(key):
                raise ValueError(f"{kind} object without metadata.{key}")
        return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"],
                "generation": int(meta.get("generation") or 1),
                "resource_version": str(meta.get("resourceVersion") or ""),
                "deleting": bool(meta.get("deletionTimestamp"))}

    @property
    def key(self) -> str:
        """``"<namespace>/<name>"``."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Proxy(ObjectIdentity):
    """A Proxy object as read from the API.

    Attributes:
        (identity): as :class:`ObjectIdentity`.
        finalizers: ``metadata.finalizers``.
        annotations / labels: metadata maps.
        spec: :class:`ProxySpec`.
        status: the raw ``status`` dict (``{}`` when absent).
        raw: the whole object as received.
    """

    finalizers: tuple[str, ...]
    annotations: dict[str, str]
    labels: dict[str, str]
    spec: ProxySpec
    status: dict[str, Any]
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, obj: dict) -> "Proxy":
        """Build from an API object dict.

        Raises:
            ValueError: ``metadata.name``/``namespace``/``uid`` is missing.
        """
        meta = obj.get("metadata") or {}
        return cls(
            **cls.fields(meta, "Proxy"),
            finalizers=tuple(meta.get("finalizers") or ()),
            annotations=dict(meta.get("annotations") or {}),
            labels=dict(meta.get("labels") or {}),
            spec=ProxySpec.from_dict(obj.get("spec")),
            status=dict(obj.get("status") or {}),
            raw=obj,
        )

    @property
    def deletion_timestamp(self) -> str | None:
        """``metadata.deletionTimestamp`` as the API server wrote it (RFC 3339), ``None`` when unset."""
        return (self.raw.get("metadata") or {}).get("deletionTimestamp") or None

    @property
    def phase(self) -> str:
        """``status.phase`` or ``"Pending"`` when unset."""
        return self.status.get("phase") or PENDING

    @property
    def controller(self) -> dict | None:
        """The ``metadata.ownerReferences`` entry with ``controller: true`` (``None`` when none):
        ``{"apiVersion", "kind", "name", "uid", ...}`` as the API holds it."""
        for ref in (self.raw.get("metadata") or {}).get("ownerReferences") or ():
            if isinstance(ref, dict) and ref.get("controller") is True:
                return ref
        return None

    @property
    def pool(self) -> str:
        """The name of the ProxyPool this Proxy is a member of (its controller ownerReference),
        ``""`` when it belongs to none."""
        ref = self.controller
        if ref and ref.get("kind") == POOL_KIND and str(ref.get("apiVersion", "")).startswith(GROUP + "/"):
            return str(ref.get("name") or "")
        return ""

    @property
    def draining_until(self) -> float | None:
        """Epoch seconds of :data:`DRAINING_ANNOTATION`, ``None`` when absent or unreadable."""
        raw = self.annotations.get(DRAINING_ANNOTATION)
        if not raw:
            return None
        try:
            return parse_rfc3339(raw).timestamp()
        except ValueError:
            return None

    @property
    def skip_cleanup(self) -> bool:
        """Whether the skip-cleanup annotation is ``"true"``."""
        return self.annotations.get(SKIP_CLEANUP_ANNOTATION, "").lower() == "true"

    @property
    def spec_hash(self) -> str:
        """:func:`spec_hash` of this object's spec."""
        return spec_hash(self.raw.get("spec"))

    def effective_host(self) -> str | None:
        """Address crawlers should use: ``spec.endpoint.host`` (External) else ``status.address``."""
        if not self.spec.managed:
            return self.spec.host
        return self.status.get("address") or None

    def effective_port(self) -> int:
        """Port crawlers should use: ``status.port`` when the provider reported one, else ``spec.endpoint.port``."""
        return int(self.status.get("port") or self.spec.port)


class ProxyRef(NamedTuple):
    """The little of a Proxy GC needs (:mod:`app.proxy.gc`), kept from a listing instead of the object.

    Attributes:
        uid: ``metadata.uid``.
        provider_id: ``status.providerID`` (``None`` when no instance is recorded).
    """

    uid: str
    provider_id: str | None

    @classmethod
    def from_dict(cls, obj: dict) -> "ProxyRef":
        """Take the UID and recorded provider ID of an API object dict.

        Raises:
            ValueError: ``metadata.uid`` is missing (as :meth:`Proxy.from_dict`: a listing GC
                cannot read whole must fail, not leave a live Proxy out).
        """
        uid = (obj.get("metadata") or {}).get("uid")
        if not uid:
            raise ValueError("Proxy object without metadata.uid")
        return cls(uid, (obj.get("status") or {}).get("providerID") or None)
