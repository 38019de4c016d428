"""kvm: a Proxy deleted while its domain is being created, and a Proxy moved off a dead host.

Real libvirtd over real sshd (the session's rig), the Kubernetes API fake for the Proxy.  The
create is held in its image download (a slow image server) when the delete arrives, so the
domain is defined and started only after the delete step has already run.
"""

from __future__ import annotations

import time
import uuid

import pytest
from kubernetes import client as k8s

from app import gc
from app.config import ProvidersConfig
from app.kube import KubernetesGateway
from app.naming import instance_name
from app.providers.kvm.provider import KvmProvider
from app.providers.registry import build
from app.reconcile import DELETE, Context, Ref, create, delete
from app.resources import GROUP, PLURAL, VERSION
from app.settings import Settings
from tests.kvm import harness
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
    while followup is not None:
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


def test_moving_off_a_dead_host_creates_on_the_new_one_without_touching_the_old(
        rig, image, kube_client, redis_client):
    path, url, sha, _ = image()
    key = "move-" + uuid.uuid4().hex[:8]
    dead = harness.free_port()  # nothing listens there: h1 is down
    entry = rig.entry(hosts=[{**rig.host("h1"), "port": dead}, rig.host("h2")],
                      images={key: {"url": url, "sha256": sha}})
    retired: list = []
    ctx = _ctx(kube_client, redis_client, entry, retired)
    provider = ctx.registry.get("kvm-test")
    ref = _apply(kube_client, "kvm-move-1", {"provider": "kvm-test",
                                                "placement": {"zone": "h1", "image": key, "machineType": "small"}})
    proxy = KubernetesGateway(kube_client).add_finalizer(KubernetesGateway(kube_client).get_proxy(NS, "kvm-move-1"))
    old_id = f"hosts/h1/domains/{instance_name(ref.uid)}"
    # It ran on h1 before h1 died.
    KubernetesGateway(kube_client).patch_status(proxy, {"phase": "Ready", "providerID": old_id, "provider": "kvm-test",
                                           "specHash": proxy.spec_hash, "observedGeneration": proxy.generation})
    k8s.CustomObjectsApi(kube_client).patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "kvm-move-1", {"spec": {"placement": {"zone": "h2"}}})

    followup = create(ctx, ref)

    assert followup is not None and followup.action != DELETE
    status = KubernetesGateway(kube_client).get_proxy(NS, "kvm-move-1").status
    assert status["providerID"] == f"hosts/h2/domains/{instance_name(ref.uid)}"
    assert instance_name(ref.uid) in _domains(provider, "h2")
    # The old instance is handed to its own host's queue, not deleted from here.
    assert retired == [("kvm-test", old_id)]
    from app.wiring import router
    assert router(ctx.registry.configs.values()).queue_for_instance("kvm-test", old_id) == "kvm.kvm-test.h1"
    # h1 never comes back in time: GC collects the instance it left as superseded.
    proxies = KubernetesGateway(kube_client).list_proxies()
    live, current = gc.current_instances(proxies, "kvm-test")
    from datetime import datetime, timedelta, timezone

    from app.naming import tags_for
    from app.providers.base import Instance, InstanceState
    old = Instance(old_id, instance_name(ref.uid), InstanceState.RUNNING,
                   created=datetime.now(timezone.utc) - timedelta(hours=1), tags=tags_for(ref.uid), zone="h1")
    new = Instance(status["providerID"], instance_name(ref.uid), InstanceState.RUNNING,
                   created=datetime.now(timezone.utc) - timedelta(hours=1), tags=tags_for(ref.uid), zone="h2")
    assert gc.orphans([old, new], live_uids=live, abandoned=set(), now=datetime.now(timezone.utc), grace_seconds=600, current=current) == [old]
