"""Adversarial cases for issue 9 (lose nothing, leak nothing), in-process with real parts.

Each test plays a hostile interleaving against the reconcile steps and GC: the Kubernetes API
fake (with its delay/fault hooks), real Redis, and the real kubernetes provider.  Tests that
pin a hole still open are ``xfail(strict=True)`` with the reason; the others are regression
tests for holes fixed alongside them.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client as k8s

from app.proxy import gc as gc_logic
from app.config.providers import ProviderConfig
from app.kube.gateway import KubernetesGateway
from app.providers.kubernetes.config import DEFAULT_IMAGE
from app.providers.naming import instance_name
from app.proxy.reconcile import (
    CREATE,
    DELETE,
    POLL,
    Ref,
    create,
    decide,
    delete,
    poll,
)
from app.resources import FINALIZER, PLURAL
from tests.support import contexts
from tests.support.proxies import (
    Background,
    apply,
    kubectl_delete,
    patch_spec,
    pods,
    read,
)
from tests.support.waiting import wait_until

NS = "default"
IMAGES = ("example/squid:6", "example/squid:7")
pytestmark = pytest.mark.timeout(60)

#: These tests change ``spec.provider``, which the CRD makes immutable: they pin what reconcile
#: and GC do when ``status.provider`` and ``spec.provider`` differ anyway (defence in depth).
PROVIDER_CHANGE = pytest.mark.no_crd_admission("changes the immutable spec.provider on purpose")


def k8s_provider(name: str = "k8s-local", namespace: str = "") -> ProviderConfig:
    return contexts.k8s_provider(name, namespace=namespace, images=IMAGES)


@pytest.fixture()
def ctx(make_context):
    return make_context(k8s_provider())


def pod_images(api) -> list[tuple[str, str, str]]:
    return sorted((p.metadata.namespace, p.metadata.name, p.spec.containers[0].image) for p in pods(api))


def kubelet_runs_all(api) -> None:
    for pod in pods(api):
        if (pod.status.phase if pod.status else None) != "Running":
            k8s.CoreV1Api(api).patch_namespaced_pod_status(
                pod.metadata.name, pod.metadata.namespace, {"status": {"phase": "Running", "podIP": "10.1.2.3"}})


def settle(ctx, api, ref: Ref, limit: int = 30) -> None:
    """Drive the Proxy the way the task layer does until nothing is left to do.

    Each round runs what :func:`decide` answers for the object as it is now (the watcher's
    and ``changed_meanwhile``'s view), following a step's own followups; the kubelet runs
    every Pod between rounds.
    """
    steps = {CREATE: create, POLL: poll, DELETE: delete}
    for _ in range(limit):
        kubelet_runs_all(api)
        proxy = read(api, ref)
        if proxy is None or proxy.uid != ref.uid:
            return
        action = decide(proxy)
        if action is None:
            return
        followup = steps[action](ctx, ref, 0)
        while followup is not None:
            kubelet_runs_all(api)
            followup = steps[followup.action](ctx, ref, followup.attempt)
    raise AssertionError("the Proxy never settled")


def test_a_spec_change_that_lands_during_the_create_is_not_lost(fake, api, ctx):
    """The image is changed while the Pod create (old image) is in flight.

    The create used to record the *new* spec hash and generation for the Pod it made from the
    old spec, so decide() saw nothing to do and the change was lost for good.
    """
    ref = apply(api, "race-1", {"provider": "k8s-local", "placement": {"image": IMAGES[0]}})
    fake.delay_next("create", "pods", seconds=2)
    creating = Background(create, ctx, ref)
    wait_until(lambda: fake.request_count("create", "pods") == 1, 10, "Pod create sent")
    patch_spec(api, "race-1", {"placement": {"image": IMAGES[1]}})
    creating.join()
    proxy = read(api, ref)
    assert proxy.status.get("specHash") != proxy.spec_hash, "status claims the new spec for the old Pod"
    assert decide(proxy) == CREATE
    settle(ctx, api, ref)
    assert pod_images(api) == [(NS, instance_name(ref.uid), IMAGES[1])]
    assert read(api, ref).status["specHash"] == read(api, ref).spec_hash


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


# -- the write-ahead status patch refused ------------------------------------------------------------
@pytest.mark.parametrize("code", [409, 500])
def test_a_refused_write_ahead_creates_nothing_and_the_retry_creates_one(fake, api, ctx, code):
    ref = apply(api, f"wa-{code}", {"provider": "k8s-local"})
    create(ctx, ref, 0)
    # Pending was written by the first pass only if it went through; start clean each time.
    assert len(pods(api)) == 1
    # Now the same with the write-ahead refused: a second Proxy.
    ref2 = apply(api, f"wa2-{code}", {"provider": "k8s-local"})
    KubernetesGateway(api).add_finalizer(read(api, ref2))
    proxy = read(api, ref2)
    KubernetesGateway(api).patch_status(proxy, {"phase": "Pending"})   # so the next status write is the write-ahead
    fake.fail_next("patch", f"{PLURAL}/status", code=code, reason="Conflict" if code == 409 else "InternalError")
    followup = create(ctx, ref2, 0)
    assert followup is not None and followup.action == CREATE
    assert [p for p in pods(api) if p.metadata.name == instance_name(ref2.uid)] == []
    create(ctx, ref2, followup.attempt)
    assert len([p for p in pods(api) if p.metadata.name == instance_name(ref2.uid)]) == 1
    assert len(pods(api)) == 2


# -- the same name, a new UID -----------------------------------------------------------------------
def test_deleted_and_recreated_with_the_same_name_during_the_create(fake, api, ctx):
    """The old object is deleted while its create is in flight and a new object of the same
    name is applied as soon as the old one is released: the old Pod goes, the new object gets
    its own Pod, nothing is shared.  The old object is released only once its Pod is found (the
    create may still make it); the create's check after the Pod create then finds it
    terminating, gone, or already replaced by the new object (it deletes its Pod), as the race
    falls."""
    old = apply(api, "same-1", {"provider": "k8s-local"})
    fake.delay_next("create", "pods", seconds=2)
    creating = Background(create, ctx, old)
    wait_until(lambda: fake.request_count("create", "pods") == 1, 10, "Pod create sent")
    kubectl_delete(api, old)
    followup = delete(ctx, old)                        # no Pod yet: kept while the create may make it
    assert followup is not None and followup.action == DELETE
    while followup is not None:
        time.sleep(followup.delay)
        followup = delete(ctx, old, followup.attempt)
    assert read(api, old) is None
    new = apply(api, "same-1", {"provider": "k8s-local"})
    assert new.uid != old.uid
    creating.join()
    settle(ctx, api, new)
    assert [p.metadata.name for p in pods(api)] == [instance_name(new.uid)]


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


# -- a delete beside a create (the per-Proxy lock lost) --------------------------------------------
def test_a_create_whose_re_read_fails_after_the_delete_leaks_nothing(fake, api, ctx):
    """The per-Proxy lock is lost (a Redis flush), so the delete runs while the create's Pod
    create is in flight; the create's check after the Pod create then fails (API 500) and its
    retry never runs (the worker died).  The delete used to find no Pod, release the finalizer
    at once and leave the Pod to GC (~20 min).  Now the write-ahead's ``createStartedAt`` keeps
    the finalizer while the create may still make the Pod: the delete alone finds and deletes it."""
    ref = apply(api, "reread-1", {"provider": "k8s-local"})
    fake.delay_next("create", "pods", seconds=2)
    creating = Background(create, ctx, ref)
    wait_until(lambda: fake.request_count("create", "pods") == 1, 10, "Pod create sent")
    kubectl_delete(api, ref)
    followup = delete(ctx, ref)                        # nothing exists yet: kept, looks again
    assert followup is not None and followup.action == DELETE
    assert FINALIZER in read(api, ref).finalizers
    gets = fake.request_count("get", PLURAL)
    fake.fail_next("get", PLURAL, code=500)           # the create's re-read after the Pod create
    created = creating.join()
    assert fake.request_count("get", PLURAL) > gets
    assert created is not None and created.action == CREATE   # its retry: never run (the worker died)
    assert len(pods(api)) == 1                        # the Pod landed after the delete looked
    while followup is not None:                       # the task layer runs the delete's followups
        assert followup.action == DELETE
        time.sleep(followup.delay)
        followup = delete(ctx, ref, followup.attempt)
    assert read(api, ref) is None
    assert pods(api) == []


def test_a_delete_beside_a_create_that_never_makes_anything_releases_after_the_window(api, ctx):
    """A create stamped its write-ahead and died before its provider call (or the call failed):
    nothing ever appears.  The delete keeps the finalizer while a create may still be running,
    and releases once ``create_window`` (task_time_limit + 10 s) has passed since the stamp.
    The stamp is written back in time here: the state a create killed that long ago leaves."""
    from app.proxy.reconcile import create_window
    from app.timefmt import rfc3339

    ref = apply(api, "dead-create-1", {"provider": "k8s-local"})
    gateway = KubernetesGateway(api)
    proxy = gateway.add_finalizer(read(api, ref))
    name = instance_name(ref.uid)
    proxy = gateway.patch_status(proxy, {"phase": "Provisioning", "providerID": f"{NS}/{name}",
                                         "provider": "k8s-local", "instanceName": name,
                                         "createStartedAt": rfc3339(time.time() - 5, millis=True)})
    kubectl_delete(api, ref)
    followup = delete(ctx, ref)
    assert followup is not None and followup.action == DELETE and 0 < followup.delay <= 1
    proxy = read(api, ref)
    assert FINALIZER in proxy.finalizers and proxy.phase == "Terminating"
    waiting = [c for c in proxy.status["conditions"] if c.get("reason") == "WaitingForCreate"]
    assert waiting and name in waiting[0]["message"]
    window = create_window(ctx.settings)
    assert window == ctx.settings.task_time_limit + 10
    gateway.patch_status(proxy, {"createStartedAt": rfc3339(time.time() - window - 1, millis=True)})
    assert delete(ctx, ref, followup.attempt) is None   # no create can still be running: released
    assert read(api, ref) is None and pods(api) == []


def test_deleting_a_proxy_whose_create_failed_for_good_is_not_held_for_the_window(api, ctx):
    """The provider refused the create (an image the config does not allow: SpecNotAllowed,
    Permanent): its call is over and made nothing, so the Failed Proxy's delete releases at once
    instead of waiting ``create_window`` (160 s by default) for an instance that cannot come."""
    ref = apply(api, "refused-1", {"provider": "k8s-local", "placement": {"image": "example/not-allowed:1"}})
    assert create(ctx, ref) is None
    assert read(api, ref).phase == "Failed"
    kubectl_delete(api, ref)
    assert delete(ctx, ref) is None
    assert read(api, ref) is None and pods(api) == []


def test_deleting_a_proxy_whose_create_waits_for_its_cloud_init_secret_is_not_held(api, ctx):
    """The create stops before any provider call (the cloud-init Secret is missing: Transient,
    retried): nothing can be in flight, so a delete meanwhile releases at once."""
    ref = apply(api, "no-secret-1", {"provider": "k8s-local",
                                     "cloudInit": {"secretRef": {"name": "missing", "key": "user-data"}}})
    followup = create(ctx, ref)
    assert followup is not None and followup.action == CREATE
    assert read(api, ref).phase == "Pending" and pods(api) == []
    kubectl_delete(api, ref)
    assert delete(ctx, ref) is None
    assert read(api, ref) is None


def _stamped_and_deleted(api, ref, stamp: str):
    """The Proxy as a create's write-ahead leaves it, but with ``stamp`` as createStartedAt (a
    worker's clock far ahead, or a user with status access), then deleted."""
    gateway = KubernetesGateway(api)
    proxy = gateway.add_finalizer(read(api, ref))
    name = instance_name(ref.uid)
    gateway.patch_status(proxy, {"phase": "Provisioning", "providerID": f"{NS}/{name}", "provider": "k8s-local",
                                 "instanceName": name, "createStartedAt": stamp})
    kubectl_delete(api, ref)


def test_a_create_stamp_from_the_future_holds_a_delete_no_longer_than_the_window_after_the_deletion(
        api, make_context):
    """``createStartedAt`` in the future (a worker clock ahead, or written by hand) was counted
    as a full ``create_window`` from now on every pass: the delete waited forever.  After the
    deletion no create can pass its write-ahead, so no instance can come later than
    ``deletionTimestamp`` (the API server's clock) + the window: the delete releases then."""
    import dataclasses

    from app.proxy.reconcile import create_window

    ctx = make_context(k8s_provider(), settings=dataclasses.replace(contexts.QUICK, task_time_limit=1.0))
    window = create_window(ctx.settings)  # 11 s
    ref = apply(api, "future-1", {"provider": "k8s-local"})
    _stamped_and_deleted(api, ref, "2999-01-01T00:00:00.000Z")
    deleted_at = time.time()
    followup = delete(ctx, ref)
    assert followup is not None and followup.action == DELETE   # a create may still be running
    assert any(c.get("reason") == "WaitingForCreate" for c in read(api, ref).status["conditions"])
    while followup is not None:
        assert time.time() - deleted_at < window + 3, "the delete still waits for a create stamped in 2999"
        time.sleep(followup.delay)
        followup = delete(ctx, ref, followup.attempt)
    assert read(api, ref) is None and pods(api) == []


@pytest.mark.parametrize("stamp", ["0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59"])
def test_a_create_stamp_out_of_the_calendar_does_not_wedge_the_delete(api, ctx, stamp):
    """RFC 3339 stamps whose offset takes them past year 1 or 9999: parsing them raised
    OverflowError (not the documented ValueError), so every delete pass failed and retried
    for ever.  A stamp that does not parse counts as none: released at once."""
    ref = apply(api, "overflow-1", {"provider": "k8s-local"})
    _stamped_and_deleted(api, ref, stamp)
    assert delete(ctx, ref) is None
    assert read(api, ref) is None


# -- GC of one provider against the instances of another in the same place ---------------------------
def test_gc_of_one_kubernetes_provider_leaves_the_live_pods_of_another_alone(api, redis_client, make_context):
    """Two kubernetes providers on the one cluster (different namespaces): each one's GC lists
    every managed Pod cluster-wide.  A live Proxy of k8s-b named its Pod; k8s-a's sweep used to
    count it 'superseded' (its Proxy records another provider) and delete it after the grace."""
    ctx = make_context(k8s_provider("k8s-a", "ns-a"), k8s_provider("k8s-b", "ns-b"))
    ref = apply(api, "two-1", {"provider": "k8s-b"})
    settle(ctx, api, ref)
    assert read(api, ref).phase == "Running"
    for name in ("k8s-a", "k8s-b"):
        report = gc_logic.collect(name, ctx.registry.get(name), KubernetesGateway(api).list_proxies, abandoned=set(),
                                  grace_seconds=0, redis=redis_client)
        assert report.deleted == [], name
    assert [p.metadata.name for p in pods(api)] == [instance_name(ref.uid)]


def test_gc_of_one_gcp_provider_leaves_the_live_instances_of_another_in_the_same_project(api, redis_client, compute,
                                                                                           make_context):
    """Two gcp providers in one project (other zones): the aggregated listing of either shows
    every managed instance of the project; neither GC may take the other's live instance."""
    from app.providers.gcp.provider import GcpProvider
    from tests.gcp.conftest import gcp_config

    ctx = make_context(gcp_config(compute, "gcp-b", zones=["europe-west1-b"]),
                       gcp_config(compute, "gcp-c", zones=["europe-west1-c"]), factories={"gcp": GcpProvider})
    ref = apply(api, "two-gce", {"provider": "gcp-c", "placement": {"zone": "europe-west1-c"}})
    create(ctx, ref)
    assert len(compute.instances) == 1
    for name in ("gcp-b", "gcp-c"):
        report = gc_logic.collect(name, ctx.registry.get(name), KubernetesGateway(api).list_proxies, abandoned=set(),
                                  grace_seconds=0, redis=redis_client)
        assert report.deleted == [], name
    assert len(compute.instances) == 1


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
