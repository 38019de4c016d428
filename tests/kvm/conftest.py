"""Fixtures for the kvm provider: one real libvirtd + sshd + image server per session.

Tests reach the daemon only through the provider's SSH path; the harness's own direct socket
is used for nothing but teardown (destroying what a failed test left behind).

Under pytest-xdist every test here is in the ``kvm`` group (``XDIST_GROUPS`` in tests/conftest.py):
they all run in one worker, so a run starts one rig (and boots at most one guest at a time), not
one per worker.
"""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from app.naming import instance_name, tags_for
from app.providers.base import CreateRequest
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


@pytest.fixture
def make_provider(rig):
    """Factory: ``make_provider(entry=None) -> KvmProvider`` from a config entry; closed after the test."""
    from app.providers.kvm.provider import KvmProvider

    made = []

    def make(entry: dict | None = None):
        p = KvmProvider(harness.provider_config(entry or rig.entry()))
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture
def image(rig, tmp_path):
    """Factory: ``image(size="16M") -> (path, url, sha256, bytes)`` serving a fresh qcow2 at a unique path."""
    def make(size: str = "16M"):
        data = harness.qcow2(tmp_path / f"{uuid.uuid4().hex}.qcow2", size)
        path = f"/images/{uuid.uuid4().hex}.qcow2"
        url, sha = rig.images.put(path, data)
        return path, url, sha, data
    return make


@pytest.fixture
def request_for():
    """Factory: ``request_for(zone="h1", **fields) -> CreateRequest`` for a fresh Proxy UID."""
    def make(zone: str | None = "h1", **fields) -> CreateRequest:
        uid = fields.pop("uid", None) or str(uuid.uuid4())
        return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="default", zone=zone, **fields)
    return make


@pytest.fixture(autouse=True)
def _cleanup_domains(request):
    """After each test that used the rig, destroy and undefine every domain it left behind."""
    yield
    if "rig" not in request.fixturenames:
        return
    r = request.getfixturevalue("rig")
    import libvirt
    try:
        conn = libvirt.open(f"qemu+unix:///system?socket={r.daemon.socket}")
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
        pool = conn.storagePoolLookupByName("default")
        for vol in pool.listAllVolumes(0):
            if not vol.name().startswith("base-"):
                try:
                    vol.delete(0)
                except libvirt.libvirtError:
                    pass
    finally:
        conn.close()
