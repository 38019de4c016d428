"""The kubernetes provider keeps the Squid Pods' egress NetworkPolicy (app/squid/egress.py), against the API fake."""

from __future__ import annotations

import dataclasses

import pytest
from kubernetes import client as k8s

from app.squid import egress, conf as squid
from app.config.providers import ProviderConfig
from app.providers.naming import instance_name, tags_for
from app.providers.base import CreateRequest
from app.providers.kubernetes.config import KubernetesSettings
from app.providers.kubernetes.provider import KubernetesProvider
from app.wiring import parse_config as parse

POLICY = squid.SquidPolicy(denied_destinations=("10.96.0.0/12", "10.244.0.0/16", "fd00:10::/64"),
                           allowed_destinations=("10.96.0.10/32",))


def make_provider(api, policy: squid.SquidPolicy = POLICY, **settings) -> KubernetesProvider:
    return KubernetesProvider(ProviderConfig("k8s", "kubernetes", 60, 15, KubernetesSettings(**settings), squid=policy),
                              client=api)


def request(uid: str, namespace: str = "crawl") -> CreateRequest:
    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace=namespace,
                         squid_config=squid.render(3128, POLICY))


def read(api, namespace: str):
    return k8s.NetworkingV1Api(api).read_namespaced_network_policy(egress.NETWORK_POLICY_NAME, namespace)


def test_a_squid_pod_is_created_with_its_egress_network_policy(api):
    make_provider(api).create(request("5c0ffee0-0000-4000-8000-000000000001"))
    np = read(api, "crawl")
    assert np.metadata.labels["app.kubernetes.io/managed-by"] == "proxy-operator"
    # It selects the provider's Squid Pods, and the Pod carries those labels.
    pod = k8s.CoreV1Api(api).read_namespaced_pod(instance_name("5c0ffee0-0000-4000-8000-000000000001"), "crawl")
    selector = np.spec.pod_selector.match_labels
    assert selector == {"app.kubernetes.io/name": "squid", "app.kubernetes.io/managed-by": "proxy-operator"}
    assert selector.items() <= pod.metadata.labels.items()
    assert np.spec.policy_types == ["Egress"]
    dns, web = np.spec.egress
    assert {(p.protocol, p.port) for p in dns.ports} == {("UDP", 53), ("TCP", 53)} and not dns.to
    blocks = [(p.ip_block.cidr, p.ip_block._except) for p in web.to]
    assert blocks[0] == ("0.0.0.0/0", ["0.0.0.0/8", "10.96.0.0/12", "10.244.0.0/16", "127.0.0.0/8", "169.254.0.0/16"])
    assert blocks[1] == ("::/0", ["::/127", "fd00:10::/64", "fd00:ec2::254/128", "fe80::/10"])
    assert blocks[2:] == [("10.96.0.10/32", None)]  # squid.allowedDestinations, on purpose


def test_the_policy_follows_the_config_and_each_namespace_gets_one(api):
    make_provider(api).create(request("5c0ffee0-0000-4000-8000-000000000002"))
    wider = dataclasses.replace(POLICY, denied_destinations=("10.0.0.0/8",), allowed_destinations=())
    make_provider(api, wider).create(request("5c0ffee0-0000-4000-8000-000000000003"))
    assert read(api, "crawl").spec.egress[1].to[0].ip_block._except == [
        "0.0.0.0/8", "10.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16"]
    assert len(read(api, "crawl").spec.egress[1].to) == 2
    make_provider(api).create(request("5c0ffee0-0000-4000-8000-000000000004", namespace="other"))
    assert read(api, "other").metadata.namespace == "other"


def test_the_metadata_server_is_never_an_allowed_destination():
    np = egress.squid_network_policy(squid.SquidPolicy(allowed_destinations=("169.254.0.0/16", "169.254.169.254/32")),
                                     "ns", {"a": "b"})
    assert np["spec"]["egress"][1]["to"][2:] == [{"ipBlock": {"cidr": "169.254.0.0/16",
                                                              "except": ["169.254.169.254/32"]}}]


def test_egress_network_policy_false_creates_none(api):
    make_provider(api, egress_network_policy=False).create(request("5c0ffee0-0000-4000-8000-000000000005"))
    with pytest.raises(k8s.ApiException) as info:
        read(api, "crawl")
    assert info.value.status == 404


def test_the_setting_is_read_strictly():
    config = parse({"providers": [{"name": "k", "type": "kubernetes",
                                   "kubernetes": {"egressNetworkPolicy": False}}]}, "providers.yaml")
    assert config.providers[0].settings.egress_network_policy is False
    assert parse({"providers": [{"name": "k", "type": "kubernetes"}]},
                 "providers.yaml").providers[0].settings.egress_network_policy is True
    with pytest.raises(Exception, match="egressNetworkPolicy"):
        parse({"providers": [{"name": "k", "type": "kubernetes", "kubernetes": {"egressNetworkPolicy": "yes"}}]},
              "providers.yaml")
