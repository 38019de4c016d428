"""Stopped is not lost, and skip-cleanup outlives Redis: the gcp provider against the Compute fake.

The reconcile steps run in-process with the API fake and the session Redis, the way the
Celery tasks run them; the instance is stopped or suspended behind the provider's back with a
second SDK client, as a user in the console or a host event would.
"""

from __future__ import annotations

import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1
from kubernetes import client as k8s

from app.providers import naming

from app.serving import view as serving
from app.proxy.gc import collect
from app.kube.gateway import KubernetesGateway
from app.providers.naming import instance_name, tags_for
from app.providers.base import CreateRequest, InstanceState
from app.errors import NotFound, Transient
from app.proxy.reconcile import ABANDONED_KEY, POLL, Ref, create, poll
from app.resources import GROUP, PLURAL, VERSION, Proxy
from app.config.settings import Settings
from tests.gcp.conftest import PROJECT, gcp_config
from tests.gcp.fake_compute import label_fingerprint

ZONE = "europe-west1-b"
NS = "default"


def _request(uid: str) -> CreateRequest:
    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace=NS, zone=ZONE)


def behind_the_back(fake, verb: str, name: str, *, wait: bool = True) -> None:
    """``instances.<verb>`` (stop, suspend) from another client, waited on like the console does."""
    opts = ClientOptions(api_endpoint=fake.url)
    instances = compute_v1.InstancesClient(credentials=AnonymousCredentials(), transport="rest", client_options=opts)
    op = getattr(instances, f"{verb}_unary")(project=PROJECT, zone=ZONE, instance=name)
    if wait:
        ops = compute_v1.ZoneOperationsClient(credentials=AnonymousCredentials(), transport="rest",
                                              client_options=opts)
        while op.status != compute_v1.Operation.Status.DONE:
            op = ops.wait(project=PROJECT, zone=ZONE, operation=op.name)


def count(fake, name: str) -> int:
    return sum(1 for (_, _, n) in fake.instances if n == name)


# -- the provider's start and abandon ------------------------------------------------------------
def test_start_and_resume_bring_back_the_same_instance(fake, provider):
    inst = provider.create(_request("uid-start"))
    [record] = [v for k, v in fake.instances.items() if k[2] == inst.name]
    original_id = record["id"]

    behind_the_back(fake, "stop", inst.name)
    assert record["status"] == "TERMINATED"  # GCE's word for a stopped instance
    stopped = provider.get(inst.provider_id)
    assert stopped.state is InstanceState.STOPPED and stopped.address not in fake.external_addresses
    provider.start(inst.provider_id)
    assert provider.get(inst.provider_id).state is InstanceState.RUNNING
    assert len(fake.calls("POST", rf"/instances/{inst.name}/start$")) == 1

    behind_the_back(fake, "suspend", inst.name)
    assert provider.get(inst.provider_id).state is InstanceState.STOPPED
    provider.start(inst.provider_id)
    assert len(fake.calls("POST", rf"/instances/{inst.name}/resume$")) == 1
    assert len(fake.calls("POST", rf"/instances/{inst.name}/start$")) == 1, "a suspended instance is resumed"
    running = provider.get(inst.provider_id)
    assert running.state is InstanceState.RUNNING and running.address in fake.external_addresses

    provider.start(inst.provider_id)  # running: nothing to do, no call
    assert len(fake.calls("POST", r"/(start|resume)$")) == 2
    assert record["id"] == original_id and count(fake, inst.name) == 1
    assert not fake.calls("DELETE") and len(fake.calls("POST", r"/instances$")) == 1


def test_start_while_still_stopping_is_transient(fake, provider):
    inst = provider.create(_request("uid-stopping"))
    fake.op_polls = 1000  # the stop never finishes
    behind_the_back(fake, "stop", inst.name, wait=False)
    with pytest.raises(Transient, match="STOPPING"):
        provider.start(inst.provider_id)
    assert not fake.calls("POST", r"/start$")
    with pytest.raises(NotFound):
        provider.start(f"projects/{PROJECT}/zones/{ZONE}/instances/proxy-nothere")


def test_abandon_sets_the_label_with_the_current_fingerprint(fake, provider):
    inst = provider.create(_request("uid-label"))
    before = label_fingerprint(tags_for("uid-label"))

    provider.abandon(inst.provider_id)

    [call] = fake.calls("POST", rf"/instances/{inst.name}/setLabels$")
    assert call.body["labelFingerprint"] == before
    assert call.body["labels"] == {**tags_for("uid-label"), "abandoned": "true"}
    assert provider.get(inst.provider_id).tags[naming.TAG_ABANDONED] == "true"
    provider.abandon(inst.provider_id)  # already marked: nothing sent
    assert len(fake.calls("POST", r"/setLabels$")) == 1
    provider.delete(inst.provider_id)
    provider.abandon(inst.provider_id)  # gone: success


def test_a_stale_fingerprint_is_reread_then_transient(fake, provider):
    inst = provider.create(_request("uid-stale"))
    fake.fail("POST", r"/setLabels$", 412, "conditionNotMet",
              "Labels fingerprint either invalid or resource labels have changed")
    provider.abandon(inst.provider_id)
    assert len(fake.calls("POST", r"/setLabels$")) == 2
    assert provider.get(inst.provider_id).tags[naming.TAG_ABANDONED] == "true"

    other = provider.create(_request("uid-stale-2"))
    fake.fail("POST", r"/setLabels$", 412, "conditionNotMet", "labels have changed", times=3)
    with pytest.raises(Transient, match="412"):
        provider.abandon(other.provider_id)
    assert naming.TAG_ABANDONED not in provider.get(other.provider_id).tags


def test_abandoned_instance_survives_a_redis_flush_and_gc(fake, provider, redis_client):
    kept = provider.create(_request("uid-keep"))
    orphan = provider.create(_request("uid-orphan"))  # the control: GC deletes it
    provider.abandon(kept.provider_id)
    redis_client.sadd(ABANDONED_KEY, "uid-keep")

    redis_client.flushall()
    report = collect("gcp-test", provider, lambda: [], abandoned=set(redis_client.smembers(ABANDONED_KEY)), grace_seconds=0)

    assert report.deleted == [orphan.provider_id]
    assert [name for (_, _, name) in fake.instances] == [kept.name]
    assert collect("gcp-test", provider, lambda: [], abandoned=set(), grace_seconds=0).deleted == []
    assert count(fake, kept.name) == 1


# -- the poll ------------------------------------------------------------------------------------
@pytest.fixture()
def ctx(fake, make_context):
    from app.providers.gcp.provider import GcpProvider

    settings = Settings(poll_initial=5, poll_max=60, retry_initial=5, retry_max=300, quota_backoff=900)
    return make_context(gcp_config(fake), settings=settings, factories={"gcp": GcpProvider})


def running_proxy(ctx, api, name: str) -> tuple[Ref, Proxy]:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": name, "namespace": NS},
            "spec": {"provider": "gcp-test", "placement": {"zone": ZONE}}}
    obj = k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    ref = Ref(NS, name, obj["metadata"]["uid"])
    assert create(ctx, ref) is None  # the fake's insert finishes within the create
    proxy = KubernetesGateway(api).get_proxy(NS, name)
    assert proxy.phase == "Running" and proxy.status["address"]
    return ref, proxy


def reasons(api) -> list[str]:
    return [e.reason for e in k8s.CoreV1Api(api).list_namespaced_event(NS).items]


def provisioned(proxy: Proxy) -> dict:
    return next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")


@pytest.mark.parametrize("verb, call", [("stop", "start"), ("suspend", "resume")])
def test_poll_starts_a_stopped_instance_instead_of_recreating_it(ctx, api, fake, redis_client, verb, call):
    ref, proxy = running_proxy(ctx, api, f"squid-{verb}")
    name = proxy.status["instanceName"]
    behind_the_back(fake, verb, name)

    followup = poll(ctx, ref)

    assert followup.action == POLL and followup.attempt == 1
    assert len(fake.calls("POST", rf"/instances/{name}/{call}$")) == 1
    proxy = KubernetesGateway(api).get_proxy(NS, ref.name)
    assert proxy.phase == "Provisioning" and proxy.status["providerID"].endswith(f"/instances/{name}")
    cond = provisioned(proxy)
    assert cond["reason"] == "InstanceStopped" and "being started again" in cond["message"]
    assert serving.get(redis_client, ref.uid) is None, "not leased while it is down"
    assert {"InstanceStopped", "InstanceStarted"} <= set(reasons(api))
    assert "InstanceLost" not in reasons(api)

    assert poll(ctx, ref, followup.attempt) is None
    proxy = KubernetesGateway(api).get_proxy(NS, ref.name)
    assert proxy.phase == "Running" and provisioned(proxy)["reason"] == "InstanceRunning"
    assert serving.get(redis_client, ref.uid)["address"] == proxy.status["address"]
    # The same instance: no delete, one insert, nothing leaked or duplicated.
    assert not fake.calls("DELETE") and len(fake.calls("POST", r"/instances$")) == 1
    assert len(fake.instances) == 1 and count(fake, name) == 1


def test_poll_starts_an_instance_in_status_stopped_instead_of_recreating_it(ctx, api, fake):
    """GCE's ``STOPPED`` status (beside ``TERMINATED``, the one a stop leaves) is started the
    same way: no verb of the API leads there, so the fake's record is set to it."""
    ref, proxy = running_proxy(ctx, api, "squid-status-stopped")
    name = proxy.status["instanceName"]
    record = fake.instances[(PROJECT, ZONE, name)]
    original_id = record["id"]
    record["status"] = "STOPPED"

    followup = poll(ctx, ref)

    assert followup.action == POLL
    assert len(fake.calls("POST", rf"/instances/{name}/start$")) == 1
    assert provisioned(KubernetesGateway(api).get_proxy(NS, ref.name))["reason"] == "InstanceStopped"
    assert poll(ctx, ref, followup.attempt) is None
    assert KubernetesGateway(api).get_proxy(NS, ref.name).phase == "Running"
    assert "InstanceLost" not in reasons(api)
    # The same instance: no delete, one insert, nothing leaked or duplicated.
    assert not fake.calls("DELETE") and len(fake.calls("POST", r"/instances$")) == 1
    assert len(fake.instances) == 1 and fake.instances[(PROJECT, ZONE, name)]["id"] == original_id


def test_a_failing_start_is_retried_with_backoff(ctx, api, fake):
    ref, proxy = running_proxy(ctx, api, "squid-flaky")
    name = proxy.status["instanceName"]
    behind_the_back(fake, "stop", name)
    fake.fail("POST", rf"/instances/{name}/start$", 503, "backendError", "injected backend error")

    first = poll(ctx, ref)

    assert first.action == POLL and first.attempt == 1 and 2.5 <= first.delay <= 5
    proxy = KubernetesGateway(api).get_proxy(NS, ref.name)
    assert provisioned(proxy)["reason"] == "Transient" and proxy.phase == "Provisioning"
    assert fake.instances[(PROJECT, ZONE, name)]["status"] == "TERMINATED"

    fake.fail_operation("start", 503, "INTERNAL_ERROR", "injected operation failure")
    second = poll(ctx, ref, first.attempt)  # the call is accepted, its operation fails
    assert second.action == POLL and second.attempt == 2 and 5 <= second.delay <= 10

    third = poll(ctx, ref, second.attempt)
    assert third.action == POLL
    assert poll(ctx, ref, third.attempt) is None
    assert KubernetesGateway(api).get_proxy(NS, ref.name).phase == "Running"
    assert len(fake.calls("POST", rf"/instances/{name}/start$")) == 3
    assert not fake.calls("DELETE") and len(fake.calls("POST", r"/instances$")) == 1
    assert len(fake.instances) == 1 and count(fake, name) == 1
