"""The Kubernetes API fake: label selectors (equality and set-based), field selectors, paging."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from devcluster.apiserver.selectors import parse_label_selector

G, V, P = "crawl.example.com", "v1alpha1", "proxies"
pytestmark = pytest.mark.timeout(30)

LABELS = {
    "a": {"managed-by": "proxy-operator", "tier": "gold"},
    "b": {"managed-by": "proxy-operator", "tier": "silver"},
    "c": {"managed-by": "someone-else"},
    "d": {},
}


@pytest.fixture
def pods(kube_client):
    core = k8s.CoreV1Api(kube_client)
    for i, (name, labels) in enumerate(LABELS.items()):
        core.create_namespaced_pod("ns1" if i % 2 == 0 else "ns2", {
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "i"}]}})
    return core


def names(pod_list) -> list[str]:
    return sorted(p.metadata.name for p in pod_list.items)


@pytest.mark.parametrize("selector, expected", [
    ("managed-by=proxy-operator", ["a", "b"]),
    ("managed-by==proxy-operator", ["a", "b"]),
    ("managed-by!=proxy-operator", ["c", "d"]),          # != matches a missing key too
    ("managed-by=proxy-operator,tier=gold", ["a"]),
    ("tier in (gold,silver)", ["a", "b"]),
    ("tier in (bronze)", []),
    ("tier notin (gold)", ["b", "c", "d"]),
    ("tier", ["a", "b"]),
    ("!tier", ["c", "d"]),
    ("managed-by in (proxy-operator, someone-else),!tier", ["c"]),
    ("", ["a", "b", "c", "d"]),
])
def test_label_selectors_on_a_cluster_wide_list(pods, selector, expected):
    assert names(pods.list_pod_for_all_namespaces(label_selector=selector)) == expected


def test_label_selector_on_custom_objects(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    for name, labels in LABELS.items():
        api.create_namespaced_custom_object(G, V, "default", P, {
            "apiVersion": f"{G}/{V}", "kind": "Proxy", "metadata": {"name": name, "labels": labels},
            "spec": {"provider": "k8s"}})
    got = api.list_namespaced_custom_object(G, V, "default", P, label_selector="tier in (gold),managed-by")
    assert [o["metadata"]["name"] for o in got["items"]] == ["a"]


def test_bad_label_selector_is_400(pods):
    with pytest.raises(k8s.ApiException) as err:
        pods.list_pod_for_all_namespaces(label_selector="tier in gold")
    assert err.value.status == 400


def test_parse_errors_name_the_problem():
    with pytest.raises(Exception) as err:
        parse_label_selector("a=b,,c")
    assert "empty requirement" in str(err.value)


def test_field_selector_metadata_name_and_status_phase(pods):
    assert names(pods.list_pod_for_all_namespaces(field_selector="metadata.name=c")) == ["c"]
    assert names(pods.list_namespaced_pod("ns1", field_selector="metadata.name!=a")) == ["c"]
    pods.patch_namespaced_pod_status("b", "ns2", {"status": {"phase": "Running"}})
    assert names(pods.list_pod_for_all_namespaces(field_selector="status.phase=Running")) == ["b"]
    selector = "status.phase!=Running,metadata.namespace=ns2"
    assert names(pods.list_pod_for_all_namespaces(field_selector=selector)) == ["d"]


def test_unsupported_field_selector_is_400(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    with pytest.raises(k8s.ApiException) as err:
        api.list_cluster_custom_object(G, V, P, field_selector="spec.provider=k8s")
    assert err.value.status == 400 and "field label not supported" in err.value.body
    assert api.list_cluster_custom_object(G, V, P, field_selector="metadata.name=x")["items"] == []


def test_limit_and_continue_page_through_everything(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    for i in range(7):
        api.create_namespaced_custom_object(G, V, f"ns{i % 3}", P, {
            "apiVersion": f"{G}/{V}", "kind": "Proxy", "metadata": {"name": f"p{i}"}, "spec": {"provider": "k8s"}})
    seen, token, pages = [], None, 0
    while True:
        page = api.list_cluster_custom_object(G, V, P, limit=3, _continue=token)
        pages += 1
        seen += [o["metadata"]["name"] for o in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
        assert page["metadata"]["remainingItemCount"] == 7 - len(seen)
    assert pages == 3 and sorted(seen) == [f"p{i}" for i in range(7)] and len(seen) == 7
