"""A Proxy deleted while its instance is being created: nothing leaks (kubernetes and gcp).

The reconcile steps run in-process against the Kubernetes API fake and, for gcp, the real
Compute client against the Compute fake.  The create runs in a thread while the test deletes
the Proxy and runs the delete step, the way two workers would if the per-Proxy lock expired;
the sequential case (the delete waits for the create, as under the lock) is covered too.
Every test ends by counting instances: 0 leaked, 0 duplicated.  The kvm cases are in
tests/kvm/test_delete_during_create.py.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from app.kube.gateway import KubernetesGateway
from app.providers.naming import instance_name, tags_for
from app.providers.base import CreateRequest
from app.proxy.reconcile import DELETE, Ref, create, delete
from app.resources import FINALIZER, GROUP, PLURAL, VERSION
from tests.support.proxies import (
    Background,
    apply,
    kubectl_delete,
    pods,
    run_delete_until_released,
)
from tests.support.waiting import wait_until

NS = "default"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def k8s_ctx(make_context):
    return make_context()  # one k8s-local provider on the API fake, short delays


def proxy_exists(api, ref: Ref) -> bool:
    return KubernetesGateway(api).get_proxy(ref.namespace, ref.name) is not None


def recorded_id(api, ref: Ref) -> str | None:
    proxy = KubernetesGateway(api).get_proxy(ref.namespace, ref.name)
    return proxy.status.get("providerID") if proxy else None


def test_kubernetes_delete_while_pod_create_is_in_flight_leaks_nothing(fake, api, k8s_ctx):
    """The issue's case: the Pod create is slow and the Proxy is deleted meanwhile."""
    ref = apply(api, "slow-1", {"provider": "k8s-local"})
    fake.delay_next("create", "pods", seconds=3)
    creating = Background(create, k8s_ctx, ref)
    # The provider ID is recorded before the Pod create is even sent.
    wait_until(lambda: recorded_id(api, ref) == f"{NS}/{instance_name(ref.uid)}", 10, "provider ID recorded")
    wait_until(lambda: fake.request_count("create", "pods") == 1, 10, "Pod create sent")
    kubectl_delete(api, ref)
    # The Pod does not exist yet, but the create that stamped createStartedAt may still make it:
    # the finalizer is kept and the delete looks again ...
    followup = delete(k8s_ctx, ref)
    assert followup is not None and followup.action == DELETE
    proxy = KubernetesGateway(api).get_proxy(NS, "slow-1")
    assert FINALIZER in proxy.finalizers
    assert any(c.get("reason") == "WaitingForCreate" for c in proxy.status["conditions"])
    run_delete_until_released(k8s_ctx, ref)       # ... until the Pod the create made is found and deleted
    assert not proxy_exists(api, ref)
    creating.join()                                # the create lands after the Proxy is gone ...
    assert pods(api) == []                         # ... and nothing is left


def test_kubernetes_delete_that_waits_for_the_create_finds_the_pod(fake, api, k8s_ctx):
    """Under the per-Proxy lock the delete runs after the create: the recorded ID finds the Pod."""
    ref = apply(api, "slow-2", {"provider": "k8s-local"})
    fake.delay_next("create", "pods", seconds=2)
    creating = Background(create, k8s_ctx, ref)
    wait_until(lambda: fake.request_count("create", "pods") == 1, 10, "Pod create sent")
    kubectl_delete(api, ref)                      # the create's object is now stale
    followup = creating.join()
    assert followup is not None and followup.action == DELETE
    assert len(pods(api)) == 1 and proxy_exists(api, ref)   # the finalizer holds it
    run_delete_until_released(k8s_ctx, ref)
    assert pods(api) == [] and not proxy_exists(api, ref)


def test_kubernetes_delete_without_a_recorded_id_finds_the_pod_by_name(api, k8s_ctx):
    """A Pod made by a create that never recorded anything (a crash) is found by its name."""
    ref = apply(api, "legacy-1", {"provider": "k8s-local"})
    KubernetesGateway(api).add_finalizer(KubernetesGateway(api).get_proxy(NS, "legacy-1"))
    provider = k8s_ctx.registry.get("k8s-local")
    provider.create(CreateRequest(name=instance_name(ref.uid), tags=tags_for(ref.uid), namespace=NS))
    assert recorded_id(api, ref) is None and len(pods(api)) == 1
    kubectl_delete(api, ref)
    run_delete_until_released(k8s_ctx, ref)
    assert pods(api) == [] and not proxy_exists(api, ref)


def test_kubernetes_finalizer_waits_until_the_pod_is_gone(fake, api, k8s_ctx):
    """A Pod whose deletion has not finished yet keeps the finalizer."""
    ref = apply(api, "stays-1", {"provider": "k8s-local"})
    create(k8s_ctx, ref)
    pod_name = instance_name(ref.uid)
    # Something else holds the Pod (as a kubelet does during graceful termination).
    k8s.CoreV1Api(api).patch_namespaced_pod(pod_name, NS, {"metadata": {"finalizers": ["example.com/hold"]}})
    kubectl_delete(api, ref)
    followup = delete(k8s_ctx, ref)
    assert followup is not None and followup.action == DELETE
    proxy = KubernetesGateway(api).get_proxy(NS, "stays-1")
    assert FINALIZER in proxy.finalizers
    assert any(c.get("reason") == "Deleting" for c in proxy.status["conditions"])
    k8s.CoreV1Api(api).patch_namespaced_pod(pod_name, NS, {"metadata": {"finalizers": None}})
    run_delete_until_released(k8s_ctx, ref)
    assert pods(api) == [] and not proxy_exists(api, ref)


def test_a_proxy_that_never_got_an_instance_is_released_even_with_an_unknown_provider(api, k8s_ctx):
    ref = apply(api, "nowhere-1", {"provider": "no-such-provider"})
    KubernetesGateway(api).add_finalizer(KubernetesGateway(api).get_proxy(NS, "nowhere-1"))
    kubectl_delete(api, ref)
    assert delete(k8s_ctx, ref) is None
    assert not proxy_exists(api, ref)


# -- gcp ------------------------------------------------------------------------------------------
@pytest.fixture()
def gcp_ctx(make_context, compute):
    from app.providers.gcp.provider import GcpProvider
    from tests.gcp.conftest import gcp_config

    return make_context(gcp_config(compute), factories={"gcp": GcpProvider})


def gcp_instances(compute) -> list:
    return list(compute.instances)


def test_gcp_delete_while_the_insert_operation_is_running_leaks_nothing(api, compute, gcp_ctx):
    ref = apply(api, "gce-1", {"provider": "gcp-test", "placement": {"zone": "europe-west1-b"}})
    # The insert is accepted at once; waiting on its operation takes 3 s.
    compute.fail("POST", r"/zones/[^/]+/operations/[^/]+/wait$", 0, delay=3)
    creating = Background(create, gcp_ctx, ref)
    wait_until(lambda: len(compute.calls("POST", r"/zones/europe-west1-b/instances$")) == 1, 15, "insert sent")
    wait_until(lambda: len(compute.calls("POST", r"/zones/[^/]+/operations/[^/]+/wait$")) == 1, 15, "operation wait sent")
    assert recorded_id(api, ref).endswith(f"/zones/europe-west1-b/instances/{instance_name(ref.uid)}")
    kubectl_delete(api, ref)
    run_delete_until_released(gcp_ctx, ref)   # deletes the instance the insert is still creating
    assert not proxy_exists(api, ref)
    try:
        creating.join()
    except Exception:  # noqa: BLE001 - the create may report the instance it lost; it must not leak it
        pass
    assert gcp_instances(compute) == []


def test_gcp_delete_without_a_recorded_id_looks_in_every_zone(api, compute, gcp_ctx):
    """An instance left in a zone the spec no longer names is found by its name."""
    ref = apply(api, "gce-2", {"provider": "gcp-test", "placement": {"zone": "europe-west1-b"}})
    KubernetesGateway(api).add_finalizer(KubernetesGateway(api).get_proxy(NS, "gce-2"))
    provider = gcp_ctx.registry.get("gcp-test")
    provider.create(CreateRequest(name=instance_name(ref.uid), tags=tags_for(ref.uid), namespace=NS,
                                  zone="europe-west1-c"))
    assert len(gcp_instances(compute)) == 1
    kubectl_delete(api, ref)
    run_delete_until_released(gcp_ctx, ref)
    assert gcp_instances(compute) == [] and not proxy_exists(api, ref)


# -- replaced instances ---------------------------------------------------------------------------
def test_a_retired_instance_is_deleted_unless_its_proxy_names_it_again(api, k8s_ctx):
    from app.proxy.reconcile import retire_instance

    ref = apply(api, "moved-1", {"provider": "k8s-local"})
    create(k8s_ctx, ref)
    pod_id = recorded_id(api, ref)
    # The Proxy still names the Pod (moved back before the retire ran): kept.
    assert retire_instance(k8s_ctx, "k8s-local", pod_id, ref=ref) is False
    assert len(pods(api)) == 1
    proxy = KubernetesGateway(api).get_proxy(NS, "moved-1")
    KubernetesGateway(api).patch_status(proxy, {"providerID": "other-ns/" + instance_name(ref.uid)})
    assert retire_instance(k8s_ctx, "k8s-local", pod_id, ref=ref) is True
    assert pods(api) == []


def test_gcp_zone_change_creates_in_the_new_zone_and_gc_leaves_exactly_one(api, compute, redis_client, make_context):
    """The zone changes while the old zone is failing: the new instance is created without it,
    the old one is handed to retire (which fails while the zone is down), and once the zone is
    back GC's real pass (gc.collect, grace 0) deletes the superseded instance: one is left."""
    from app.proxy import gc as gc_logic
    from app.errors import ProviderError
    from app.proxy.reconcile import retire_instance
    from app.providers.gcp.provider import GcpProvider
    from tests.gcp.conftest import gcp_config

    retired: list = []
    ctx = make_context(gcp_config(compute), factories={"gcp": GcpProvider},
                       retire=lambda name, pid, ref: retired.append((name, pid)))
    ref = apply(api, "gce-move", {"provider": "gcp-test", "placement": {"zone": "europe-west1-b"}})
    create(ctx, ref)
    old_id = recorded_id(api, ref)
    # Zone b is in trouble: every call there fails.  The move must not need it.
    compute.fail("DELETE", r"/zones/europe-west1-b/", 503, times=100)
    compute.fail("GET", r"/zones/europe-west1-b/", 503, times=100)
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "gce-move", {"spec": {"placement": {"zone": "europe-west1-c"}}})
    create(ctx, ref)
    new_id = recorded_id(api, ref)
    assert "/zones/europe-west1-c/" in new_id and retired == [("gcp-test", old_id)]
    assert sorted(zone for _, zone, _ in compute.instances) == ["europe-west1-b", "europe-west1-c"]
    assert compute.calls("DELETE") == []
    # The retire task runs (on the proxies queue) while zone b is still down: it fails, and is
    # retried until it gives up; GC is what collects the instance then.
    with pytest.raises(ProviderError):
        retire_instance(ctx, "gcp-test", old_id, ref=ref)
    compute.faults.clear()                                  # zone b is back
    report = gc_logic.collect("gcp-test", ctx.registry.get("gcp-test"), KubernetesGateway(api).list_proxy_refs,
                              abandoned=set(), grace_seconds=0, redis=redis_client)
    assert report.deleted == [old_id] and not report.skipped_partial
    assert [zone for _, zone, _ in compute.instances] == ["europe-west1-c"]
    assert recorded_id(api, ref) == new_id
    # Another pass finds nothing more to do: the current instance stays.
    report = gc_logic.collect("gcp-test", ctx.registry.get("gcp-test"), KubernetesGateway(api).list_proxy_refs,
                              abandoned=set(), grace_seconds=0, redis=redis_client)
    assert report.deleted == [] and len(compute.instances) == 1
