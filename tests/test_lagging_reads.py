"""A cloud that does not show yet what it just created, and steps retried after part of their work.

Reconcile steps run in-process against the Kubernetes API fake (its ``fail_next`` hook answers
a Pod read 404 the way a lagging read would) and, for gcp, the real Compute client against the
Compute fake with ``read_lag`` (``instances.get`` answers 404 for a while after the insert).
The kvm case is in tests/kvm/test_lagging_reads.py.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client as k8s

from app import timefmt
from app.providers.naming import instance_name
from app.proxy.reconcile import CREATE, DELETE, POLL, create, create_window, delete, poll
from app.resources import FINALIZER, GROUP, PLURAL, VERSION
from tests.support.proxies import apply, kubectl_delete, kubelet_runs, pods, read

NS = "default"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def k8s_ctx(make_context):
    return make_context()


def reasons(api, uid: str) -> list[str]:
    return [e.reason for e in k8s.CoreV1Api(api).list_namespaced_event(NS).items if e.involved_object.uid == uid]


def provisioned(proxy) -> dict:
    return next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")


def age_create_stamp(api, ref, seconds: float) -> None:
    """Write ``status.createStartedAt`` ``seconds`` in the past (as if the create ran then)."""
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, ref.name,
        {"status": {"createStartedAt": timefmt.rfc3339(time.time() - seconds, millis=True)}})


# -- item: NotFound right after a create is "still provisioning" ------------------------------------
def test_kubernetes_pod_not_shown_yet_after_the_create_stays_provisioning(fake, api, k8s_ctx):
    ref = apply(api, "lag-1", {"provider": "k8s-local"})
    followup = create(k8s_ctx, ref)
    assert followup.action == POLL
    fake.fail_next("get", "pods", code=404, reason="NotFound", times=2)   # reads lag behind the create
    for _ in range(2):
        followup = poll(k8s_ctx, ref, followup.attempt)
        assert followup.action == POLL, followup          # not a create: nothing was lost
        proxy = read(api, ref)
        assert proxy.phase == "Provisioning" and proxy.status["providerID"] == f"{NS}/{instance_name(ref.uid)}"
        assert provisioned(proxy)["reason"] == "NotVisibleYet"
        assert "does not show it yet" in provisioned(proxy)["message"]
    kubelet_runs(api, instance_name(ref.uid), "10.1.2.30")
    assert poll(k8s_ctx, ref, followup.attempt) is None
    assert read(api, ref).phase == "Running"
    assert "InstanceLost" not in reasons(api, ref.uid)
    assert fake.request_count("create", "pods") == 1 and len(pods(api)) == 1


def test_kubernetes_pod_missing_after_the_window_is_lost(fake, api, k8s_ctx):
    ref = apply(api, "lag-2", {"provider": "k8s-local"})
    create(k8s_ctx, ref)
    age_create_stamp(api, ref, 3600)   # an hour: past any window
    fake.fail_next("get", "pods", code=404, reason="NotFound")
    followup = poll(k8s_ctx, ref)
    assert followup.action == CREATE
    assert provisioned(read(api, ref))["reason"] == "InstanceLost"
    assert "InstanceLost" in reasons(api, ref.uid)


@pytest.fixture()
def gcp_ctx(make_context, compute):
    from app.providers.gcp.provider import GcpProvider
    from tests.gcp.conftest import gcp_config

    return make_context(gcp_config(compute), factories={"gcp": GcpProvider})


def test_gcp_instance_not_shown_yet_after_the_insert_stays_provisioning(api, compute, gcp_ctx):
    compute.read_lag = 2.0
    ref = apply(api, "gce-lag-1", {"provider": "gcp-test", "placement": {"zone": "europe-west1-b"}})
    followup = create(gcp_ctx, ref)
    assert followup is not None and followup.action == POLL, followup   # the insert is done: provisioning
    assert compute.lagged_reads >= 1                                    # its own read got the 404
    followup = poll(gcp_ctx, ref, followup.attempt)
    assert followup.action == POLL
    proxy = read(api, ref)
    assert proxy.phase == "Provisioning" and provisioned(proxy)["reason"] == "NotVisibleYet"
    deadline = time.monotonic() + 20
    while followup is not None and time.monotonic() < deadline:
        assert followup.action == POLL, followup
        time.sleep(followup.delay)
        followup = poll(gcp_ctx, ref, followup.attempt)
    assert read(api, ref).phase == "Running"
    assert "InstanceLost" not in reasons(api, ref.uid)
    assert len(compute.calls("POST", r"/zones/[^/]+/instances$")) == 1 and len(compute.instances) == 1


# -- item: a retried step knows what its first attempt did ------------------------------------------
def test_a_delete_retried_after_a_409_on_the_finalizer_releases_at_once(fake, api, k8s_ctx):
    """The instance was deleted, then releasing the finalizer met a 409: the retry finds no
    instance and must not wait out the create window for a create that is long done."""
    ref = apply(api, "del-409", {"provider": "k8s-local"})
    create(k8s_ctx, ref)
    assert create_window(k8s_ctx.settings) > 60
    kubectl_delete(api, ref)
    fake.fail_next("patch", PLURAL, code=409, reason="Conflict")       # the finalizer removal
    followup = delete(k8s_ctx, ref)
    assert followup is not None and followup.action == DELETE
    assert pods(api) == [] and FINALIZER in read(api, ref).finalizers
    assert delete(k8s_ctx, ref, followup.attempt) is None              # released, not WaitingForCreate
    assert read(api, ref) is None


def test_a_poll_retried_after_deleting_an_ended_pod_recreates_at_once(fake, api, k8s_ctx):
    """The poll deleted an ended Pod, then its InstanceLost write met a 409: the retry finds no
    Pod, and must not take it for one not shown yet (the poll had seen it)."""
    ref = apply(api, "ended-409", {"provider": "k8s-local"})
    create(k8s_ctx, ref)
    assert poll(k8s_ctx, ref).action == POLL                       # seen, still pending
    k8s.CoreV1Api(api).patch_namespaced_pod_status(instance_name(ref.uid), NS, {"status": {"phase": "Failed"}})
    # the poll's first status write records that it saw the Pod; its second (InstanceLost) meets a 409
    fake.fail_next("patch", f"{PLURAL}/status", code=409, reason="Conflict", after=1)
    followup = poll(k8s_ctx, ref)
    assert followup.action == POLL and pods(api) == []             # deleted, not recorded yet
    followup = poll(k8s_ctx, ref, followup.attempt)
    assert followup.action == CREATE
    assert provisioned(read(api, ref))["reason"] == "InstanceLost"
