"""The kvm rig's shared fixtures (a pytest plugin: ``pytest_plugins`` in tests/conftest.py).

One real libvirtd + sshd + image server per session (per pytest-xdist worker), used by
tests/kvm and by tests/pools/test_spread_providers.py: defined here once, so a session that
runs both starts one rig, not one per directory.  Every node that uses them is in the ``kvm``
xdist group (``XDIST_GROUPS``, tests/conftest.py).  Nothing here starts unless a test asks.

* ``rig`` — the session's :class:`tests.kvm.harness.Rig` (skipped without root or the binaries).
* ``second_daemon`` — a second private libvirtd, for two hosts with separate domains.
* ``image`` — factory: a fresh qcow2 served by the rig's image server.
"""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from tests.kvm import harness

_NEEDED = ("libvirtd", "virtlogd", "qemu-system-x86_64", "qemu-img", "unshare", "nsenter", "ssh-keygen", "dnsmasq")


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (libvirtd in private namespaces)"
    absent = [b for b in _NEEDED if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]
    if absent:
        return f"missing binaries: {', '.join(absent)}"
    return None


@pytest.fixture(scope="session")
def rig(tmp_path_factory):
    """The session's :class:`tests.kvm.harness.Rig` (libvirtd, sshd, images, keys)."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    r = harness.Rig(tmp_path_factory.mktemp("kvm-rig")).start()
    yield r
    r.stop()


@pytest.fixture(scope="session")
def second_daemon(rig):
    """A second private libvirtd, for tests that need two hosts with separate domains (the
    rig's hosts all reach the one daemon, so ``h1`` and ``h2`` on it share every domain).

    Dialled through the rig's sshd like the first: ``rig.host("h2", libvirtSocket=str(second_daemon.socket))``.
    """
    daemon = harness.LibvirtDaemon().start()
    yield daemon
    daemon.stop()


@pytest.fixture
def image(rig, tmp_path):
    """Factory: ``image(size="16M") -> (path, url, sha256, bytes)`` serving a fresh qcow2 at a unique path."""
    def make(size: str = "16M"):
        data = harness.qcow2(tmp_path / f"{uuid.uuid4().hex}.qcow2", size)
        path = f"/images/{uuid.uuid4().hex}.qcow2"
        url, sha = rig.images.put(path, data)
        return path, url, sha, data
    return make


def wipe_domains(socket_path) -> None:
    """Destroy and undefine every domain of the libvirtd at ``socket_path`` and delete the
    volumes of its ``default`` pool other than the base images (``base-*``); a daemon that
    cannot be reached is left alone.  Imports libvirt on call (the rig may be skipped)."""
    import libvirt
    try:
        conn = libvirt.open(f"qemu+unix:///system?socket={socket_path}")
    except libvirt.libvirtError:
        return
    try:
        for dom in conn.listAllDomains(0):
            try:
                if dom.isActive():
                    dom.destroy()
                dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
            except libvirt.libvirtError:
                pass
        for vol in conn.storagePoolLookupByName("default").listAllVolumes(0):
            if not vol.name().startswith("base-"):
                try:
                    vol.delete(0)
                except libvirt.libvirtError:
                    pass
    finally:
        conn.close()
