"""The Kubernetes API fake: create/get/list/delete, naming and built-in type behaviour."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s


G, V, P = "crawl.example.com", "v1alpha1", "proxies"
pytestmark = pytest.mark.timeout(30)


def proxy(name: str | None = None, **spec) -> dict:
    meta = {"name": name} if name else {}
    return {"apiVersion": f"{G}/{V}", "kind": "Proxy", "metadata": meta, "spec": spec or {"provider": "k8s"}}


def status_of(exc: k8s.ApiException) -> dict:
    return json.loads(exc.body)


def test_create_returns_the_object_with_server_fields(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    obj = api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    meta = obj["metadata"]
    assert meta["name"] == "a" and meta["namespace"] == "default"
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1 and int(meta["resourceVersion"]) > 0
    assert api.get_namespaced_custom_object(G, V, "default", P, "a") == obj


def test_create_answers_201(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    _, code, _ = api.create_namespaced_custom_object_with_http_info(G, V, "default", P, proxy("a"))
    assert code == 201


def test_generate_name(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    body = proxy()
    body["metadata"]["generateName"] = "px-"
    names = {api.create_namespaced_custom_object(G, V, "default", P, body)["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3 and all(n.startswith("px-") and len(n) == 8 for n in names)


def test_create_twice_is_409_already_exists(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    with pytest.raises(k8s.ApiException) as err:
        api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    assert err.value.status == 409 and status_of(err.value)["reason"] == "AlreadyExists"


def test_get_missing_is_404_with_a_status_body(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    with pytest.raises(k8s.ApiException) as err:
        api.get_namespaced_custom_object(G, V, "default", P, "nope")
    body = status_of(err.value)
    assert err.value.status == 404
    assert body["kind"] == "Status" and body["reason"] == "NotFound" and body["code"] == 404
    assert body["message"] == 'proxies.crawl.example.com "nope" not found'
    assert body["details"] == {"name": "nope", "group": G, "kind": P}


def test_bad_name_is_422_invalid(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    with pytest.raises(k8s.ApiException) as err:
        api.create_namespaced_custom_object(G, V, "default", P, proxy("Bad_Name"))
    body = status_of(err.value)
    assert err.value.status == 422 and body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "metadata.name"


def test_namespace_mismatch_and_missing_kind_are_400(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    body = proxy("a")
    body["metadata"]["namespace"] = "other"
    with pytest.raises(k8s.ApiException) as err:
        api.create_namespaced_custom_object(G, V, "default", P, body)
    assert err.value.status == 400
    body = proxy("b")
    del body["kind"]
    with pytest.raises(k8s.ApiException) as err:
        api.create_namespaced_custom_object(G, V, "default", P, body)
    assert err.value.status == 400 and "Kind" in status_of(err.value)["message"]


def test_resource_version_on_create_is_rejected(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    body = proxy("a")
    body["metadata"]["resourceVersion"] = "5"
    with pytest.raises(k8s.ApiException) as err:
        api.create_namespaced_custom_object(G, V, "default", P, body)
    assert err.value.status == 400


def test_cluster_wide_list_spans_namespaces(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    api.create_namespaced_custom_object(G, V, "ns-a", P, proxy("a"))
    api.create_namespaced_custom_object(G, V, "ns-b", P, proxy("b"))
    every = api.list_cluster_custom_object(G, V, P)
    assert every["kind"] == "ProxyList"
    keys = [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in every["items"]]
    assert keys == [("ns-a", "a"), ("ns-b", "b")]
    assert [o["metadata"]["name"] for o in api.list_namespaced_custom_object(G, V, "ns-b", P)["items"]] == ["b"]
    newest = max(int(o["metadata"]["resourceVersion"]) for o in every["items"])
    assert int(every["metadata"]["resourceVersion"]) >= newest


def test_delete_without_finalizers_removes_the_object(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    api.create_namespaced_custom_object(G, V, "default", P, proxy("a"))
    out = api.delete_namespaced_custom_object(G, V, "default", P, "a")
    assert out["status"] == "Success"
    with pytest.raises(k8s.ApiException) as err:
        api.get_namespaced_custom_object(G, V, "default", P, "a")
    assert err.value.status == 404
    with pytest.raises(k8s.ApiException) as err:
        api.delete_namespaced_custom_object(G, V, "default", P, "a")
    assert err.value.status == 404


def test_cluster_scoped_provider_health(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    body = {"apiVersion": f"{G}/{V}", "kind": "ProviderHealth",
            "metadata": {"name": "k8s-local", "labels": {"app.kubernetes.io/managed-by": "proxy-operator"}}}
    created = api.create_cluster_custom_object(G, V, "providerhealths", body)
    assert "namespace" not in created["metadata"]
    api.patch_cluster_custom_object_status(G, V, "providerhealths", "k8s-local",
                                           {"status": {"readyTargets": 1, "totalTargets": 1}})
    got = api.get_cluster_custom_object(G, V, "providerhealths", "k8s-local")
    assert got["status"] == {"readyTargets": 1, "totalTargets": 1}
    listed = api.list_cluster_custom_object(G, V, "providerhealths",
                                            label_selector="app.kubernetes.io/managed-by=proxy-operator")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["k8s-local"]
    api.delete_cluster_custom_object(G, V, "providerhealths", "k8s-local")
    assert api.list_cluster_custom_object(G, V, "providerhealths")["items"] == []


def test_pod_create_is_pending_and_validated(kube_client):
    core = k8s.CoreV1Api(kube_client)
    pod = core.create_namespaced_pod("default", k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p", labels={"app": "squid"}),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="squid", image="ubuntu/squid:latest")])))
    assert pod.status.phase == "Pending" and pod.status.pod_ip is None
    assert pod.spec.restart_policy == "Always"
    with pytest.raises(k8s.ApiException) as err:
        core.create_namespaced_pod("default", {"metadata": {"name": "q"}, "spec": {"containers": []}})
    assert err.value.status == 422 and "spec.containers" in status_of(err.value)["message"]


def test_pod_spec_is_immutable_but_image_may_change(kube_client):
    core = k8s.CoreV1Api(kube_client)
    core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "a:1", "ports": [{"containerPort": 3128}]}]}})
    core.patch_namespaced_pod("p", "default", {"spec": {"containers": [{"name": "c", "image": "a:2",
                                                                        "ports": [{"containerPort": 3128}]}]}})
    assert core.read_namespaced_pod("p", "default").spec.containers[0].image == "a:2"
    with pytest.raises(k8s.ApiException) as err:
        core.patch_namespaced_pod("p", "default", {"spec": {"hostname": "other"}})
    assert err.value.status == 422


def test_pod_delete_returns_the_pod(kube_client):
    core = k8s.CoreV1Api(kube_client)
    core.create_namespaced_pod("default", {"metadata": {"name": "p"},
                                           "spec": {"containers": [{"name": "c", "image": "i"}]}})
    out = core.delete_namespaced_pod("p", "default")
    assert out.metadata.name == "p"
    assert core.list_namespaced_pod("default").items == []


def test_secret_string_data_becomes_data(kube_client):
    core = k8s.CoreV1Api(kube_client)
    core.create_namespaced_secret("default", {"metadata": {"name": "s"},
                                              "stringData": {"user-data": "#cloud-config\n"}})
    secret = core.read_namespaced_secret("s", "default")
    assert secret.data == {"user-data": "I2Nsb3VkLWNvbmZpZwo="} and secret.string_data is None
    assert secret.type == "Opaque"


def test_events_v1_requires_its_fields(kube, kube_client):
    import urllib.error
    import urllib.request

    # the typed client refuses this body itself, so send it raw
    req = urllib.request.Request(kube.url + "/apis/events.k8s.io/v1/namespaces/default/events", method="POST",
                                 data=json.dumps({"metadata": {"name": "e"}, "reason": "Created"}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req)
    fields = {c["field"] for c in json.load(err.value)["details"]["causes"]}
    assert err.value.code == 422 and {"eventTime", "reportingController", "action", "type"} <= fields
    events = k8s.EventsV1Api(kube_client)
    ok = events.create_namespaced_event("default", {
        "metadata": {"generateName": "px."}, "eventTime": "2024-01-01T00:00:00.000000Z",
        "reportingController": "crawl.example.com/proxy-operator", "reportingInstance": "w-1",
        "action": "Provision", "reason": "Provisioning", "type": "Normal", "note": "created",
        "regarding": {"kind": "Proxy", "name": "a", "namespace": "default"}})
    assert ok.metadata.name.startswith("px.")


def test_core_events_and_leases(kube_client):
    core = k8s.CoreV1Api(kube_client)
    ev = core.create_namespaced_event("default", {
        "metadata": {"name": "e1"}, "reason": "Ready", "message": "m",
        "involvedObject": {"kind": "Proxy", "name": "a", "namespace": "default"}})
    assert ev.involved_object.name == "a"
    coord = k8s.CoordinationV1Api(kube_client)
    lease = coord.create_namespaced_lease("default", {"metadata": {"name": "l"}, "spec": {
        "holderIdentity": "me", "leaseDurationSeconds": 15}})
    assert lease.spec.holder_identity == "me"
    with pytest.raises(k8s.ApiException) as err:
        coord.create_namespaced_lease("default", {"metadata": {"name": "m"}, "spec": {"leaseDurationSeconds": 0}})
    assert err.value.status == 422


def test_dry_run_does_not_persist(kube_client):
    api = k8s.CustomObjectsApi(kube_client)
    out = api.create_namespaced_custom_object(G, V, "default", P, proxy("a"), dry_run="All")
    assert out["metadata"]["name"] == "a"
    assert api.list_cluster_custom_object(G, V, P)["items"] == []


def test_required_namespace_is_enforced_when_asked():
    from devcluster.apiserver import FakeKube

    with FakeKube(require_namespaces=True) as fake:
        client = fake.api_client()
        api = k8s.CustomObjectsApi(client)
        with pytest.raises(k8s.ApiException) as err:
            api.create_namespaced_custom_object(G, V, "nowhere", P, proxy("a"))
        assert err.value.status == 404
        k8s.CoreV1Api(client).create_namespace({"metadata": {"name": "nowhere"}})
        assert api.create_namespaced_custom_object(G, V, "nowhere", P, proxy("a"))["metadata"]["name"] == "a"
        client.close()


def test_unknown_paths_are_404_and_discovery_answers(kube, kube_client):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(kube.url + "/apis/crawl.example.com/v1alpha1/widgets")
    assert err.value.code == 404
    groups = json.load(urllib.request.urlopen(kube.url + "/apis"))
    assert "crawl.example.com" in [g["name"] for g in groups["groups"]]
    res = json.load(urllib.request.urlopen(kube.url + "/apis/crawl.example.com/v1alpha1"))
    assert {"proxies", "proxies/status", "providerhealths"} <= {r["name"] for r in res["resources"]}
