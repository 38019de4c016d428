"""Faults around ``instance.retire`` messages and the rotation marker, with real parts.

Reconcile steps in-process against the Kubernetes API fake, the real Compute client against the
Compute fake (two gcp providers, ``gcp-a`` and ``gcp-b``, in one project, as GC's docs allow)
and real Redis.  Each test names the fault it tries; those that found a hole pin its fix.
"""

from __future__ import annotations

import threading

import pytest
from kubernetes import client as k8s

from app.kube import credentials
from app.kube.gateway import KubernetesGateway
from app.errors import NotFound
from app.proxy.reconcile import CREATE, ROTATED_SPEC_HASH, Ref, create, delete, poll, retire_instance
from app.config.settings import Settings
from app.wiring import parse_config as parse
from tests.gcp.conftest import PROJECT, ZONES
from tests.support.proxies import NS, apply, kubectl_delete, patch_spec, read, rotate_credentials

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def ctx(make_context, compute):
    from app.providers.gcp.provider import GcpProvider

    def entry(name: str) -> dict:
        return {"name": name, "type": "gcp", "squid": {"basicAuth": True},
                "gcp": {"project": PROJECT, "zones": list(ZONES), "apiEndpoint": compute.url,
                        "anonymous": True, "requestTimeout": "5s", "operationTimeout": "10s"}}

    cfg = parse({"providers": [entry("gcp-a"), entry("gcp-b")]}, "providers-test.yaml")
    return make_context(*cfg.providers, factories={"gcp": GcpProvider},
                        settings=Settings(poll_initial=0.2, poll_max=1, retry_initial=0.2, retry_max=1))


def _settle(ctx, ref, first) -> None:
    steps = {"create": create, "poll": poll, "delete": delete}
    followup = first
    while followup is not None:
        followup = steps[followup.action](ctx, ref, followup.attempt)


def _running(kube_client, ctx, name: str, zone: str = ZONES[0]) -> tuple[Ref, str]:
    """A Running gcp-a Proxy ``name`` in ``zone``; return its ref and provider ID."""
    ref = apply(kube_client, name, {"provider": "gcp-a", "placement": {"zone": zone}})
    _settle(ctx, ref, create(ctx, ref))
    proxy = read(kube_client, ref)
    assert proxy.phase == "Running"
    return ref, proxy.status["providerID"]


def _exists(ctx, provider_id: str) -> bool:
    try:
        ctx.registry.get("gcp-a").get(provider_id)
    except NotFound:
        return False
    return True


def _rotate(kube_client, ref) -> str:
    """The user rotates the Proxy's basic-auth Secret; return the new htpasswd line."""
    return rotate_credentials(kube_client, credentials.secret_name(read(kube_client, ref)))


def _replacing(kube_client, name: str) -> list[str]:
    return [e.message for e in k8s.CoreV1Api(kube_client).list_namespaced_event(NS).items
            if e.reason == "Replacing" and e.involved_object.name == name]


# -- hostile or stale instance.retire messages --------------------------------------------------
def test_a_retire_naming_another_provider_of_the_same_project_keeps_the_live_instance(kube_client, ctx):
    """Hostile message (anyone who can write to Redis): the live instance's own ID and Proxy
    UID, but the *other* provider's name.  Both providers reach the instance (one project; a
    gcp ID names its project), and the Proxy's status names it: it is current and must stay.
    Was: retire_instance also compared status.provider with the message's provider name and
    deleted the live instance (GC compares by provider ID alone for this very reason)."""
    ref, live = _running(kube_client, ctx, "bk5-live")
    assert retire_instance(ctx, "gcp-b", live, ref=ref) is False
    assert _exists(ctx, live)
    assert retire_instance(ctx, "gcp-a", live, ref=ref) is False  # its own provider: kept too
    assert _exists(ctx, live)


def test_a_retire_for_a_name_recreated_with_a_new_uid_deletes_only_the_old_uids_instance(kube_client, ctx):
    """A retire of the old object's instance runs after the Proxy of that name was deleted
    (finalizer forced off, instance left) and created again (new UID, new instance)."""
    old_ref, old_id = _running(kube_client, ctx, "bk5-reborn")
    gateway = KubernetesGateway(kube_client)
    kubectl_delete(kube_client, old_ref)
    gateway.remove_finalizer(gateway.get_proxy(NS, "bk5-reborn"))     # forced: the instance is left
    new_ref, new_id = _running(kube_client, ctx, "bk5-reborn", zone=ZONES[1])
    assert new_ref.uid != old_ref.uid and new_id != old_id

    # hostile mixes first: the new UID's live instance under the old UID, and under its own UID
    assert retire_instance(ctx, "gcp-a", new_id, ref=old_ref) is False   # tags say another UID
    assert retire_instance(ctx, "gcp-a", new_id, ref=new_ref) is False   # its status names it
    assert retire_instance(ctx, "gcp-a", old_id, ref=new_ref) is False   # tags say the old UID
    assert _exists(ctx, new_id) and _exists(ctx, old_id)
    # the genuine message: the old UID's instance goes, the new Proxy keeps serving
    assert retire_instance(ctx, "gcp-a", old_id, ref=old_ref) is True
    assert not _exists(ctx, old_id) and _exists(ctx, new_id)
    assert read(kube_client, new_ref).phase == "Running"


def test_the_same_retire_run_twice_at_once_deletes_once_and_both_runs_end_cleanly(kube_client, compute, ctx):
    """Redelivery: two workers run the same retire at the same time (no lock between them:
    as after a Redis flush).  The instance is deleted, neither run raises, the Proxy's new
    instance is untouched."""
    ref, old_id = _running(kube_client, ctx, "bk5-twice")
    retired: list = []
    moving = type(ctx)(**{**ctx.__dict__, "retire": lambda *a: retired.append(a)})
    patch_spec(kube_client, "bk5-twice", {"placement": {"zone": ZONES[1]}})
    _settle(moving, ref, create(moving, ref))
    assert retired == [("gcp-a", old_id, ref)]
    new_id = read(kube_client, ref).status["providerID"]
    results, errors = [], []
    barrier = threading.Barrier(2)

    def run() -> None:
        barrier.wait()
        try:
            results.append(retire_instance(ctx, *retired[0][:2], ref=ref))
        except Exception as exc:  # noqa: BLE001 - what the task would see
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert True in results and len(results) == 2
    assert not _exists(ctx, old_id) and _exists(ctx, new_id)
    assert retire_instance(ctx, "gcp-a", old_id, ref=ref) is False    # a third delivery later: NotFound


# -- the rotation marker ------------------------------------------------------------------------
def test_a_spec_change_while_the_rotation_marker_is_set_replaces_once_and_says_both(kube_client, compute, ctx):
    """poll wrote the marker; before create runs, the user moves the Proxy to another zone.
    One replacement (one new instance, the old one deleted once), made with the new
    credentials, and the Replacing Event names both causes."""
    ref, old_id = _running(kube_client, ctx, "bk5-both")
    line = _rotate(kube_client, ref)
    followup = poll(ctx, ref)
    assert followup is not None and followup.action == CREATE
    assert read(kube_client, ref).status["specHash"] == ROTATED_SPEC_HASH
    patch_spec(kube_client, "bk5-both", {"placement": {"zone": ZONES[1]}})
    _settle(ctx, ref, followup)
    proxy = read(kube_client, ref)
    assert proxy.phase == "Running" and proxy.status["specHash"] == proxy.spec_hash
    assert f"/zones/{ZONES[1]}/" in proxy.status["providerID"]
    assert len(compute.instances) == 1 and not _exists(ctx, old_id)
    assert len(compute.calls("DELETE")) == 1
    assert [item["value"].strip() for inst in compute.instances.values()
            for item in inst["metadata"]["items"] if item["key"] == "squid-htpasswd"] == [line]
    [message] = _replacing(kube_client, "bk5-both")
    assert "spec changed" in message and "credentials changed" in message, message


def test_a_proxy_deleted_while_the_rotation_marker_is_set_deletes_its_instance(kube_client, compute, ctx):
    """The marker is set, then the Proxy is deleted before create replaces the instance: the
    queued create hands over to delete, which deletes the recorded instance (no replacement is
    made) and releases the Proxy."""
    ref, old_id = _running(kube_client, ctx, "bk5-gone")
    _rotate(kube_client, ref)
    followup = poll(ctx, ref)
    assert followup is not None and followup.action == CREATE
    kubectl_delete(kube_client, ref)
    handed = create(ctx, ref, followup.attempt)
    assert handed is not None and handed.action == "delete"
    _settle(ctx, ref, handed)
    assert read(kube_client, ref) is None
    assert not _exists(ctx, old_id) and len(compute.instances) == 0
    assert len(compute.calls("POST", r"/instances$")) == 1       # only the first create: nothing replaced
    assert _replacing(kube_client, "bk5-gone") == []
