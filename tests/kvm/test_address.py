"""Address discovery: the guest agent is the source of truth; the newest DHCP lease for the
domain's MAC only after ``agentAddressTimeout``, reported as a degraded guest.

The agent's answers come from libvirt's ``test:///default`` driver (served by the rig's daemon
over SSH), which reports agent addresses for its domains.  A silent agent is the real thing:
a QEMU domain whose disk holds no OS, so nothing opens its agent channel; its lease comes
from the rig's real dnsmasq, taken by a DHCP client with the domain's MAC (``FakeGuest``).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from datetime import datetime, timezone

import pytest

from kubernetes import client as k8s

from app.kube.gateway import KubernetesGateway
from app.providers.naming import MANAGED_BY, instance_name, tags_for
from app.providers.base import InstanceState
from app.errors import NotFound
from app.providers.kvm import domain as dom_xml
from app.proxy.reconcile import POLL, Ref, create, poll
from app.resources import GROUP, PLURAL, VERSION
from tests.kvm import harness

pytestmark = pytest.mark.timeout(120)



def test_guest_agent_address_and_stripped_metadata_via_the_test_driver(rig, make_provider, caplog):
    """libvirt's test driver, served by the real daemon over SSH, reports a guest-agent address
    and hands our metadata back with the namespace declaration stripped."""
    provider = make_provider(rig.entry(hosts=[rig.host("t1", libvirtURI="test:///default", pool="default-pool")]))
    link = provider.link("t1")
    uid = "agent-test-uid"
    name = instance_name(uid)
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    xml = dom_xml.domain_xml(dom_xml.DomainSpec(
        name=name, domain_type="qemu", vcpus=1, memory_mib=128, firmware="uefi", disk_path="/pool/x.qcow2",
        seed_path="/pool/x-seed.iso", metadata=dom_xml.metadata_xml(tags_for(uid), created)))
    link.call("virDomainDefineXML", lambda c: c.defineXML(xml).create())
    raw = link.call("virDomainGetMetadata", lambda c: c.lookupByName(name).metadata(2, dom_xml.METADATA_NS, 0))
    assert "xmlns" not in raw, "this driver strips the declaration: the case the parser must survive"
    reported = link.call("virDomainInterfaceAddresses", lambda c: c.lookupByName(name).interfaceAddresses(1, 0))
    expected = next(a["addr"] for i in reported.values() for a in i["addrs"] if a["type"] == 0)

    with caplog.at_level(logging.INFO, logger="proxy_operator.kvm"):
        inst = provider.get(f"hosts/t1/domains/{name}")
        provider.get(f"hosts/t1/domains/{name}")

    assert inst.state is InstanceState.RUNNING and inst.note is None, "the agent answered: nothing to report"
    assert inst.address == expected and ipaddress.IPv4Address(inst.address)
    # The source is named, once (the second poll found the same address from the same source).
    assert [r.getMessage() for r in caplog.records if "from the guest agent" in r.getMessage()] == [
        f"kvm host t1: domain {name}: address {expected} from the guest agent"]
    assert inst.tags == tags_for(uid) and inst.created == created
    assert [i.name for i in provider.list_by_tag(MANAGED_BY).instances] == [name]
    provider.delete(inst.provider_id)  # this driver refuses the NVRAM flag: plain undefine
    with pytest.raises(NotFound):
        provider.get(inst.provider_id)


def _lease_guest_entry(rig, image, **block):
    _, url, sha, _ = image()
    return rig.entry(images={"tiny": {"url": url, "sha256": sha}}, **block)


def test_a_silent_agent_keeps_the_domain_provisioning_then_the_newest_lease_is_used_degraded(
        rig, make_provider, image, request_for, caplog):
    """A guest without an agent that booted twice with different client-ids holds two leases
    from the real dnsmasq.  Until ``agentAddressTimeout`` has passed the domain stays
    Provisioning (the lease is not the source of truth), saying why; then the newer lease is
    the address, with a degraded note and a WARNING naming the source."""
    wait = 4
    provider = make_provider(_lease_guest_entry(rig, image, agentAddressTimeout=f"{wait}s"))
    inst = provider.create(request_for())
    xml = provider.link("h1").call("virDomainGetXMLDesc", lambda c: c.lookupByName(inst.name).XMLDesc(0))
    [(mac, network)] = dom_xml.nic_macs(xml)
    assert network == "default"

    # The "guest" is a DHCP client in its own namespace on a veth plugged into the network's
    # bridge (a source address of its own would be a martian to the bridge's stack).
    with harness.FakeGuest(rig, inst.name) as guest:
        with caplog.at_level(logging.INFO, logger="proxy_operator.kvm"):
            first_poll = time.monotonic()
            waiting = provider.get(inst.provider_id)
            first = guest.lease(mac, "boot-1")
            time.sleep(1.1)  # leases are stamped in seconds
            second = guest.lease(mac, "boot-2")
            assert first != second
            still = provider.get(inst.provider_id)
            assert time.monotonic() - first_poll < wait, "the machine was too slow for this test's timing"

            for got in (waiting, still):
                assert got.state is InstanceState.PROVISIONING and got.address is None, \
                    "a lease exists, but the agent is the source of truth until agentAddressTimeout"
                assert got.note.reason == "WaitingForGuestAgent" and not got.note.degraded
                assert "waiting for the QEMU guest agent" in got.note.message
                assert "guest agent is not connected" in got.note.message, got.note.message
                assert f"agentAddressTimeout ({wait}s)" in got.note.message

            deadline = first_poll + wait + 10
            got = still
            while got.state is not InstanceState.RUNNING and time.monotonic() < deadline:
                time.sleep(0.2)
                got = provider.get(inst.provider_id)
            ran_after = time.monotonic() - first_poll
        assert got.state is InstanceState.RUNNING and got.address == second, "the newest lease is the address"
        assert ran_after >= wait, "the lease was taken before agentAddressTimeout"
        assert got.note.reason == "GuestAgentUnavailable" and got.note.degraded
        assert f"address {second} from a DHCP lease on network default" in got.note.message
        assert "no address within agentAddressTimeout (4s)" in got.note.message
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(m.startswith(f"kvm host h1: domain {inst.name}: address {second} from a DHCP lease on "
                                f"network default because the QEMU guest agent reported no address") and
                   m.endswith("the guest is degraded") for m in warnings), warnings
    provider.delete(inst.provider_id)


def test_agent_address_timeout_zero_takes_the_lease_at_once_still_degraded(rig, make_provider, image, request_for):
    provider = make_provider(_lease_guest_entry(rig, image, agentAddressTimeout="0"))
    inst = provider.create(request_for())
    xml = provider.link("h1").call("virDomainGetXMLDesc", lambda c: c.lookupByName(inst.name).XMLDesc(0))
    [(mac, _)] = dom_xml.nic_macs(xml)
    none_yet = provider.get(inst.provider_id)
    assert none_yet.state is InstanceState.PROVISIONING and none_yet.address is None
    assert "no DHCP lease or ARP entry names the guest either" in none_yet.note.message
    with harness.FakeGuest(rig, inst.name) as guest:
        address = guest.lease(mac, "boot-1")
        deadline = time.monotonic() + 10  # dnsmasq's lease file is read back by libvirt
        while (got := provider.get(inst.provider_id)).address is None and time.monotonic() < deadline:
            time.sleep(0.1)
    assert got.state is InstanceState.RUNNING and got.address == address
    assert got.note.reason == "GuestAgentUnavailable" and "agentAddressTimeout is 0" in got.note.message
    provider.delete(inst.provider_id)


def test_the_proxy_says_it_waits_for_the_agent_then_warns_that_the_guest_is_degraded(
        rig, make_provider, image, api, make_context):
    """Through the reconciler: the Provisioned condition carries the provider's note while the
    Proxy waits, and one Warning Event ``GuestAgentUnavailable`` marks the fallback."""
    entry = _lease_guest_entry(rig, image, agentAddressTimeout="3s")
    provider = make_provider(entry)
    ctx = make_context(harness.provider_config(entry), factories={"kvm": lambda pc: provider})
    obj = k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "squid-agentless"},
        "spec": {"provider": provider.name, "placement": {"zone": "h1", "image": "tiny", "machineType": "small"}}})
    ref = Ref("default", "squid-agentless", obj["metadata"]["uid"])
    gateway = KubernetesGateway(api)

    def provisioned() -> dict:
        proxy = gateway.get_proxy("default", "squid-agentless")
        return proxy, next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")

    assert create(ctx, ref).action == POLL
    name = instance_name(ref.uid)
    xml = provider.link("h1").call("virDomainGetXMLDesc", lambda c: c.lookupByName(name).XMLDesc(0))
    [(mac, _)] = dom_xml.nic_macs(xml)
    with harness.FakeGuest(rig, name) as guest:
        address = guest.lease(mac, "boot-1")
        followup = poll(ctx, ref)
        assert followup.action == POLL
        proxy, cond = provisioned()
        assert proxy.phase == "Provisioning" and proxy.status.get("address") is None
        assert (cond["status"], cond["reason"]) == ("False", "WaitingForGuestAgent")
        assert "waiting for the QEMU guest agent" in cond["message"]

        deadline = time.monotonic() + 20
        while (followup := poll(ctx, ref, followup.attempt)) is not None:
            assert followup.action == POLL and time.monotonic() < deadline, "never fell back to the lease"
            time.sleep(0.3)
        proxy, cond = provisioned()
        assert proxy.phase == "Running" and proxy.status["address"] == address
        assert (cond["status"], cond["reason"]) == ("True", "GuestAgentUnavailable")
        assert f"address {address} from a DHCP lease" in cond["message"] and "degraded" in cond["message"]
        assert poll(ctx, ref) is None  # a resync finding the same: no new Event
    events = [(e.type, e.reason) for e in k8s.CoreV1Api(api).list_namespaced_event("default").items
              if e.involved_object.name == "squid-agentless"]
    assert events.count(("Warning", "GuestAgentUnavailable")) == 1, events
    assert ("Normal", "Running") in events, events
    provider.delete(f"hosts/h1/domains/{name}")


def test_address_rules():
    ifaces = {
        "lo": {"addrs": [{"type": 0, "addr": "127.0.0.1"}]},
        "eth0": {"addrs": [{"type": 1, "addr": "fe80::1"}, {"type": 0, "addr": "169.254.3.3"},
                           {"type": 0, "addr": "10.0.0.7"}]},
    }
    assert dom_xml.agent_address(ifaces) == "10.0.0.7"
    assert dom_xml.agent_address({"eth0": {"addrs": [{"type": 0, "addr": "0.0.0.0"}]}}) is None
    leases = [
        {"mac": "52:54:00:aa:bb:cc", "ipaddr": "10.1.0.5", "type": 0, "expirytime": 100},
        {"mac": "52:54:00:AA:BB:CC", "ipaddr": "10.1.0.9", "type": 0, "expirytime": 200},
        {"mac": "52:54:00:00:00:01", "ipaddr": "10.1.0.2", "type": 0, "expirytime": 300},
    ]
    assert dom_xml.lease_address(leases, "52:54:00:aa:bb:cc") == "10.1.0.9"
    assert dom_xml.lease_address(leases, "52:54:00:ff:ff:ff") is None
