"""Domain and volume XML, the GC metadata element, provider IDs, states and addresses (pure).

Rules that come from the field (docs/kvm-provider.md explains each):

* Disks are ``<disk type="file">`` with the paths libvirt reported for the pool's volumes,
  never ``type="volume"``: virt-aa-helper grants QEMU AppArmor access only to disk sources that
  carry a path, so volume references fail with "Permission denied" on stock Debian/Ubuntu.
* The seed is a cdrom on a virtio-scsi controller: Debian's cloud kernel has no AHCI driver,
  so a SATA cdrom is invisible and cloud-init silently finds no datasource.
* UEFI is the default (``<os firmware="efi">``, libvirt picks OVMF and manages the NVRAM)
  with the ``secure-boot`` and ``enrolled-keys`` firmware features off so unsigned
  bootloaders run; ``bios`` per image gives SeaBIOS.
* The GC contract (managed-by, Proxy UID, creation time) is a namespaced ``<metadata>``
  element.  libvirt may hand it back without the namespace declaration (libvirt 11.6 does),
  so :func:`parse_metadata` matches local names only.
"""

from __future__ import annotations

import ipaddress
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import datetime

from app.providers.base import InstanceState
from app.timefmt import parse_rfc3339, rfc3339

#: Namespace URI of our metadata element (an identifier, never fetched).
METADATA_NS = "https://crawl.example.com/proxy-operator/kvm/v1"
METADATA_PREFIX = "proxyop"

#: libvirt ``virDomainState`` (https://libvirt.org/html/libvirt-libvirt-domain.html#virDomainState)
#: -> provider state (Running is refined by the address).  Every state of a domain that
#: exists is recoverable in place (``KvmProvider.start``: create, resume or wake it), so
#: nothing maps to Terminated: a hypervisor reboot or a guest crash must not rebuild the VM.
_STATES = {
    0: InstanceState.PROVISIONING,   # VIR_DOMAIN_NOSTATE
    1: InstanceState.RUNNING,        # VIR_DOMAIN_RUNNING
    2: InstanceState.RUNNING,        # VIR_DOMAIN_BLOCKED (running, waiting on I/O)
    3: InstanceState.STOPPED,        # VIR_DOMAIN_PAUSED -> resume
    4: InstanceState.STOPPED,        # VIR_DOMAIN_SHUTDOWN (shutting down) -> create once off
    5: InstanceState.STOPPED,        # VIR_DOMAIN_SHUTOFF -> create
    6: InstanceState.STOPPED,        # VIR_DOMAIN_CRASHED -> destroy + create
    7: InstanceState.STOPPED,        # VIR_DOMAIN_PMSUSPENDED -> wake up
}


# -- provider IDs ------------------------------------------------------------------------------
def provider_id(host: str, name: str) -> str:
    """Return ``hosts/<host>/domains/<name>``."""
    return f"hosts/{host}/domains/{name}"


def parse_provider_id(pid: str) -> tuple[str, str]:
    """Split ``hosts/<host>/domains/<name>`` into ``(host, name)``.

    Raises:
        ValueError: any other shape.
    """
    parts = pid.split("/") if isinstance(pid, str) else []
    if len(parts) != 4 or parts[0] != "hosts" or parts[2] != "domains" or not parts[1] or not parts[3]:
        raise ValueError(f"not a kvm provider ID (hosts/<host>/domains/<name>): {pid!r}")
    return parts[1], parts[3]


def base_state(libvirt_state: int) -> InstanceState:
    """Map a libvirt domain state onto :class:`InstanceState` without looking at the address."""
    return _STATES.get(libvirt_state, InstanceState.PROVISIONING)


def map_state(libvirt_state: int, address: str | None) -> InstanceState:
    """Map a libvirt domain state onto :class:`InstanceState`.

    A running domain without a known address is still Provisioning: an empty address is never
    published.
    """
    state = base_state(libvirt_state)
    if state is InstanceState.RUNNING and not address:
        return InstanceState.PROVISIONING
    return state


# -- metadata ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metadata:
    """The GC contract read back from a domain.

    Attributes:
        tags: tag key -> value (``managed-by``, ``proxy-uid``).
        created: creation time (UTC) or ``None`` if missing/unparsable.
    """

    tags: dict[str, str]
    created: datetime | None


def metadata_xml(tags: dict[str, str], created: datetime | None, *, namespaced: bool = True) -> str:
    """Return our ``<proxyop:instance>`` element (with its namespace declaration).

    ``created`` ``None`` (rewriting metadata whose creation time was unreadable) leaves the
    ``<created>`` element out; GC keeps instances without a creation time.

    ``namespaced=False`` returns the bare ``<instance>`` element for ``virDomainSetMetadata``,
    which puts the root in our namespace under our prefix itself and refuses an element that
    already declares that prefix ("failed to create a new XML namespace").
    """
    prefix = f"{METADATA_PREFIX}:" if namespaced else ""
    root = ET.Element(f"{prefix}instance", {f"xmlns:{METADATA_PREFIX}": METADATA_NS} if namespaced else {})
    for key, value in sorted(tags.items()):
        tag = ET.SubElement(root, f"{prefix}tag", {"key": key})
        tag.text = value
    if created is not None:
        ET.SubElement(root, f"{prefix}created").text = rfc3339(created)
    return ET.tostring(root, encoding="unicode")


_XMLNS_ATTR = re.compile(r"""\s+xmlns(?::[\w.-]+)?\s*=\s*(?:"[^"]*"|'[^']*')""")
_PREFIX = re.compile(r"<(/?)[\w.-]+:")


def parse_metadata(text: str) -> Metadata:
    """Parse our metadata element as libvirt returns it, with or without namespace declarations.

    libvirt selects the element by our namespace URI but may return it bare (no ``xmlns``,
    with or without the prefix), so namespaces are stripped and local names matched.

    Raises:
        ValueError: not XML, or not our ``instance`` element.
    """
    cleaned = _PREFIX.sub(r"<\1", _XMLNS_ATTR.sub("", text))
    try:
        root = ET.fromstring(cleaned)
    except ET.ParseError as exc:
        raise ValueError(f"metadata is not XML: {exc}") from exc
    if root.tag != "instance":
        raise ValueError(f"metadata root is <{root.tag}>, not <instance>")
    tags = {el.get("key", ""): (el.text or "") for el in root.findall("tag") if el.get("key")}
    created = None
    text_created = (root.findtext("created") or "").strip()
    if text_created:
        try:
            created = parse_rfc3339(text_created)
        except ValueError:
            created = None
    return Metadata(tags, created)


_METADATA_SLOT = "@@proxy-operator-metadata@@"


# -- XML builders ------------------------------------------------------------------------------
@dataclass(frozen=True)
class DomainSpec:
    """What :func:`domain_xml` needs.

    Attributes:
        name: domain name.
        domain_type: ``"kvm"`` or ``"qemu"``.
        vcpus, memory_mib: sizing.
        firmware: ``"uefi"`` or ``"bios"``.
        disk_path: the overlay's path as libvirt reported it (``virStorageVolGetPath``).
        disk_format: the overlay's format (``qcow2``).
        seed_path: the seed ISO's path as libvirt reported it.
        network: libvirt network name, or ``None`` when ``bridge`` is set.
        bridge: host bridge name, or ``None``.
        metadata: our metadata element (:func:`metadata_xml`).
    """

    name: str
    domain_type: str
    vcpus: int
    memory_mib: int
    firmware: str
    disk_path: str
    seed_path: str
    metadata: str
    network: str | None = "default"
    bridge: str | None = None
    disk_format: str = "qcow2"


def domain_xml(spec: DomainSpec) -> str:
    """Return the domain XML for ``spec`` (q35, virtio disk, seed cdrom on virtio-scsi, guest agent)."""
    d = ET.Element("domain", {"type": spec.domain_type})
    ET.SubElement(d, "name").text = spec.name
    ET.SubElement(d, "metadata").text = _METADATA_SLOT
    ET.SubElement(d, "memory", {"unit": "MiB"}).text = str(spec.memory_mib)
    ET.SubElement(d, "vcpu").text = str(spec.vcpus)
    os_attrs = {"firmware": "efi"} if spec.firmware == "uefi" else {}
    os_el = ET.SubElement(d, "os", os_attrs)
    ET.SubElement(os_el, "type", {"arch": "x86_64", "machine": "q35"}).text = "hvm"
    if spec.firmware == "uefi":
        fw = ET.SubElement(os_el, "firmware")
        ET.SubElement(fw, "feature", {"enabled": "no", "name": "secure-boot"})
        ET.SubElement(fw, "feature", {"enabled": "no", "name": "enrolled-keys"})
    ET.SubElement(os_el, "boot", {"dev": "hd"})
    features = ET.SubElement(d, "features")
    ET.SubElement(features, "acpi")
    ET.SubElement(features, "apic")
    cpu_mode = "host-passthrough" if spec.domain_type == "kvm" else "maximum"
    ET.SubElement(d, "cpu", {"mode": cpu_mode})
    ET.SubElement(d, "clock", {"offset": "utc"})
    ET.SubElement(d, "on_poweroff").text = "destroy"
    ET.SubElement(d, "on_reboot").text = "restart"
    ET.SubElement(d, "on_crash").text = "destroy"
    dev = ET.SubElement(d, "devices")
    disk = ET.SubElement(dev, "disk", {"type": "file", "device": "disk"})
    ET.SubElement(disk, "driver", {"name": "qemu", "type": spec.disk_format})
    ET.SubElement(disk, "source", {"file": spec.disk_path})
    ET.SubElement(disk, "target", {"dev": "vda", "bus": "virtio"})
    ET.SubElement(dev, "controller", {"type": "scsi", "index": "0", "model": "virtio-scsi"})
    cdrom = ET.SubElement(dev, "disk", {"type": "file", "device": "cdrom"})
    ET.SubElement(cdrom, "driver", {"name": "qemu", "type": "raw"})
    ET.SubElement(cdrom, "source", {"file": spec.seed_path})
    ET.SubElement(cdrom, "target", {"dev": "sda", "bus": "scsi"})
    ET.SubElement(cdrom, "readonly")
    if spec.bridge:
        nic = ET.SubElement(dev, "interface", {"type": "bridge"})
        ET.SubElement(nic, "source", {"bridge": spec.bridge})
    else:
        nic = ET.SubElement(dev, "interface", {"type": "network"})
        ET.SubElement(nic, "source", {"network": spec.network or "default"})
    ET.SubElement(nic, "model", {"type": "virtio"})
    chan = ET.SubElement(dev, "channel", {"type": "unix"})
    ET.SubElement(chan, "target", {"type": "virtio", "name": "org.qemu.guest_agent.0"})
    ET.SubElement(dev, "serial", {"type": "pty"})
    console = ET.SubElement(dev, "console", {"type": "pty"})
    ET.SubElement(console, "target", {"type": "serial"})
    rng = ET.SubElement(dev, "rng", {"model": "virtio"})
    ET.SubElement(rng, "backend", {"model": "random"}).text = "/dev/urandom"
    # The metadata element goes in verbatim: ElementTree would rename a parsed namespaced
    # element to ns0:... and hoist its declaration to <domain>.
    return ET.tostring(d, encoding="unicode").replace(_METADATA_SLOT, spec.metadata, 1)


def volume_xml(name: str, capacity_bytes: int, fmt: str, *, backing_path: str | None = None,
               backing_format: str | None = None) -> str:
    """Return storage volume XML (``virStorageVolCreateXML``), optionally with a backing store."""
    v = ET.Element("volume")
    ET.SubElement(v, "name").text = name
    ET.SubElement(v, "capacity", {"unit": "bytes"}).text = str(int(capacity_bytes))
    target = ET.SubElement(v, "target")
    ET.SubElement(target, "format", {"type": fmt})
    if backing_path:
        bs = ET.SubElement(v, "backingStore")
        ET.SubElement(bs, "path").text = backing_path
        ET.SubElement(bs, "format", {"type": backing_format or "qcow2"})
    return ET.tostring(v, encoding="unicode")


# -- reading XML back --------------------------------------------------------------------------
def disk_sources(xml_text: str) -> dict[str, str]:
    """Return ``{device: source file}`` of a domain's ``type="file"`` disks (``disk``, ``cdrom``)."""
    root = ET.fromstring(xml_text)
    out: dict[str, str] = {}
    for disk in root.findall("./devices/disk"):
        src = disk.find("source")
        path = src.get("file") if src is not None else None
        if disk.get("type") == "file" and path:
            out.setdefault(disk.get("device", "disk"), path)
    return out


def nic_macs(xml_text: str) -> list[tuple[str, str | None]]:
    """Return ``[(mac, network-or-None)]`` for each interface of a domain XML."""
    root = ET.fromstring(xml_text)
    out = []
    for nic in root.findall("./devices/interface"):
        mac = nic.find("mac")
        src = nic.find("source")
        address = mac.get("address") if mac is not None else None
        if address:
            out.append((address.lower(), src.get("network") if src is not None else None))
    return out


def nvram_path(xml_text: str) -> str | None:
    """Return the ``<os><nvram>`` path of a domain XML, or ``None``."""
    el = ET.fromstring(xml_text).find("./os/nvram")
    return el.text.strip() if el is not None and el.text else None


def backing_path(volume_xml_text: str) -> str | None:
    """Return the ``<backingStore><path>`` of a volume XML, or ``None``."""
    el = ET.fromstring(volume_xml_text).find("./backingStore/path")
    return el.text.strip() if el is not None and el.text else None


# -- addresses ---------------------------------------------------------------------------------
def routable_ipv4(addr: str) -> bool:
    """Return whether ``addr`` is an IPv4 address a client could reach (not loopback,
    link-local, unspecified, multicast or reserved)."""
    try:
        ip = ipaddress.IPv4Address(addr)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast or ip.is_reserved)


def agent_address(interfaces: dict) -> str | None:
    """Return the first routable IPv4 in libvirt ``interfaceAddresses`` output, or ``None``.

    Args:
        interfaces: ``{ifname: {"hwaddr": str, "addrs": [{"type": 0|1, "addr": str, "prefix": int}]}}``
            (type 0 = IPv4), as ``virDomainInterfaceAddresses`` returns it.
    """
    for ifname in sorted(interfaces or {}):
        if ifname == "lo":
            continue
        for a in interfaces[ifname].get("addrs") or []:
            if a.get("type") == 0 and routable_ipv4(a.get("addr", "")):
                return a["addr"]
    return None


def lease_address(leases: list[dict], mac: str) -> str | None:
    """Return the IPv4 of the newest DHCP lease for ``mac``, or ``None``.

    A guest may send a new client-id on every boot, so a MAC can hold several leases; the one
    expiring last was granted last.

    Args:
        leases: ``virNetworkGetDHCPLeases`` output (dicts with ``mac``, ``ipaddr``, ``type``,
            ``expirytime``).
        mac: the NIC's MAC address.
    """
    mine = [le for le in leases or [] if (le.get("mac") or "").lower() == mac.lower()
            and le.get("type", 0) == 0 and routable_ipv4(le.get("ipaddr", ""))]
    if not mine:
        return None
    return max(mine, key=lambda le: le.get("expirytime", 0))["ipaddr"]
