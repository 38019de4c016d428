"""The provider contract: one interface every backend implements.

A provider is any object with these methods (structural typing via :class:`Provider`):

* ``create(request: CreateRequest) -> Instance`` — idempotent by ``request.name``.
* ``get(provider_id: str) -> Instance`` — raises :class:`~app.errors.NotFound`.
* ``delete(provider_id: str) -> None`` — succeeds when the instance is already gone; re-reads
  the instance first and raises :class:`~app.errors.NotManaged` (Permanent, logged,
  the instance left in place) when it does not carry our managed-by tag and a Proxy UID
  (:func:`require_managed`).
* ``list_by_tag(tag: str) -> ListResult`` — every instance carrying the managed-by tag
  ``tag``; ``ListResult.partial`` is true when some target could not be listed.
* ``abandon(provider_id: str) -> None`` — mark the instance abandoned (the tag
  :data:`app.providers.naming.TAG_ABANDONED` = ``"true"``, stored on the instance itself and given back in
  ``Instance.tags``) so GC never deletes it; succeeds when the instance is already gone.
  Called when a Proxy is released with the skip-cleanup annotation.
* ``start(provider_id: str) -> None`` — start a ``Stopped`` instance again (the same instance,
  not a new one); a running or starting instance is left alone; raises
  :class:`~app.errors.NotFound` when it does not exist.  Called by the poll for
  ``Stopped``; ``Terminated`` means "cannot be started, replace it" and is recreated instead.
* ``instance_ids(name: str, namespace: str, zone: str | None) -> list[str]`` — the provider
  IDs an instance named ``name`` (of a Proxy in ``namespace`` placed in ``zone``) may have,
  without calling the backend; the first is the one ``create`` uses.  The reconciler records
  it in the Proxy's status *before* it creates, and a delete that finds no recorded ID deletes
  by these IDs, so an instance is never created where no delete would look for it.
* ``credentials_in_instance: bool`` — whether the basic-auth htpasswd is baked into the
  instance at create (kvm vendor-data, gcp metadata), so a rotated Secret means a new instance.

Capabilities beyond the contract are declared, never probed: a provider class subclasses the
Protocols it implements, and callers test ``isinstance(provider, <Protocol>)``.

* :class:`CheckableProvider` — ``check() -> list[TargetVerdict]``, never raises as a whole.
* :class:`ShardedProvider` — work split by host (kvm): ``hosts()``, ``host_of(provider_id)``,
  ``check_host(host)`` and ``list_by_tag(tag, host=...)``; every task touching host H runs on
  H's queue.

Each provider type registers itself once, in its package (``app/providers/<type>/registration.py``):
a :class:`app.config.provider_types.ProviderType` naming its config parser, its constructor and, for a
sharded type, its :class:`app.config.provider_types.HostPlacement` (routing known from the config alone,
so no provider is built and no SDK imported to pick a queue).  Both live in the domain
(:mod:`app.config.provider_types`), so :mod:`app.config.providers` and :mod:`app.dispatch.proxies`
never import this package.

SDK types never cross this boundary: requests and results are the dataclasses below, and
errors are the taxonomy of :mod:`app.errors`.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from app.providers.naming import MANAGED_BY, TAG_MANAGED_BY, TAG_PROXY_UID
from app.config.provider_types import HostPlacement, ProviderType  # noqa: F401 - their home is the domain; kept importable here
from app.errors import NotManaged, SpecNotAllowed
from app.resources import CAPACITY_ON_DEMAND, CAPACITY_SPOT

log = logging.getLogger("proxy_operator.providers")


class InstanceState(str, enum.Enum):
    """Provider-neutral lifecycle state of an instance.

    * ``Provisioning``: being created or started; no address to publish yet.
    * ``Running``: up with an address.
    * ``Stopped``: exists but does not run (a shut-off domain after a hypervisor reboot, a GCE
      instance stopped or suspended); :meth:`Provider.start` brings the same instance back.
    * ``Terminated``: exists but can never run again (a finished Pod); the reconciler deletes
      and recreates it.
    """

    PROVISIONING = "Provisioning"
    RUNNING = "Running"
    STOPPED = "Stopped"
    TERMINATED = "Terminated"


#: The :class:`InstanceNote` reason of a ``Terminated`` instance its cloud reclaimed (an AWS spot
#: instance taken back, a GCE spot VM preempted): the reconciler replaces it like a lost one, with
#: the Warning Event ``InstanceInterrupted`` instead of ``InstanceLost``.
INTERRUPTED = "InstanceInterrupted"


@dataclass(frozen=True)
class InstanceNote:
    """What the user must know about an instance that its state alone does not say.

    The reconciler's poll puts it in the Proxy's ``Provisioned`` condition: while the instance
    is Provisioning as ``Provisioned=False/<reason>`` (why it is not Running yet, e.g. kvm's
    ``WaitingForGuestAgent``); once it is Running as ``Provisioned=True/<reason>`` with the
    message appended, plus one Warning Event ``<reason>`` when ``degraded`` (e.g. kvm's
    ``GuestAgentUnavailable``: the address came from a fallback source).  On a ``Terminated``
    instance, the reason :data:`INTERRUPTED` says the cloud reclaimed it (spot capacity).

    Attributes:
        reason: CamelCase condition (and Event) reason.
        message: one human-readable sentence, stable from poll to poll (no counters or times,
            so an unchanged note writes nothing); never secrets.
        degraded: the instance works but is not as it should be (Warning Event once Running).
    """

    reason: str
    message: str
    degraded: bool = False


@dataclass(frozen=True)
class Instance:
    """What a provider reports about one instance.

    Attributes:
        provider_id: self-contained ID (kubernetes ``<ns>/<pod>``, gcp
            ``projects/<p>/zones/<z>/instances/<name>``, kvm ``hosts/<host>/domains/<name>``).
        name: the instance name (see :func:`app.providers.naming.instance_name`).
        state: :class:`InstanceState`.
        address: reachable IPv4 address as a string, or ``None`` while unknown.
        created: creation time (timezone-aware UTC) or ``None`` when the provider cannot tell.
        tags: the tags the instance carries (keys of :mod:`app.providers.naming`), ``{}`` for none.
        zone: where it runs (kvm host, gcp zone, kubernetes namespace), or ``None``.
        note: an :class:`InstanceNote` for the Proxy's status (why it is still Provisioning,
            or how a Running instance is degraded), or ``None``.
    """

    provider_id: str
    name: str
    state: InstanceState
    address: str | None = None
    created: datetime | None = None
    tags: dict[str, str] = field(default_factory=dict)
    zone: str | None = None
    note: InstanceNote | None = None


@dataclass(frozen=True)
class CreateRequest:
    """Everything a provider needs to create one proxy instance.

    Attributes:
        name: deterministic instance name (:func:`app.providers.naming.instance_name`).
        tags: tags to attach (managed-by marker and Proxy UID, see :func:`app.providers.naming.tags_for`).
        namespace: the Proxy's namespace.
        zone: ``spec.placement.zone`` or ``None``.
        image: ``spec.placement.image`` or ``None`` (provider default).
        machine_type: ``spec.placement.machineType`` or ``None``.
        capacity: ``spec.placement.capacity``: ``"OnDemand"`` or ``"Spot"`` (interruptible:
            :data:`app.resources.CAPACITY_SPOT`); a provider without spot capacity refuses
            ``"Spot"`` with :class:`~app.errors.SpecNotAllowed`.
        port: the Squid port (``spec.endpoint.port``, default 3128).
        user_data: the resolved cloud-init document (bytes as given) or ``None``.  Never log it.
        vendor_data: extra vendor-data (kvm) or ``None``.  Never log it.
        squid_config: the squid.conf the instance must run (see :mod:`app.squid.conf`), or ``None``.
        auth_secret: name of the Secret (in ``namespace``) whose ``htpasswd`` key the instance
            must install at :data:`app.squid.conf.DEFAULT_HTPASSWD_PATH` when the squid.conf
            requires basic auth, else ``None`` (Pods mount it).
        auth_htpasswd: the same htpasswd line itself, for providers that ship it inside the
            instance's bootstrap (kvm vendor-data); a bcrypt hash, but still never log it.
        egress_rules: the nftables ruleset VM guests load for Squid's user before Squid
            starts (:func:`app.squid.egress.nftables_rules` of the same policy), or ``None``.
    """

    name: str
    tags: dict[str, str]
    namespace: str
    zone: str | None = None
    image: str | None = None
    machine_type: str | None = None
    capacity: str = CAPACITY_ON_DEMAND
    port: int = 3128
    user_data: bytes | None = None
    vendor_data: bytes | None = None
    squid_config: str | None = None
    auth_secret: str | None = None
    auth_htpasswd: str | None = None
    egress_rules: str | None = None

    def __repr__(self) -> str:  # keep user-data out of every repr that might reach a log
        return (f"CreateRequest(name={self.name!r}, namespace={self.namespace!r}, zone={self.zone!r}, "
                f"image={self.image!r}, machine_type={self.machine_type!r}, capacity={self.capacity!r}, "
                f"port={self.port})")


@dataclass(frozen=True)
class ListResult:
    """Result of :meth:`Provider.list_by_tag`.

    Attributes:
        instances: instances carrying the tag.
        partial: true when at least one target (host, zone) could not be listed; GC then
            deletes nothing of this provider in that sweep.
        errors: human-readable reasons for the partial listing.
    """

    instances: list[Instance]
    partial: bool = False
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TargetVerdict:
    """One target's result of a provider health check (a KVM host, the GCP API, the cluster).

    Attributes:
        name: target name.
        ready: whether the target can serve requests.
        reason: CamelCase reason (``"Ready"``, ``"DialFailed"``, ...).
        message: human-readable detail (never secrets).
        details: extra facts, e.g. ``{"freeBytes": "1234"}``.
    """

    name: str
    ready: bool
    reason: str
    message: str = ""
    details: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Provider(Protocol):
    """Structural type of a provider (see module docstring for the semantics).

    Attributes:
        name: the provider's name in the providers config.
        type: its type (``"kubernetes"``, ``"gcp"``, ``"kvm"``).
        credentials_in_instance: whether the basic-auth htpasswd travels inside the instance
            (its bootstrap), so a rotated Secret replaces the instance (``app.proxy.reconcile``);
            ``False`` unless a provider class says otherwise.
    """

    name: str
    type: str
    credentials_in_instance: bool = False

    def create(self, request: CreateRequest) -> Instance: ...

    def get(self, provider_id: str) -> Instance: ...

    def delete(self, provider_id: str) -> None: ...

    def list_by_tag(self, tag: str) -> ListResult: ...

    def abandon(self, provider_id: str) -> None: ...

    def start(self, provider_id: str) -> None: ...

    def instance_ids(self, name: str, namespace: str, zone: str | None = None) -> list[str]: ...


@runtime_checkable
class CheckableProvider(Protocol):
    """A provider with a health check (every shipped provider declares it).

    ``check()`` returns one :class:`TargetVerdict` per target (a KVM host, the GCP project, the
    cluster) and never raises as a whole.  Health checks run on the unwrapped provider, so the
    metrics wrapper (:mod:`app.providers.metrics`) never is one.
    """

    def check(self) -> list[TargetVerdict]: ...


@runtime_checkable
class ShardedProvider(Protocol):
    """A provider whose work is split by host (kvm): each host has its own queue and worker.

    * ``hosts() -> list[str]`` — the configured host names, in config order.
    * ``host_of(provider_id) -> str | None`` — the host named inside a provider ID (``None``
      when it does not parse).
    * ``check_host(host) -> TargetVerdict`` — check one host (on that host's queue).
    * ``list_by_tag(tag, host=None) -> ListResult`` — one host's instances when ``host`` is
      given (GC lists one host per task, on its queue).
    """

    def hosts(self) -> list[str]: ...

    def host_of(self, provider_id: str) -> str | None: ...

    def check_host(self, host: str) -> TargetVerdict: ...

    def list_by_tag(self, tag: str, host: str | None = None) -> ListResult: ...


def refuse_spot(request: CreateRequest, provider: str, provider_type: str) -> None:
    """Refuse ``spec.placement.capacity: Spot`` on a provider that has no interruptible capacity.

    Raises:
        SpecNotAllowed: naming ``spec.placement.capacity`` when ``request.capacity`` is Spot.
    """
    if request.capacity == CAPACITY_SPOT:
        raise SpecNotAllowed("spec.placement.capacity", f"Spot is not offered by provider {provider} "
                                                        f"(type {provider_type}: aws and gcp only)")


def require_managed(tags: dict[str, str] | None, provider: str, provider_id: str) -> None:
    """Refuse to touch an instance that is not ours (docs/security.md).

    Ours means: the managed-by tag equals :data:`app.providers.naming.MANAGED_BY` and a non-empty Proxy
    UID tag is present (the tags every create writes, :func:`app.providers.naming.tags_for`).  Every
    provider's ``delete`` calls this on the instance it has just re-read, so a forged or
    mistaken ``gc.delete`` naming ``kube-system/<pod>``, someone's VM or domain deletes nothing.

    Args:
        tags: the instance's tags as the provider maps them back (``Instance.tags``), or ``None``
            when the instance carries none at all.
        provider: the provider name (for the message).
        provider_id: the instance's provider ID (for the message).
    Raises:
        NotManaged: (Permanent) the tags are missing or name another manager; logged at WARNING.
    """
    tags = tags or {}
    if tags.get(TAG_MANAGED_BY) == MANAGED_BY and tags.get(TAG_PROXY_UID):
        return
    have = tags.get(TAG_MANAGED_BY)
    why = (f"its {TAG_MANAGED_BY} tag is {have!r}" if have and have != MANAGED_BY
           else f"it carries no {TAG_MANAGED_BY}={MANAGED_BY} tag" if not have
           else f"it carries no {TAG_PROXY_UID} tag")
    message = f"provider {provider}: refusing to delete {provider_id}: {why}, so proxy-operator did not create it"
    log.warning("%s", message)
    raise NotManaged(message)
