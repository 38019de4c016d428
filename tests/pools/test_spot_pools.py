"""Spot capacity in ProxyPools: ``spec.onDemandReplicas`` mixes on-demand and spot members, and
the pool counts its members' interruptions (their ``status.interruptions``, written by the
reconciler's poll when the cloud reclaimed an instance: tests/aws/test_spot.py)."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from app.kube.gateway import KubernetesGateway
from app.pools import controller
from app.pools.controller import PoolRef
from app.resources import GROUP, PLURAL, POOL_PLURAL, VERSION
from devcluster.cluster import FakeCluster
from tests.support.contexts import k8s_provider

pytestmark = pytest.mark.timeout(60)
NS = "crawl"


@pytest.fixture()
def api():
    with FakeCluster(kubelet=False) as c:
        client = c.fake.api_client()
        yield client
        client.close()


def test_the_pool_status_sums_its_members_interruptions(api, redis_client):
    custom = k8s.CustomObjectsApi(api)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": "spot", "namespace": NS},
            "spec": {"replicas": 3, "template": {"metadata": {"labels": {"app": "spot"}},
                                                 "spec": {"provider": "k8s-local"}}}}
    obj = custom.create_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, body)
    ref = PoolRef(NS, "spot", obj["metadata"]["uid"])
    gw = KubernetesGateway(api)
    configs = {"k8s-local": k8s_provider("k8s-local")}
    controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30)
    pool = custom.get_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "spot")
    assert "interruptions" not in pool["status"]  # none yet: nothing written
    a, b, _ = gw.list_proxies_in(NS)
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, a.name, {"status": {"interruptions": 2}})
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, b.name, {"status": {"interruptions": 1}})
    controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30)
    pool = custom.get_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "spot")
    assert pool["status"]["interruptions"] == 3


def test_on_demand_replicas_keeps_n_on_demand_and_makes_the_rest_spot(api, redis_client):
    custom = k8s.CustomObjectsApi(api)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": "mix", "namespace": NS},
            "spec": {"replicas": 5, "onDemandReplicas": 2,
                     "template": {"metadata": {"labels": {"app": "mix"}}, "spec": {"provider": "k8s-local"}}}}
    obj = custom.create_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, body)
    ref = PoolRef(NS, "mix", obj["metadata"]["uid"])
    gw = KubernetesGateway(api)
    configs = {"k8s-local": k8s_provider("k8s-local")}
    controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30)
    members = gw.list_proxies_in(NS)
    assert sorted(m.spec.capacity for m in members) == ["OnDemand", "OnDemand", "Spot", "Spot", "Spot"]
    # An on-demand member lost: its replacement is on demand again.
    gone = next(m for m in members if m.spec.capacity == "OnDemand")
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, gone.name)
    controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30)
    assert sorted(m.spec.capacity for m in gw.list_proxies_in(NS)) == ["OnDemand", "OnDemand", "Spot", "Spot", "Spot"]
