"""Domain XML rules, the metadata element in every form libvirt returns it, provider IDs, states."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timezone

import pytest

from app.providers.base import InstanceState
from app.providers.kvm import domain as d

CREATED = datetime(2026, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
TAGS = {"managed-by": "proxy-operator", "proxy-uid": "0b6f-<&>-uid"}


def spec(**kw) -> d.DomainSpec:
    base = dict(name="proxy-abc", domain_type="kvm", vcpus=2, memory_mib=1024, firmware="uefi",
                disk_path="/var/lib/libvirt/images/proxy-abc.qcow2",
                seed_path="/var/lib/libvirt/images/proxy-abc-seed.iso", metadata=d.metadata_xml(TAGS, CREATED))
    base.update(kw)
    return d.DomainSpec(**base)


def test_kvm_host_gets_host_passthrough_and_file_disks():
    root = ET.fromstring(d.domain_xml(spec()))
    assert root.get("type") == "kvm" and root.find("cpu").get("mode") == "host-passthrough"
    assert root.find("./os/type").get("machine") == "q35"
    disks = root.findall("./devices/disk")
    assert {x.get("type") for x in disks} == {"file"}, "never type=volume: AppArmor needs paths"
    assert all(x.find("source").get("pool") is None for x in disks)
    assert d.disk_sources(d.domain_xml(spec())) == {"disk": spec().disk_path, "cdrom": spec().seed_path}


def test_bridge_nic_and_bios():
    root = ET.fromstring(d.domain_xml(spec(bridge="br0", network=None, firmware="bios")))
    nic = root.find("./devices/interface")
    assert nic.get("type") == "bridge" and nic.find("source").get("bridge") == "br0"
    assert root.find("./os").get("firmware") is None and root.find("./os/firmware") is None


@pytest.mark.parametrize("form", ["declared", "declaration-stripped", "bare"])
def test_metadata_parses_in_every_form(form):
    text = d.metadata_xml(TAGS, CREATED)
    if form != "declared":
        text = text.replace(f' xmlns:{d.METADATA_PREFIX}="{d.METADATA_NS}"', "")
    if form == "bare":
        text = text.replace(f"{d.METADATA_PREFIX}:", "")
    meta = d.parse_metadata(text)
    assert meta.tags == TAGS and meta.created == CREATED


def test_metadata_for_set_metadata_is_bare_and_may_lack_created():
    """virDomainSetMetadata adds our namespace and prefix itself (it refuses an element declaring them)."""
    text = d.metadata_xml({**TAGS, "abandoned": "true"}, None, namespaced=False)
    assert "xmlns" not in text and f"{d.METADATA_PREFIX}:" not in text
    meta = d.parse_metadata(text)
    assert meta.tags == {**TAGS, "abandoned": "true"} and meta.created is None
    assert d.parse_metadata(d.metadata_xml(TAGS, CREATED, namespaced=False)).created == CREATED


def test_metadata_rejects_other_elements():
    with pytest.raises(ValueError):
        d.parse_metadata("<something/>")
    with pytest.raises(ValueError):
        d.parse_metadata("not xml <")


def test_provider_ids():
    assert d.provider_id("lab1", "proxy-x") == "hosts/lab1/domains/proxy-x"
    assert d.parse_provider_id("hosts/lab1/domains/proxy-x") == ("lab1", "proxy-x")
    for bad in ("hosts/lab1/domains", "hosts//domains/x", "zones/a/instances/b", "hosts/a/b/domains/x", ""):
        with pytest.raises(ValueError):
            d.parse_provider_id(bad)


def test_state_mapping():
    assert d.map_state(1, "10.0.0.2") is InstanceState.RUNNING
    assert d.map_state(1, None) is InstanceState.PROVISIONING
    assert d.map_state(5, None) is InstanceState.STOPPED
    assert d.map_state(3, "10.0.0.2") is InstanceState.STOPPED
    # Every state of an existing domain is recoverable in place (the provider's start):
    # crashed (6), shutting down (4) and pmsuspended (7) too; nothing is Terminated.
    for state in (3, 4, 5, 6, 7):
        assert d.base_state(state) is InstanceState.STOPPED
    assert d.map_state(0, None) is InstanceState.PROVISIONING
