"""A create in flight while the Proxy changes under it, in-process with real parts.

The reconcile steps against the Kubernetes API fake (its delay and fault hooks), real Redis and
the real kubernetes provider: a spec change, a refused write-ahead status patch, and a delete
and re-create of the same name, each landing while a Pod create is on its way.
"""

from __future__ import annotations

import time

import pytest

from app.kube.gateway import KubernetesGateway
from app.providers.naming import instance_name
from app.proxy.reconcile import CREATE, DELETE, create, decide, delete
from app.resources import PLURAL
from tests.support.proxies import (
    IMAGES,
    NS,
    Background,
    apply,
    kubectl_delete,
    patch_spec,
    pod_images,
    pods,
    read,
    settle,
)
from tests.support.proxies import k8s_provider_with_images as k8s_provider
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def ctx(make_context):
    return make_context(k8s_provider())


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
