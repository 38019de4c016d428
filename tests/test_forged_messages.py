"""Forged ``gc.delete`` and ``instance.retire`` messages (a Pod that got into Redis) take nothing live.

Both tasks re-read the instance and judge it by GC's rules whatever the message says
(docs/security.md).  In-process: the Kubernetes API fake, real Redis, the real kubernetes provider.
"""

from __future__ import annotations

import pytest

from app.kube.gateway import KubernetesGateway
from app.providers.naming import instance_name
from app.proxy import gc as gc_logic

pytestmark = pytest.mark.timeout(120)


def test_a_forged_gc_delete_cannot_take_a_live_proxys_pod(api, redis_client, make_context):
    """What the gc.delete task runs (app.proxy.gc.verify_and_delete) re-reads the instance and judges it
    by GC's rules: a live Proxy's current Pod is kept whatever the message says; a real orphan past
    the grace period is still collected."""
    from app.providers.base import CreateRequest
    from app.providers.naming import tags_for
    from tests.support.proxies import apply, pods, read, settle
    from tests.support.proxies import k8s_provider_with_images as k8s_provider

    ctx = make_context(k8s_provider())
    ref = apply(api, "live-1", {"provider": "k8s-local"})
    settle(ctx, api, ref)
    live = read(api, ref)
    assert live.phase == "Running"
    provider = ctx.registry.get("k8s-local")
    assert not gc_logic.verify_and_delete(provider, "k8s-local", live.status["providerID"], redis=redis_client,
                                          list_proxies=KubernetesGateway(api).list_proxies, grace_seconds=0)
    assert [x.metadata.name for x in pods(api)] == [instance_name(ref.uid)], "the live Proxy's Pod was deleted"
    # A Pod of a Proxy that no longer exists is an orphan: collected (grace 0).
    gone_uid = "00000000-0000-4000-8000-00000000dead"
    orphan = provider.create(CreateRequest(name=instance_name(gone_uid), tags=tags_for(gone_uid), namespace="default"))
    assert gc_logic.verify_and_delete(provider, "k8s-local", orphan.provider_id, redis=redis_client,
                                      list_proxies=KubernetesGateway(api).list_proxies, grace_seconds=0)
    assert [x.metadata.name for x in pods(api)] == [instance_name(ref.uid)]


def test_a_forged_retire_cannot_take_a_live_proxys_pod(api, make_context):
    """instance.retire's arguments come from Redis too: an instance whose Proxy-UID tag is not the
    message's, or that its Proxy names, is kept."""
    from app.proxy.reconcile import Ref, retire_instance
    from tests.support.proxies import apply, pods, read, settle
    from tests.support.proxies import k8s_provider_with_images as k8s_provider

    ctx = make_context(k8s_provider())
    ref = apply(api, "live-2", {"provider": "k8s-local"})
    settle(ctx, api, ref)
    pod_id = read(api, ref).status["providerID"]
    # Another Proxy's UID (and a name that does not exist) in the message.
    assert not retire_instance(ctx, "k8s-local", pod_id, ref=Ref("default", "nobody", "00000000-forged-uid"))
    # The right Proxy: its status still names the Pod, so the Pod is kept.
    assert not retire_instance(ctx, "k8s-local", pod_id, ref=Ref("default", "live-2", ref.uid))
    assert [x.metadata.name for x in pods(api)] == [instance_name(ref.uid)]
