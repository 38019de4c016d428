"""A Proxy moved between providers: the new instance, the old one's retire, GC and routing.

In-process with real parts (the Kubernetes API fake, real Redis, the real kubernetes and gcp
providers): a move while the create is in flight, a move back before the old place was cleaned
up, GC's superseded verdict against a move back, and where the delete of a moving Proxy runs.
"""

from __future__ import annotations

import pytest

from app.kube.gateway import KubernetesGateway
from app.providers.kubernetes.config import DEFAULT_IMAGE
from app.providers.naming import instance_name
from app.proxy import gc as gc_logic
from app.proxy.reconcile import CREATE, DELETE, create
from tests.support.proxies import (
    IMAGES,
    Background,
    apply,
    patch_spec,
    pod_images,
    pods,
    read,
    settle,
)
from tests.support.proxies import k8s_provider_with_images as k8s_provider
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

#: These tests change ``spec.provider``, which the CRD makes immutable: they pin what reconcile
#: and GC do when ``status.provider`` and ``spec.provider`` differ anyway (defence in depth).
PROVIDER_CHANGE = pytest.mark.no_crd_admission("changes the immutable spec.provider on purpose")


@PROVIDER_CHANGE
def test_a_provider_change_during_the_create_replaces_and_retires_the_old_pod(fake, api, redis_client, make_context):
    """spec.provider changes while the create for the old provider is in flight: the new
    provider gets its Pod, the old one is retired, nothing is left over."""
    ctx = make_context(k8s_provider("k8s-a", "ns-a"), k8s_provider("k8s-b", "ns-b"))
    ref = apply(api, "race-2", {"provider": "k8s-a"})
    fake.delay_next("create", "pods", seconds=2)
    creating = Background(create, ctx, ref)
    wait_until(lambda: fake.request_count("create", "pods") == 1, 10, "Pod create sent")
    patch_spec(api, "race-2", {"provider": "k8s-b"})
    creating.join()
    settle(ctx, api, ref)
    name = instance_name(ref.uid)
    assert pod_images(api) == [("ns-b", name, DEFAULT_IMAGE)]
    proxy = read(api, ref)
    assert proxy.status["provider"] == "k8s-b" and proxy.status["providerID"] == f"ns-b/{name}"


# -- a move back before the old place was cleaned up ----------------------------------------------------
@PROVIDER_CHANGE
def test_moving_back_with_a_changed_spec_does_not_adopt_the_stale_instance(api, redis_client, make_context):
    retired: list = []   # the retire tasks never run (the old place is unreachable)
    ctx = make_context(k8s_provider("k8s-a", "ns-a"), k8s_provider("k8s-b", "ns-b"),
               retire=lambda name, pid, ref: retired.append((name, pid)))
    ref = apply(api, "back-1", {"provider": "k8s-a", "placement": {"image": IMAGES[0]}})
    settle(ctx, api, ref)
    patch_spec(api, "back-1", {"provider": "k8s-b", "placement": {"image": IMAGES[0]}})
    settle(ctx, api, ref)
    patch_spec(api, "back-1", {"provider": "k8s-a", "placement": {"image": IMAGES[1]}})
    settle(ctx, api, ref)
    name = instance_name(ref.uid)
    current = read(api, ref).status["providerID"]
    assert current == f"ns-a/{name}"
    images = {f"{ns}/{n}": image for ns, n, image in pod_images(api)}
    assert images[current] == IMAGES[1], "the Proxy names a Pod built from an older spec"


# -- GC against a move back ------------------------------------------------------------------------------
@PROVIDER_CHANGE
def test_gc_does_not_delete_an_instance_its_proxy_names_again(api, redis_client, make_context):
    """GC decides 'superseded' from one Proxy listing and deletes later (gc.collect: after the
    listing; sharded sweeps: a gc.delete queued on the host queue, possibly behind the create).
    A Proxy moved back in between names the instance again (the create adopted it); GC used
    to delete it by ID anyway (Ready -> InstanceLost -> rebuilt).  Now the superseded verdict
    is re-checked under the per-Proxy lock (app.proxy.gc.delete_superseded)."""
    retired: list = []
    ctx = make_context(k8s_provider("k8s-a", "ns-a"), k8s_provider("k8s-b", "ns-b"),
               retire=lambda name, pid, ref: retired.append((name, pid)))
    ref = apply(api, "gcback-1", {"provider": "k8s-a"})
    settle(ctx, api, ref)
    patch_spec(api, "gcback-1", {"provider": "k8s-b"})
    settle(ctx, api, ref)
    name = instance_name(ref.uid)
    assert sorted(ns for ns, _, _ in pod_images(api)) == ["ns-a", "ns-b"]   # ns-a's retire never ran

    provider_a = ctx.registry.get("k8s-a")
    kube = KubernetesGateway(api)

    calls = []

    def list_proxies_then_move_back():
        listed = list(kube.list_proxies())       # GC's view: the Proxy names ns-b's Pod
        if not calls:
            patch_spec(api, "gcback-1", {"provider": "k8s-a"})
            settle(ctx, api, ref)                # the move back adopts ns-a's Pod (no rebuild)
        calls.append(1)
        return listed

    report = gc_logic.collect("k8s-a", provider_a, list_proxies_then_move_back, abandoned=set(), grace_seconds=0,
                              redis=redis_client)
    assert report.deleted == []
    assert read(api, ref).status["providerID"] == f"ns-a/{name}"
    assert f"ns-a/{name}" in {f"{ns}/{n}" for ns, n, _ in pod_images(api)}, "GC deleted the live instance"
    # ... while one that stays superseded is still collected: move away again, its retire lost.
    patch_spec(api, "gcback-1", {"provider": "k8s-b"})
    settle(ctx, api, ref)
    report = gc_logic.collect("k8s-a", provider_a, kube.list_proxies, abandoned=set(), grace_seconds=0, redis=redis_client)
    assert report.deleted == [f"ns-a/{name}"]
    assert [f"{ns}/{n}" for ns, n, _ in pod_images(api)] == [f"ns-b/{name}"]


@PROVIDER_CHANGE
def test_gc_leaves_a_superseded_instance_of_a_busy_proxy_for_the_next_sweep(api, redis_client, make_context):
    """A step holds the Proxy's lock (a create may be adopting the instance): GC keeps its hands off."""
    retired: list = []
    ctx = make_context(k8s_provider("k8s-a", "ns-a"), k8s_provider("k8s-b", "ns-b"),
               retire=lambda name, pid, ref: retired.append((name, pid)))
    ref = apply(api, "gcbusy-1", {"provider": "k8s-a"})
    settle(ctx, api, ref)
    patch_spec(api, "gcbusy-1", {"provider": "k8s-b"})
    settle(ctx, api, ref)
    lock = redis_client.lock(gc_logic.proxy_lock_key(ref.uid), timeout=30)
    assert lock.acquire()
    try:
        report = gc_logic.collect("k8s-a", ctx.registry.get("k8s-a"), KubernetesGateway(api).list_proxies, abandoned=set(),
                                  grace_seconds=0, redis=redis_client)
    finally:
        lock.release()
    assert report.deleted == [] and len(pods(api)) == 2


# -- routing: the delete of a Proxy moving to another provider ------------------------------------------
def test_a_delete_during_a_move_to_another_provider_runs_on_the_recorded_hosts_queue(tmp_path):
    """The Proxy moves from kvm host h1 to another provider; the create has not recorded the
    new instance yet (its write-ahead failed, or it is still queued) when the Proxy is
    deleted.  The delete removes the recorded domain on h1 (status.provider), so it must run
    on h1's queue; it used to be routed by spec.provider (no hosts: ``proxies``)."""
    from app.dispatch.proxies import Router
    from app.resources import Proxy
    from app.wiring import PROVIDER_TYPES
    from tests.test_routing import UID
    from tests.test_routing import _config as routing_config

    router = Router(routing_config(tmp_path), PROVIDER_TYPES)
    status = {"providerID": "hosts/h1/domains/proxy-abc", "provider": "lab", "phase": "Provisioning"}
    for new_provider in ("gcp-elsewhere", "lab-removed"):
        proxy = Proxy.from_dict({"metadata": {"namespace": "ns", "name": "p", "uid": UID, "generation": 3},
                                 "spec": {"provider": new_provider}, "status": status})
        assert router.queue_for_proxy(proxy, DELETE) == "kvm.lab.h1", new_provider
        assert router.queue_for_proxy(proxy, CREATE) == "proxies"
