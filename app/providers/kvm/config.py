"""The ``kvm:`` block of a providers-config entry (no SDK import here).

Shape (docs/kvm-provider.md is the user reference; every key not marked required is optional)::

    kvm:
      ssh:
        user: proxyop                                      # required
        port: 22
        keyFile: /etc/proxy-operator/kvm/id_ed25519        # required; read lazily on each dial
        knownHostsFile: /etc/proxy-operator/kvm/known_hosts  # required; strict, never auto-added
        connectTimeout: 10s       # TCP connect
        handshakeTimeout: 15s     # SSH banner + key exchange + auth, and the libvirt hello
        keepaliveInterval: 30s    # SSH and libvirt keepalives (0 = off)
        keepaliveCount: 3         # libvirt keepalive probes missed before the link is dropped
      callTimeout: 60s            # one libvirt call; a call past it drops the link (Transient)
      imageTimeout: 30m           # one image download+upload into the pool
      installGuestAgent: true     # vendor-data installs and enables qemu-guest-agent
      agentAddressTimeout: 5m     # wait this long for the guest agent's address, then take the
                                  # DHCP lease / ARP entry and report the guest degraded (0: at once)
      configureSquid: true        # vendor-data writes the operator's squid.conf and (re)starts Squid
      images:
        debian-12: {url: "https://...", sha256: "<64 hex>", format: qcow2, firmware: uefi}
      allowImageURLs:             # absent: a Proxy may only name a key of images
        hosts: [images.example.com]   # required: the URL's host and every redirect's host
        maxSize: 10GiB            # the download is cut (Permanent) beyond this
      machineTypes:
        small: {vcpus: 1, memoryMiB: 512, diskGiB: 8}
      hosts:
        - name: lab1                      # required; [a-z0-9]([-a-z0-9]*[a-z0-9])?
          address: lab1.example.internal  # required; what the operator dials (and known_hosts names)
          port: 2222                      # overrides ssh.port for this host
          pool: default
          network: default                # or bridge: br0 (exactly one; default network "default")
          domainType: kvm                 # kvm (host-passthrough CPU) | qemu (TCG, CPU "maximum")
          libvirtSocket: /var/run/libvirt/libvirt-sock
          libvirtURI: qemu:///system      # the driver URI the daemon is asked for

Every check raises :class:`app.config.validation.ConfigError` naming the file, the provider and the
dotted field (``kvm.hosts[0].name``), so the operator refuses to start on a bad block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from app.config.provider_types import CheckTargets
from app.config.validation import IDENTIFIER, Reader

DEFAULT_LIBVIRT_SOCKET = "/var/run/libvirt/libvirt-sock"
DEFAULT_LIBVIRT_URI = "qemu:///system"
#: Profile used when no ``machineTypes`` are configured at all.
DEFAULT_MACHINE_TYPE = {"vcpus": 1, "memoryMiB": 512, "diskGiB": 8}
#: Default ``agentAddressTimeout``: seconds a running domain may go without a guest-agent address
#: before the DHCP lease (or ARP entry) is used.  Measured: the agent answers ~90 s after start
#: under TCG with the agent preinstalled; cloud-init installing it from a mirror takes longer.
DEFAULT_AGENT_ADDRESS_TIMEOUT = 300.0
#: Largest ``agentAddressTimeout`` accepted: an agent silent for an hour will not answer.
MAX_AGENT_ADDRESS_TIMEOUT = 3600.0

_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
#: ``<driver>:///<path>`` — a local libvirt driver URI the remote daemon serves.
_LIBVIRT_URI = re.compile(r"^[a-z][a-z0-9]*:///[a-z][a-z0-9]*$")
#: libvirt object names we paste into XML and volume paths: no slashes, spaces or quotes.
_LIBVIRT_NAME = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")
IMAGE_FORMATS = ("qcow2", "raw")
#: Default ``allowImageURLs.maxSize``: 10 GiB.
DEFAULT_IMAGE_URL_MAX_BYTES = 10 * 1024 ** 3
_SIZE = re.compile(r"^(\d+)\s*(B|KiB|MiB|GiB|TiB|K|M|G|T|KB|MB|GB|TB)?$")
_SIZE_UNITS = {None: 1, "B": 1, "K": 1024, "KiB": 1024, "M": 1024 ** 2, "MiB": 1024 ** 2, "G": 1024 ** 3,
               "GiB": 1024 ** 3, "T": 1024 ** 4, "TiB": 1024 ** 4, "KB": 1000, "MB": 1000 ** 2,
               "GB": 1000 ** 3, "TB": 1000 ** 4}
#: A host name (or IP address) as written in ``allowImageURLs.hosts``.
_HOST = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$|^\[?[0-9a-f:.]+\]?$")
FIRMWARES = ("uefi", "bios")
DOMAIN_TYPES = ("kvm", "qemu")


@dataclass(frozen=True)
class SshSettings:
    """How the operator reaches every host of this provider.

    Attributes:
        user: SSH user (needs access to the libvirt socket, e.g. group ``libvirt``).
        port: default SSH port (a host's ``port`` overrides it).
        key_file: private key path (OpenSSH or PEM; not a ``.pub``).  Loaded on each dial.
        known_hosts_file: OpenSSH known_hosts path.  Host keys are checked strictly.
        connect_timeout: seconds for the TCP connect.
        handshake_timeout: seconds for SSH banner, key exchange and authentication, and
            separately for the libvirt connection handshake.
        keepalive_interval: seconds between SSH and libvirt keepalives (0 = off).
        keepalive_count: libvirt keepalive probes without answer before libvirt closes the link.
    """

    user: str
    key_file: str
    known_hosts_file: str
    port: int = 22
    connect_timeout: float = 10.0
    handshake_timeout: float = 15.0
    keepalive_interval: float = 30.0
    keepalive_count: int = 3


@dataclass(frozen=True)
class ImageSettings:
    """One cacheable image.

    Attributes:
        key: plain identifier; the cached volume is ``base-<key>.<format>``.
        url: ``http(s)://`` source.
        sha256: expected lowercase hex digest of the downloaded bytes (every image has one:
            configured images in the config, URL images in the URL's ``#sha256=`` fragment).
        format: ``qcow2`` or ``raw``.
        firmware: ``uefi`` (default: OVMF, secure boot off) or ``bios`` (SeaBIOS).
        allowed_hosts: for an image a Proxy gave as a URL, the hosts the download and every
            redirect may go to (redirects are followed by hand and checked); ``None`` for a
            configured image (the operator's own URL: redirects followed freely).
        max_bytes: a size cap for the download (Permanent beyond it), or ``None`` for none.
    """

    key: str
    url: str
    sha256: str | None
    format: str = "qcow2"
    firmware: str = "uefi"
    allowed_hosts: tuple[str, ...] | None = None
    max_bytes: int | None = None


@dataclass(frozen=True)
class ImageURLSettings:
    """``allowImageURLs``: Proxies may name an image by URL, within limits.

    Attributes:
        hosts: lowercase host names (no port) the URL and each redirect must point at.
        max_bytes: the largest download accepted.
    """

    hosts: tuple[str, ...]
    max_bytes: int = DEFAULT_IMAGE_URL_MAX_BYTES


@dataclass(frozen=True)
class MachineType:
    """A machine-type profile.

    Attributes:
        vcpus: virtual CPUs.
        memory_mib: memory in MiB.
        disk_gib: overlay disk size in GiB (grown to the base image's size if that is larger).
    """

    vcpus: int = 1
    memory_mib: int = 512
    disk_gib: int = 8


@dataclass(frozen=True)
class KvmHost:
    """One hypervisor.

    Attributes:
        name: plain identifier, used in provider IDs (``hosts/<name>/domains/<vm>``) and queue
            names (``kvm.<provider>.<name>``); equals ``spec.placement.zone``.
        address: address the operator dials over SSH (known_hosts must list it under this name).
        port: SSH port override, or ``None`` for ``ssh.port``.
        pool: libvirt storage pool holding base images, overlays and seeds.
        network: libvirt network for the NIC (leases come from it), or ``None`` with ``bridge``.
        bridge: host bridge for the NIC instead of a libvirt network, or ``None``.
        domain_type: ``"kvm"`` (CPU host-passthrough) or ``"qemu"`` (software emulation,
            CPU ``maximum``) for hosts without hardware virtualisation.
        libvirt_socket: path of libvirtd's read-write unix socket on the host.
        libvirt_uri: the driver URI asked of that daemon (``qemu:///system``).
    """

    name: str
    address: str
    port: int | None = None
    pool: str = "default"
    network: str | None = "default"
    bridge: str | None = None
    domain_type: str = "kvm"
    libvirt_socket: str = DEFAULT_LIBVIRT_SOCKET
    libvirt_uri: str = DEFAULT_LIBVIRT_URI


@dataclass(frozen=True)
class KvmSettings(CheckTargets):
    """Settings of a kvm provider.

    Attributes:
        hosts: configured hypervisors, in file order.
        ssh: :class:`SshSettings`.
        images: image key -> :class:`ImageSettings`.
        image_urls: :class:`ImageURLSettings` when Proxies may give an image as a URL
            (``allowImageURLs``), else ``None``: only keys of ``images`` are accepted.
        machine_types: profile key -> :class:`MachineType`.
        call_timeout: seconds one libvirt call may take before the link is dropped.
        image_timeout: seconds one image download and upload may take.
        install_guest_agent: vendor-data installs and enables qemu-guest-agent.
        agent_address_timeout: seconds a running domain may go without a routable IPv4 from
            the QEMU guest agent (the address source of truth) before the provider takes the
            DHCP lease or ARP entry instead and reports the guest degraded; 0 = at once.
            Counted from the first poll that found the domain running without one.
        configure_squid: vendor-data installs Squid if missing, writes the operator's
            squid.conf and restarts it.
    """

    hosts: tuple[KvmHost, ...]
    ssh: SshSettings
    images: dict[str, ImageSettings] = field(default_factory=dict)
    machine_types: dict[str, MachineType] = field(default_factory=dict)
    call_timeout: float = 60.0
    image_timeout: float = 1800.0
    install_guest_agent: bool = True
    configure_squid: bool = True
    agent_address_timeout: float = DEFAULT_AGENT_ADDRESS_TIMEOUT
    image_urls: ImageURLSettings | None = None

    def check_targets(self) -> list[str]:
        """The check targets: every configured host, in file order (each is checked on its own
        queue, ``providers.check_host``)."""
        return [h.name for h in self.hosts if h.name]

    def host(self, name: str | None) -> KvmHost | None:
        """Return the host called ``name`` or ``None``."""
        return next((h for h in self.hosts if h.name == name), None)

    def ssh_port(self, host: KvmHost) -> int:
        """Return the SSH port to dial for ``host`` (its override, else ``ssh.port``)."""
        return host.port if host.port is not None else self.ssh.port


def _positive(reader: Reader, key: str, default: float, *, allow_zero: bool = False) -> float:
    value = reader.duration(key, default)
    if value == 0 and not allow_zero:
        raise reader.error(key, "must be greater than 0")
    return value


def _agent_address_timeout(block: Reader) -> float:
    value = block.duration("agentAddressTimeout", DEFAULT_AGENT_ADDRESS_TIMEOUT)
    if value > MAX_AGENT_ADDRESS_TIMEOUT:
        raise block.error("agentAddressTimeout", f"must be at most 1h (got {value:g}s): it bounds how long a "
                                                 "guest without a working QEMU guest agent stays Provisioning; "
                                                 "0 takes the DHCP lease at once")
    return value


def _size(reader: Reader, key: str, default: int) -> int:
    value = reader.raw(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (match := _SIZE.match(value.strip())):
        number, unit = match.groups()
        size = int(number) * _SIZE_UNITS[unit]
    else:
        raise reader.error(key, f"must be a size such as 10GiB, 512MiB or a number of bytes, got {value!r}")
    if size <= 0:
        raise reader.error(key, "must be greater than 0")
    return size


def _image_urls(block: Reader) -> ImageURLSettings | None:
    if not block.has("allowImageURLs"):
        return None
    value = block.raw("allowImageURLs")
    if not isinstance(value, dict):
        raise block.error("allowImageURLs", "must be a mapping {hosts: [...], maxSize: ...} (absent: no URLs)")
    urls = block.child("allowImageURLs")
    hosts = urls.str_list("hosts", required=True)
    if not hosts:
        raise urls.error("hosts", "must list at least one host the images may come from")
    for i, host in enumerate(hosts):
        if not _HOST.match(host.lower()):
            raise urls.error(f"hosts[{i}]", f"{host!r} is not a host name (no scheme, port or path)")
    settings = ImageURLSettings(hosts=tuple(h.lower().strip("[]") for h in hosts),
                                max_bytes=_size(urls, "maxSize", DEFAULT_IMAGE_URL_MAX_BYTES))
    urls.done()
    return settings


def parse(block: Reader) -> KvmSettings:
    """Parse the block.

    Raises:
        app.config.validation.ConfigError: naming the field, e.g. ``kvm.hosts[0].name`` for a host
            name that is not a plain identifier or ``kvm.images.x.sha256`` for a bad digest.
    """
    ssh = block.child("ssh", required=True)
    ssh_settings = SshSettings(
        user=ssh.str("user", required=True),
        port=ssh.int("port", 22, minimum=1, maximum=65535),
        key_file=ssh.str("keyFile", required=True),
        known_hosts_file=ssh.str("knownHostsFile", required=True),
        connect_timeout=_positive(ssh, "connectTimeout", 10.0),
        handshake_timeout=_positive(ssh, "handshakeTimeout", 15.0),
        keepalive_interval=_positive(ssh, "keepaliveInterval", 30.0, allow_zero=True),
        keepalive_count=ssh.int("keepaliveCount", 3, minimum=1),
    )
    if ssh_settings.key_file.endswith(".pub"):
        raise ssh.error("keyFile", f"{ssh_settings.key_file!r} is a public key; give the private key file")
    ssh.done()

    images: dict[str, ImageSettings] = {}
    for key, img in block.mapping("images").items():
        if not IDENTIFIER.match(key):
            raise img.error(None, f"image key {key!r} is not a plain identifier matching {IDENTIFIER.pattern}")
        url = img.str("url", required=True)
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise img.error("url", f"{url!r} is not an http(s) URL")
        digest = img.str("sha256", required=True)
        if not _SHA256.match(digest):
            raise img.error("sha256", "must be 64 hexadecimal characters (the image's SHA-256)")
        images[key] = ImageSettings(
            key=key, url=url, sha256=digest.lower(),
            format=img.str("format", "qcow2", choices=IMAGE_FORMATS),
            firmware=img.str("firmware", "uefi", choices=FIRMWARES),
        )
        img.done()

    machine_types: dict[str, MachineType] = {}
    for key, mt in block.mapping("machineTypes").items():
        machine_types[key] = MachineType(
            vcpus=mt.int("vcpus", 1, minimum=1),
            memory_mib=mt.int("memoryMiB", 512, minimum=64),
            disk_gib=mt.int("diskGiB", 8, minimum=1),
        )
        mt.done()

    hosts: list[KvmHost] = []
    seen: set[str] = set()
    for h in block.items("hosts", required=True):
        name = h.str("name", required=True, pattern=IDENTIFIER)
        if name in seen:
            raise h.error("name", f"duplicate host name {name!r}")
        seen.add(name)
        network = h.str("network")
        bridge = h.str("bridge")
        if network and bridge:
            raise h.error("bridge", "give either network or bridge, not both")
        for key, value in (("pool", h.raw("pool")), ("network", network), ("bridge", bridge)):
            if isinstance(value, str) and not _LIBVIRT_NAME.match(value):
                raise h.error(key, f"{value!r} is not a libvirt object name ([A-Za-z0-9][-A-Za-z0-9_.]*)")
        socket_path = h.str("libvirtSocket", DEFAULT_LIBVIRT_SOCKET)
        if not socket_path.startswith("/"):
            raise h.error("libvirtSocket", f"{socket_path!r} is not an absolute path")
        uri = h.str("libvirtURI", DEFAULT_LIBVIRT_URI)
        if not _LIBVIRT_URI.match(uri):
            raise h.error("libvirtURI", f"{uri!r} is not a local driver URI like qemu:///system")
        hosts.append(KvmHost(
            name=name,
            address=h.str("address", required=True),
            port=h.int("port", None, minimum=1, maximum=65535),
            pool=h.str("pool", "default"),
            network=None if bridge else (network or "default"),
            bridge=bridge,
            domain_type=h.str("domainType", "kvm", choices=DOMAIN_TYPES),
            libvirt_socket=socket_path,
            libvirt_uri=uri,
        ))
        h.done()
    if not hosts:
        raise block.error("hosts", "at least one host is required")

    return KvmSettings(
        hosts=tuple(hosts), ssh=ssh_settings, images=images, machine_types=machine_types,
        call_timeout=_positive(block, "callTimeout", 60.0),
        image_timeout=_positive(block, "imageTimeout", 1800.0),
        install_guest_agent=block.bool("installGuestAgent", True),
        configure_squid=block.bool("configureSquid", True),
        agent_address_timeout=_agent_address_timeout(block),
        image_urls=_image_urls(block),
    )
