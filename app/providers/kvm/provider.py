"""The kvm provider: libvirt domains on hypervisors reached over SSH.

``placement.zone`` is the host name; the provider ID is ``hosts/<host>/domains/<name>``; work
for host H belongs on the Celery queue ``kvm.<provider>.H`` (:meth:`KvmProvider.queue_for`) so
one worker process owns H's pooled link.  The constructor never dials: every host's link
(:class:`app.providers.kvm.link.HostLink`) is established on first use.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any

import libvirt

from app.config.providers import ProviderConfig
from app.providers.naming import ABANDONED, TAG_ABANDONED, TAG_MANAGED_BY, TAG_PROXY_UID, is_abandoned, is_instance_name
from app.providers.base import (CheckableProvider, CreateRequest, Instance, InstanceNote, InstanceState, ListResult,
                                Provider, ShardedProvider, TargetVerdict, refuse_spot, require_managed)
from app.errors import NotFound, Permanent, ProviderError, SpecNotAllowed, Transient
from app.providers.kvm import domain as dom_xml
from app.providers.kvm import images, placement, seed, sshlink
from app.providers.kvm.config import DEFAULT_MACHINE_TYPE, KvmHost, KvmSettings, MachineType
from app.providers.kvm.faults import BadSSHMaterial, DialError, code_of
from app.providers.kvm.link import HostLink

log = logging.getLogger("proxy_operator.kvm")

_GIB = 1024 ** 3
#: Seconds a guest-agent query may take before libvirt gives up on it.
AGENT_TIMEOUT = 5
_RUNNING_STATES = (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_BLOCKED)
#: :class:`InstanceNote` reasons (the Proxy's ``Provisioned`` condition; the second is also a
#: Warning Event).
WAITING_FOR_AGENT = "WaitingForGuestAgent"
AGENT_UNAVAILABLE = "GuestAgentUnavailable"
#: Source names in the address log line (``address A from <source>``).
SOURCE_AGENT = "the guest agent"
_UNDEFINE_FLAGS = (libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
                   | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA)


def overlay_name(name: str) -> str:
    """Return the per-VM overlay volume name: ``<name>.qcow2``."""
    return f"{name}.qcow2"


def seed_name(name: str) -> str:
    """Return the per-VM seed ISO volume name: ``<name>-seed.iso``."""
    return f"{name}-seed.iso"


class KvmProvider(Provider, ShardedProvider, CheckableProvider):
    """Provider over libvirt hosts reached by SSH (sharded by host, with checks).

    Args:
        pc: the provider's config entry; ``pc.settings`` is a
            :class:`app.providers.kvm.config.KvmSettings`.

    Never dials in the constructor; logs a WARNING when the SSH key or known_hosts file is
    missing or unreadable (hosts stay unreachable, Transient, until the files appear).
    """

    type = "kvm"
    #: The htpasswd travels inside the instance (its bootstrap), so a rotated Secret means a new
    #: instance (see ``app.proxy.reconcile``).
    credentials_in_instance = True

    def __init__(self, pc: ProviderConfig) -> None:
        self.name = pc.name
        self.settings: KvmSettings = pc.settings
        self.check_timeout = pc.check_timeout
        self._links = {h.name: HostLink(pc.name, h, self.settings) for h in self.settings.hosts}
        self._image_locks: dict[tuple[str, str], threading.Lock] = {}
        self._image_locks_guard = threading.Lock()
        #: (host, domain) -> (address, source) last logged, so the source is logged once per change.
        self._address_sources: dict[tuple[str, str], tuple[str, str]] = {}
        #: (host, domain) -> monotonic time of the first poll that found it running without an
        #: agent address (cleared when the agent answers or the domain stops): the fallback clock.
        self._agent_waits: dict[tuple[str, str], float] = {}
        problems = sshlink.material_problems(self.settings.ssh.key_file, self.settings.ssh.known_hosts_file)
        if problems:
            log.warning("kvm provider %s: %s; its hosts are unreachable until the files appear "
                        "(mount the kvm-ssh Secret; no restart needed)", self.name, "; ".join(problems))

    # -- wiring helpers -------------------------------------------------------------------------
    def hosts(self) -> list[str]:
        """Return the configured host names in config order."""
        return placement.hosts(self.settings)

    def link(self, host: str) -> HostLink:
        """Return the pooled link of ``host``.

        Raises:
            Permanent: the host is not configured.
        """
        try:
            return self._links[host]
        except KeyError:
            raise Permanent(f"kvm provider {self.name}: host {host!r} is not configured "
                            f"(hosts: {', '.join(self._links)})") from None

    def host_of(self, provider_id: str) -> str | None:
        """Return the host name inside ``provider_id`` (``None`` if it does not parse)."""
        return placement.host_of(provider_id)

    def close(self) -> None:
        """Close every host link (they redial on next use)."""
        for link in self._links.values():
            link.close()

    def _image_lock(self, host: str, key: str) -> threading.Lock:
        with self._image_locks_guard:
            return self._image_locks.setdefault((host, key), threading.Lock())

    # -- resolution -----------------------------------------------------------------------------
    def _host_for(self, zone: str | None) -> KvmHost:
        """Return the host ``spec.placement.zone`` names (:func:`app.providers.kvm.placement.host_for`).

        Raises SpecNotAllowed (Permanent) naming the field.
        """
        host = self.settings.host(placement.host_for(self.settings, zone))
        if host is None and not zone:
            raise SpecNotAllowed("spec.placement.zone", f"required (the host): kvm provider {self.name} has "
                                                        f"hosts {', '.join(self._links)}")
        if host is None:
            raise SpecNotAllowed("spec.placement.zone", f"{zone!r} is not a configured host of kvm provider "
                                                        f"{self.name} (hosts: {', '.join(self._links)})")
        return host

    def _machine_type(self, key: str | None) -> MachineType:
        types = self.settings.machine_types
        if not key:
            if "default" in types:
                return types["default"]
            if len(types) == 1:
                return next(iter(types.values()))
            if not types:
                return MachineType(DEFAULT_MACHINE_TYPE["vcpus"], DEFAULT_MACHINE_TYPE["memoryMiB"],
                                   DEFAULT_MACHINE_TYPE["diskGiB"])
            raise SpecNotAllowed("spec.placement.machineType", f"required: kvm provider {self.name} has "
                                                               f"profiles {', '.join(sorted(types))}")
        if key not in types:
            raise SpecNotAllowed("spec.placement.machineType", f"{key!r} is not a configured profile of kvm "
                                                               f"provider {self.name} "
                                                               f"({', '.join(sorted(types)) or 'none'})")
        return types[key]

    # -- libvirt helpers ------------------------------------------------------------------------
    @staticmethod
    def _lookup(link: HostLink, name: str) -> libvirt.virDomain | None:
        try:
            return link.call("virDomainLookupByName", lambda c: c.lookupByName(name), domain=name)
        except NotFound:
            return None

    @staticmethod
    def _metadata(link: HostLink, dom: libvirt.virDomain, name: str) -> dom_xml.Metadata | None:
        try:
            text = link.call("virDomainGetMetadata",
                             lambda c: dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, dom_xml.METADATA_NS, 0),
                             domain=name, trace_result=True)
        except NotFound:
            return None
        try:
            return dom_xml.parse_metadata(text)
        except ValueError as exc:
            log.debug("kvm host %s: domain %s: unreadable metadata: %s", link.host.name, name, exc)
            return None

    def _pool(self, link: HostLink) -> libvirt.virStoragePool:
        name = link.host.pool
        try:
            pool = link.call("virStoragePoolLookupByName", lambda c: c.storagePoolLookupByName(name), pool=name)
        except NotFound as exc:
            raise Permanent(f"kvm host {link.host.name}: storage pool {name!r} does not exist") from exc
        if not link.call("virStoragePoolIsActive", lambda c: pool.isActive(), pool=name):
            raise Transient(f"kvm host {link.host.name}: storage pool {name!r} is not running "
                            f"(virsh pool-start {name})")
        return pool

    @staticmethod
    def _ensure_autostart(link: HostLink, dom: libvirt.virDomain, name: str) -> None:
        if not link.call("virDomainGetAutostart", lambda c: dom.autostart(), domain=name):
            link.call("virDomainSetAutostart", lambda c: dom.setAutostart(1), domain=name, autostart=1)

    @staticmethod
    def _start(link: HostLink, dom: libvirt.virDomain, name: str) -> None:
        try:
            link.call("virDomainCreate", lambda c: dom.create(), domain=name)
        except ProviderError as exc:
            if code_of(exc) == libvirt.VIR_ERR_OPERATION_INVALID and \
                    link.call("virDomainIsActive", lambda c: dom.isActive(), domain=name):
                return  # started concurrently
            raise

    # -- contract -------------------------------------------------------------------------------
    def instance_ids(self, name: str, namespace: str, zone: str | None = None) -> list[str]:
        """Return ``["hosts/<host>/domains/<name>"]`` for the host ``zone`` names (the only host
        when ``zone`` is empty and one is configured): the ID :meth:`create` uses.

        Only that host: work for host H runs on H's queue, so a step never looks at other
        hosts.  A domain left on another host is found through the provider ID recorded before
        every create; without one, the delete hands the name on each other host to that host's
        queue (``app.proxy.reconcile`` retires it there), and GC collects what stays unreachable.

        Raises:
            Permanent: ``zone`` is not a configured host, or is empty with several hosts.
        """
        return [dom_xml.provider_id(self._host_for(zone).name, name)]

    def create(self, request: CreateRequest) -> Instance:
        """Create (or start) the domain ``request.name`` on the host ``request.zone``.

        Looks the domain up first and only starts it when it exists; otherwise caches the
        image, reuses or creates the overlay, rebuilds the seed ISO (an interrupted upload can
        leave a truncated one), defines the domain with autostart on (libvirtd starts it
        again when the hypervisor boots) and starts it.

        Returns:
            the instance (Provisioning until an address is known).
        Raises:
            SpecNotAllowed: (Permanent) ``spec.placement.zone``/``image``/``machineType`` is not
                a configured host, image (or allowed image URL) or profile, or
                ``spec.placement.capacity`` is Spot; nothing is dialled.
            Permanent: missing pool; bad checksum; an image over its size cap or redirected off
                the allowed hosts; a domain of that name that belongs to someone else.
            ImageInUse (Transient): the cached image must be replaced but other VMs use it.
            DialError (Transient) / BadSSHMaterial (Permanent): the host is unreachable.
            NotFound, QuotaExceeded, Transient: libvirt errors, classified.
        """
        refuse_spot(request, self.name, self.type)
        host = self._host_for(request.zone)
        img = images.resolve(self.settings, request.image)
        mt = self._machine_type(request.machine_type)
        link = self.link(host.name)
        name = request.name
        pid = dom_xml.provider_id(host.name, name)

        dom = self._lookup(link, name)
        if dom is not None:
            meta = self._metadata(link, dom, name)
            want_uid = request.tags.get(TAG_PROXY_UID)
            if meta is None or (want_uid and meta.tags.get(TAG_PROXY_UID) != want_uid):
                raise Permanent(f"kvm host {host.name}: a domain named {name} exists but does not carry "
                                f"this Proxy's metadata; refusing to adopt it")
            found = dom
            state = link.call("virDomainGetState", lambda c: found.state(0)[0], domain=name)
            if state == libvirt.VIR_DOMAIN_PAUSED:
                link.call("virDomainResume", lambda c: found.resume(), domain=name)
            elif state not in _RUNNING_STATES:
                self._start(link, dom, name)
            self._ensure_autostart(link, dom, name)  # domains defined before autostart was set
            return Instance(pid, name, InstanceState.PROVISIONING, None, meta.created, dict(meta.tags), host.name)

        pool = self._pool(link)
        pool_name = host.pool
        ov_name, sd_name = overlay_name(name), seed_name(name)
        with self._image_lock(host.name, img.key):  # one fetch of a base at a time in this process
            base = images.ensure_base(link, pool, pool_name, img=img, own_volumes={ov_name, sd_name},
                                      timeout=self.settings.image_timeout)

        try:
            overlay = link.call("virStorageVolLookupByName", lambda c: pool.storageVolLookupByName(ov_name),
                                pool=pool_name, volume=ov_name)
        except NotFound:
            capacity = max(mt.disk_gib * _GIB, base.capacity)
            xml = dom_xml.volume_xml(ov_name, capacity, "qcow2", backing_path=base.path, backing_format=img.format)
            overlay = link.call("virStorageVolCreateXML", lambda c: pool.createXML(xml, 0),
                                pool=pool_name, volume=ov_name, xml=xml)
        disk_path = link.call("virStorageVolGetPath", lambda c: overlay.path(), volume=ov_name)

        iso = seed.build_seed(name, request.user_data, seed.vendor_data(
            install_guest_agent=self.settings.install_guest_agent,
            squid_conf=request.squid_config if self.settings.configure_squid else None,
            user_vendor_data=request.vendor_data, htpasswd=request.auth_htpasswd,
            egress_rules=request.egress_rules if self.settings.configure_squid else None))
        images.delete_volume(link, pool, pool_name, name=sd_name)
        xml = dom_xml.volume_xml(sd_name, len(iso), "raw")
        seed_vol = link.call("virStorageVolCreateXML", lambda c: pool.createXML(xml, 0),
                             pool=pool_name, volume=sd_name, xml=xml)
        images.upload_bytes(link, seed_vol, iso, pool=pool_name, volume=sd_name)
        seed_path = link.call("virStorageVolGetPath", lambda c: seed_vol.path(), volume=sd_name)

        created = datetime.now(timezone.utc).replace(microsecond=0)
        spec = dom_xml.DomainSpec(
            name=name, domain_type=host.domain_type, vcpus=mt.vcpus, memory_mib=mt.memory_mib,
            firmware=img.firmware, disk_path=disk_path, seed_path=seed_path,
            metadata=dom_xml.metadata_xml(request.tags, created), network=host.network, bridge=host.bridge)
        xml = dom_xml.domain_xml(spec)
        dom = link.call("virDomainDefineXML", lambda c: c.defineXML(xml), domain=name, xml=xml)
        # Autostart: libvirtd starts the domain again when the hypervisor boots, so a host
        # reboot brings its proxies back by itself (the reconciler's start covers the rest).
        link.call("virDomainSetAutostart", lambda c: dom.setAutostart(1), domain=name, autostart=1)
        self._start(link, dom, name)
        log.info("kvm host %s: created domain %s (image %s, %s)", host.name, name, img.key, img.firmware)
        return Instance(pid, name, InstanceState.PROVISIONING, None, created, dict(request.tags), host.name)

    def get(self, provider_id: str) -> Instance:
        """Return the domain's state and address.

        Address: the QEMU guest agent is the source of truth (the first routable IPv4 it reports,
        ``virDomainInterfaceAddresses`` with ``VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT``).  While
        it reports none, a running domain stays Provisioning with the note
        ``WaitingForGuestAgent`` (:class:`InstanceNote`, the Proxy's ``Provisioned`` condition).
        Only once ``agentAddressTimeout`` has passed since the first poll that found the domain
        running without an agent address (in this process: a worker restart starts the count
        again, a shut-off domain or an agent answer resets it) does it take the newest DHCP lease
        for the NIC's MAC on its libvirt network, else the host's ARP table, and report the
        instance Running with the note ``GuestAgentUnavailable`` (degraded: a Warning Event) and a
        WARNING log line.  Which source gave the address is logged (``address ... from the guest
        agent|a DHCP lease on network N|the ARP table``) when the address or its source changes.

        Raises:
            NotFound: no such domain on that host.
            Permanent: the ID does not parse, or its host is not configured (a typo in hosts
                must not look like a missing VM, which would be recreated).
        """
        host_name, name, link, dom = self._existing(provider_id)
        meta = self._metadata(link, dom, name)
        state = link.call("virDomainGetState", lambda c: dom.state(0)[0], domain=name)
        address, note = None, None
        if state in _RUNNING_STATES:
            address, note = self._address(link, dom, name)
        else:
            self._agent_waits.pop((host_name, name), None)  # the next run waits for its agent afresh
        return Instance(provider_id, name, dom_xml.map_state(state, address), address,
                        meta.created if meta else None, dict(meta.tags) if meta else {}, host_name, note)

    @staticmethod
    def _interfaces(link: HostLink, dom: libvirt.virDomain, name: str, source: str) -> Any:
        """Return the domain's interface addresses as ``source`` (``"agent"``, ``"arp"``) reports them.

        Raises:
            ProviderError: libvirt failed (classified); DialError / BadSSHMaterial: the link failed.
        """
        flag = (libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT if source == "agent"
                else libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP)
        return link.call("virDomainInterfaceAddresses", lambda c: dom.interfaceAddresses(flag, 0),
                         domain=name, source=source)

    def _agent_address(self, link: HostLink, dom: libvirt.virDomain, name: str) -> tuple[str | None, str]:
        """Ask the guest agent; return ``(routable IPv4 or None, why there is none)``."""
        try:
            # Agent commands block forever by default; a hung agent must not hang (and so drop)
            # the link.  The setting is per running domain, so it is renewed on every poll.
            link.call("virDomainAgentSetResponseTimeout",
                      lambda c: dom.agentSetResponseTimeout(AGENT_TIMEOUT, 0), domain=name, seconds=AGENT_TIMEOUT)
        except (DialError, BadSSHMaterial):
            raise
        except ProviderError:
            pass
        try:
            ifaces = self._interfaces(link, dom, name, "agent")
        except (DialError, BadSSHMaterial):
            raise
        except ProviderError as exc:
            cause = exc.__cause__
            detail = cause.get_error_message() if isinstance(cause, libvirt.libvirtError) else None
            return None, f"it does not answer: {detail or exc}"
        address = dom_xml.agent_address(ifaces)
        return address, "" if address else "it answers but reports no routable IPv4 address yet"

    def _address(self, link: HostLink, dom: libvirt.virDomain,
                 name: str) -> tuple[str | None, InstanceNote | None]:
        """Return ``(address or None, note or None)`` for a running domain (see :meth:`get`)."""
        key = (link.host.name, name)
        address, silence = self._agent_address(link, dom, name)
        if address:
            self._agent_waits.pop(key, None)
            return self._address_from(link, name, address, SOURCE_AGENT), None
        limit = self.settings.agent_address_timeout
        now = time.monotonic()
        since = self._agent_waits.setdefault(key, now)
        if now - since < limit:
            if since == now:
                log.info("kvm host %s: domain %s runs; waiting up to %gs for the guest agent to report its "
                         "address (%s)", link.host.name, name, limit, silence)
            return None, InstanceNote(WAITING_FOR_AGENT, (
                f"domain {name} runs; waiting for the QEMU guest agent to report its address ({silence}); "
                f"if it has not within agentAddressTimeout ({limit:g}s), the DHCP lease is used"))
        why = (f"the QEMU guest agent reported no address within agentAddressTimeout ({limit:g}s): {silence}"
               if limit else f"agentAddressTimeout is 0 and the QEMU guest agent reports no address: {silence}")
        fallback, source = self._fallback_address(link, dom, name)
        if fallback is None:
            return None, InstanceNote(WAITING_FOR_AGENT, f"{why}; no DHCP lease or ARP entry names the guest either")
        self._address_from(link, name, fallback, source, degraded=why)
        return fallback, InstanceNote(AGENT_UNAVAILABLE, (
            f"address {fallback} from {source} because {why}; the guest is degraded "
            f"(check qemu-guest-agent in the guest)"), degraded=True)

    def _fallback_address(self, link: HostLink, dom: libvirt.virDomain,
                          name: str) -> tuple[str | None, str]:
        """The newest DHCP lease of the NIC's MAC, else the ARP table: ``(address or None, source)``."""
        xml = link.call("virDomainGetXMLDesc", lambda c: dom.XMLDesc(0), domain=name, trace_result=True)
        for mac, network in dom_xml.nic_macs(xml):
            if not network:
                continue
            try:
                net = link.call("virNetworkLookupByName", lambda c, n=network: c.networkLookupByName(n),  # type: ignore[misc]  # defaults bind this iteration's values
                                network=network)
                leases = link.call("virNetworkGetDHCPLeases", lambda c, m=mac, nt=net: nt.DHCPLeases(m),  # type: ignore[misc]  # defaults bind this iteration's values
                                   network=network, mac=mac)
            except (DialError, BadSSHMaterial):
                raise
            except ProviderError:
                continue
            address = dom_xml.lease_address(leases, mac)
            if address:
                return address, f"a DHCP lease on network {network}"
        try:
            arp = self._interfaces(link, dom, name, "arp")
        except (DialError, BadSSHMaterial):
            raise
        except ProviderError:
            return None, ""
        address = dom_xml.agent_address(arp)
        return (address, "the ARP table") if address else (None, "")

    def _address_from(self, link: HostLink, name: str, address: str, source: str, *,
                      degraded: str | None = None) -> str:
        """Return ``address``; log where it came from when it or its source changed.

        ``degraded`` (why the agent's address was not used) makes the line a WARNING.
        """
        key = (link.host.name, name)
        if self._address_sources.get(key) != (address, source):
            self._address_sources[key] = (address, source)
            if degraded:
                log.warning("kvm host %s: domain %s: address %s from %s because %s; the guest is degraded",
                            link.host.name, name, address, source, degraded)
            else:
                log.info("kvm host %s: domain %s: address %s from %s", link.host.name, name, address, source)
        return address

    def delete(self, provider_id: str) -> None:
        """Destroy and undefine the domain (with its NVRAM) and remove its overlay and seed.

        The domain found is checked first (one ``virDomainGetMetadata`` on the lookup): one
        without our metadata (``managed-by=proxy-operator`` and a ``proxy-uid``) is refused and
        left alone, volumes included (:func:`app.providers.base.require_managed`).  With no
        domain, the leftover overlay and seed of an interrupted create are removed only when
        the name has the shape of our instance names (:func:`app.providers.naming.is_instance_name`).
        Every already-gone case is success, and so is a host that is no longer configured.

        Raises:
            NotManaged: (Permanent) the domain is not ours.
            Permanent: the ID does not parse.
            DialError (Transient): the host is unreachable.
        """
        found = self._configured(provider_id, "delete")
        if found is None:
            return
        host_name, name = found
        self._forget(host_name, name)
        link = self.link(host_name)
        dom = self._lookup(link, name)
        if dom is not None:
            meta = self._metadata(link, dom, name)
            # No metadata read back: the domain has none (not ours), or was undefined meanwhile.
            if meta is not None or self._lookup(link, name) is not None:
                require_managed(meta.tags if meta is not None else None, self.name, provider_id)
            else:
                dom = None
        if dom is None and not is_instance_name(name):
            log.info("kvm host %s: delete %s: no such domain, and %s is not an instance name of ours; "
                     "leaving its volumes alone", host_name, provider_id, name)
            return
        if dom is not None:
            try:
                link.call("virDomainDestroy", lambda c: dom.destroy(), domain=name)
            except NotFound:
                pass
            except ProviderError as exc:
                if code_of(exc) != libvirt.VIR_ERR_OPERATION_INVALID:  # "domain is not running"
                    raise
            self._undefine(link, dom, name)
        try:
            pool = link.call("virStoragePoolLookupByName",
                             lambda c: c.storagePoolLookupByName(link.host.pool), pool=link.host.pool)
        except NotFound:
            return
        for vol in (overlay_name(name), seed_name(name)):
            images.delete_volume(link, pool, link.host.pool, name=vol)
        log.info("kvm host %s: deleted domain %s", host_name, name)

    def _forget(self, host_name: str, name: str) -> None:
        """Drop what this process remembers of domain ``name`` on ``host_name`` (its last address
        source, its guest-agent wait): on a delete, and when the domain is found gone, whoever
        removed it, so that neither map outlives its domain."""
        self._address_sources.pop((host_name, name), None)
        self._agent_waits.pop((host_name, name), None)

    @staticmethod
    def _undefine(link: HostLink, dom: libvirt.virDomain, name: str) -> None:
        try:
            link.call("virDomainUndefineFlags", lambda c: dom.undefineFlags(_UNDEFINE_FLAGS),
                      domain=name, flags=_UNDEFINE_FLAGS)
        except NotFound:
            pass
        except Permanent as exc:
            if code_of(exc) not in (libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_INVALID_ARG,
                                    libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED):
                raise
            # A driver without NVRAM support (it has no NVRAM to leave behind either).
            try:
                link.call("virDomainUndefine", lambda c: dom.undefine(), domain=name)
            except NotFound:
                pass

    def start(self, provider_id: str) -> None:
        """Run the existing domain again (never a new one) and make sure it has autostart on.

        By libvirt state (https://libvirt.org/html/libvirt-libvirt-domain.html#virDomainState):
        shut off -> ``virDomainCreate``; crashed -> ``virDomainDestroy`` then create; paused ->
        ``virDomainResume``; pmsuspended -> ``virDomainPMWakeup``; running -> nothing.

        Raises:
            NotFound: no such domain on that host.
            Transient: the domain is still shutting down (it can be created once it is off),
                the host is unreachable (DialError), or libvirt failed transiently.
            Permanent: the ID does not parse, or its host is not configured.
        """
        host_name, name, link, dom = self._existing(provider_id)
        state = link.call("virDomainGetState", lambda c: dom.state(0)[0], domain=name)
        if state == libvirt.VIR_DOMAIN_SHUTDOWN:
            raise Transient(f"kvm host {host_name}: domain {name} is shutting down; it is started once it is off")
        if state == libvirt.VIR_DOMAIN_PAUSED:
            try:
                link.call("virDomainResume", lambda c: dom.resume(), domain=name)
            except ProviderError as exc:
                if code_of(exc) != libvirt.VIR_ERR_OPERATION_INVALID or \
                        link.call("virDomainGetState", lambda c: dom.state(0)[0], domain=name) not in _RUNNING_STATES:
                    raise  # else: resumed concurrently
        elif state == libvirt.VIR_DOMAIN_PMSUSPENDED:
            link.call("virDomainPMWakeup", lambda c: dom.pMWakeup(0), domain=name)
        elif state not in _RUNNING_STATES:
            if state == libvirt.VIR_DOMAIN_CRASHED:
                try:  # a crashed domain kept for inspection (on_crash=preserve) is still active
                    link.call("virDomainDestroy", lambda c: dom.destroy(), domain=name)
                except ProviderError as exc:
                    if code_of(exc) != libvirt.VIR_ERR_OPERATION_INVALID:
                        raise
            self._start(link, dom, name)
        self._ensure_autostart(link, dom, name)
        if state not in _RUNNING_STATES:
            log.info("kvm host %s: started domain %s again (libvirt state %d)", host_name, name, state)

    def abandon(self, provider_id: str) -> None:
        """Add the tag ``abandoned=true`` to the domain's metadata element, so GC never deletes it.

        ``virDomainSetMetadata`` with our namespace on the persistent config, and on the live
        domain too when it runs (https://libvirt.org/html/libvirt-libvirt-domain.html#virDomainSetMetadata).
        A domain already gone, already marked or without our metadata (not ours: GC never
        touches it), and a host no longer in the config (GC does not list it), are success.

        Raises:
            Permanent: the ID does not parse.
            DialError (Transient): the host is unreachable.
            Transient / QuotaExceeded: libvirt errors, classified.
        """
        found = self._configured(provider_id, "abandon")
        if found is None:
            return
        host_name, name = found
        link = self.link(host_name)
        dom = self._lookup(link, name)
        if dom is None:
            return
        meta = self._metadata(link, dom, name)
        if meta is None or is_abandoned(meta.tags):
            return
        xml = dom_xml.metadata_xml({**meta.tags, TAG_ABANDONED: ABANDONED}, meta.created, namespaced=False)
        config = libvirt.VIR_DOMAIN_AFFECT_CONFIG
        try:
            active = link.call("virDomainIsActive", lambda c: dom.isActive(), domain=name)
            flags = config | (libvirt.VIR_DOMAIN_AFFECT_LIVE if active else 0)
            try:
                link.call("virDomainSetMetadata", lambda c: dom.setMetadata(
                    libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, dom_xml.METADATA_PREFIX, dom_xml.METADATA_NS, flags),
                    domain=name, flags=flags, xml=xml)
            except ProviderError as exc:
                if not active or code_of(exc) != libvirt.VIR_ERR_OPERATION_INVALID:
                    raise
                # It stopped between the two calls: the persistent config is what remains.
                link.call("virDomainSetMetadata", lambda c: dom.setMetadata(
                    libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, dom_xml.METADATA_PREFIX, dom_xml.METADATA_NS, config),
                    domain=name, flags=config, xml=xml)
        except NotFound:
            return  # undefined meanwhile
        log.info("kvm host %s: marked domain %s abandoned", host_name, name)

    def list_by_tag(self, tag: str, host: str | None = None) -> ListResult:
        """Return every domain whose metadata carries ``managed-by=<tag>``.

        Args:
            tag: the managed-by value.
            host: only this host (what a per-host GC task on ``kvm.<provider>.<host>`` asks);
                ``None`` = every host, listed concurrently.
        Returns:
            the instances; ``partial`` when a host could not be listed (GC then deletes nothing
            of this provider in that sweep).  Domains without our metadata are skipped.
        Raises:
            Permanent: ``host`` is not configured.
        """
        if host is not None:
            return self.list_host(host, tag)
        instances, errors = [], []
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(self._links)),
                                                   thread_name_prefix="kvm-list") as pool:
            for result in pool.map(lambda h: self.list_host(h, tag), list(self._links)):
                instances.extend(result.instances)
                errors.extend(result.errors)
        return ListResult(instances, partial=bool(errors), errors=errors)

    def list_host(self, host: str, tag: str) -> ListResult:
        """Return the managed domains on one host (``partial`` when it cannot be listed).

        This is what a per-host GC task on ``kvm.<provider>.<host>`` calls.
        """
        link = self.link(host)
        try:
            doms = link.call("virConnectListAllDomains", lambda c: c.listAllDomains(0))
        except ProviderError as exc:
            return ListResult([], partial=True, errors=[str(exc)])
        found = []
        for dom in doms:
            name = dom.name()
            try:
                meta = self._metadata(link, dom, name)
                if meta is None or meta.tags.get(TAG_MANAGED_BY) != tag:
                    continue
                state = link.call("virDomainGetState", lambda c, d=dom: d.state(0)[0], domain=name)  # type: ignore[misc]  # defaults bind this iteration's values
            except NotFound:
                continue  # gone meanwhile
            except (DialError, BadSSHMaterial) as exc:
                return ListResult([], partial=True, errors=[str(exc)])
            except ProviderError as exc:
                log.info("kvm host %s: list: skipping domain %s: %s", host, name, exc)
                continue
            found.append(Instance(dom_xml.provider_id(host, name), name,
                                  dom_xml.base_state(state),
                                  None, meta.created, dict(meta.tags), host))
        return ListResult(found)

    def check(self) -> list[TargetVerdict]:
        """Check every host concurrently (one verdict each; never raises).

        A host that does not answer within the provider's ``checkTimeout`` is not ready with
        reason ``Timeout``.
        """
        hosts = list(self._links)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(hosts)), thread_name_prefix="kvm-check")
        futures = {h: pool.submit(self.check_host, h) for h in hosts}
        verdicts = []
        for h in hosts:
            try:
                verdicts.append(futures[h].result(timeout=self.check_timeout))
            except concurrent.futures.TimeoutError:
                verdicts.append(TargetVerdict(h, False, "Timeout",
                                              f"no answer within {self.check_timeout:g}s"))
            except Exception as exc:  # noqa: BLE001 - check never raises as a whole
                verdicts.append(TargetVerdict(h, False, "CheckFailed", f"{type(exc).__name__}: {exc}"))
        pool.shutdown(wait=False)
        return verdicts

    def check_host(self, host: str) -> TargetVerdict:
        """Check one host: libvirt answers (version, hostname); the pool exists, runs, has free space.

        Returns:
            a :class:`TargetVerdict`; ``details`` has ``libvirtVersion``, ``hostname``,
            ``pool``, ``capacityBytes`` and ``freeBytes`` when known, ``stage`` on dial failures.
        """
        link = self.link(host)
        details: dict[str, str] = {"pool": link.host.pool}
        try:
            version = link.call("virConnectGetLibVersion", lambda c: c.getLibVersion())
            details["libvirtVersion"] = f"{version // 1000000}.{version // 1000 % 1000}.{version % 1000}"
            details["hostname"] = link.call("virConnectGetHostname", lambda c: c.getHostname())
        except (DialError, BadSSHMaterial) as exc:
            return TargetVerdict(host, False, exc.reason, str(exc), {**details, "stage": exc.stage})
        except ProviderError as exc:
            return TargetVerdict(host, False, "LibvirtError", str(exc), details)
        pool_name = link.host.pool
        try:
            pool = link.call("virStoragePoolLookupByName", lambda c: c.storagePoolLookupByName(pool_name),
                             pool=pool_name)
            active = link.call("virStoragePoolIsActive", lambda c: pool.isActive(), pool=pool_name)
            info = link.call("virStoragePoolGetInfo", lambda c: pool.info(), pool=pool_name) if active else None
        except NotFound:
            return TargetVerdict(host, False, "PoolNotFound", f"storage pool {pool_name!r} does not exist", details)
        except ProviderError as exc:
            return TargetVerdict(host, False, "LibvirtError", str(exc), details)
        if not active or info is None:
            return TargetVerdict(host, False, "PoolInactive", f"storage pool {pool_name!r} is not running", details)
        details["capacityBytes"] = str(info[1])
        details["freeBytes"] = str(info[3])
        return TargetVerdict(host, True, "Ready",
                             f"libvirt {details['libvirtVersion']} on {details['hostname']}; pool {pool_name} "
                             f"has {info[3]} bytes free", details)

    def _configured(self, provider_id: str, action: str) -> tuple[str, str] | None:
        """Return the host and domain names of ``provider_id``, or ``None`` (logged) when its host
        is no longer configured.

        Args:
            provider_id: ``<host>/<domain>``.
            action: what the caller does (``"delete"``, ``"abandon"``), for the log line.
        Raises:
            Permanent: the ID does not parse.
        """
        host_name, name = self._parse(provider_id)
        if self.settings.host(host_name) is not None:
            return host_name, name
        log.info("kvm provider %s: %s %s: host %s is not configured; nothing to do",
                 self.name, action, provider_id, host_name)
        return None

    def _existing(self, provider_id: str) -> tuple[str, str, HostLink, libvirt.virDomain]:
        """Return the host name, domain name, host link and domain of ``provider_id``.

        Raises:
            NotFound: no such domain on that host (what this process remembers of it is dropped).
            Permanent: the ID does not parse, or its host is not configured (a typo in hosts must
                not look like a missing VM, which would be recreated).
            DialError (Transient): the host is unreachable.
        """
        host_name, name = self._parse(provider_id)
        if self.settings.host(host_name) is None:
            raise Permanent(f"kvm provider {self.name}: host {host_name!r} of {provider_id} is not configured")
        link = self.link(host_name)
        dom = self._lookup(link, name)
        if dom is None:
            self._forget(host_name, name)
            raise NotFound(f"kvm host {host_name}: domain {name} does not exist")
        return host_name, name, link, dom

    @staticmethod
    def _parse(provider_id: str) -> tuple[str, str]:
        try:
            return dom_xml.parse_provider_id(provider_id)
        except ValueError as exc:
            raise Permanent(str(exc)) from None
