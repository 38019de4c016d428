"""GC of one provider beside another provider's live instances in the same cluster or project.

In-process with real parts: the Kubernetes API fake, the Compute fake, real Redis and the real
kubernetes and gcp providers.  Superseded is judged by provider ID alone (decision 17).
"""

from __future__ import annotations

import pytest

from app.kube.gateway import KubernetesGateway
from app.providers.naming import instance_name
from app.proxy import gc as gc_logic
from app.proxy.reconcile import create
from tests.support.proxies import (
    apply,
    pods,
    read,
    settle,
)
from tests.support.proxies import k8s_provider_with_images as k8s_provider

pytestmark = pytest.mark.timeout(60)


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
