"""The ``kvm:`` block of a providers-config entry (no SDK import here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.validation import IDENTIFIER, Reader


@dataclass(frozen=True)
class KvmHost:
    """One hypervisor.

    Attributes:
        name: plain identifier, used in provider IDs and queue names.
        address: address the operator dials over SSH.
        pool: libvirt storage pool name.
        network: libvirt network name.
        domain_type: ``"kvm"`` (default) or ``"qemu"`` (software emulation).
    """

    name: str
    address: str
    pool: str = "default"
    network: str = "default"
    domain_type: str = "kvm"


@dataclass(frozen=True)
class KvmSettings:
    """Settings of a kvm provider.

    Attributes:
        hosts: configured hypervisors, in file order.
        ssh: raw ssh settings ``{user, port, keyFile, knownHostsFile}``.
        images: image key -> raw image settings.
        machine_types: profile key -> raw profile settings.
    """

    hosts: tuple[KvmHost, ...]
    ssh: dict = field(default_factory=dict)
    images: dict = field(default_factory=dict)
    machine_types: dict = field(default_factory=dict)

    def host(self, name: str) -> KvmHost | None:
        """Return the host called ``name`` or ``None``."""
        return next((h for h in self.hosts if h.name == name), None)


def parse(block: Reader) -> KvmSettings:
    """Parse the block; raises :class:`app.validation.ConfigError` naming the field."""
    ssh = block.child("ssh", required=True)
    ssh_settings = {
        "user": ssh.str("user", required=True),
        "port": ssh.int("port", 22, minimum=1, maximum=65535),
        "keyFile": ssh.str("keyFile", required=True),
        "knownHostsFile": ssh.str("knownHostsFile", required=True),
    }
    ssh.done()
    images = {}
    for key, img in block.mapping("images").items():
        if not IDENTIFIER.match(key):
            raise img.error(None, f"image key {key!r} is not a plain identifier matching {IDENTIFIER.pattern}")
        images[key] = {
            "url": img.str("url", required=True),
            "sha256": img.str("sha256", required=True),
            "format": img.str("format", "qcow2", choices=("qcow2", "raw")),
            "firmware": img.str("firmware", "uefi", choices=("uefi", "bios")),
        }
        img.done()
    machine_types = {}
    for key, mt in block.mapping("machineTypes").items():
        machine_types[key] = {
            "vcpus": mt.int("vcpus", 1, minimum=1),
            "memoryMiB": mt.int("memoryMiB", 512, minimum=64),
            "diskGiB": mt.int("diskGiB", 8, minimum=1),
        }
        mt.done()
    hosts = []
    for h in block.items("hosts", required=True):
        hosts.append(KvmHost(
            name=h.str("name", required=True, pattern=IDENTIFIER),
            address=h.str("address", required=True),
            pool=h.str("pool", "default"),
            network=h.str("network", "default"),
            domain_type=h.str("domainType", "kvm", choices=("kvm", "qemu")),
        ))
        h.done()
    return KvmSettings(tuple(hosts), ssh_settings, images, machine_types)
