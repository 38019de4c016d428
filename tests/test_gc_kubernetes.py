"""GC on the kubernetes provider against the API fake: orphans go, everything else stays."""

from __future__ import annotations

from kubernetes import client as k8s

from app.config.providers import ProviderConfig
from app.proxy.gc import collect
from app.kube.gateway import KubernetesGateway
from app.providers.kubernetes.config import KubernetesSettings
from app.providers.kubernetes.provider import LABEL_MANAGED_BY, LABEL_PROXY_UID, KubernetesProvider
from app.resources import GROUP, PLURAL, VERSION


def pod(api, name, labels, namespace="default"):
    k8s.CoreV1Api(api).create_namespaced_pod(namespace, k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="i")])))


def test_gc_deletes_only_orphans_across_namespaces(api):
    live = k8s.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL,
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "live"},
         "spec": {"provider": "k8s"}})["metadata"]["uid"]
    managed = {LABEL_MANAGED_BY: "proxy-operator"}
    pod(api, "ours-live", {**managed, LABEL_PROXY_UID: live})
    pod(api, "ours-orphan", {**managed, LABEL_PROXY_UID: "gone-uid"}, namespace="other")
    pod(api, "ours-abandoned", {**managed, LABEL_PROXY_UID: "abandoned-uid"})
    pod(api, "foreign", {LABEL_PROXY_UID: "gone-uid"})
    pod(api, "foreign-other-manager", {LABEL_MANAGED_BY: "helm", LABEL_PROXY_UID: "gone-uid"})
    provider = KubernetesProvider(ProviderConfig("k8s", "kubernetes", 60, 15, KubernetesSettings()), client=api)
    kube = KubernetesGateway(api)

    # Within the grace period nothing is old enough.
    report = collect("k8s", provider, kube.list_proxy_refs, abandoned={"abandoned-uid"}, grace_seconds=3600)
    assert report.listed == 3 and report.deleted == []

    report = collect("k8s", provider, kube.list_proxy_refs, abandoned={"abandoned-uid"}, grace_seconds=0)
    assert report.deleted == ["other/ours-orphan"]
    left = {p.metadata.name for p in k8s.CoreV1Api(api).list_pod_for_all_namespaces().items}
    assert left == {"ours-live", "ours-abandoned", "foreign", "foreign-other-manager"}
