"""kvm: a Proxy deleted while its domain is being created, a Proxy moved off a dead host, a
delete without a recorded provider ID, and where GC's tasks are sent.

Real libvirtd over real sshd (the session's rig; a second daemon where two hosts must hold
separate domains), the Kubernetes API fake for the Proxy.  The create is held in its image
download (a slow image server) when the delete arrives, so the domain is defined and started
only after the delete step first looked: the delete keeps the finalizer (the create stamped
``createStartedAt``) and finds the domain on a later pass.  GC runs its real path: each host
listed (``gc.record_shard``), the sweep's verdict (``gc.sweep``), each deletion re-checked
(``gc.verify_and_delete``, what a ``gc.delete`` task runs).

A create held later, after ``virDomainDefineXML`` while libvirtd starts the domain, runs on a
private libvirtd with a ``qemu`` hook script (``hooked``): libvirtd runs the hook before it
starts a domain and waits for it, holding the domain meanwhile.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client as k8s

from app.proxy import gc

from app.providers import naming
from app.config.providers import ProvidersConfig
from app.kube.gateway import KubernetesGateway
from app.providers.naming import instance_name, tags_for
from app.providers.base import CreateRequest
from app.providers.kvm.provider import KvmProvider
from app.providers.registry import build
from app.proxy.reconcile import CREATE, DELETE, POLL, Context, Ref, create, delete, poll
from app.resources import FINALIZER, GROUP, PLURAL, VERSION
from app.config.settings import Settings
from tests.kvm import harness
from tests.support.kvm_rig import wipe_domains
from tests.support.proxies import Background
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
NS = "default"


def _ctx(kube_client, redis_client, entry: dict, retired: list | None = None) -> Context:
    pc = harness.provider_config(entry)
    made = KvmProvider(pc)
    registry = build(ProvidersConfig((pc,)), {"kvm": lambda _pc: made})
    retire = (lambda name, pid, ref: retired.append((name, pid))) if retired is not None else None
    return Context(kube=KubernetesGateway(kube_client), registry=registry, redis=redis_client, retire=retire,
                   settings=Settings(poll_initial=0.2, poll_max=1, retry_initial=0.2, retry_max=1))


def _apply(kube_client, name: str, spec: dict) -> Ref:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}
    obj = k8s.CustomObjectsApi(kube_client).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    return Ref(NS, name, obj["metadata"]["uid"])


def _domains(provider: KvmProvider, host: str = "h1") -> list[str]:
    return [d.name() for d in provider.link(host).call("virConnectListAllDomains", lambda c: c.listAllDomains(0))]


def _gc(provider: KvmProvider, kube_client, redis_client) -> list[str]:
    """One GC sweep of ``provider`` the way the tasks run it, grace 0; return what it deleted.

    ``gc.collect_shard`` per host (each host listed, the last shard gets the merged listing
    and the verdict: :func:`app.proxy.gc.sweep`), ``gc.delete`` per instance found
    (:func:`app.proxy.gc.verify_and_delete`: judged again under the Proxy's lock, then deleted).
    """
    kube = KubernetesGateway(kube_client)
    sweep_id, hosts, merged = f"{provider.name}:{uuid.uuid4().hex}", provider.hosts(), None
    for host in hosts:
        merged = gc.record_shard(redis_client, sweep_id, host, shards=len(hosts),
                                 listing=provider.list_by_tag(naming.MANAGED_BY, host=host)) or merged
    assert merged is not None and not merged.partial
    live, current = gc.current_instances(kube.list_proxy_refs(), provider.name)
    deleted: list[str] = []

    def gc_delete(provider_id: str, uid: str | None = None) -> bool:
        if gc.verify_and_delete(provider, provider.name, provider_id, redis=redis_client,
                                list_proxies=kube.list_proxy_refs, grace_seconds=0):
            deleted.append(provider_id)
        return True

    gc.sweep(provider.name, gc_delete, merged, live_uids=live, abandoned=set(), grace_seconds=0, current=current,
             superseded=lambda uid, provider_id: gc_delete(provider_id, uid))
    return deleted


def _release(ctx: Context, ref: Ref) -> None:
    """Run the delete step and its followups until the Proxy is released."""
    followup = delete(ctx, ref)
    for _ in range(40):
        if followup is None:
            return
        assert followup.action == DELETE
        time.sleep(followup.delay)
        followup = delete(ctx, ref, followup.attempt)
    raise AssertionError("the delete never finished")


def test_delete_while_the_domain_is_being_created_leaks_nothing(rig, image, kube_client, redis_client):
    path, url, sha, _ = image()
    key = "slow-" + uuid.uuid4().hex[:8]
    rig.images.delays[path] = 4                      # the create waits in its image download
    ctx = _ctx(kube_client, redis_client, rig.entry(images={key: {"url": url, "sha256": sha}}))
    provider = ctx.registry.get("kvm-test")
    ref = _apply(kube_client, "kvm-slow-1", {"provider": "kvm-test",
                                                "placement": {"zone": "h1", "image": key, "machineType": "small"}})
    creating = Background(create, ctx, ref)
    wait_until(lambda: rig.images.gets.get(path) == 1, 20, "image download started")
    assert KubernetesGateway(kube_client).get_proxy(NS, "kvm-slow-1").status["providerID"] == \
        f"hosts/h1/domains/{instance_name(ref.uid)}"
    k8s.CustomObjectsApi(kube_client).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "kvm-slow-1")
    followup = delete(ctx, ref)
    # No domain yet, but the create that stamped createStartedAt may still define it: kept.
    assert followup is not None and followup.action == DELETE
    proxy = KubernetesGateway(kube_client).get_proxy(NS, "kvm-slow-1")
    assert FINALIZER in proxy.finalizers
    assert any(c.get("reason") == "WaitingForCreate" for c in proxy.status["conditions"])
    while followup is not None:   # until the domain the create defines is found and deleted
        assert followup.action == DELETE
        time.sleep(followup.delay)
        followup = delete(ctx, ref, followup.attempt)
    assert KubernetesGateway(kube_client).get_proxy(NS, "kvm-slow-1") is None
    try:
        creating.join(60)  # defines and starts the domain, finds the Proxy gone, deletes it
    except Exception:  # noqa: BLE001 - what the create reports does not matter; what it leaves does
        pass
    assert instance_name(ref.uid) not in _domains(provider)
    volumes = provider.link("h1").call("virStoragePoolListAllVolumes",
                                       lambda c: [v.name() for v in c.storagePoolLookupByName("default").listAllVolumes(0)])
    assert not [v for v in volumes if v.startswith(instance_name(ref.uid))]


# -- a create held between define and start (a libvirt hook) ---------------------------------------
#: libvirtd runs ``/etc/libvirt/hooks/qemu <domain> <op> <subop> -`` (the domain XML on stdin)
#: before it starts a domain, and waits for it.  At ``prepare begin`` of domain D the hook waits
#: while ``<marks>/D.hold`` exists, touching ``D.held`` first; every other domain passes.
_HOOK = """#!/bin/sh
cat >/dev/null
[ "$2" = prepare ] && [ "$3" = begin ] || exit 0
m={marks}/"$1"
if [ -e "$m.hold" ]; then
    touch "$m.held"
    while [ -e "$m.hold" ]; do sleep 0.05; done
fi
exit 0
"""


@pytest.fixture(scope="module")
def hooked(rig, tmp_path_factory):
    """``(daemon, marks)``: a private libvirtd (:class:`tests.kvm.harness.LibvirtDaemon`) whose
    ``qemu`` hook holds the start of domain D while ``marks/D.hold`` exists (:data:`_HOOK`).

    Its own daemon: libvirtd looks for hook scripts only when it starts, so the rig's daemon
    (started without one) cannot take it.  Dialled through the rig's sshd like any host.
    """
    marks = tmp_path_factory.mktemp("hook-marks")
    root = Path(tempfile.mkdtemp(prefix="kvm-libvirtd-hooked-"))
    hook = root / "etc" / "hooks" / "qemu"
    hook.parent.mkdir(parents=True)
    hook.write_text(_HOOK.format(marks=marks))
    hook.chmod(0o755)
    daemon = harness.LibvirtDaemon(root).start()
    yield daemon, marks
    daemon.stop()


def test_delete_while_libvirt_starts_the_defined_domain_releases_only_after_it_is_gone(
        rig, hooked, image, kube_client, redis_client):
    """The create has defined the domain and libvirtd is starting it (held in the ``prepare``
    hook) when the Proxy is deleted.  The delete step (another worker's) reaches libvirt while
    the start is held and waits on the domain; the start is let go; the finalizer is released
    only once the domain is gone, and the create finishing beside it makes nothing again.
    Sampled all along from the hypervisor's side: never a released Proxy with its domain still
    there, never a second domain (one UUID), and 0 domains and 0 volumes left at the end."""
    import libvirt

    daemon, marks = hooked
    _, url, sha, _ = image()
    key = "held-" + uuid.uuid4().hex[:8]
    entry = rig.entry(hosts=[rig.host("h1", libvirtSocket=str(daemon.socket))],
                      images={key: {"url": url, "sha256": sha}})
    ctx = _ctx(kube_client, redis_client, entry)
    other = _ctx(kube_client, redis_client, entry)        # the delete runs in another worker
    gateway = KubernetesGateway(kube_client)
    direct = libvirt.open(f"qemu+unix:///system?socket={daemon.socket}")   # the hypervisor's view
    stop, samples = threading.Event(), []
    hold = None
    try:
        ref = _apply(kube_client, "kvm-held-1", {"provider": "kvm-test",
                                                    "placement": {"zone": "h1", "image": key, "machineType": "small"}})
        name = instance_name(ref.uid)
        hold = marks / f"{name}.hold"
        hold.touch()
        creating = Background(create, ctx, ref)
        wait_until((marks / f"{name}.held").exists, 60, "the create's start held in the prepare hook")
        defined = daemon.root / "etc" / "qemu" / f"{name}.xml"    # virDomainDefineXML's persistent config
        assert defined.exists(), "the domain is defined before libvirtd starts it"
        domain_uuid = defined.read_text().split("<uuid>")[1].split("</uuid>")[0]

        def sample() -> None:  # the Proxy first, then the domains: "released" then "still there" is a leak
            while not stop.is_set():
                present = gateway.get_proxy(NS, "kvm-held-1") is not None
                doms = {d.name(): d.UUIDString() for d in direct.listAllDomains(0)}
                samples.append((present, doms.get(name)))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        k8s.CustomObjectsApi(kube_client).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "kvm-held-1")
        deleting = Background(delete, other, ref)
        wait_until(lambda: gateway.get_proxy(NS, "kvm-held-1").phase == "Terminating", 10,
                   "the delete step past its status write, at the provider")
        time.sleep(1)
        assert deleting.thread.is_alive(), "the delete waits on the domain libvirtd is starting"
        assert FINALIZER in gateway.get_proxy(NS, "kvm-held-1").finalizers
        assert (marks / f"{name}.held").exists() and hold.exists()   # still held: nothing could go yet

        hold.unlink()                                     # libvirtd goes on starting it
        followup = deleting.join(60)
        while followup is not None:
            assert followup.action == DELETE
            time.sleep(followup.delay)
            followup = delete(other, ref, followup.attempt)
        assert gateway.get_proxy(NS, "kvm-held-1") is None
        assert name not in [d.name() for d in direct.listAllDomains(0)]
        # The create returns (its start failed, or it found the Proxy terminating): run what it
        # asks for next, as its worker would, until nothing is left to do.
        steps, step = {CREATE: create, DELETE: delete, POLL: poll}, creating.join(60)
        for _ in range(20):
            if step is None:
                break
            time.sleep(min(step.delay, 2))
            step = steps[step.action](ctx, ref, step.attempt)
        assert step is None
        time.sleep(0.5)                                   # a few more samples after the create finished
        stop.set()
        sampler.join(30)

        assert samples and not samples[-1][0] and samples[-1][1] is None
        leaked = [s for s in samples if not s[0] and s[1] is not None]
        assert not leaked, "the Proxy was released while its domain existed"
        assert {u for _, u in samples if u is not None} <= {domain_uuid}, "a second domain was made"
        assert [d.name() for d in direct.listAllDomains(0)] == []                  # 0 domains leaked
        volumes = [v.name() for v in direct.storagePoolLookupByName("default").listAllVolumes(0)]
        assert [v for v in volumes if not v.startswith("base-")] == []            # 0 volumes leaked
    finally:
        stop.set()
        if hold is not None:
            hold.unlink(missing_ok=True)
        direct.close()
        for c in (ctx, other):
            c.registry.unwrapped["kvm-test"].close()
        wipe_domains(daemon.socket)


def test_moving_off_a_dead_host_creates_on_the_new_one_and_gc_leaves_exactly_one(
        rig, second_daemon, image, kube_client, redis_client):
    """h1 (its own libvirtd) runs the Proxy's domain, then dies; the Proxy moves to h2.  The
    replacing create never dials h1 and hands the old domain to h1's queue; that retire fails
    while h1 is down (the task retries, then gives up).  When h1 is back, GC's real path
    deletes the superseded domain: exactly one instance is left, on h2."""
    from app.proxy.reconcile import retire_instance
    from app.errors import ProviderError
    from app.wiring import router

    path, url, sha, _ = image()
    key = "move-" + uuid.uuid4().hex[:8]
    images = {key: {"url": url, "sha256": sha}}
    h1 = rig.host("h1", libvirtSocket=str(second_daemon.socket))
    live = _ctx(kube_client, redis_client, rig.entry(hosts=[h1, rig.host("h2")], images=images))
    retired: list = []
    dead = _ctx(kube_client, redis_client,
                rig.entry(hosts=[{**h1, "port": harness.free_port()}, rig.host("h2")], images=images), retired)
    provider = live.registry.unwrapped["kvm-test"]
    try:
        ref = _apply(kube_client, "kvm-move-1", {"provider": "kvm-test",
                                                    "placement": {"zone": "h1", "image": key, "machineType": "small"}})
        name = instance_name(ref.uid)
        old_id, new_id = f"hosts/h1/domains/{name}", f"hosts/h2/domains/{name}"
        create(live, ref)                                 # it ran on h1 before h1 died
        assert name in _domains(provider, "h1") and name not in _domains(provider, "h2")
        k8s.CustomObjectsApi(kube_client).patch_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, "kvm-move-1", {"spec": {"placement": {"zone": "h2"}}})

        followup = create(dead, ref)                      # h1 is unreachable now

        assert followup is not None and followup.action != DELETE
        assert KubernetesGateway(kube_client).get_proxy(NS, "kvm-move-1").status["providerID"] == new_id
        assert name in _domains(provider, "h2")
        # The old instance is handed to its own host's queue, not deleted from here ...
        assert retired == [("kvm-test", old_id)]
        assert router(dead.registry.configs.values()).queue_for_instance("kvm-test", old_id) == "kvm.kvm-test.h1"
        # ... where the retire fails while h1 is down (instance.retire retries, then gives up).
        with pytest.raises(ProviderError):
            retire_instance(dead, "kvm-test", old_id, ref=ref)
        # h1 is back: GC collects the domain the Proxy no longer names (superseded).
        assert _gc(provider, kube_client, redis_client).count(old_id) == 1
        assert name not in _domains(provider, "h1")
        assert [d for d in _domains(provider, "h1") + _domains(provider, "h2") if d == name] == [name]
        assert _gc(provider, kube_client, redis_client).count(new_id) == 0   # the current one stays
        assert name in _domains(provider, "h2")
    finally:
        for pid in (f"hosts/h1/domains/{instance_name(ref.uid)}", f"hosts/h2/domains/{instance_name(ref.uid)}"):
            provider.delete(pid)
        for ctx in (live, dead):
            ctx.registry.unwrapped["kvm-test"].close()


# -- a delete that finds no recorded provider ID ------------------------------------------------------
def test_a_delete_without_a_recorded_id_finds_the_domain_on_the_specs_host(rig, image, kube_client, redis_client):
    """A domain made by a create that recorded nothing (a crash before any status write of an
    older release, a status lost) is found by its name on the host the spec places it on."""
    _, url, sha, _ = image()
    key = "noid-" + uuid.uuid4().hex[:8]
    ctx = _ctx(kube_client, redis_client, rig.entry(images={key: {"url": url, "sha256": sha}}))
    provider = ctx.registry.unwrapped["kvm-test"]
    try:
        ref = _apply(kube_client, "kvm-noid-1", {"provider": "kvm-test",
                                                    "placement": {"zone": "h1", "image": key, "machineType": "small"}})
        gateway = KubernetesGateway(kube_client)
        gateway.add_finalizer(gateway.get_proxy(NS, "kvm-noid-1"))
        provider.create(CreateRequest(name=instance_name(ref.uid), tags=tags_for(ref.uid), namespace=NS, zone="h1",
                                      image=key, machine_type="small"))
        assert instance_name(ref.uid) in _domains(provider, "h1")
        assert "providerID" not in (gateway.get_proxy(NS, "kvm-noid-1").status or {})
        k8s.CustomObjectsApi(kube_client).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "kvm-noid-1")
        _release(ctx, ref)
        assert gateway.get_proxy(NS, "kvm-noid-1") is None
        assert instance_name(ref.uid) not in _domains(provider, "h1")
    finally:
        provider.close()


@pytest.mark.parametrize("retire_runs", [True, False], ids=["retired-on-its-host", "host-unreachable-gc"])
def test_a_domain_without_a_recorded_id_on_another_host_is_retired_on_its_own_queue(
        rig, second_daemon, image, kube_client, redis_client, retire_runs):
    """Decision 16: a delete with no recorded provider ID looks on the spec's host itself (work
    for host H runs on H's queue) and hands the name on every other host to ``instance.retire``
    for that host's queue, without waiting for it.  When h2's worker runs it, the domain is
    deleted (it carries this Proxy's UID); when h2 never answers, GC deletes the domain as an
    orphan (its Proxy UID is gone) once it is older than the grace period (grace 0 here)."""
    from app.proxy.reconcile import retire_instance

    _, url, sha, _ = image()
    key = "elsewhere-" + uuid.uuid4().hex[:8]
    h2 = rig.host("h2", libvirtSocket=str(second_daemon.socket))
    retired: list = []
    ctx = _ctx(kube_client, redis_client, rig.entry(hosts=[rig.host("h1"), h2],
                                                    images={key: {"url": url, "sha256": sha}}), retired)
    provider = ctx.registry.unwrapped["kvm-test"]
    try:
        ref = _apply(kube_client, "kvm-noid-2", {"provider": "kvm-test",
                                                    "placement": {"zone": "h1", "image": key, "machineType": "small"}})
        name, gateway = instance_name(ref.uid), KubernetesGateway(kube_client)
        gateway.add_finalizer(gateway.get_proxy(NS, "kvm-noid-2"))
        provider.create(CreateRequest(name=name, tags=tags_for(ref.uid), namespace=NS, zone="h2", image=key,
                                      machine_type="small"))
        assert name in _domains(provider, "h2") and name not in _domains(provider, "h1")
        k8s.CustomObjectsApi(kube_client).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "kvm-noid-2")
        _release(ctx, ref)                                # looked on h1 itself: nothing there, released
        assert gateway.get_proxy(NS, "kvm-noid-2") is None
        assert retired == [("kvm-test", f"hosts/h2/domains/{name}")]   # h2's name, for h2's queue
        assert name in _domains(provider, "h2")           # the h1 step never touched h2 itself
        if retire_runs:                                   # what h2's worker runs for instance.retire
            assert retire_instance(ctx, "kvm-test", f"hosts/h2/domains/{name}", ref=ref) is True
        else:                                             # h2 never answered the retire: GC's
            assert f"hosts/h2/domains/{name}" in _gc(provider, kube_client, redis_client)
        assert name not in _domains(provider, "h1") + _domains(provider, "h2")
    finally:
        provider.close()


# -- where a sharded GC sends its deletions -------------------------------------------------------------
def test_gc_collect_shard_sends_each_deletion_to_the_queue_of_the_host_it_found_it_on(
        rig, image, tmp_path, kube, kubeconfig, redis_url):
    """The ``gc.collect_shard`` task itself (a process configured as a worker is, the test's
    Redis as the broker) lists host h1 on real libvirt and queues ``gc.delete`` of the orphan
    domain it finds on ``kvm.<provider>.h1``."""
    import yaml

    from tests.test_task_queues import run_task

    _, url, sha, _ = image()
    key = "gcq-" + uuid.uuid4().hex[:8]
    entry = rig.entry(name="kvm-gcq", hosts=[rig.host("h1")], images={key: {"url": url, "sha256": sha}})
    providers = tmp_path / "providers.yaml"
    providers.write_text(yaml.safe_dump({"providers": [{**entry, "checkInterval": 0}]}))
    provider = KvmProvider(harness.provider_config(entry))
    uid = str(uuid.uuid4())                               # no Proxy has it: an orphan
    orphan = f"hosts/h1/domains/{instance_name(uid)}"
    try:
        provider.create(CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace=NS, zone="h1",
                                      image=key, machine_type="small"))
        sent = run_task("gc_collect_shard", ["kvm-gcq", "h1", f"kvm-gcq:{uuid.uuid4().hex}", 1],
                        {"PROVIDERS_CONFIG": str(providers), "REDIS_URL": redis_url, "KUBECONFIG": kubeconfig,
                         "GC_GRACE": "0"})
        mine = [(task, queue, args) for task, queue, args, _ in sent if args and orphan in args]
        assert mine == [("gc.delete", "kvm.kvm-gcq.h1", ["kvm-gcq", orphan])]
        assert all(queue == "kvm.kvm-gcq.h1" for _, queue, _, _ in sent)
    finally:
        provider.delete(orphan)
        provider.close()
