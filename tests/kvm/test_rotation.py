"""A rotated basic-auth Secret replaces a kvm domain, which carries the htpasswd line in its
vendor-data (gcp: tests/test_rotation_replaces_baked_instances.py).

Reconcile steps in-process against the Kubernetes API fake, the real kvm provider over SSH to
the rig's libvirtd.  A fake guest takes a DHCP lease for each domain's MAC from the network's
real dnsmasq, so the polls see an address and the Proxy goes Running, as a booted guest would.
"""

from __future__ import annotations

import base64
import email
import re
import time

import libvirt
import pytest
from kubernetes import client as k8s

from app.kube import credentials

from app.squid import conf as squid
from app.providers.kvm import domain as dom_xml
from app.proxy.reconcile import CREATE, create, credentials_hash, drifted, poll
from tests.kvm import harness
from tests.kvm.test_seed import read_iso
from tests.support.proxies import NS, apply, read

pytestmark = pytest.mark.timeout(240)


def _seeded_htpasswd(rig, name: str) -> str:
    """The htpasswd line the domain's NoCloud seed installs (vendor-data's squid script)."""
    _, files = read_iso((rig.daemon.pool_dir / f"{name}-seed.iso").read_bytes())
    parts = {p.get_filename(): p.get_payload(decode=True).decode()
             for p in email.message_from_bytes(files["vendor-data"]).walk() if p.get_filename()}
    script = parts["proxy-operator-squid.sh"]
    writes = {path.rstrip(")"): base64.b64decode(blob).decode()
              for blob, path in re.findall(r"echo '([A-Za-z0-9+/=]+)' \| base64 -d > (\S+)", script)}
    return writes[squid.DEFAULT_HTPASSWD_PATH].strip()


def _running(ctx, kube_client, ref, timeout: float = 60.0):
    """Poll (as the queued polls would) until the Proxy is Running; return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        followup = poll(ctx, ref)
        proxy = read(kube_client, ref)
        if proxy.phase == "Running":
            return proxy
        assert followup is not None, f"polling stopped in phase {proxy.phase}: {proxy.status}"
        time.sleep(0.3)
    raise AssertionError(f"not Running after {timeout}s: {read(kube_client, ref).status}")


def test_a_rotated_secret_replaces_the_domain_with_the_new_htpasswd(rig, image, kube_client, make_context):
    from app.providers.kvm.provider import KvmProvider

    _, url, sha, _ = image()
    # agentAddressTimeout 0: the fake guest (a lease, no agent) is Running at once.
    entry = rig.entry(name="kvm-lab", hosts=[rig.host("h1")], imageTimeout="60s", agentAddressTimeout="0",
                      images={"tiny": {"url": url, "sha256": sha, "format": "qcow2", "firmware": "bios"}})
    ctx = make_context(harness.provider_config({**entry, "squid": {"basicAuth": True}}), factories={"kvm": KvmProvider})
    conn = libvirt.open(f"qemu+unix:///system?socket={rig.daemon.socket}")
    try:
        ref = apply(kube_client, "rot-kvm", {"provider": "kvm-lab", "cloudInit": {"inline": "#cloud-config\n"},
                                             "placement": {"zone": "h1", "image": "tiny", "machineType": "small"}})
        assert create(ctx, ref).action == "poll"
        name = read(kube_client, ref).status["instanceName"]
        old = conn.lookupByName(name)
        old_uuid = old.UUIDString()
        old_line = _seeded_htpasswd(rig, name)
        secret = credentials.read(ctx.kube, read(kube_client, ref))
        assert old_line == secret.htpasswd.strip()
        with harness.FakeGuest(rig, name) as guest:
            [(mac, _)] = dom_xml.nic_macs(old.XMLDesc(0))
            guest.lease(mac, "boot-1")
            proxy = _running(ctx, kube_client, ref)
            assert proxy.status["credentialsHash"] == credentials_hash(old_line)
            again = poll(ctx, ref)  # a resync poll with the credentials as built
            assert again is None or again.action != CREATE
            assert conn.lookupByName(name).UUIDString() == old_uuid, "unchanged credentials replace nothing"

            # The user rotates the password (new password and the htpasswd line that goes with it).
            user, password = squid.generate_credentials()
            new_line = squid.htpasswd_entry(user, password)
            k8s.CoreV1Api(kube_client).patch_namespaced_secret(credentials.secret_name(proxy), NS, {"data": {
                key: base64.b64encode(value.encode()).decode()
                for key, value in (("username", user), ("password", password), ("htpasswd", new_line + "\n"))}})
            assert drifted(ctx, read(kube_client, ref)), "the resync polls it"

            followup = poll(ctx, ref)
            assert followup is not None and followup.action == CREATE
            create(ctx, ref)
            new = conn.lookupByName(name)  # same name and place: the old domain went first
            assert new.UUIDString() != old_uuid, "a new domain, not the old one kept"
            assert _seeded_htpasswd(rig, name) == new_line, "the new domain's vendor-data has the new line"
            [(mac, _)] = dom_xml.nic_macs(new.XMLDesc(0))
            guest.lease(mac, "boot-2")
            proxy = _running(ctx, kube_client, ref)
        assert proxy.status["credentialsHash"] == credentials_hash(new_line)
        assert [d.name() for d in conn.listAllDomains(0)] == [name], "one domain left"
        listed = [e for e in k8s.CoreV1Api(kube_client).list_namespaced_event(NS).items
                  if e.involved_object.name == "rot-kvm"]
        assert "CredentialsRotated" in [e.reason for e in listed]
        [replacing] = [e.message for e in listed if e.reason == "Replacing"]
        assert replacing.startswith("the basic-auth credentials changed: replacing instance"), replacing
        assert not drifted(ctx, read(kube_client, ref))
    finally:
        conn.close()
        for provider in ctx.registry.unwrapped.values():
            provider.close()
