"""Spot capacity on AWS: a one-time spot launch, and EC2 reclaiming it behind the provider's back
(moto's backend terminates it with the spot state reason), replaced by the reconciler's poll as
interrupted; providers without spot capacity refuse it."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from app.config.settings import Settings
from app.errors import NotFound, SpecNotAllowed
from app.kube.gateway import KubernetesGateway
from app.providers.base import INTERRUPTED, CreateRequest, InstanceState
from app.providers.naming import instance_name, tags_for
from app.proxy.reconcile import CREATE, Ref, create, poll
from app.resources import CAPACITY_SPOT, GROUP, PLURAL, VERSION
from app.serving import view as serving
from tests.aws.conftest import REGION, aws_config

NS = "default"


def _request(uid: str, **kw) -> CreateRequest:
    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace=NS, squid_config="http_port 3128\n",
                         egress_rules="table inet t {}\n", **kw)


def _instance_id(ec2, name: str) -> str:
    found = ec2.describe_instances(Filters=[{"Name": "tag:Name", "Values": [name]},
                                            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    [inst] = [i for r in found["Reservations"] for i in r["Instances"]]
    return inst["InstanceId"]


def test_spot_launch_and_interruption(moto, ec2, provider):
    inst = provider.create(_request("0e000000-0000-4000-8000-000000000001", capacity=CAPACITY_SPOT))
    [run] = moto.front.of("RunInstances")
    assert run.params["InstanceMarketOptions.MarketType"] == "spot"
    assert run.params["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] == "terminate"
    assert run.params["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"

    moto.interrupt(REGION, _instance_id(ec2, inst.name))
    reclaimed = provider.get(inst.provider_id)
    assert reclaimed.state is InstanceState.TERMINATED
    assert reclaimed.note is not None and reclaimed.note.reason == INTERRUPTED
    assert "Server.SpotInstanceTermination" in reclaimed.note.message
    provider.delete(inst.provider_id)  # nothing live: success, nothing terminated again
    assert moto.front.count("TerminateInstances") == 0

    again = provider.create(_request("0e000000-0000-4000-8000-000000000001", capacity=CAPACITY_SPOT))
    first, second = moto.front.of("RunInstances")
    assert first.params["ClientToken"] != second.params["ClientToken"]  # a replacement, not the old launch
    assert provider.get(again.provider_id).state is InstanceState.RUNNING


def test_on_demand_sends_no_market_options(moto, provider):
    provider.create(_request("0e000000-0000-4000-8000-000000000002"))
    [run] = moto.front.of("RunInstances")
    assert not [k for k in run.params if k.startswith("InstanceMarketOptions")]


# -- the poll replaces an interrupted instance ---------------------------------------------------
@pytest.fixture()
def ctx(moto, credentials_file, ami, make_context):
    from app.providers.aws.provider import AwsProvider

    settings = Settings(poll_initial=5, poll_max=60, retry_initial=5, retry_max=300, quota_backoff=900)
    return make_context(aws_config(moto, credentials_file), settings=settings, factories={"aws": AwsProvider})


def test_poll_replaces_a_reclaimed_spot_instance_with_an_interrupted_event(ctx, api, moto, ec2, redis_client):
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "squid-spot", "namespace": NS},
            "spec": {"provider": "aws-test", "placement": {"zone": "eu-west-1a", "capacity": "Spot"}}}
    obj = k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    ref = Ref(NS, "squid-spot", obj["metadata"]["uid"])
    create(ctx, ref)
    gw = KubernetesGateway(api)
    assert poll(ctx, ref) is None  # Running, published
    proxy = gw.get_proxy(NS, "squid-spot")
    assert proxy.phase == "Running" and serving.get(redis_client, ref.uid) is not None
    name = proxy.status["instanceName"]

    moto.interrupt(REGION, _instance_id(ec2, name))
    followup = poll(ctx, ref)

    assert followup is not None and followup.action == CREATE
    proxy = gw.get_proxy(NS, "squid-spot")
    cond = next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")
    assert cond["reason"] == INTERRUPTED and "reclaimed the spot instance" in cond["message"]
    assert serving.get(redis_client, ref.uid) is None  # withdrawn: its leases end as for any withdrawn proxy
    events = k8s.CoreV1Api(api).list_namespaced_event(NS).items
    assert [e.reason for e in events if e.type == "Warning"] == [INTERRUPTED]
    assert proxy.status["interruptions"] == 1  # counted on the Proxy (and summed by its pool)
    create(ctx, ref)
    assert poll(ctx, ref) is None
    assert gw.get_proxy(NS, "squid-spot").phase == "Running"
    assert moto.front.count("RunInstances") == 2


def test_a_user_terminated_instance_is_lost_not_interrupted(ctx, api, moto, ec2):
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "squid-od", "namespace": NS},
            "spec": {"provider": "aws-test", "placement": {"zone": "eu-west-1a"}}}
    obj = k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    ref = Ref(NS, "squid-od", obj["metadata"]["uid"])
    create(ctx, ref)
    poll(ctx, ref)
    name = KubernetesGateway(api).get_proxy(NS, "squid-od").status["instanceName"]
    ec2.terminate_instances(InstanceIds=[_instance_id(ec2, name)])
    with pytest.raises(NotFound):
        ctx.registry.get("aws-test").get(KubernetesGateway(api).get_proxy(NS, "squid-od").status["providerID"])
    assert poll(ctx, ref).action == CREATE
    reasons = [e.reason for e in k8s.CoreV1Api(api).list_namespaced_event(NS).items if e.type == "Warning"]
    assert reasons == ["InstanceLost"]
    assert "interruptions" not in KubernetesGateway(api).get_proxy(NS, "squid-od").status


def test_providers_without_spot_refuse_it(kube_client):
    from app.config.providers import ProviderConfig
    from app.providers.kubernetes.config import KubernetesSettings
    from app.providers.kubernetes.provider import KubernetesProvider

    provider = KubernetesProvider(ProviderConfig("k8s", "kubernetes", 60, 15, KubernetesSettings()), client=kube_client)
    with pytest.raises(SpecNotAllowed) as err:
        provider.create(_request("0e000000-0000-4000-8000-000000000003", capacity=CAPACITY_SPOT))
    assert err.value.field == "spec.placement.capacity" and "aws and gcp only" in str(err.value)


def test_a_replacement_never_reuses_the_client_token_of_an_earlier_launch(moto, ec2, provider):
    """EC2 answers a known token with the instance it launched (IdempotentInstanceTerminated once that
    one is gone), and lists terminated instances for about an hour only: a third launch after the
    first one aged out of the listings must not repeat the second one's token."""
    uid = "0e000000-0000-4000-8000-000000000009"
    launched = []
    for _ in range(2):
        inst = provider.create(_request(uid, capacity=CAPACITY_SPOT))
        launched.append(_instance_id(ec2, inst.name))
        moto.interrupt(REGION, launched[-1])
    backend = moto.backend(REGION)  # EC2 stops listing the first, oldest terminated instance
    for rid, reservation in list(backend.reservations.items()):
        if any(i.id == launched[0] for i in reservation.instances):
            del backend.reservations[rid]
    provider.create(_request(uid, capacity=CAPACITY_SPOT))
    tokens = [c.params["ClientToken"] for c in moto.front.of("RunInstances")]
    assert len(tokens) == 3 and len(set(tokens)) == 3, tokens
