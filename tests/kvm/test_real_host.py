"""The kvm provider against a real hypervisor (``-m kvmhost``; skipped unless configured).

Environment (the fields of a ``kvm:`` host entry and its ``ssh:`` block):

* ``KVM_TEST_ADDRESS`` (required) — the address the operator dials; known_hosts must list it.
* ``KVM_TEST_USER`` (required), ``KVM_TEST_KEY`` (required, private key path),
  ``KVM_TEST_KNOWN_HOSTS`` (required), ``KVM_TEST_PORT`` (default 22).
* ``KVM_TEST_POOL`` (default ``default``), ``KVM_TEST_NETWORK`` (default ``default``) or
  ``KVM_TEST_BRIDGE``, ``KVM_TEST_DOMAIN_TYPE`` (default ``kvm``),
  ``KVM_TEST_SOCKET`` (default ``/var/run/libvirt/libvirt-sock``).
* ``KVM_TEST_IMAGE_URL`` + ``KVM_TEST_IMAGE_SHA256`` — a bootable cloud image with cloud-init
  (e.g. Debian 12 genericcloud).  Without them a tiny empty qcow2 is served from this machine
  (the operator downloads images itself and uploads them over libvirt), which tests
  everything but the boot.
* ``KVM_TEST_BOOT_TIMEOUT`` — with a real image, seconds to wait for Running with an address
  (default 600; the guest installs qemu-guest-agent from vendor-data first).

Creates one domain named ``proxy-...`` and deletes it at the end, even on failure.

    KVM_TEST_ADDRESS=lab1.example.internal KVM_TEST_USER=proxyop KVM_TEST_KEY=~/.ssh/kvm_id_ed25519 \\
    KVM_TEST_KNOWN_HOSTS=~/.ssh/kvm_known_hosts .venv/bin/pytest -m kvmhost tests/kvm -v
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from app.providers.naming import MANAGED_BY, instance_name, tags_for
from app.providers.base import CreateRequest, InstanceState
from app.errors import NotFound
from tests.kvm import harness

pytestmark = [pytest.mark.kvmhost, pytest.mark.timeout(1800)]

ENV = os.environ.get


@pytest.fixture
def real_provider(tmp_path):
    missing = [v for v in ("KVM_TEST_ADDRESS", "KVM_TEST_USER", "KVM_TEST_KEY", "KVM_TEST_KNOWN_HOSTS") if not ENV(v)]
    if missing:
        pytest.skip(f"real-host KVM suite not configured: set {', '.join(missing)}")
    from app.providers.kvm.provider import KvmProvider

    server = None
    if ENV("KVM_TEST_IMAGE_URL"):
        if not ENV("KVM_TEST_IMAGE_SHA256"):
            pytest.skip("KVM_TEST_IMAGE_URL needs KVM_TEST_IMAGE_SHA256 (sha256sum of the image)")
        image = {"url": ENV("KVM_TEST_IMAGE_URL"), "sha256": ENV("KVM_TEST_IMAGE_SHA256")}
    else:
        server = harness.ImageServer()
        url, sha = server.put("/tiny.qcow2", harness.qcow2(tmp_path / "tiny.qcow2"))
        image = {"url": url, "sha256": sha}
    host = {"name": "real", "address": ENV("KVM_TEST_ADDRESS"), "pool": ENV("KVM_TEST_POOL", "default"),
            "domainType": ENV("KVM_TEST_DOMAIN_TYPE", "kvm"),
            "libvirtSocket": ENV("KVM_TEST_SOCKET", "/var/run/libvirt/libvirt-sock")}
    host["bridge" if ENV("KVM_TEST_BRIDGE") else "network"] = ENV("KVM_TEST_BRIDGE") or ENV("KVM_TEST_NETWORK", "default")
    entry = harness.kvm_entry(
        user=ENV("KVM_TEST_USER"), port=int(ENV("KVM_TEST_PORT", "22")),
        key_file=Path(ENV("KVM_TEST_KEY")).expanduser(), known_hosts_file=Path(ENV("KVM_TEST_KNOWN_HOSTS")).expanduser(),
        hosts=[host], images={"kvmhost-test": image},
        machine_types={"small": {"vcpus": 1, "memoryMiB": 1024, "diskGiB": 8}},
        ssh={"connectTimeout": "10s", "handshakeTimeout": "15s", "keepaliveInterval": "30s"})
    entry["kvm"]["callTimeout"] = "120s"
    provider = KvmProvider(harness.provider_config(entry))
    yield provider, server is None
    provider.close()
    if server:
        server.stop()


def test_lifecycle_on_a_real_host(real_provider):
    provider, bootable = real_provider
    verdict = provider.check_host("real")
    assert verdict.ready, verdict.message
    uid = f"kvmhost-{uuid.uuid4()}"
    req = CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="kvmhost-test", zone="real",
                        image="kvmhost-test", user_data=b"#cloud-config\n{}\n")
    pid = None
    try:
        inst = provider.create(req)
        pid = inst.provider_id
        assert provider.create(req).provider_id == pid
        assert pid in {i.provider_id for i in provider.list_by_tag(MANAGED_BY).instances}
        got = provider.get(pid)
        assert got.tags == req.tags
        if bootable:
            deadline = time.monotonic() + float(ENV("KVM_TEST_BOOT_TIMEOUT", "600"))
            while got.state is not InstanceState.RUNNING and time.monotonic() < deadline:
                time.sleep(10)
                got = provider.get(pid)
            assert got.state is InstanceState.RUNNING and got.address, "no address: is the guest agent up?"
    finally:
        if pid:
            provider.delete(pid)
    with pytest.raises(NotFound):
        provider.get(pid)
    provider.delete(pid)
