"""The dispatcher (app.dispatch.proxies) in process: real Redis, the Kubernetes API fake, no broker.

Messages go to a recorder passed as the dispatcher's ``send``; everything else is the product's
code: the per-Proxy lock, parking, de-duplication, routing from the providers config, the
resync's choice of what to send.
"""

from __future__ import annotations

import threading

import pytest

from app.store import keys as redis_keys

from app.serving import view as serving
from app.config.providers import ProvidersConfig
from app.dispatch.proxies import Dispatcher, Router, dedup_key
from app.kube.gateway import KubernetesGateway
from app.proxy.reconcile import Context, Ref, drifted, steady
from app.resources import FINALIZER, Proxy
from app.config.settings import Settings
from app.wiring import PROVIDER_TYPES, build_registry, parse_config
from tests.support.proxies import apply, rotate_credentials
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


class Sent(list):
    """The dispatcher's ``send``: records ``(task, args, queue, countdown)``."""

    def __call__(self, task, args, queue, countdown=None):
        self.append((task, list(args), queue, countdown))


def _config(tmp_path) -> ProvidersConfig:
    return parse_config({"providers": [
        {"name": "lab", "type": "kvm", "kvm": {
            "ssh": {"user": "u", "keyFile": str(tmp_path / "key"), "knownHostsFile": str(tmp_path / "kh")},
            "hosts": [{"name": "h1", "address": "127.0.0.1"}, {"name": "h2", "address": "127.0.0.1"}]}},
        {"name": "k8s", "type": "kubernetes"},
    ]}, "<dispatch-test>")


@pytest.fixture()
def config(tmp_path):
    return _config(tmp_path)


@pytest.fixture()
def ctx(config, kube_client, redis_client):
    # kvm hosts are never dialled here: the steps below decide before touching the provider
    return Context(kube=KubernetesGateway(kube_client), registry=build_registry(config), redis=redis_client,
                   settings=Settings(task_time_limit=20))


@pytest.fixture()
def sent():
    return Sent()


@pytest.fixture()
def dispatcher(config, redis_client, sent):
    return Dispatcher(redis_client, Router(config, PROVIDER_TYPES), sent)


def _moved_kvm_proxy(kube_client, name="moved") -> Ref:
    """A Ready kvm Proxy on h1 whose spec now says h2 (a new generation the reconciler has not seen)."""
    gw = KubernetesGateway(kube_client)
    ref = apply(kube_client, name, {"provider": "lab", "placement": {"zone": "h1"}})
    proxy = gw.add_finalizer(gw.get_proxy(ref.namespace, ref.name))
    gw.patch_status(proxy, {"phase": "Ready", "providerID": f"hosts/h1/domains/{name}", "provider": "lab",
                            "specHash": proxy.spec_hash, "observedGeneration": proxy.generation})
    from kubernetes import client as k8s

    from app.resources import GROUP, PLURAL, VERSION
    k8s.CustomObjectsApi(kube_client).patch_namespaced_custom_object(
        GROUP, VERSION, ref.namespace, PLURAL, ref.name, {"spec": {"placement": {"zone": "h2"}}})
    return ref


# -- run_step ----------------------------------------------------------------------------------
def test_a_different_followup_is_routed_to_the_queue_of_the_host_the_proxy_moved_to(
        kube_client, ctx, dispatcher, sent, redis_client):
    ref = _moved_kvm_proxy(kube_client)
    redis_client.set(dedup_key("poll", ref.uid), "1")  # the mark of the message being run

    outcome = dispatcher.run_step(ctx, "poll", ref, queue="kvm.lab.h1")  # delivered on the old host's queue

    assert outcome == "followup"
    # the poll sees a new generation: a create, on the queue of the host the spec now names
    assert sent == [("proxy.create", [ref.namespace, ref.name, ref.uid, 0], "kvm.lab.h2", None)]
    assert redis_client.get(dedup_key("poll", ref.uid)) is None      # cleared when the step started
    assert redis_client.get(dedup_key("create", ref.uid)) is not None  # the create is marked queued
    assert not redis_client.exists(redis_keys.proxy_lock(ref.uid))   # released


def test_a_same_step_followup_stays_on_the_queue_it_was_delivered_from(kube_client, ctx, dispatcher, sent):
    gw = KubernetesGateway(kube_client)
    ref = apply(kube_client, "provisioning", {"provider": "lab", "placement": {"zone": "h1"}})
    proxy = gw.add_finalizer(gw.get_proxy(ref.namespace, ref.name))
    gw.patch_status(proxy, {"phase": "Provisioning", "providerID": "hosts/h1/domains/x", "provider": "lab",
                            "specHash": proxy.spec_hash, "observedGeneration": proxy.generation})

    # h1 cannot be reached (no SSH key yet): Transient, the poll retries itself with backoff.
    assert dispatcher.run_step(ctx, "poll", ref, queue="kvm.lab.h1") == "followup"

    [(task, args, queue, countdown)] = sent
    assert (task, args[:3], queue) == ("proxy.poll", [ref.namespace, ref.name, ref.uid], "kvm.lab.h1")
    assert args[3] == 1 and countdown and countdown > 0


def test_a_locked_proxy_parks_the_request_and_the_holder_decides_again_when_it_ends(
        kube, kube_client, ctx, dispatcher, sent, redis_client):
    ref = _moved_kvm_proxy(kube_client)
    # The holder: a stale delete message for the (not deleted) Proxy, whose read of it is slow.
    kube.delay_next("get", "proxies", seconds=1.5)
    outcomes = []
    holder = threading.Thread(target=lambda: outcomes.append(dispatcher.run_step(ctx, "delete", ref)))
    holder.start()
    wait_until(lambda: redis_client.exists(redis_keys.proxy_lock(ref.uid)), 5, "the holder's lock")

    assert dispatcher.run_step(ctx, "poll", ref, queue="kvm.lab.h1") == "locked"
    assert sent == []  # parked, not re-sent: a backoff the holder schedules is not cut short
    assert redis_client.smembers(redis_keys.parked(ref.uid)) == {"task:poll"}

    holder.join(10)
    assert outcomes == ["done"]  # the delete found nothing to do ...
    # ... and, having found a parked request, re-read the Proxy and dispatched what it needs now:
    # a create, routed to the host the spec names.
    assert sent == [("proxy.create", [ref.namespace, ref.name, ref.uid, 0], "kvm.lab.h2", None)]
    assert not redis_client.exists(redis_keys.parked(ref.uid))
    assert not redis_client.exists(redis_keys.proxy_lock(ref.uid))


def test_a_step_that_finds_its_proxy_gone_sends_nothing(kube_client, ctx, dispatcher, sent):
    ref = Ref("default", "never-was", "0000-gone")
    assert dispatcher.run_step(ctx, "poll", ref) == "done"
    assert sent == []


# -- resync ------------------------------------------------------------------------------------
def _proxy(name, *, phase="Ready", generation=1, observed=1, provider="k8s", zone=None, provisioned="True",
           provider_id=True, deleting=False, finalizers=(FINALIZER,)) -> Proxy:
    spec = {"provider": provider, **({"placement": {"zone": zone}} if zone else {})}
    proxy = Proxy.from_dict({"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                                          "generation": generation, "finalizers": list(finalizers)},
                             "spec": spec})
    status = {"phase": phase, "observedGeneration": observed, "specHash": proxy.spec_hash, "provider": provider,
              "conditions": [{"type": "Provisioned", "status": provisioned, "reason": "InstanceRunning",
                              "observedGeneration": observed}]}
    if provider_id:
        status["providerID"] = f"hosts/{zone}/domains/{name}" if provider == "lab" else f"ns/{name}"
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": generation,
            "finalizers": list(finalizers)}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return Proxy.from_dict({"metadata": meta, "spec": spec, "status": status})


def _published(redis_client, *proxies):
    for p in proxies:
        serving.publish(redis_client, p, address="10.0.0.1", port=3128, phase=p.phase)


def test_resync_sends_only_what_needs_work_and_counts_what_it_sent(dispatcher, sent, redis_client):
    steady_ready = _proxy("ready")
    steady_running = _proxy("running", phase="Running")
    unpublished = _proxy("flushed")                       # steady, but the serving view lost it
    drifting = _proxy("drifting")                         # steady, but drifted (below)
    unhealthy = _proxy("unhealthy", phase="Unhealthy")
    provisioning = _proxy("provisioning", phase="Provisioning", provisioned="False")
    new_generation = _proxy("edited", generation=2)
    retrying = _proxy("retrying", provisioned="False")    # Ready, but a retry of this generation is due
    deleting = _proxy("deleting", deleting=True)
    kvm = _proxy("on-h2", provider="lab", zone="h2", phase="Pending", provider_id=False, provisioned="False")
    _published(redis_client, steady_ready, steady_running, drifting, unhealthy, new_generation, retrying)
    assert steady(steady_ready) and steady(steady_running) and steady(unpublished) and steady(drifting)
    assert not any(steady(p) for p in (unhealthy, provisioning, new_generation, retrying, deleting, kvm))

    listed = [steady_ready, steady_running, unpublished, drifting, unhealthy, provisioning, new_generation,
              retrying, deleting, kvm]
    count = dispatcher.resync(listed, drifted=lambda p: p.name == "drifting")

    got = {args[1]: (task, queue) for task, args, queue, _ in sent}
    assert got == {
        "flushed": ("proxy.poll", "proxies"), "drifting": ("proxy.poll", "proxies"),
        "unhealthy": ("proxy.poll", "proxies"), "provisioning": ("proxy.poll", "proxies"),
        "edited": ("proxy.create", "proxies"), "retrying": ("proxy.poll", "proxies"),
        "deleting": ("proxy.delete", "proxies"), "on-h2": ("proxy.create", "kvm.lab.h2"),
    }
    assert count == len(sent) == 8
    # The next period finds the same messages still queued: nothing sent, and it says so.
    assert dispatcher.resync(listed, drifted=lambda p: p.name == "drifting") == 0
    assert len(sent) == 8


def test_resync_leaves_a_proxy_whose_step_is_running_alone(dispatcher, sent, redis_client):
    provisioning = _proxy("busy", phase="Provisioning", provisioned="False")
    assert redis_client.lock(redis_keys.proxy_lock(provisioning.uid), timeout=30).acquire()
    assert dispatcher.resync([provisioning]) == 0 and sent == []


def test_a_steady_proxy_drifts_when_its_provider_or_host_is_gone(config, tmp_path):
    ctx = Context(kube=None, registry=build_registry(config), redis=None, settings=Settings())
    assert not drifted(ctx, _proxy("fine", provider="lab", zone="h1"))
    assert not drifted(ctx, _proxy("pod"))                                   # kubernetes: nothing baked in
    assert drifted(ctx, _proxy("host-gone", provider="lab", zone="h9"))      # the host left the config
    assert drifted(ctx, _proxy("provider-gone", provider="removed"))         # the provider left the config


# -- rotated credentials ---------------------------------------------------------------------
def test_resync_queues_a_rotated_proxy_for_replacement_only_where_the_credentials_are_baked_in(
        kube_client, redis_client, tmp_path):
    """Credential rotation: kvm and gcp bake the htpasswd line into the instance, so a
    Secret whose line no longer matches ``status.credentialsHash`` makes the resync poll the
    (steady, published) Proxy, and that poll replaces the instance; a kubernetes Pod mounts the
    Secret and follows it, so its Proxy is left alone."""
    from kubernetes import client as k8s

    from app.kube import credentials
    from app.proxy.reconcile import CREATE, credentials_hash, poll

    config = parse_config({"providers": [
        {"name": "lab", "type": "kvm", "squid": {"basicAuth": True}, "kvm": {
            "ssh": {"user": "u", "keyFile": str(tmp_path / "key"), "knownHostsFile": str(tmp_path / "kh")},
            "hosts": [{"name": "h1", "address": "127.0.0.1"}]}},
        # never dialled: the drift check reads Secrets only, the poll decides before any call
        {"name": "cloud", "type": "gcp", "squid": {"basicAuth": True}, "gcp": {
            "project": "demo-project", "zones": ["europe-west1-b"], "apiEndpoint": "http://127.0.0.1:9", "anonymous": True}},
        {"name": "k8s", "type": "kubernetes", "squid": {"basicAuth": True}},
    ]}, "<rotation-test>")
    ctx = Context(kube=KubernetesGateway(kube_client), registry=build_registry(config), redis=redis_client,
                  settings=Settings(task_time_limit=20))
    sent = Sent()
    dispatcher = Dispatcher(redis_client, Router(config, PROVIDER_TYPES), sent)
    gw = ctx.kube
    places = {"lab": ("h1", "hosts/h1/domains/{}"), "cloud": ("europe-west1-b", "projects/demo-project/zones/europe-west1-b/instances/{}"),
              "k8s": (None, "default/{}")}
    refs = {}
    for provider, (zone, pid) in places.items():
        name = f"rot-{provider}"
        spec = {"provider": provider, **({"placement": {"zone": zone}} if zone else {})}
        ref = refs[provider] = apply(kube_client, name, spec)
        proxy = gw.add_finalizer(gw.get_proxy(ref.namespace, ref.name))
        auth = credentials.ensure(gw, proxy)           # the Secret the create step made
        proxy = gw.patch_status(proxy, {
            "phase": "Ready", "provider": provider, "providerID": pid.format(name), "specHash": proxy.spec_hash,
            "observedGeneration": proxy.generation, "credentialsHash": credentials_hash(auth.htpasswd),
            "conditions": [{"type": "Provisioned", "status": "True", "reason": "InstanceRunning",
                            "observedGeneration": proxy.generation, "lastTransitionTime": "2026-01-01T00:00:00Z",
                            "message": ""}]})
        assert steady(proxy), provider
        serving.publish(redis_client, proxy, address="10.0.0.1", port=3128, phase="Ready")

    def resync() -> dict[str, tuple[str, str]]:
        sent.clear()
        dispatcher.resync(gw.list_proxies(), drifted=lambda p: drifted(ctx, p))
        return {args[1]: (task, queue) for task, args, queue, _ in sent}

    # Credentials as built: every Proxy is steady and published, nothing is sent.
    assert resync() == {}

    # The user rotates every password (new password and the htpasswd line that goes with it).
    for ref in refs.values():
        rotate_credentials(kube_client, f"{ref.name}-proxy-auth", ref.namespace)

    assert resync() == {"rot-lab": ("proxy.poll", "kvm.lab.h1"), "rot-cloud": ("proxy.poll", "proxies")}
    assert not drifted(ctx, gw.get_proxy("default", "rot-k8s"))

    # The poll the resync queued replaces the instance: CredentialsRotated, then a create.
    for provider in ("lab", "cloud"):
        followup = poll(ctx, refs[provider])
        assert followup is not None and followup.action == CREATE, provider
        proxy = gw.get_proxy("default", f"rot-{provider}")
        [cond] = [c for c in proxy.status["conditions"] if c["type"] == "Provisioned"]
        assert (cond["status"], cond["reason"]) == ("False", "CredentialsRotated")
    events = {(e.involved_object.name, e.reason) for e in k8s.CoreV1Api(kube_client).list_namespaced_event("default").items}
    assert {("rot-lab", "CredentialsRotated"), ("rot-cloud", "CredentialsRotated")} <= events
    assert not any(name == "rot-k8s" for name, _ in events)
