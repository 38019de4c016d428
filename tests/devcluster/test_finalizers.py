"""The Kubernetes API fake: finalizers, deletionTimestamp and delete preconditions."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s

from devcluster.apiserver import FakeKube

G, V, P = "crawl.example.com", "v1alpha1", "proxies"
FIN = "crawl.example.com/cleanup"
pytestmark = pytest.mark.timeout(30)


def proxy(name: str, finalizers=None) -> dict:
    meta = {"name": name}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": f"{G}/{V}", "kind": "Proxy", "metadata": meta, "spec": {"provider": "k8s"}}


def events_after(kube: FakeKube, rv: str) -> list[tuple[str, str, dict]]:
    sub = kube.store.subscribe(kube.store.type_named(P), resource_version=rv)
    return [(e.type, e.name, e.obj) for e in sub.next(0)]


def test_delete_with_a_finalizer_sets_deletion_timestamp_and_keeps_the_object(kube, custom_api):
    created = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a", [FIN]))
    out = custom_api.delete_namespaced_custom_object(G, V, "default", P, "a")
    assert out["metadata"]["deletionTimestamp"] and out["metadata"]["finalizers"] == [FIN]
    got = custom_api.get_namespaced_custom_object(G, V, "default", P, "a")
    assert got["metadata"]["deletionTimestamp"] == out["metadata"]["deletionTimestamp"]
    assert got["metadata"]["generation"] == created["metadata"]["generation"] + 1  # as upstream
    assert [t for t, _, _ in events_after(kube, created["metadata"]["resourceVersion"])] == ["MODIFIED"]
    # deleting again changes nothing
    again = custom_api.delete_namespaced_custom_object(G, V, "default", P, "a")
    assert again["metadata"]["resourceVersion"] == got["metadata"]["resourceVersion"]


def test_no_new_finalizer_once_deleting(custom_api):
    custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a", [FIN]))
    custom_api.delete_namespaced_custom_object(G, V, "default", P, "a")
    with pytest.raises(k8s.ApiException) as err:
        custom_api.patch_namespaced_custom_object(G, V, "default", P, "a",
                                                  {"metadata": {"finalizers": [FIN, "other/x"]}})
    assert err.value.status == 422 and "no new finalizers" in json.loads(err.value.body)["message"]


def test_removing_the_last_finalizer_deletes_modified_then_deleted(kube, custom_api):
    custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a", [FIN, "other/x"]))
    deleting = custom_api.delete_namespaced_custom_object(G, V, "default", P, "a")
    mark = deleting["metadata"]["resourceVersion"]
    custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {"finalizers": ["other/x"]}})
    assert custom_api.get_namespaced_custom_object(G, V, "default", P, "a")["metadata"]["finalizers"] == ["other/x"]
    out = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {"finalizers": None}})
    assert "finalizers" not in out["metadata"]
    with pytest.raises(k8s.ApiException) as err:
        custom_api.get_namespaced_custom_object(G, V, "default", P, "a")
    assert err.value.status == 404
    seen = events_after(kube, mark)
    assert [t for t, _, _ in seen] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert int(seen[-1][2]["metadata"]["resourceVersion"]) > int(seen[-2][2]["metadata"]["resourceVersion"])


def test_finalizers_of_an_object_not_being_deleted_can_change_freely(custom_api):
    custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    out = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {"finalizers": [FIN]}})
    assert out["metadata"]["finalizers"] == [FIN]
    out = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {"finalizers": []}})
    assert "finalizers" not in out["metadata"]
    assert custom_api.get_namespaced_custom_object(G, V, "default", P, "a")  # still there


def test_delete_preconditions(custom_api):
    obj = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    with pytest.raises(k8s.ApiException) as err:
        custom_api.delete_namespaced_custom_object(G, V, "default", P, "a",
                                                   body={"preconditions": {"uid": "someone-else"}})
    assert err.value.status == 409
    custom_api.delete_namespaced_custom_object(G, V, "default", P, "a",
                                               body={"preconditions": {"uid": obj["metadata"]["uid"]}})
    assert custom_api.list_cluster_custom_object(G, V, P)["items"] == []


def test_a_pod_with_a_finalizer_waits_too(kube_client):
    core = k8s.CoreV1Api(kube_client)
    core.create_namespaced_pod("default", {"metadata": {"name": "p", "finalizers": ["x/y"]},
                                           "spec": {"containers": [{"name": "c", "image": "i"}]}})
    out = core.delete_namespaced_pod("p", "default")
    assert out.metadata.deletion_timestamp is not None
    core.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": None}})
    assert core.list_namespaced_pod("default").items == []
