"""A delete running beside a create (the per-Proxy lock lost): nothing leaks, nothing wedges.

The write-ahead's ``status.createStartedAt`` keeps the finalizer while a create may still make
the instance (``app.proxy.reconcile.create_window``, decision 16); these pin what the delete does
with it, in-process against the Kubernetes API fake, real Redis and the real kubernetes provider.
"""

from __future__ import annotations

import time

import pytest

from app.kube.gateway import KubernetesGateway
from app.providers.naming import instance_name
from app.proxy.reconcile import CREATE, DELETE, create, delete
from app.resources import FINALIZER, PLURAL
from tests.support import contexts
from tests.support.proxies import (
    NS,
    Background,
    apply,
    kubectl_delete,
    pods,
    read,
)
from tests.support.proxies import k8s_provider_with_images as k8s_provider
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def ctx(make_context):
    return make_context(k8s_provider())


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
