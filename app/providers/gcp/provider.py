"""The gcp provider: Compute Engine instances through google-cloud-compute (REST transport).

Implements the contract of :mod:`app.providers.base`:

* ``create`` inserts an instance named ``request.name`` in ``request.zone`` (else a zone of
  ``gcp.zones`` picked from the name), labelled with ``request.tags``, with the Proxy's
  cloud-init as ``user-data`` metadata, the rendered squid.conf (``squid-conf``, with
  ``squid-htpasswd``) and the ``startup-script`` that installs them at every boot
  (:mod:`app.providers.gcp.startup`), waits for the zone operation and returns the
  instance; an instance that already exists (409) is fetched and returned (idempotent).
* ``get`` maps the instance status and reads the external, else internal, IPv4.
* ``delete`` reads the instance, refuses one without our ``managed-by``/``proxy-uid`` labels
  (NotManaged, Permanent), deletes it and waits for the zone operation; an instance already
  gone (404) is success.
* ``abandon`` adds the label ``abandoned=true`` (``setLabels`` with the label fingerprint of a
  fresh get; a stale fingerprint, 412, is re-read and retried).
* ``start`` runs a stopped (TERMINATED) instance with ``instances.start`` and a SUSPENDED one
  with ``instances.resume``.
* ``list_by_tag`` reads every page of the aggregated list filtered on the managed-by label.
* ``check`` reads one page of at most one managed instance.

Nothing is dialled at construction: the SDK clients (and credentials) are built on first
use, every one of them with the configured ``apiEndpoint``.  Operations are waited through a
``ZoneOperationsClient``/``GlobalOperationsClient`` that *we* build with those client
options; ``ExtendedOperation.result()`` is never used, because the zone-operations client the
instances transport builds for it ignores ``client_options`` and would poll the public
endpoint (see /work/shared/ENVIRONMENT.md).  ``operations.wait`` also returns as soon as the
operation is done, instead of polling with client-side sleeps.

Errors are mapped by :func:`app.providers.gcp.classify.to_provider_error` and raised ``from``
the SDK error.  SDK types never leave this module.
"""

from __future__ import annotations

import builtins
import functools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

import google.auth
import google.auth.exceptions
from google.auth import aws, identity_pool
from google.oauth2 import credentials as user_credentials
from google.oauth2 import service_account
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from app.config.providers import ProviderConfig
from app.providers.naming import ABANDONED, MANAGED_BY, TAG_ABANDONED, TAG_MANAGED_BY
from app.providers.placement import refuse_port, refuse_unlisted
from app.providers.base import (INTERRUPTED, CheckableProvider, CreateRequest, Instance, InstanceNote, InstanceState,
                                ListResult, Provider, TargetVerdict, require_managed)
from app.resources import CAPACITY_SPOT
from app.errors import NotFound, Permanent, ProviderError, Transient
from app.providers.gcp import ids, startup, wire
from app.providers.gcp.classify import already_exists, operation_error, to_provider_error
from app.providers.gcp.config import RFC1035, GcpSettings
from app.timefmt import parse_rfc3339

log = logging.getLogger("proxy_operator.gcp")

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
#: Metadata key of the Proxy's cloud-init (read by cloud-init's GCE datasource).
USER_DATA_KEY = "user-data"
#: Metadata key carrying the rendered squid.conf (:mod:`app.squid.conf`); the ``startup-script``
#: (:mod:`app.providers.gcp.startup`) installs it at every boot.
SQUID_CONF_KEY = "squid-conf"
#: Metadata key carrying the Proxy's htpasswd line (basic auth), installed by the same script.
SQUID_HTPASSWD_KEY = "squid-htpasswd"
#: Metadata key carrying the nftables ruleset for Squid's user (:mod:`app.squid.egress`), loaded by the
#: same script before Squid starts.
SQUID_EGRESS_KEY = "squid-egress-nft"
#: Longest single ``operations.wait`` call we make (the API itself returns after ~2 minutes).
_MAX_WAIT_CALL = 120.0
#: A wait call that returns faster than this without a finished operation is followed by a
#: pause growing from _MIN_PAUSE to _MAX_PAUSE seconds.
_QUICK_WAIT, _MIN_PAUSE, _MAX_PAUSE = 1.0, 0.25, 5.0
#: Page size of the aggregated list used by GC.
_LIST_PAGE_SIZE = 500

#: GCE instance status -> provider state.  In GCE, TERMINATED is a *stopped* instance (disk,
#: name and internal IP kept; ``instances.start`` runs it again), not a deleted one
#: (https://cloud.google.com/compute/docs/instances/instance-life-cycle).  Nothing maps to
#: Terminated: every GCE instance that exists can be started again.
_STATES = {
    "PENDING": InstanceState.PROVISIONING,
    "PROVISIONING": InstanceState.PROVISIONING,
    "STAGING": InstanceState.PROVISIONING,
    "REPAIRING": InstanceState.PROVISIONING,
    "RUNNING": InstanceState.RUNNING,
    "PENDING_STOP": InstanceState.STOPPED,
    "STOPPING": InstanceState.STOPPED,
    "DEPROVISIONING": InstanceState.STOPPED,
    "STOPPED": InstanceState.STOPPED,
    "TERMINATED": InstanceState.STOPPED,
    "SUSPENDING": InstanceState.STOPPED,
    "SUSPENDED": InstanceState.STOPPED,
}
#: Statuses :meth:`GcpProvider.start` answers with ``instances.start`` / ``instances.resume``.
_START_FROM = frozenset({"TERMINATED", "STOPPED"})
_RESUME_FROM = frozenset({"SUSPENDED"})
#: Statuses on the way to stopped/suspended: neither call is accepted yet (resourceNotReady).
_STOPPING = frozenset({"PENDING_STOP", "STOPPING", "DEPROVISIONING", "SUSPENDING"})
#: Attempts :meth:`GcpProvider.abandon` makes when the label fingerprint went stale meanwhile.
_SET_LABELS_ATTEMPTS = 3
_DONE = compute_v1.Operation.Status.DONE


@dataclass(frozen=True)
class _Clients:
    instances: compute_v1.InstancesClient
    zone_operations: compute_v1.ZoneOperationsClient
    firewalls: compute_v1.FirewallsClient
    global_operations: compute_v1.GlobalOperationsClient


def state_of(status: str) -> InstanceState:
    """Map a GCE instance status onto :class:`InstanceState`.

    PENDING/PROVISIONING/STAGING/REPAIRING -> Provisioning, RUNNING -> Running,
    PENDING_STOP/STOPPING/DEPROVISIONING/STOPPED/TERMINATED/SUSPENDING/SUSPENDED -> Stopped:
    in GCE, TERMINATED means *stopped* (the instance keeps its disk and can be started again),
    see the instance life cycle, https://cloud.google.com/compute/docs/instances/instance-life-cycle.
    Never Terminated.  An unknown status counts as Provisioning, so no address is published
    for it.
    """
    return _STATES.get((status or "").upper(), InstanceState.PROVISIONING)


def _address(inst: compute_v1.Instance) -> str | None:
    for nic in inst.network_interfaces:
        for ac in nic.access_configs:
            if ac.nat_i_p:
                return ac.nat_i_p
    for nic in inst.network_interfaces:
        if nic.network_i_p:
            return nic.network_i_p
    return None


def _created(stamp: str) -> datetime | None:
    if not stamp:
        return None
    try:
        return parse_rfc3339(stamp)
    except ValueError:
        return None


def to_instance(inst: compute_v1.Instance, project: str, zone: str | None = None) -> Instance:
    """Convert a GCE instance into an :class:`Instance` (provider ID, state, address, labels).

    A spot VM (``scheduling.provisioningModel: SPOT``) that is stopping or stopped was preempted
    (GCE deletes it next: ``instanceTerminationAction: DELETE``): Terminated, with the note
    :data:`~app.providers.base.INTERRUPTED`, so the poll replaces it instead of starting it.
    """
    zone = ids.last_segment(inst.zone) if inst.zone else zone
    state, note = state_of(inst.status), None
    if state is InstanceState.STOPPED and (inst.scheduling.provisioning_model or "").upper() == "SPOT":
        state = InstanceState.TERMINATED
        note = InstanceNote(reason=INTERRUPTED, message=f"GCE preempted the spot VM {inst.name} "
                                                        f"(status {inst.status})", degraded=True)
    return Instance(provider_id=ids.provider_id(project, zone or "", inst.name), name=inst.name,
                    state=state, address=_address(inst) if note is None else None,
                    created=_created(inst.creation_timestamp), tags=dict(inst.labels), zone=zone, note=note)


def _same_rule(have: compute_v1.Firewall, want: compute_v1.Firewall) -> bool:
    def allowed(fw: compute_v1.Firewall) -> set[tuple[str, tuple[str, ...]]]:
        return {(a.I_p_protocol.lower(), tuple(sorted(a.ports))) for a in fw.allowed}

    return (ids.last_segment(have.network) == ids.last_segment(want.network)
            and (have.direction or "INGRESS") == want.direction and not have.disabled
            and sorted(have.source_ranges) == sorted(want.source_ranges)
            and sorted(have.target_tags) == sorted(want.target_tags)
            and allowed(have) == allowed(want) and not have.denied)


class GcpProvider(Provider, CheckableProvider):
    """A configured gcp provider (see the module docstring); it has checks.

    Args:
        pc: the provider's config entry; ``pc.settings`` is a :class:`GcpSettings`.
    Raises:
        TypeError: ``pc.settings`` is not a :class:`GcpSettings` (a wiring bug).
    """

    type = "gcp"
    #: The htpasswd travels inside the instance (its bootstrap), so a rotated Secret means a new
    #: instance (see ``app.proxy.reconcile``).
    credentials_in_instance = True

    def __init__(self, pc: ProviderConfig) -> None:
        if not isinstance(pc.settings, GcpSettings):
            raise TypeError(f"GcpProvider needs GcpSettings, got {type(pc.settings).__name__}")
        self.name = pc.name
        self.settings: GcpSettings = pc.settings
        self.check_timeout = pc.check_timeout or self.settings.request_timeout
        self._lock = threading.Lock()
        self._clients: _Clients | None = None
        self._firewalls_ok: set[str] = set()
        if self.settings.credentials_file and not os.access(self.settings.credentials_file, os.R_OK):
            # Only a diagnostic: the file is read on first use, so a Secret mounted later heals.
            log.warning("gcp provider %s: credentialsFile %s is not readable (yet)",
                        self.name, self.settings.credentials_file)

    # -- clients -----------------------------------------------------------------------
    def _credentials(self) -> Any:
        s = self.settings
        if s.anonymous:
            return AnonymousCredentials()
        if s.credentials_file:
            return self._file_credentials(s.credentials_file)
        try:
            creds, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
        except google.auth.exceptions.GoogleAuthError as exc:
            raise Permanent(f"gcp provider {self.name}: no Application Default Credentials "
                            f"(set gcp.credentialsFile or GOOGLE_APPLICATION_CREDENTIALS): {exc}") from exc
        return creds

    def _file_credentials(self, path: str) -> Any:
        """Load a key file: ``service_account``, ``authorized_user`` or ``external_account`` JSON.

        Raises:
            Transient: the file does not exist or cannot be read (yet): a Secret mounted
                later heals without a restart.
            Permanent: the file is not JSON, or not a usable credentials document.
        """
        where = f"gcp provider {self.name}: credentialsFile {path}"
        if not os.path.exists(path):
            raise Transient(f"{where} does not exist (yet)")
        try:
            with open(path, encoding="utf-8") as fh:
                info = json.load(fh)
        except OSError as exc:
            raise Transient(f"{where}: cannot read: {exc.strerror or exc}") from exc
        except ValueError as exc:
            raise Permanent(f"{where} is not usable: not JSON ({exc.__class__.__name__})") from None
        kind = info.get("type") if isinstance(info, dict) else None
        scopes = [CLOUD_PLATFORM_SCOPE]
        try:
            if kind == "service_account":
                return service_account.Credentials.from_service_account_info(info, scopes=scopes)
            if kind == "authorized_user":
                return user_credentials.Credentials.from_authorized_user_info(info, scopes=scopes)
            if kind == "external_account":
                source = info.get("credential_source") or {}
                if str(source.get("environment_id", "")).startswith("aws"):
                    return aws.Credentials.from_info(info, scopes=scopes)
                return identity_pool.Credentials.from_info(info, scopes=scopes)
        except (ValueError, KeyError, google.auth.exceptions.GoogleAuthError) as exc:
            # Never echo the file's content: it holds a private key.
            raise Permanent(f"{where} is not usable: {type(exc).__name__}") from None
        raise Permanent(f"{where} is not usable: type {kind!r} is not service_account, "
                        "authorized_user or external_account")

    def _api(self) -> _Clients:
        """Build the SDK clients once (thread-safe); a failure is retried on the next call."""
        with self._lock:
            if self._clients is None:
                s = self.settings
                wire.configure(enabled=s.wire_logging.enabled, full_payloads=s.wire_logging.full_payloads,
                               api_endpoint=s.api_endpoint)
                creds = self._credentials()
                opts = ClientOptions(api_endpoint=s.api_endpoint) if s.api_endpoint else None

                def make(cls: Callable[..., Any]) -> Any:
                    return cls(credentials=creds, transport="rest", client_options=opts)

                self._clients = _Clients(instances=make(compute_v1.InstancesClient),
                                         zone_operations=make(compute_v1.ZoneOperationsClient),
                                         firewalls=make(compute_v1.FirewallsClient),
                                         global_operations=make(compute_v1.GlobalOperationsClient))
            return self._clients

    def _call(self, what: str, fn: Callable[[], Any], *, on_404: builtins.type[ProviderError] = NotFound) -> Any:
        """Run one SDK call; log one DEBUG line with outcome and duration; classify failures."""
        start = time.monotonic()
        try:
            result = fn()
        except Exception as exc:
            err = to_provider_error(exc, what, on_404=on_404)
            log.debug("gcp %s: %s (%.3fs)", what, err.reason, time.monotonic() - start)
            raise err from exc
        log.debug("gcp %s: ok%s (%.3fs)", what,
                  f" operation={result.name}" if isinstance(result, compute_v1.Operation) else "",
                  time.monotonic() - start)
        return result

    def _wait(self, what: str, op: compute_v1.Operation, project: str, zone: str | None, *,
              on_404: builtins.type[ProviderError] = NotFound) -> None:
        """Wait until ``op`` of ``project`` is DONE (a zone operation, or global when ``zone`` is None).

        Raises:
            Transient: still running after ``operationTimeout``, or the wait call failed.
            ProviderError: the operation finished with an error (classified, cause kept).
        """
        api = self._api()
        s = self.settings
        deadline = time.monotonic() + s.operation_timeout
        pause = 0.0
        while op.status != _DONE:
            if pause:
                # wait may return before the operation is done (it is documented as "at most
                # two minutes, not guaranteed"); back off instead of spinning.
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Transient(f"gcp {what}: operation {op.name} still {op.status.name} after "
                                f"{s.operation_timeout:g}s")
            timeout = max(1.0, min(remaining, _MAX_WAIT_CALL)) + s.request_timeout
            if zone is None:
                request: Any = compute_v1.WaitGlobalOperationRequest(project=project, operation=op.name)
                wait: Callable[..., Any] = api.global_operations.wait
            else:
                request = compute_v1.WaitZoneOperationRequest(project=project, zone=zone, operation=op.name)
                wait = api.zone_operations.wait
            started = time.monotonic()
            op = self._call(f"wait {what}", functools.partial(wait, request=request, timeout=timeout, retry=None))
            quick = time.monotonic() - started < _QUICK_WAIT
            pause = min(max(pause * 2, _MIN_PAUSE), _MAX_PAUSE) if quick else 0.0
        failure = operation_error(op)
        if failure is not None:
            err = to_provider_error(failure, what, on_404=on_404)  # stable message: no operation name
            log.debug("gcp %s: operation %s finished with %s", what, op.name, err.reason)
            raise err from failure

    # -- contract ----------------------------------------------------------------------
    def instance_ids(self, name: str, namespace: str, zone: str | None = None) -> list[str]:
        """Return the provider IDs an instance named ``name`` may have, the one :meth:`create` uses first.

        First ``projects/<project>/zones/<zone>/instances/<name>`` for ``zone`` (else the zone
        :func:`~app.providers.gcp.ids.pick_zone` picks from ``gcp.zones``), then the same name in
        every other configured zone (a Proxy whose zone changed may have left one there).

        Raises:
            Permanent: no zone is given and none is configured.
        """
        s = self.settings
        try:
            first = zone or ids.pick_zone(name, s.zones)
        except ValueError as exc:
            raise Permanent(f"gcp provider {self.name}: {exc}") from exc
        zones = [first] + [z for z in s.zones if z != first]
        return [ids.provider_id(s.project, z, name) for z in zones]

    def create(self, request: CreateRequest) -> Instance:
        """Create the instance ``request.name`` (idempotent by name) and return it.

        Raises:
            SpecNotAllowed: (Permanent) ``spec.placement.zone``, ``.image`` or ``.machineType``
                is not allowed by the config (:meth:`check_placement`); nothing is sent.
            Permanent: no zone to use, a zone or name that is not an RFC 1035 label,
                user-data that is not UTF-8, a rejected request (400/403/404).
            QuotaExceeded: quota or capacity refused, at the call or in the operation.
            Transient: 5xx, timeouts, connection errors, the operation still running.
        """
        s = self.settings
        self.check_placement(request)
        try:
            zone = request.zone or ids.pick_zone(request.name, s.zones)
        except ValueError as exc:
            raise Permanent(f"gcp provider {self.name}: {exc}") from exc
        if not RFC1035.match(zone):
            raise Permanent(f"gcp provider {self.name}: zone {zone!r} is not a GCE zone name")
        if not RFC1035.match(request.name):
            raise Permanent(f"gcp provider {self.name}: instance name {request.name!r} is not an RFC 1035 label")
        pid = ids.provider_id(s.project, zone, request.name)
        if s.firewall.ensure:
            self._ensure_firewall(request.port)
        body = self._instance_body(request, zone)
        api = self._api()
        insert = compute_v1.InsertInstanceRequest(project=s.project, zone=zone, instance_resource=body)
        try:
            op = self._call(f"insert {pid}", lambda: api.instances.insert_unary(
                request=insert, timeout=s.request_timeout, retry=None), on_404=Permanent)
        except ProviderError as exc:
            if already_exists(exc.__cause__):
                log.info("gcp insert %s: already exists; returning it", pid)
                return self._inserted(pid, request.name, zone)
            raise
        try:
            self._wait(f"insert {pid}", op, s.project, zone, on_404=Permanent)
        except ProviderError as exc:
            if already_exists(exc.__cause__):
                return self._inserted(pid, request.name, zone)
            raise
        return self._inserted(pid, request.name, zone)

    def _inserted(self, pid: str, name: str, zone: str) -> Instance:
        """Read back the instance an insert made (its operation DONE, or it already existed).

        Args:
            pid: its provider ID.
            name: its instance name.
            zone: its zone.
        Returns:
            the instance; Provisioning without an address when the read does not show it yet.
        Raises:
            ProviderError: the read failed otherwise (classified as :meth:`get` does).
        """
        try:
            return self.get(pid)
        except NotFound:
            # Reads may lag behind a create (eventual consistency, as EC2 documents for its own
            # API: https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html), but
            # the operation says the instance exists: the poll reads it again
            # (app.proxy.reconcile.visibility_window).
            log.info("gcp insert %s: done, but the instance does not show yet; provisioning", pid)
            return Instance(provider_id=pid, name=name, state=InstanceState.PROVISIONING, zone=zone)

    def check_placement(self, request: CreateRequest) -> None:
        """Refuse a zone, image or machine type the providers config does not list.

        Allowed: ``gcp.zones``; ``gcp.image`` and ``gcp.images``; ``gcp.machineType`` and
        ``gcp.machineTypes`` (exact strings).  A Proxy that names none gets the defaults.

        Raises:
            SpecNotAllowed: naming ``spec.placement.zone``, ``spec.placement.image`` or
                ``spec.placement.machineType``; or ``spec.endpoint.port`` outside
                ``gcp.firewall.ports`` while ``gcp.firewall.ensure`` is on.
        """
        s = self.settings
        checks = (("spec.placement.zone", request.zone, s.zones, "gcp.zones"),
                  ("spec.placement.image", request.image, s.allowed_images(), "gcp.image/images"),
                  ("spec.placement.machineType", request.machine_type, s.allowed_machine_types(),
                   "gcp.machineType/machineTypes"))
        refuse_unlisted(self.name, checks)
        # With the firewall opt-in the port becomes an ingress rule to every proxy VM: only the
        # configured ports, never one a Proxy author picks (docs/security.md).
        if s.firewall.ensure:
            refuse_port(self.name, request.port, s.firewall.ports, "gcp.firewall.ports",
                        "with gcp.firewall.ensure the port opens an ingress rule to every proxy VM")

    def _instance_body(self, request: CreateRequest, zone: str) -> compute_v1.Instance:
        s = self.settings
        items = []
        if request.user_data is not None:
            try:
                text = request.user_data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise Permanent(f"gcp provider {self.name}: cloud-init user-data is not UTF-8 "
                                f"(GCE metadata values are text): byte {exc.start}") from None
            items.append(compute_v1.Items(key=USER_DATA_KEY, value=text))
        if request.squid_config:
            items.append(compute_v1.Items(key=SQUID_CONF_KEY, value=request.squid_config))
            # The guest environment runs it at every boot: the operator's squid.conf is installed
            # whatever the user-data does (app/providers/gcp/startup.py, docs/security.md).
            items.append(compute_v1.Items(key=startup.STARTUP_SCRIPT_KEY, value=startup.STARTUP_SCRIPT))
        if request.auth_htpasswd:
            items.append(compute_v1.Items(key=SQUID_HTPASSWD_KEY, value=request.auth_htpasswd))
        if request.squid_config and request.egress_rules:
            items.append(compute_v1.Items(key=SQUID_EGRESS_KEY, value=request.egress_rules))
        nic = compute_v1.NetworkInterface(network=ids.network_path(s.project, s.network))
        if s.subnetwork:
            nic.subnetwork = ids.subnetwork_path(s.project, zone, s.subnetwork)
        if s.external_ip:
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        disk = compute_v1.AttachedDisk(
            boot=True, auto_delete=True,
            initialize_params=compute_v1.AttachedDiskInitializeParams(source_image=request.image or s.image))
        body = compute_v1.Instance(
            name=request.name,
            machine_type=ids.machine_type_path(zone, request.machine_type or s.machine_type),
            labels=dict(request.tags),
            metadata=compute_v1.Metadata(items=items),
            disks=[disk],
            network_interfaces=[nic],
            tags=compute_v1.Tags(items=list(s.network_tags)),
            description=f"proxy-operator provider {self.name}, namespace {request.namespace}",
        )
        if request.capacity == CAPACITY_SPOT:
            # GCE spot: preemptible at any time; DELETE on preemption (a spot VM is never restarted
            # by the reconciler: it is replaced, as InstanceInterrupted, see to_instance).
            body.scheduling = compute_v1.Scheduling(provisioning_model="SPOT", instance_termination_action="DELETE",
                                                    automatic_restart=False, on_host_maintenance="TERMINATE")
        if s.service_account:
            body.service_accounts = [compute_v1.ServiceAccount(email=s.service_account,
                                                               scopes=list(s.service_account_scopes))]
        return body

    def get(self, provider_id: str) -> Instance:
        """Return the instance behind ``provider_id``.

        Raises:
            Permanent: a malformed provider ID, or a 4xx other than 404/429.
            NotFound: the instance does not exist.
            QuotaExceeded / Transient: see :func:`app.providers.gcp.classify.to_provider_error`.
        """
        project, zone, name = self._parse(provider_id)
        api = self._api()
        inst = self._call(f"get {provider_id}", lambda: api.instances.get(
            project=project, zone=zone, instance=name, timeout=self.settings.request_timeout, retry=None))
        return to_instance(inst, project, zone)

    def delete(self, provider_id: str) -> None:
        """Delete the instance if it is ours and wait for the operation; an instance already gone is success.

        Reads the instance first (one ``instances.get``) and refuses one whose labels lack
        ``managed-by=proxy-operator`` and a ``proxy-uid`` (:func:`app.providers.base.require_managed`).

        Raises:
            NotManaged: (Permanent) the instance is not ours; it is left in place.
            Permanent: a malformed provider ID, or a rejected request.
            QuotaExceeded / Transient: rate limited, 5xx, timeouts, operation still running.
        """
        project, zone, name = self._parse(provider_id)
        api = self._api()
        try:
            inst = self._call(f"get {provider_id}", lambda: api.instances.get(
                project=project, zone=zone, instance=name, timeout=self.settings.request_timeout, retry=None))
        except NotFound:
            log.debug("gcp delete %s: already gone", provider_id)
            return
        require_managed(dict(inst.labels), self.name, provider_id)
        request = compute_v1.DeleteInstanceRequest(project=project, zone=zone, instance=name)
        try:
            op = self._call(f"delete {provider_id}", lambda: api.instances.delete_unary(
                request=request, timeout=self.settings.request_timeout, retry=None))
            self._wait(f"delete {provider_id}", op, project, zone)
        except NotFound:
            log.debug("gcp delete %s: already gone", provider_id)

    def abandon(self, provider_id: str) -> None:
        """Add the label ``abandoned=true`` to the instance (``instances.setLabels``) and wait.

        setLabels replaces the whole label set and must carry the ``labelFingerprint`` of the
        labels it replaces (https://cloud.google.com/compute/docs/labeling-resources), so each
        attempt reads the instance first; a fingerprint gone stale meanwhile (HTTP 412,
        someone else changed the labels) is re-read and retried up to three times, then raised
        as Transient.  An instance already gone, or already marked, is success.

        Raises:
            Permanent: a malformed provider ID, or a rejected request (400/403).
            QuotaExceeded / Transient: rate limited, 5xx, timeouts, a fingerprint that stays
                stale, the operation still running.
        """
        project, zone, name = self._parse(provider_id)
        api = self._api()
        s = self.settings
        for attempt in range(1, _SET_LABELS_ATTEMPTS + 1):
            try:
                inst = self._call(f"get {provider_id}", lambda: api.instances.get(
                    project=project, zone=zone, instance=name, timeout=s.request_timeout, retry=None))
            except NotFound:
                log.debug("gcp abandon %s: already gone", provider_id)
                return
            labels = dict(inst.labels)
            if labels.get(TAG_ABANDONED) == ABANDONED:
                return
            labels[TAG_ABANDONED] = ABANDONED
            request = compute_v1.SetLabelsInstanceRequest(
                project=project, zone=zone, instance=name,
                instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
                    labels=labels, label_fingerprint=inst.label_fingerprint))
            try:
                op = self._call(f"setLabels {provider_id}", functools.partial(
                    api.instances.set_labels_unary, request=request, timeout=s.request_timeout, retry=None))
                self._wait(f"setLabels {provider_id}", op, project, zone)
            except NotFound:
                log.debug("gcp abandon %s: gone meanwhile", provider_id)
                return
            except Transient as exc:
                if getattr(exc.__cause__, "code", None) != 412 or attempt == _SET_LABELS_ATTEMPTS:
                    raise
                log.debug("gcp setLabels %s: label fingerprint went stale; re-reading (attempt %d)",
                          provider_id, attempt)
                continue
            log.info("gcp instance %s marked abandoned", provider_id)
            return

    def start(self, provider_id: str) -> None:
        """Run a stopped or suspended instance again and wait for the operation.

        Reads the instance first: TERMINATED/STOPPED -> ``instances.start``, SUSPENDED ->
        ``instances.resume`` (https://cloud.google.com/compute/docs/instances/instance-life-cycle,
        .../stop-start-instance, .../suspend-resume-instance); an instance running or on its
        way up needs nothing.

        Raises:
            NotFound: the instance does not exist.
            Transient: the instance is still stopping or suspending (neither call is accepted
                until it has), 5xx, timeouts, the operation still running.
            Permanent: a malformed provider ID, or a rejected request.
            QuotaExceeded: quota or capacity refused (a zone stockout on start).
        """
        project, zone, name = self._parse(provider_id)
        api = self._api()
        s = self.settings
        inst = self._call(f"get {provider_id}", lambda: api.instances.get(
            project=project, zone=zone, instance=name, timeout=s.request_timeout, retry=None))
        status = (inst.status or "").upper()
        if status in _STOPPING:
            raise Transient(f"gcp instance {provider_id} is {status}; it can be started once it has stopped")
        if status in _START_FROM:
            verb, fn = "start", lambda: api.instances.start_unary(request=compute_v1.StartInstanceRequest(
                project=project, zone=zone, instance=name), timeout=s.request_timeout, retry=None)
        elif status in _RESUME_FROM:
            verb, fn = "resume", lambda: api.instances.resume_unary(request=compute_v1.ResumeInstanceRequest(
                project=project, zone=zone, instance=name), timeout=s.request_timeout, retry=None)
        else:
            log.debug("gcp start %s: status %s, nothing to do", provider_id, status or "unknown")
            return
        op = self._call(f"{verb} {provider_id}", fn)
        self._wait(f"{verb} {provider_id}", op, project, zone)
        log.info("gcp instance %s was %s; %s done", provider_id, status, verb)

    def list_by_tag(self, tag: str) -> ListResult:
        """Return every instance of the project labelled ``managed-by=<tag>``, over every page.

        Zones the API reports unreachable make the result partial (GC then deletes nothing).

        Raises:
            Permanent: ``tag`` is not a GCE label value, or a rejected request.
            QuotaExceeded / Transient: the listing failed as a whole.
        """
        pager = self._aggregated(tag, _LIST_PAGE_SIZE, self.settings.request_timeout)
        instances: list[Instance] = []
        unreachable: list[str] = []

        def drain() -> int:
            pages = 0
            for page in pager.pages:  # the pager fetches each next page lazily
                pages += 1
                self._collect(page, instances, unreachable)
            return pages

        pages = self._call(f"aggregatedList projects/{self.settings.project} (all pages)", drain)
        log.debug("gcp list_by_tag %s: %d instance(s) in %d page(s)%s", tag, len(instances), pages,
                  f", unreachable zones {unreachable}" if unreachable else "")
        errors = [f"zone {z} unreachable" for z in unreachable]
        return ListResult(instances=instances, partial=bool(unreachable), errors=errors)

    def check(self) -> list[TargetVerdict]:
        """Ask the Compute API for one page of at most one managed instance; never raises.

        Returns:
            one :class:`TargetVerdict` named after the project: ready with reason ``Ready``,
            or not ready with the taxonomy reason and the classified message.
        """
        project = self.settings.project
        try:
            pager = self._aggregated(None, 1, self.check_timeout)
            page = self._call(f"check projects/{project}", lambda: next(iter(pager.pages)))
            found: list[Instance] = []
            unreachable: list[str] = []
            self._collect(page, found, unreachable)
        except Exception as exc:  # noqa: BLE001 - a check reports, it never raises
            err = to_provider_error(exc, f"check projects/{project}")
            return [TargetVerdict(name=project, ready=False, reason=err.reason, message=str(err))]
        details = {"managedInstancesOnFirstPage": str(len(found))}
        if unreachable:
            details["unreachableZones"] = ",".join(unreachable)
        return [TargetVerdict(name=project, ready=True, reason="Ready",
                              message=f"Compute API answered for project {project}", details=details)]

    # -- firewall opt-in ---------------------------------------------------------------
    def firewall_rule(self, port: int) -> compute_v1.Firewall:
        """Return the ingress rule proxies on ``port`` need: TCP ``port`` from
        ``firewall.sourceRanges`` to instances tagged with the first network tag."""
        s = self.settings
        name = ids.firewall_name(s.firewall.name or f"proxy-operator-{self.name}", port)
        return compute_v1.Firewall(
            name=name, network=ids.network_path(s.project, s.network), direction="INGRESS", priority=1000,
            allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=[str(port)])],
            source_ranges=list(s.firewall.source_ranges), target_tags=[s.network_tags[0]],
            description=f"proxy-operator provider {self.name}: clients to Squid on port {port}")

    def _ensure_firewall(self, port: int) -> None:
        """Create the rule of :meth:`firewall_rule`, or patch it when it differs; once per process and port.

        Raises:
            Permanent: the API refused (typically 403: the operator lacks
                ``roles/compute.securityAdmin``).
            QuotaExceeded / Transient: as for any call.
        """
        s = self.settings
        want = self.firewall_rule(port)
        if want.name in self._firewalls_ok:
            return
        api = self._api()
        what = f"firewall projects/{s.project}/global/firewalls/{want.name}"
        try:
            have = self._call(f"get {what}", lambda: api.firewalls.get(
                project=s.project, firewall=want.name, timeout=s.request_timeout, retry=None))
        except NotFound:
            have = None
        op = None
        if have is None:
            try:
                op = self._call(f"insert {what}", lambda: api.firewalls.insert_unary(
                    project=s.project, firewall_resource=want, timeout=s.request_timeout, retry=None),
                    on_404=Permanent)
            except ProviderError as exc:
                if not already_exists(exc.__cause__):  # created concurrently: fine
                    raise
        elif not _same_rule(have, want):
            log.info("gcp %s differs from the configuration; patching it", what)
            op = self._call(f"patch {what}", lambda: api.firewalls.patch_unary(
                project=s.project, firewall=want.name, firewall_resource=want,
                timeout=s.request_timeout, retry=None), on_404=Permanent)
        if op is not None:
            self._wait(what, op, s.project, None, on_404=Permanent)
        self._firewalls_ok.add(want.name)

    # -- helpers -----------------------------------------------------------------------
    def _parse(self, provider_id: str) -> tuple[str, str, str]:
        try:
            return ids.parse_provider_id(provider_id)
        except ValueError as exc:
            raise Permanent(f"gcp provider {self.name}: {exc}") from exc

    def _aggregated(self, tag: str | None, page_size: int, timeout: float) -> Any:
        """Return a lazy pager over the aggregated list filtered on the managed-by label."""
        value = MANAGED_BY if tag is None else tag
        if not value or len(value) > 63 or not all(c.islower() or c.isdigit() or c in "-_" for c in value):
            raise Permanent(f"gcp provider {self.name}: {value!r} is not a GCE label value")
        request = compute_v1.AggregatedListInstancesRequest(
            project=self.settings.project, filter=f'labels.{TAG_MANAGED_BY} = "{value}"', max_results=page_size)
        api = self._api()
        return self._call(f"aggregatedList projects/{self.settings.project}",
                          lambda: api.instances.aggregated_list(request=request, timeout=timeout, retry=None))

    def _collect(self, page: Any, instances: list[Instance], unreachable: list[str]) -> None:
        for scope, scoped in page.items.items():
            zone = ids.last_segment(scope)
            for inst in scoped.instances:
                instances.append(to_instance(inst, self.settings.project, zone))
            if scoped.warning and scoped.warning.code == "UNREACHABLE" and zone not in unreachable:
                unreachable.append(zone)
        for scope in page.unreachables:
            zone = ids.last_segment(scope)
            if zone not in unreachable:
                unreachable.append(zone)
