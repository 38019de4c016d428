"""The Kubernetes API fake: updates, patches, resourceVersion conflicts, generation and /status."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s


G, V, P = "crawl.example.com", "v1alpha1", "proxies"
JSON_PATCH = "application/json-patch+json"
pytestmark = [pytest.mark.timeout(30),
              pytest.mark.no_crd_admission("the store's generic write semantics, with Proxies as plain custom objects")]


def proxy(name: str, **spec) -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "Proxy", "metadata": {"name": name},
            "spec": spec or {"provider": "k8s"}}


def rv(obj: dict) -> int:
    return int(obj["metadata"]["resourceVersion"])


def test_resource_version_is_global_and_monotonic(custom_api, kube_client):
    a = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    pod = k8s.CoreV1Api(kube_client).create_namespaced_pod(
        "other", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    b = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("b"))
    assert rv(a) < int(pod.metadata.resource_version) < rv(b)


def test_put_with_stale_resource_version_is_409(custom_api):
    first = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    fresh = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {"labels": {"x": "1"}}})
    first["spec"]["provider"] = "other"
    with pytest.raises(k8s.ApiException) as err:
        custom_api.replace_namespaced_custom_object(G, V, "default", P, "a", first)
    body = json.loads(err.value.body)
    assert err.value.status == 409 and body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]
    fresh["spec"]["provider"] = "other"
    out = custom_api.replace_namespaced_custom_object(G, V, "default", P, "a", fresh)
    assert out["spec"]["provider"] == "other" and rv(out) > rv(fresh)


def test_merge_patch_carrying_a_stale_resource_version_is_409(custom_api):
    first = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {"labels": {"x": "1"}}})
    stale = {"metadata": {"finalizers": ["crawl.example.com/cleanup"],
                          "resourceVersion": first["metadata"]["resourceVersion"]}}
    with pytest.raises(k8s.ApiException) as err:
        custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", stale)
    assert err.value.status == 409
    # without a resourceVersion the patch applies to whatever is stored
    out = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {"finalizers": ["f/x"]}})
    assert out["metadata"]["finalizers"] == ["f/x"] and out["metadata"]["labels"] == {"x": "1"}


def test_status_patch_with_stale_resource_version_is_409(custom_api):
    first = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    custom_api.patch_namespaced_custom_object_status(G, V, "default", P, "a", {"status": {"phase": "Provisioning"}})
    with pytest.raises(k8s.ApiException) as err:
        custom_api.patch_namespaced_custom_object_status(G, V, "default", P, "a", {
            "metadata": {"resourceVersion": first["metadata"]["resourceVersion"]}, "status": {"phase": "Failed"}})
    assert err.value.status == 409


def test_put_of_a_custom_resource_needs_a_resource_version(custom_api):
    obj = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    del obj["metadata"]["resourceVersion"]
    with pytest.raises(k8s.ApiException) as err:
        custom_api.replace_namespaced_custom_object(G, V, "default", P, "a", obj)
    assert err.value.status == 422 and "metadata.resourceVersion" in err.value.body


def test_a_no_op_write_keeps_the_resource_version(custom_api):
    obj = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    same = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"spec": {"provider": "k8s"}})
    assert rv(same) == rv(obj)


def test_merge_patch_semantics(custom_api):
    custom_api.create_namespaced_custom_object(G, V, "default", P, proxy(
        "a", provider="k8s", placement={"zone": "z1", "image": "i"}))
    patch = {"spec": {"placement": {"zone": None, "machineType": "m"}}}
    out = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", patch)
    assert out["spec"]["placement"] == {"image": "i", "machineType": "m"}


def test_json_patch_with_a_test_operation(custom_api, kube_client):
    custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    out = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", [
        {"op": "test", "path": "/spec/provider", "value": "k8s"},
        {"op": "add", "path": "/metadata/labels", "value": {"tier": "a"}}], _content_type=JSON_PATCH)
    assert out["metadata"]["labels"] == {"tier": "a"}
    with pytest.raises(k8s.ApiException) as err:
        custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", [
            {"op": "test", "path": "/spec/provider", "value": "gcp"}], _content_type=JSON_PATCH)
    assert err.value.status == 422


def test_strategic_merge_is_refused_for_custom_resources(kube, custom_api):
    import urllib.error
    import urllib.request

    custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    req = urllib.request.Request(f"{kube.url}/apis/{G}/{V}/namespaces/default/{P}/a", method="PATCH",
                                 data=b'{"spec":{"provider":"x"}}',
                                 headers={"Content-Type": "application/strategic-merge-patch+json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req)
    assert err.value.code == 415


def test_strategic_merge_merges_pod_containers_by_name(kube_client):
    core = k8s.CoreV1Api(kube_client)
    core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "a", "image": "a:1", "ports": [{"containerPort": 3128}]}, {"name": "b", "image": "b:1"}]}})
    out = core.patch_namespaced_pod("p", "default", {"spec": {"containers": [{"name": "b", "image": "b:2"}]}})
    assert [(c.name, c.image) for c in out.spec.containers] == [("a", "a:1"), ("b", "b:2")]
    assert out.spec.containers[0].ports[0].container_port == 3128


def test_generation_bumps_on_spec_changes_only(custom_api):
    obj = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    assert obj["metadata"]["generation"] == 1
    obj = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {"labels": {"a": "b"},
                                                                                        "annotations": {"n": "v"}}})
    assert obj["metadata"]["generation"] == 1
    obj = custom_api.patch_namespaced_custom_object_status(G, V, "default", P, "a", {"status": {"phase": "Running"}})
    assert obj["metadata"]["generation"] == 1
    obj = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"spec": {"maxLeases": 0}})
    assert obj["metadata"]["generation"] == 2
    obj["spec"]["maxLeases"] = 3
    obj = custom_api.replace_namespaced_custom_object(G, V, "default", P, "a", obj)
    assert obj["metadata"]["generation"] == 3


def test_create_drops_status_of_a_custom_resource(custom_api):
    body = proxy("a")
    body["status"] = {"phase": "Ready"}
    assert "status" not in custom_api.create_namespaced_custom_object(G, V, "default", P, body)


def test_main_resource_writes_ignore_status(custom_api):
    custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    custom_api.patch_namespaced_custom_object_status(G, V, "default", P, "a", {"status": {"phase": "Running"}})
    out = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"status": {"phase": "Failed"},
                                                                              "metadata": {"labels": {"l": "1"}}})
    assert out["status"] == {"phase": "Running"} and out["metadata"]["labels"] == {"l": "1"}
    out["status"] = {"phase": "Failed"}
    out = custom_api.replace_namespaced_custom_object(G, V, "default", P, "a", out)
    assert out["status"] == {"phase": "Running"}


def test_status_writes_change_only_status(custom_api):
    custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    out = custom_api.patch_namespaced_custom_object_status(G, V, "default", P, "a", {
        "spec": {"provider": "evil"}, "metadata": {"labels": {"l": "1"}},
        "status": {"phase": "Provisioning", "providerID": "default/proxy-x"}})
    assert out["spec"] == {"provider": "k8s"} and "labels" not in out["metadata"]
    assert out["status"] == {"phase": "Provisioning", "providerID": "default/proxy-x"}
    out["status"]["phase"] = "Running"
    out["spec"]["provider"] = "evil"
    out = custom_api.replace_namespaced_custom_object_status(G, V, "default", P, "a", out)
    assert out["status"]["phase"] == "Running" and out["spec"] == {"provider": "k8s"}
    # a merge patch of status merges into the stored status
    out = custom_api.patch_namespaced_custom_object_status(G, V, "default", P, "a", {"status": {"address": "10.0.0.1"}})
    assert out["status"] == {"phase": "Running", "providerID": "default/proxy-x", "address": "10.0.0.1"}


def test_pod_status_goes_through_its_subresource(kube_client):
    core = k8s.CoreV1Api(kube_client)
    core.create_namespaced_pod("default", {"metadata": {"name": "p"},
                                           "spec": {"containers": [{"name": "c", "image": "i"}]}})
    out = core.patch_namespaced_pod("p", "default", {"status": {"phase": "Running"}})
    assert out.status.phase == "Pending"
    out = core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running", "podIP": "10.42.0.9"}})
    assert out.status.phase == "Running" and out.status.pod_ip == "10.42.0.9"


def test_name_in_body_must_match_the_url(custom_api):
    obj = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    obj["metadata"]["name"] = "b"
    with pytest.raises(k8s.ApiException) as err:
        custom_api.replace_namespaced_custom_object(G, V, "default", P, "a", obj)
    assert err.value.status == 400


def test_system_metadata_cannot_be_overwritten(custom_api):
    obj = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    out = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {
        "uid": obj["metadata"]["uid"], "generation": 99, "creationTimestamp": "2000-01-01T00:00:00Z"}})
    for key in ("uid", "generation", "creationTimestamp"):
        assert out["metadata"][key] == obj["metadata"][key]


def test_a_uid_in_the_body_is_a_precondition(custom_api):
    # kube-apiserver: a PATCH naming another UID fails validation (metadata.uid is immutable,
    # 422; what a ReplicaSet's release of a Pod relies on), a PUT fails its UID precondition (409)
    obj = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    with pytest.raises(k8s.ApiException) as err:
        custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"metadata": {
            "uid": "forged", "labels": {"x": "1"}}})
    assert err.value.status == 422 and "metadata.uid" in json.loads(err.value.body)["message"]
    obj["metadata"]["uid"] = "forged"
    with pytest.raises(k8s.ApiException) as err:
        custom_api.replace_namespaced_custom_object(G, V, "default", P, "a", obj)
    assert err.value.status == 409 and "Precondition failed" in json.loads(err.value.body)["message"]
    assert "labels" not in custom_api.get_namespaced_custom_object(G, V, "default", P, "a")["metadata"]


def test_a_merge_patch_of_owner_references_replaces_the_list(custom_api, kube_client):
    core = k8s.CoreV1Api(kube_client)
    owners = [{"apiVersion": "v1", "kind": "Secret", "name": n, "controller": n == "a",
               "uid": core.create_namespaced_secret("default", {"metadata": {"name": n}}).metadata.uid}
              for n in ("a", "b")]
    body = proxy("p")
    body["metadata"]["ownerReferences"] = owners
    obj = custom_api.create_namespaced_custom_object(G, V, "default", P, body)
    out = custom_api.patch_namespaced_custom_object(G, V, "default", P, "p", {"metadata": {
        "ownerReferences": owners[1:], "resourceVersion": obj["metadata"]["resourceVersion"],
        "uid": obj["metadata"]["uid"]}})
    assert out["metadata"]["ownerReferences"] == owners[1:]
    out = custom_api.patch_namespaced_custom_object(G, V, "default", P, "p", {"metadata": {"ownerReferences": None}})
    assert "ownerReferences" not in out["metadata"]
