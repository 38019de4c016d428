"""The full lifecycle against a real libvirtd reached over the provider's SSH path."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import uuid
import xml.etree.ElementTree as ET

import pycdlib
import pytest

from app.providers.naming import MANAGED_BY
from app.providers.base import InstanceState
from app.errors import NotFound, NotManaged, Permanent, SpecNotAllowed
from app.providers.kvm import domain as dom_xml

pytestmark = pytest.mark.timeout(120)


def _domain_xml(provider, host: str, name: str) -> str:
    """The live domain XML as libvirt reports it, read over the provider's own link."""
    return provider.link(host).call("virDomainGetXMLDesc", lambda c: c.lookupByName(name).XMLDesc(0))


def _vol_path(provider, host: str, vol: str) -> str:
    return provider.link(host).call(
        "virStorageVolGetPath", lambda c: c.storagePoolLookupByName("default").storageVolLookupByName(vol).path())


def _is_active(provider, host: str, name: str) -> bool:
    return bool(provider.link(host).call("virDomainIsActive", lambda c: c.lookupByName(name).isActive()))


def _seed_files(path) -> dict[str, bytes]:
    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    try:
        out = {}
        for child in iso.list_children(rr_path="/"):
            if child.is_file():
                name = child.rock_ridge.name().decode()
                buf = io.BytesIO()
                iso.get_file_from_iso_fp(buf, rr_path="/" + name)
                out[name] = buf.getvalue()
        assert iso.pvd.volume_identifier.decode().strip() == "cidata"
        return out
    finally:
        iso.close()


def _qemu_img_info(path) -> dict:
    return json.loads(subprocess.run(["qemu-img", "info", "-U", "--output=json", str(path)],
                                     check=True, capture_output=True, text=True).stdout)


def test_lifecycle_uefi(rig, make_provider, image, request_for):
    path, url, sha, data = image()
    key = "life-" + uuid.uuid4().hex[:8]  # a key no earlier test cached
    provider = make_provider(rig.entry(images={key: {"url": url, "sha256": sha}}))
    user_data = b"#cloud-config\npackages: [squid]\n"
    req = request_for(image=key, machine_type="small", user_data=user_data)

    inst = provider.create(req)

    assert inst.provider_id == f"hosts/h1/domains/{req.name}"
    assert inst.state is InstanceState.PROVISIONING and inst.zone == "h1"
    # Image fetched once, verified, marker written after it.
    pool = rig.daemon.pool_dir
    base = pool / f"base-{key}.qcow2"
    assert rig.images.gets[path] == 1
    assert hashlib.sha256(base.read_bytes()).hexdigest() == sha
    assert (pool / f"base-{key}.qcow2.sha256-{sha}").exists()
    # Overlay backed by the base; seed holds the user-data byte for byte.
    overlay, seed_iso = pool / f"{req.name}.qcow2", pool / f"{req.name}-seed.iso"
    info = _qemu_img_info(overlay)
    assert info["format"] == "qcow2" and info["backing-filename"] == str(base)
    assert info["backing-filename-format"] == "qcow2"
    assert info["virtual-size"] == 1 << 30, "machine type small: diskGiB 1"
    assert _seed_files(seed_iso)["user-data"] == user_data

    # Domain XML: file disks at the paths libvirt reported, seed as a cdrom on virtio-scsi, UEFI.
    xml = _domain_xml(provider, "h1", req.name)
    root = ET.fromstring(xml)
    assert root.get("type") == "qemu"
    assert root.find("cpu").get("mode") == "maximum"
    assert not root.findall("./devices/disk[@type='volume']")
    sources = dom_xml.disk_sources(xml)
    assert sources["disk"] == _vol_path(provider, "h1", overlay.name) == str(overlay)
    assert sources["cdrom"] == _vol_path(provider, "h1", seed_iso.name) == str(seed_iso)
    cdrom = root.find("./devices/disk[@device='cdrom']")
    assert cdrom.find("target").get("bus") == "scsi"
    assert root.find("./devices/controller[@type='scsi']").get("model") == "virtio-scsi"
    assert "OVMF" in root.find("./os/loader").text
    features = {f.get("name"): f.get("enabled") for f in root.findall("./os/firmware/feature")}
    assert features == {"secure-boot": "no", "enrolled-keys": "no"}
    nvram = dom_xml.nvram_path(xml)
    assert (rig.daemon.nvram_dir / nvram.rsplit("/", 1)[1]).exists()
    assert root.find("./devices/channel/target").get("name") == "org.qemu.guest_agent.0"
    assert _is_active(provider, "h1", req.name)

    # Get: running without a known address is still Provisioning; metadata read back.
    got = provider.get(inst.provider_id)
    assert got.state is InstanceState.PROVISIONING and got.address is None
    assert got.tags == req.tags and got.created == inst.created

    # Create again: idempotent, nothing fetched or defined twice.
    again = provider.create(req)
    assert again.provider_id == inst.provider_id
    assert rig.images.gets[path] == 1
    names = provider.link("h1").call("virConnectListAllDomains", lambda c: [d.name() for d in c.listAllDomains(0)])
    assert names.count(req.name) == 1

    provider.delete(inst.provider_id)

    with pytest.raises(NotFound):
        provider.get(inst.provider_id)
    assert not overlay.exists() and not seed_iso.exists()
    assert not (rig.daemon.nvram_dir / nvram.rsplit("/", 1)[1]).exists()
    assert base.exists(), "the cached base stays for the next VM"
    provider.delete(inst.provider_id)  # already gone: success


def test_bios_image_on_a_bridged_host(rig, make_provider, image, request_for):
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(hosts=[rig.host(bridge="br-po")],
                                       images={"legacy": {"url": url, "sha256": sha, "firmware": "bios"}}))
    req = request_for(image="legacy")

    inst = provider.create(req)

    root = ET.fromstring(_domain_xml(provider, "h1", req.name))
    assert root.find("./os").get("firmware") is None
    assert root.find("./os/loader") is None and root.find("./os/nvram") is None
    nic = root.find("./devices/interface")
    assert nic.get("type") == "bridge" and nic.find("source").get("bridge") == "br-po"
    assert _is_active(provider, "h1", req.name)
    provider.delete(inst.provider_id)
    with pytest.raises(NotFound):
        provider.get(inst.provider_id)


def test_create_starts_a_stopped_domain_and_get_maps_states(rig, make_provider, image, request_for):
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"tiny": {"url": url, "sha256": sha}}))
    req = request_for()
    inst = provider.create(req)
    provider.link("h1").call("virDomainDestroy", lambda c: c.lookupByName(req.name).destroy())

    assert provider.get(inst.provider_id).state is InstanceState.STOPPED
    provider.create(req)
    assert _is_active(provider, "h1", req.name)
    assert provider.get(inst.provider_id).state is InstanceState.PROVISIONING

    provider.link("h1").call("virDomainSuspend", lambda c: c.lookupByName(req.name).suspend())
    assert provider.get(inst.provider_id).state is InstanceState.STOPPED
    provider.create(req)  # resumes
    assert provider.link("h1").call("virDomainGetState", lambda c: c.lookupByName(req.name).state(0)[0]) == 1
    provider.delete(inst.provider_id)


def test_create_rebuilds_a_truncated_seed_and_reuses_the_overlay(rig, make_provider, image, request_for):
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"tiny": {"url": url, "sha256": sha}}))
    req = request_for(user_data=b"#!/bin/sh\necho hello\n")
    inst = provider.create(req)
    # An interrupted earlier attempt: domain never defined, a truncated seed left behind.
    link = provider.link("h1")
    link.call("virDomainDestroy", lambda c: c.lookupByName(req.name).destroy())
    link.call("virDomainUndefineFlags", lambda c: c.lookupByName(req.name).undefineFlags(4))
    seed_iso = rig.daemon.pool_dir / f"{req.name}-seed.iso"
    overlay = rig.daemon.pool_dir / f"{req.name}.qcow2"
    seed_iso.write_bytes(seed_iso.read_bytes()[:1000])
    overlay_inode = overlay.stat().st_ino

    provider.create(req)

    assert _seed_files(seed_iso)["user-data"] == b"#!/bin/sh\necho hello\n"
    assert overlay.stat().st_ino == overlay_inode
    provider.delete(inst.provider_id)


def test_list_by_tag_finds_ours_and_skips_foreign_domains(rig, make_provider, image, request_for):
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"tiny": {"url": url, "sha256": sha}}))
    req = request_for()
    inst = provider.create(req)
    link = provider.link("h1")
    foreign = ("<domain type='qemu'><name>foreign-vm</name><memory unit='MiB'>64</memory>"
               "<os><type arch='x86_64' machine='q35'>hvm</type></os></domain>")
    link.call("virDomainDefineXML", lambda c: c.defineXML(foreign))
    other_tool = ("<domain type='qemu'><name>other-tool-vm</name><memory unit='MiB'>64</memory>"
                  "<metadata>" + dom_xml.metadata_xml({"managed-by": "someone-else", "proxy-uid": "x"},
                                                      inst.created) + "</metadata>"
                  "<os><type arch='x86_64' machine='q35'>hvm</type></os></domain>")
    link.call("virDomainDefineXML", lambda c: c.defineXML(other_tool))

    result = provider.list_by_tag(MANAGED_BY)

    assert not result.partial
    assert [i.provider_id for i in result.instances] == [inst.provider_id]
    found = result.instances[0]
    assert found.tags == req.tags and found.created == inst.created and found.state is InstanceState.RUNNING
    provider.delete(inst.provider_id)
    assert provider.list_by_tag(MANAGED_BY).instances == []


def test_create_refuses_to_adopt_a_domain_of_the_same_name_without_our_metadata(rig, make_provider, image,
                                                                                request_for):
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"tiny": {"url": url, "sha256": sha}}))
    req = request_for()
    squatter = (f"<domain type='qemu'><name>{req.name}</name><memory unit='MiB'>64</memory>"
                "<os><type arch='x86_64' machine='q35'>hvm</type></os></domain>")
    provider.link("h1").call("virDomainDefineXML", lambda c: c.defineXML(squatter))

    with pytest.raises(Permanent, match="does not carry this Proxy's metadata"):
        provider.create(req)


def test_metadata_read_back_from_libvirt_parses(rig, make_provider, image, request_for):
    """What this libvirt hands back parses; the stripped forms are pinned in test_domain.py."""
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"tiny": {"url": url, "sha256": sha}}))
    req = request_for()
    inst = provider.create(req)
    raw = provider.link("h1").call(
        "virDomainGetMetadata", lambda c: c.lookupByName(req.name).metadata(2, dom_xml.METADATA_NS, 0))
    assert dom_xml.parse_metadata(raw).tags == req.tags
    bare = raw.replace(f' xmlns:{dom_xml.METADATA_PREFIX}="{dom_xml.METADATA_NS}"', "")
    assert "xmlns" not in bare
    assert dom_xml.parse_metadata(bare).tags == req.tags
    provider.delete(inst.provider_id)


def test_unconfigured_host_delete_is_a_noop_get_is_permanent(make_provider):
    provider = make_provider()
    provider.delete("hosts/retired/domains/proxy-abc")
    with pytest.raises(Permanent, match="not configured"):
        provider.get("hosts/retired/domains/proxy-abc")
    with pytest.raises(Permanent):
        provider.get("zones/x/instances/y")
    with pytest.raises(Permanent):
        provider.delete("hosts/h1")
    assert provider.link("h1").dials == 0, "none of these needs the host"


def test_bad_placement_is_permanent_without_dialling(rig, make_provider, request_for, image):
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"a": {"url": url, "sha256": sha}, "b": {"url": url, "sha256": sha}},
                                       machine_types={"small": {}, "large": {"vcpus": 2}}))
    with pytest.raises(SpecNotAllowed, match="^spec.placement.zone: 'nope' is not a configured host"):
        provider.create(request_for(zone="nope", image="a", machine_type="small"))
    with pytest.raises(SpecNotAllowed, match="^spec.placement.image: 'debian-13' is not a configured image"):
        provider.create(request_for(image="debian-13", machine_type="small"))
    with pytest.raises(SpecNotAllowed, match="^spec.placement.image: required"):
        provider.create(request_for(machine_type="small"))
    with pytest.raises(SpecNotAllowed, match="^spec.placement.machineType: 'huge'"):
        provider.create(request_for(image="a", machine_type="huge"))
    with pytest.raises(SpecNotAllowed, match="^spec.placement.machineType: required"):
        provider.create(request_for(image="a"))
    # a URL is refused unless the provider sets allowImageURLs (docs/security.md)
    with pytest.raises(SpecNotAllowed, match="^spec.placement.image: http://127.0.0.1:.* is a URL.*allowImageURLs"):
        provider.create(request_for(image=url, machine_type="small"))
    assert issubclass(SpecNotAllowed, Permanent)
    assert provider.link("h1").dials == 0


def test_work_for_a_host_is_routed_to_the_host_queue(make_provider, rig):
    from app.wiring import router
    from tests.kvm import harness

    provider = make_provider(rig.entry(hosts=[rig.host("h1"), rig.host("h2")]))
    route = router([harness.provider_config(rig.entry(hosts=[rig.host("h1"), rig.host("h2")]))])
    assert route.queue_for("kvm-test", "h2") == "kvm.kvm-test.h2"
    assert route.queue_for("kvm-test", "h9") == route.queue_for("kvm-test", None) == "proxies"
    assert provider.hosts() == list(route.host_queues("kvm-test")) == ["h1", "h2"]
    single = make_provider()
    assert router([harness.provider_config(rig.entry())]).queue_for("kvm-test", None) == "kvm.kvm-test.h1"
    assert single.hosts() == ["h1"]
    assert single.host_of("hosts/h1/domains/x") == "h1"


def test_delete_refuses_a_domain_that_is_not_ours_and_leaves_it(rig, make_provider, image, request_for):
    """A gc.delete (or a wrong provider ID) naming someone's domain deletes nothing (docs/security.md)."""
    _, url, sha, _ = image()
    provider = make_provider(rig.entry(images={"tiny": {"url": url, "sha256": sha}}))
    link = provider.link("h1")
    req = request_for()
    # a squatter with one of our instance names, and a domain whose metadata names another manager
    squatter = (f"<domain type='qemu'><name>{req.name}</name><memory unit='MiB'>64</memory>"
                "<os><type arch='x86_64' machine='q35'>hvm</type></os></domain>")
    other = ("<domain type='qemu'><name>other-tool-vm</name><memory unit='MiB'>64</memory>"
             "<metadata>" + dom_xml.metadata_xml({"managed-by": "someone-else", "proxy-uid": "x"}, None) +
             "</metadata><os><type arch='x86_64' machine='q35'>hvm</type></os></domain>")
    link.call("virDomainDefineXML", lambda c: c.defineXML(squatter))
    link.call("virDomainDefineXML", lambda c: c.defineXML(other))
    pool = rig.daemon.pool_dir
    (pool / f"{req.name}.qcow2").write_bytes(b"someone's disk")
    link.call("virStoragePoolRefresh", lambda c: c.storagePoolLookupByName("default").refresh(0))
    for name in (req.name, "other-tool-vm"):
        with pytest.raises(NotManaged, match=f"refusing to delete hosts/h1/domains/{name}"):
            provider.delete(f"hosts/h1/domains/{name}")
        assert link.call("virDomainLookupByName", lambda c, n=name: c.lookupByName(n).name()) == name
    assert (pool / f"{req.name}.qcow2").read_bytes() == b"someone's disk", "its volumes are left alone too"
    # no domain and a name that is not one of ours: its volumes are not ours to remove either
    (pool / "important.qcow2").write_bytes(b"keep")
    link.call("virStoragePoolRefresh", lambda c: c.storagePoolLookupByName("default").refresh(0))
    provider.delete("hosts/h1/domains/important")
    assert (pool / "important.qcow2").exists()
    (pool / "important.qcow2").unlink()
    for name in (req.name, "other-tool-vm"):
        link.call("virDomainUndefine", lambda c, n=name: c.lookupByName(n).undefine())
    (pool / f"{req.name}.qcow2").unlink()
    link.call("virStoragePoolRefresh", lambda c: c.storagePoolLookupByName("default").refresh(0))

    # ours: deleted, volumes included; gone: success
    inst = provider.create(req)
    provider.delete(inst.provider_id)
    with pytest.raises(NotFound):
        provider.get(inst.provider_id)
    assert not (pool / f"{req.name}.qcow2").exists()
    provider.delete(inst.provider_id)
