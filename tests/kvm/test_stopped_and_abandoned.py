"""Stopped is not lost, and skip-cleanup outlives Redis: the kvm provider on a real libvirtd.

The provider reaches the daemon over SSH as always; "behind its back" is a second libvirt
connection straight to the daemon's socket (what ``virsh destroy`` on the hypervisor, or the
hypervisor's reboot, does to a domain).
"""

from __future__ import annotations

import time

import libvirt
import pytest
from kubernetes import client as k8s

from app.providers import naming
from app.proxy.gc import collect
from app.kube.gateway import KubernetesGateway
from app.providers.base import InstanceState
from app.errors import NotFound
from app.providers.kvm import domain as dom_xml
from app.proxy.reconcile import ABANDONED_KEY, POLL, Ref, create, poll
from app.config.settings import Settings
from tests.kvm import harness
from tests.support.proxies import apply

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def direct(rig):
    """A libvirt connection straight to the daemon's socket: the hypervisor's own view."""
    conn = libvirt.open(f"qemu+unix:///system?socket={rig.daemon.socket}")
    yield conn
    conn.close()


@pytest.fixture
def entry(rig, image):
    """A providers-config entry for the rig with one small BIOS image ``tiny``; the fake guest's
    lease is taken at once (``agentAddressTimeout: 0``: a disk without an OS runs no agent)."""
    _, url, sha, _ = image()
    return rig.entry(images={"tiny": {"url": url, "sha256": sha, "firmware": "bios"}}, agentAddressTimeout="0")


@pytest.fixture
def provider(make_provider, entry):
    return make_provider(entry)


def managed(conn) -> list[str]:
    """Names of the domains carrying our managed-by tag (what GC would list)."""
    out = []
    for dom in conn.listAllDomains(0):
        try:
            meta = dom_xml.parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, dom_xml.METADATA_NS, 0))
        except libvirt.libvirtError:
            continue
        if meta.tags.get(naming.TAG_MANAGED_BY) == naming.MANAGED_BY:
            out.append(dom.name())
    return out


def test_create_defines_the_domain_with_autostart_and_start_restores_it(provider, request_for, direct):
    req = request_for(image="tiny", machine_type="small")
    inst = provider.create(req)
    dom = direct.lookupByName(req.name)
    assert dom.autostart() == 1, "libvirtd starts it again when the hypervisor boots"

    dom.setAutostart(0)  # a domain defined by an older version
    dom.destroy()
    assert provider.get(inst.provider_id).state is InstanceState.STOPPED
    provider.start(inst.provider_id)
    assert dom.isActive() and dom.autostart() == 1

    dom.suspend()
    assert provider.get(inst.provider_id).state is InstanceState.STOPPED
    provider.start(inst.provider_id)  # resumes
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    provider.start(inst.provider_id)  # running: nothing to do
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    assert managed(direct) == [req.name]

    provider.delete(inst.provider_id)
    with pytest.raises(NotFound):
        provider.start(inst.provider_id)


def poll_until_running(ctx, ref: Ref, attempt: int = 0, timeout: float = 20) -> None:
    """Run the poll step (as its followups would) until it finishes: the lease became visible."""
    deadline = time.monotonic() + timeout
    while (followup := poll(ctx, ref, attempt)) is not None:
        assert followup.action == POLL and time.monotonic() < deadline, f"still {followup} after {timeout}s"
        attempt = followup.attempt
        time.sleep(0.2)


def _slow_ctx(make_context, entry, provider):
    """A reconcile context on ``provider`` with the deployed backoff (poll 5-60 s, retry 5-300 s)."""
    settings = Settings(poll_initial=5, poll_max=60, retry_initial=5, retry_max=300, quota_backoff=900)
    return make_context(harness.provider_config(entry), settings=settings, factories={"kvm": lambda pc: provider})


def test_poll_starts_the_same_domain_after_it_was_shut_off(rig, entry, provider, direct, api, make_context):
    ctx = _slow_ctx(make_context, entry, provider)
    ref = apply(api, "squid-kvm", {"provider": provider.name,
                                   "placement": {"zone": "h1", "image": "tiny", "machineType": "small"}},
                namespace="default")

    assert create(ctx, ref).action == POLL
    name = naming.instance_name(ref.uid)
    dom = direct.lookupByName(name)
    uuid = dom.UUIDString()
    [(mac, _network)] = dom_xml.nic_macs(dom.XMLDesc(0))
    with harness.FakeGuest(rig, name) as guest:
        address = guest.lease(mac, "boot-1")
        poll_until_running(ctx, ref)
        proxy = KubernetesGateway(api).get_proxy("default", "squid-kvm")
        assert proxy.phase == "Running" and proxy.status["address"] == address

        dom.destroy()  # the hypervisor went down under it

        followup = poll(ctx, ref)

        assert followup.action == POLL
        again = direct.lookupByName(name)
        assert again.UUIDString() == uuid, "the same domain, not a new one"
        assert again.isActive()
        proxy = KubernetesGateway(api).get_proxy("default", "squid-kvm")
        cond = next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")
        assert proxy.phase == "Provisioning" and cond["reason"] == "InstanceStopped"

        poll_until_running(ctx, ref, followup.attempt)
        proxy = KubernetesGateway(api).get_proxy("default", "squid-kvm")
        assert proxy.phase == "Running" and proxy.status["address"] == address
        reasons = [e.reason for e in k8s.CoreV1Api(api).list_namespaced_event("default").items]
        assert reasons.count("InstanceStarted") == 1 and "InstanceLost" not in reasons
        assert direct.lookupByName(name).UUIDString() == uuid
    assert managed(direct) == [name], "nothing leaked, nothing duplicated"


def test_a_failing_start_is_retried_with_backoff(rig, entry, provider, direct, api, make_context):
    """The domain is found shut off and starting it fails: its disk is not there (a rebooted
    hypervisor whose storage is not mounted yet; here the overlay file moved away behind
    libvirt's back).  Transient: ``Provisioned=False/Transient``, the poll retried with backoff
    (2.5-5 s, then 5-10 s), the domain neither deleted nor made again; once the disk is back the
    same domain starts and serves its old address.  One domain, its own two volumes, at the end."""
    from pathlib import Path

    from app.providers.kvm.provider import overlay_name, seed_name

    ctx = _slow_ctx(make_context, entry, provider)
    ref = apply(api, "squid-kvm-flaky", {"provider": provider.name,
                                         "placement": {"zone": "h1", "image": "tiny", "machineType": "small"}},
                namespace="default")

    assert create(ctx, ref).action == POLL
    name = naming.instance_name(ref.uid)
    dom = direct.lookupByName(name)
    uuid = dom.UUIDString()
    [(mac, _network)] = dom_xml.nic_macs(dom.XMLDesc(0))
    pool = direct.storagePoolLookupByName("default")
    disk = Path(pool.storageVolLookupByName(overlay_name(name)).path())
    away = disk.with_name(disk.name + ".away")
    with harness.FakeGuest(rig, name) as guest:
        address = guest.lease(mac, "boot-1")
        poll_until_running(ctx, ref)

        dom.destroy()                                     # the hypervisor went down under it ...
        disk.rename(away)                                 # ... and came back without its storage
        try:
            first = poll(ctx, ref)

            assert first.action == POLL and first.attempt == 1 and 2.5 <= first.delay <= 5
            proxy = KubernetesGateway(api).get_proxy("default", "squid-kvm-flaky")
            cond = next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")
            assert proxy.phase == "Provisioning" and cond["reason"] == "Transient"
            assert "virDomainCreate" in cond["message"] and "Cannot access storage file" in cond["message"]
            assert not dom.isActive() and direct.lookupByName(name).UUIDString() == uuid

            second = poll(ctx, ref, first.attempt)        # still no disk: backing off further
            assert second.action == POLL and second.attempt == 2 and 5 <= second.delay <= 10
        finally:
            away.rename(disk)                             # the storage is back

        third = poll(ctx, ref, second.attempt)
        assert third.action == POLL
        again = direct.lookupByName(name)
        assert again.UUIDString() == uuid and again.isActive(), "the same domain, started again"
        poll_until_running(ctx, ref, third.attempt)
        proxy = KubernetesGateway(api).get_proxy("default", "squid-kvm-flaky")
        assert proxy.phase == "Running" and proxy.status["address"] == address
    reasons = [e.reason for e in k8s.CoreV1Api(api).list_namespaced_event("default").items]
    assert reasons.count("InstanceStarted") == 1 and "InstanceLost" not in reasons
    assert managed(direct) == [name], "nothing leaked, nothing duplicated"
    assert sorted(v.name() for v in pool.listAllVolumes(0) if v.name().startswith(name)) == \
        sorted([overlay_name(name), seed_name(name)])


def test_abandoned_domain_survives_a_redis_flush_and_gc(provider, request_for, direct, redis_client):
    kept = provider.create(request_for(image="tiny", machine_type="small"))
    orphan = provider.create(request_for(image="tiny", machine_type="small"))  # the control: GC deletes it
    redis_client.sadd(ABANDONED_KEY, kept.tags[naming.TAG_PROXY_UID])

    provider.abandon(kept.provider_id)

    dom = direct.lookupByName(kept.name)
    for flags in (libvirt.VIR_DOMAIN_AFFECT_LIVE, libvirt.VIR_DOMAIN_AFFECT_CONFIG):
        meta = dom_xml.parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, dom_xml.METADATA_NS, flags))
        assert meta.tags == {**kept.tags, naming.TAG_ABANDONED: "true"} and meta.created == kept.created
    provider.abandon(kept.provider_id)  # already marked: success

    redis_client.flushall()
    report = collect(provider.name, provider, lambda: [], abandoned=set(redis_client.smembers(ABANDONED_KEY)), grace_seconds=0)

    assert report.deleted == [orphan.provider_id]
    assert managed(direct) == [kept.name]
    # The mark is in the persistent definition: it survives the domain being shut off and started.
    dom.destroy()
    provider.start(kept.provider_id)
    assert collect(provider.name, provider, lambda: [], abandoned=set(), grace_seconds=0).deleted == []
    assert managed(direct) == [kept.name]
    assert provider.get(kept.provider_id).tags[naming.TAG_ABANDONED] == "true"

    provider.delete(kept.provider_id)
    provider.abandon(kept.provider_id)  # gone: success
    assert managed(direct) == []


def test_a_shut_off_domain_is_marked_in_its_persistent_definition(provider, request_for, direct):
    inst = provider.create(request_for(image="tiny", machine_type="small"))
    dom = direct.lookupByName(inst.name)
    dom.destroy()

    provider.abandon(inst.provider_id)

    meta = dom_xml.parse_metadata(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, dom_xml.METADATA_NS,
                                               libvirt.VIR_DOMAIN_AFFECT_CONFIG))
    assert meta.tags[naming.TAG_ABANDONED] == "true"
    dom.create()
    assert provider.get(inst.provider_id).tags[naming.TAG_ABANDONED] == "true"
    provider.delete(inst.provider_id)
