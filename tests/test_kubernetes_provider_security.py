"""The kubernetes provider against the API fake: what a delete may touch and what a Proxy
author may choose (docs/security.md)."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from app.config.providers import ProviderConfig, ProvidersConfig
from app.wiring import parse_config as parse
from app.kube.gateway import KubernetesGateway
from app.errors import NotManaged, Permanent, SpecNotAllowed
from app.providers.kubernetes.config import DEFAULT_IMAGE, KubernetesSettings
from app.providers.kubernetes.provider import LABEL_MANAGED_BY, LABEL_PROXY_UID, KubernetesProvider
from app.providers.registry import build
from app.proxy.reconcile import Context, Ref, create
from app.resources import GROUP, PLURAL, VERSION
from app.config.settings import Settings
from app.config.validation import ConfigError

MANAGED = {LABEL_MANAGED_BY: "proxy-operator"}


def make_provider(api, **settings) -> KubernetesProvider:
    return KubernetesProvider(ProviderConfig("k8s", "kubernetes", 60, 15, KubernetesSettings(**settings)), client=api)


def pod(api, name: str, labels: dict, namespace: str = "default") -> None:
    k8s.CoreV1Api(api).create_namespaced_pod(namespace, k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="i")])))


def names(api, namespace: str) -> set[str]:
    return {p.metadata.name for p in k8s.CoreV1Api(api).list_namespaced_pod(namespace).items}


# -- item 1: delete refuses what is not ours ----------------------------------------------------

@pytest.mark.parametrize("labels", [
    {},                                                # a system Pod: kube-system/coredns
    {LABEL_MANAGED_BY: "helm", LABEL_PROXY_UID: "u"},  # another manager
    MANAGED,                                           # our marker but no Proxy UID
    {LABEL_PROXY_UID: "u"},                            # a UID but not our marker
])
def test_delete_refuses_a_pod_that_is_not_ours_and_leaves_it(api, labels, caplog):
    pod(api, "coredns", labels, namespace="kube-system")
    provider = make_provider(api)
    with pytest.raises(NotManaged, match="refusing to delete kube-system/coredns") as info:
        provider.delete("kube-system/coredns")
    assert isinstance(info.value, Permanent)
    assert names(api, "kube-system") == {"coredns"}
    assert any("refusing to delete kube-system/coredns" in r.getMessage() for r in caplog.records
               if r.levelname == "WARNING"), "the refusal is logged"


def test_delete_removes_ours_and_an_already_gone_pod_is_success(api):
    pod(api, "proxy-ours", {**MANAGED, LABEL_PROXY_UID: "uid-1"})
    provider = make_provider(api)
    provider.delete("default/proxy-ours")
    assert "proxy-ours" not in names(api, "default") or \
        k8s.CoreV1Api(api).read_namespaced_pod("proxy-ours", "default").metadata.deletion_timestamp
    provider.delete("default/proxy-ours")
    provider.delete("default/never-existed")


# -- item 3: what runs -------------------------------------------------------------------------

def _request(image=None, port=3128):
    from app.providers.naming import instance_name, tags_for
    from app.providers.base import CreateRequest
    return CreateRequest(name=instance_name("uid-img"), tags=tags_for("uid-img"), namespace="default",
                         image=image, port=port, squid_config="http_port 3128\n")


def test_the_squid_pod_is_hardened(api):
    provider = make_provider(api)
    provider.create(_request())
    created = k8s.CoreV1Api(api).read_namespaced_pod(_request().name, "default")
    spec = created.spec
    assert spec.automount_service_account_token is False
    assert spec.security_context.seccomp_profile.type == "RuntimeDefault"
    [container] = spec.containers
    sc = container.security_context
    assert sc.allow_privilege_escalation is False
    assert sc.capabilities.drop == ["ALL"] and sc.capabilities.add == ["SETUID", "SETGID"]
    assert container.image == DEFAULT_IMAGE


def test_a_port_below_1024_keeps_net_bind_service(api):
    provider = make_provider(api)
    provider.create(_request(port=80))
    created = k8s.CoreV1Api(api).read_namespaced_pod(_request().name, "default")
    assert created.spec.containers[0].security_context.capabilities.add == ["SETUID", "SETGID", "NET_BIND_SERVICE"]


def test_only_configured_images_run(api):
    provider = make_provider(api, images=("registry.example.com/squid:6.6",))
    with pytest.raises(SpecNotAllowed, match=r"^spec.placement.image: 'evil/miner:latest' is not an image") as info:
        provider.create(_request(image="evil/miner:latest"))
    assert info.value.field == "spec.placement.image" and isinstance(info.value, Permanent)
    assert names(api, "default") == set(), "nothing was created"
    provider.create(_request(image="registry.example.com/squid:6.6"))
    created = k8s.CoreV1Api(api).read_namespaced_pod(_request().name, "default")
    assert created.spec.containers[0].image == "registry.example.com/squid:6.6"


def test_a_refused_image_fails_the_proxy_with_the_field_named(api, redis_client):
    config = ProvidersConfig((ProviderConfig("k8s-local", "kubernetes", 60, 15, KubernetesSettings()),))
    registry = build(config, {"kubernetes": lambda pc: KubernetesProvider(pc, client=api)})
    ctx = Context(kube=KubernetesGateway(api), registry=registry, redis=redis_client,
                  settings=Settings(poll_initial=5, poll_max=60, retry_initial=5, retry_max=300, quota_backoff=900))
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "miner", "namespace": "default"},
            "spec": {"provider": "k8s-local", "placement": {"image": "evil/miner:latest"}}}
    obj = k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    assert create(ctx, Ref("default", "miner", obj["metadata"]["uid"])) is None
    proxy = KubernetesGateway(api).get_proxy("default", "miner")
    cond = next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")
    assert proxy.phase == "Failed"
    assert cond["reason"] == "SpecNotAllowed"
    assert cond["message"].startswith("spec.placement.image: 'evil/miner:latest'")
    assert names(api, "default") == set()


def test_the_images_key_is_parsed_strictly():
    cfg = parse({"providers": [{"name": "k", "type": "kubernetes",
                                "kubernetes": {"images": ["registry.example.com/squid:6.6"]}}]}, "providers.yaml")
    assert cfg.providers[0].settings.allowed_images() == (DEFAULT_IMAGE, "registry.example.com/squid:6.6")
    for images, field in (("squid:6", "kubernetes.images"), (["ok", "bad image"], "kubernetes.images[1]"),
                          ([""], "kubernetes.images[0]")):
        with pytest.raises(ConfigError) as info:
            parse({"providers": [{"name": "k", "type": "kubernetes", "kubernetes": {"images": images}}]},
                  "providers.yaml")
        assert (info.value.file, info.value.provider, info.value.field) == ("providers.yaml", "k", field)
