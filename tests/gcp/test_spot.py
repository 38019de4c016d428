"""GCE spot VMs against the Compute fake: the insert's ``scheduling``, a preemption the poll
replaces as interrupted (not started again, as a stopped on-demand VM is)."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from app.config.settings import Settings
from app.kube.gateway import KubernetesGateway
from app.providers.base import INTERRUPTED, CreateRequest, InstanceState
from app.providers.naming import instance_name, tags_for
from app.proxy.reconcile import CREATE, Ref, create, poll
from app.resources import CAPACITY_SPOT, GROUP, PLURAL, VERSION
from tests.gcp.conftest import PROJECT, gcp_config

ZONE = "europe-west1-b"
NS = "default"


def test_spot_insert_carries_scheduling_and_a_preemption_is_interrupted(fake, provider):
    uid = "0f000000-0000-4000-8000-000000000001"
    inst = provider.create(CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace=NS, zone=ZONE,
                                         capacity=CAPACITY_SPOT))
    [insert] = fake.calls("POST", rf"/zones/{ZONE}/instances$")
    assert insert.body["scheduling"] == {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                                         "automaticRestart": False, "onHostMaintenance": "TERMINATE"}
    fake.preempt(PROJECT, ZONE, inst.name)
    got = provider.get(inst.provider_id)
    assert got.state is InstanceState.TERMINATED and got.address is None
    assert got.note is not None and got.note.reason == INTERRUPTED


def test_on_demand_insert_has_no_spot_scheduling(fake, provider):
    uid = "0f000000-0000-4000-8000-000000000002"
    provider.create(CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace=NS, zone=ZONE))
    [insert] = fake.calls("POST", rf"/zones/{ZONE}/instances$")
    assert "provisioningModel" not in (insert.body.get("scheduling") or {})


@pytest.fixture()
def ctx(fake, make_context):
    from app.providers.gcp.provider import GcpProvider

    settings = Settings(poll_initial=5, poll_max=60, retry_initial=5, retry_max=300, quota_backoff=900)
    return make_context(gcp_config(fake), settings=settings, factories={"gcp": GcpProvider})


def test_poll_replaces_a_preempted_spot_vm(ctx, api, fake):
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "squid-spot", "namespace": NS},
            "spec": {"provider": "gcp-test", "placement": {"zone": ZONE, "capacity": "Spot"}}}
    obj = k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    ref = Ref(NS, "squid-spot", obj["metadata"]["uid"])
    assert create(ctx, ref) is None
    gw = KubernetesGateway(api)
    name = gw.get_proxy(NS, "squid-spot").status["instanceName"]

    fake.preempt(PROJECT, ZONE, name)
    followup = poll(ctx, ref)

    assert followup is not None and followup.action == CREATE
    assert not fake.calls("POST", r"/start$"), "a preempted spot VM is replaced, never started again"
    cond = next(c for c in gw.get_proxy(NS, "squid-spot").status["conditions"] if c["type"] == "Provisioned")
    assert cond["reason"] == INTERRUPTED and "preempted" in cond["message"]
    assert INTERRUPTED in [e.reason for e in k8s.CoreV1Api(api).list_namespaced_event(NS).items]
    fake.finish_preemptions()
    assert create(ctx, ref) is None
    assert gw.get_proxy(NS, "squid-spot").phase == "Running"
    assert len(fake.calls("POST", rf"/zones/{ZONE}/instances$")) == 2
