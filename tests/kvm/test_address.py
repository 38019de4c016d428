"""Address discovery: guest agent first, else the newest DHCP lease for the domain's MAC."""

from __future__ import annotations

import ipaddress
import logging
import time
from datetime import datetime, timezone

import pytest

from app.naming import MANAGED_BY, instance_name, tags_for
from app.providers.base import InstanceState
from app.providers.errors import NotFound
from app.providers.kvm import domain as dom_xml
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

    assert inst.state is InstanceState.RUNNING
    assert inst.address == expected and ipaddress.IPv4Address(inst.address)
    # The source is named, once (the second poll found the same address from the same source).
    assert [r.getMessage() for r in caplog.records if "from the guest agent" in r.getMessage()] == [
        f"kvm host t1: domain {name}: address {expected} from the guest agent"]
    assert inst.tags == tags_for(uid) and inst.created == created
    assert [i.name for i in provider.list_by_tag(MANAGED_BY).instances] == [name]
    provider.delete(inst.provider_id)  # this driver refuses the NVRAM flag: plain undefine
    with pytest.raises(NotFound):
        provider.get(inst.provider_id)


def test_newest_dhcp_lease_for_the_mac_when_no_agent_answers(rig, make_provider, image, request_for, caplog):
    """A guest without an agent that booted twice with different client-ids holds two leases
    from the real dnsmasq; the address is the newer one."""
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"tiny": {"url": url, "sha256": sha}}))
    inst = provider.create(request_for())
    xml = provider.link("h1").call("virDomainGetXMLDesc", lambda c: c.lookupByName(inst.name).XMLDesc(0))
    [(mac, network)] = dom_xml.nic_macs(xml)
    assert network == "default"
    assert provider.get(inst.provider_id).address is None, "no agent and no lease yet"

    # The "guest" is a DHCP client in its own namespace on a veth plugged into the network's
    # bridge (a source address of its own would be a martian to the bridge's stack).
    with harness.FakeGuest(rig, inst.name) as guest:
        first = guest.lease(mac, "boot-1")
        time.sleep(1.1)  # leases are stamped in seconds
        second = guest.lease(mac, "boot-2")
        assert first != second

        def address():
            got = provider.get(inst.provider_id)
            return got if got.address == second else None

        deadline = time.monotonic() + 10
        got = None
        with caplog.at_level(logging.INFO, logger="proxy_operator.kvm"):
            while got is None and time.monotonic() < deadline:
                got = address()
                time.sleep(0.1)
        assert got is not None, "the newest lease was not reported"
        assert got.state is InstanceState.RUNNING
        assert f"kvm host h1: domain {inst.name}: address {second} from a DHCP lease on network default" in [
            r.getMessage() for r in caplog.records]
    provider.delete(inst.provider_id)


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
