"""The Kubernetes API fake serves ProxyPools like kube-apiserver serves the CRD.

Over HTTP with the real ``kubernetes`` client: CRUD and admission through the real CRD
(deploy/crd/proxypool.yaml), generation, the status subresource, watch, the ``scale``
subresource (``autoscaling/v1`` ``Scale``), discovery and OpenAPI entries for it, Table
answers with the printer columns.  The real ``kubectl`` (skipped when absent): ``get pxp``
and ``scale pxp/NAME --replicas=N``, ``delete`` with ``--cascade``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import requests
import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from app.resources import FINALIZER, GROUP, VERSION
from devcluster.apiserver import PROXY_POOLS
from devcluster.cluster import FakeCluster
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "deploy" / "samples" / "proxypool_kubernetes.yaml"
P = "proxypools"
NS = "default"
pytestmark = pytest.mark.timeout(60)
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None,
                                   reason="kubectl is not installed (1.27 or newer)")


@pytest.fixture()
def cluster():
    """The API fake with ProxyPool and Proxy admission through the real CRDs (no kubelet)."""
    with FakeCluster(kubelet=False, bookmark_interval=0.2) as c:
        yield c


@pytest.fixture()
def api(cluster):
    client = cluster.fake.api_client()
    yield k8s.CustomObjectsApi(client)
    client.close()


def sample() -> dict:
    return yaml.safe_load(SAMPLE.read_text())


def create(api, body: dict | None = None) -> dict:
    return api.create_namespaced_custom_object(GROUP, VERSION, NS, P, body or sample())


def get(api, name: str = "squid-k8s-pool") -> dict:
    return api.get_namespaced_custom_object(GROUP, VERSION, NS, P, name)


def test_the_served_type_matches_the_crd():
    crd = yaml.safe_load((ROOT / "deploy" / "crd" / "proxypool.yaml").read_text())
    [version] = crd["spec"]["versions"]
    scale = version["subresources"]["scale"]
    assert (PROXY_POOLS.group, PROXY_POOLS.version, PROXY_POOLS.plural, PROXY_POOLS.kind) == (
        crd["spec"]["group"], version["name"], crd["spec"]["names"]["plural"], crd["spec"]["names"]["kind"])
    assert PROXY_POOLS.short_names == tuple(crd["spec"]["names"]["shortNames"])
    assert PROXY_POOLS.status_subresource and "status" in version["subresources"]
    assert (PROXY_POOLS.scale.spec_replicas_path, PROXY_POOLS.scale.status_replicas_path,
            PROXY_POOLS.scale.label_selector_path) == (scale["specReplicasPath"], scale["statusReplicasPath"],
                                                       scale["labelSelectorPath"])


# -- CRUD, admission, status, watch ----------------------------------------------------------------

def test_create_defaults_and_rejects_like_the_crd(api):
    out = create(api)
    assert out["metadata"]["generation"] == 1 and out["metadata"]["uid"]
    assert out["spec"]["template"]["spec"]["maxLeases"] == 5 and out["spec"]["rollout"]["maxSurge"] == 1
    bad = sample()
    bad["metadata"]["name"] = "bad"
    bad["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    with pytest.raises(k8s.ApiException) as err:
        create(api, bad)
    body = json.loads(err.value.body)
    assert err.value.status == 422 and body["details"]["kind"] == "ProxyPool"
    assert "`selector` does not match template `labels`" in body["message"]


def test_spec_changes_bump_the_generation_and_status_writes_do_not(api):
    create(api)
    out = api.patch_namespaced_custom_object(GROUP, VERSION, NS, P, "squid-k8s-pool", {"spec": {"maxAge": "1h"}})
    assert out["metadata"]["generation"] == 2
    status = {"replicas": 3, "readyReplicas": 2, "leasableReplicas": 2, "updatedReplicas": 3,
              "observedGeneration": 2, "selector": "app.kubernetes.io/name=squid,crawl.example.com/team=crawlers"}
    out = api.patch_namespaced_custom_object_status(GROUP, VERSION, NS, P, "squid-k8s-pool", {"status": status})
    assert out["status"] == status and out["metadata"]["generation"] == 2
    # the main resource ignores status; the status subresource ignores spec
    out = api.patch_namespaced_custom_object(GROUP, VERSION, NS, P, "squid-k8s-pool", {"status": {"replicas": 9}})
    assert out["status"]["replicas"] == 3
    with pytest.raises(k8s.ApiException) as err:
        api.patch_namespaced_custom_object_status(GROUP, VERSION, NS, P, "squid-k8s-pool",
                                                  {"status": {"replicas": -1}})
    assert err.value.status == 422


def test_list_and_watch(cluster, api):
    create(api)
    listed = api.list_namespaced_custom_object(GROUP, VERSION, NS, P)
    assert listed["kind"] == "ProxyPoolList" and [i["metadata"]["name"] for i in listed["items"]] == ["squid-k8s-pool"]
    events = []

    def watch():
        w = k8s_watch.Watch()
        for ev in w.stream(api.list_namespaced_custom_object, GROUP, VERSION, NS, P,
                           resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=5):
            events.append((ev["type"], ev["object"]["spec"]["replicas"]))
            if len(events) == 2:
                w.stop()

    t = threading.Thread(target=watch)
    t.start()
    wait_for(lambda: cluster.fake.open_watches(P), 5, "the watch open")
    api.patch_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool", {"spec": {"replicas": 4}})
    api.delete_namespaced_custom_object(GROUP, VERSION, NS, P, "squid-k8s-pool")
    t.join(10)
    assert events == [("MODIFIED", 4), ("DELETED", 4)]


# -- the scale subresource ---------------------------------------------------------------------------

def test_get_scale(api):
    pool = create(api)
    scale = api.get_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool")
    assert scale == {"kind": "Scale", "apiVersion": "autoscaling/v1",
                     "metadata": {k: pool["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                                   "creationTimestamp")},
                     "spec": {"replicas": 3}, "status": {"replicas": 0}}
    api.patch_namespaced_custom_object_status(GROUP, VERSION, NS, P, "squid-k8s-pool",
                                              {"status": {"replicas": 2, "selector": "app=squid"}})
    scale = api.get_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool")
    assert scale["status"] == {"replicas": 2, "selector": "app=squid"}


def test_patch_scale_writes_spec_replicas_and_bumps_the_generation(api):
    create(api)
    out = api.patch_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool", {"spec": {"replicas": 5}})
    pool = get(api)
    assert out["spec"] == {"replicas": 5} and out["metadata"]["resourceVersion"] == pool["metadata"]["resourceVersion"]
    assert pool["spec"]["replicas"] == 5 and pool["metadata"]["generation"] == 2
    # the same value again is a no-op: no new resourceVersion, no new generation
    again = api.patch_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool",
                                                     {"spec": {"replicas": 5}})
    assert again["metadata"]["resourceVersion"] == out["metadata"]["resourceVersion"]
    zero = api.patch_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool", {"spec": {"replicas": 0}})
    assert zero["spec"] == {} and get(api)["spec"]["replicas"] == 0  # Go's omitempty
    assert get(api)["metadata"]["generation"] == 3


def test_put_scale_with_and_without_a_resource_version(api):
    create(api)
    scale = api.get_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool")
    scale["spec"]["replicas"] = 6
    out = api.replace_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool", scale)
    assert out["spec"]["replicas"] == 6
    with pytest.raises(k8s.ApiException) as err:  # the same (now stale) resourceVersion
        api.replace_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool", scale)
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "Conflict"
    unconditional = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "squid-k8s-pool"},
                     "spec": {"replicas": 1}}
    assert api.replace_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool",
                                                      unconditional)["spec"]["replicas"] == 1
    assert get(api)["spec"]["replicas"] == 1


@pytest.mark.parametrize("patch, status, text", [
    ({"spec": {"replicas": -1}}, 422,
     'Scale.autoscaling "squid-k8s-pool" is invalid: spec.replicas: Invalid value: -1: must be greater than or '
     "equal to 0"),
    ({"spec": {"replicas": "3"}}, 400, "is not an int32"),
    ({"metadata": {"name": "other"}}, 400, "does not match the name on the URL"),
])
def test_bad_scale_writes_are_refused(api, patch, status, text):
    create(api)
    with pytest.raises(k8s.ApiException) as err:
        api.patch_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool", patch)
    assert err.value.status == status and text in json.loads(err.value.body)["message"]
    assert get(api)["spec"]["replicas"] == 3


def test_scale_goes_through_the_crd_admission(cluster, api):
    create(api)
    calls = []
    real = cluster.fake.store._admission[PROXY_POOLS]

    def admit(obj, old, field_validation=None):
        calls.append(obj["spec"]["replicas"])
        return real(obj, old, field_validation=field_validation)

    admit.takes_field_validation = True
    cluster.fake.set_admission(P, admit)
    api.patch_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool", {"spec": {"replicas": 2}})
    assert calls == [2]


def test_scale_of_a_missing_object_or_a_type_without_one_is_404(api):
    with pytest.raises(k8s.ApiException) as err:
        api.get_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "nope")
    assert err.value.status == 404 and json.loads(err.value.body)["message"] == \
        'proxypools.crawl.example.com "nope" not found'
    with pytest.raises(k8s.ApiException) as err:
        api.get_namespaced_custom_object_scale(GROUP, VERSION, NS, "proxies", "nope")
    assert err.value.status == 404


def test_scale_requests_are_audited_and_faults_apply(cluster, api):
    create(api)
    seen = cluster.fake.audit("kubefake")
    cluster.fake.fail_next("patch", "proxypools/scale", code=500)
    with pytest.raises(k8s.ApiException) as err:
        api.patch_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool", {"spec": {"replicas": 2}})
    assert err.value.status == 500
    api.get_namespaced_custom_object_scale(GROUP, VERSION, NS, P, "squid-k8s-pool")
    assert {("patch", GROUP, "proxypools/scale", NS), ("get", GROUP, "proxypools/scale", NS)} <= seen


# -- discovery, OpenAPI, Tables ------------------------------------------------------------------------

def test_discovery_names_the_scale_subresource(cluster):
    url = cluster.fake.url
    legacy = requests.get(f"{url}/apis/{GROUP}/{VERSION}", timeout=5).json()
    entries = {r["name"]: r for r in legacy["resources"]}
    assert entries["proxypools"]["shortNames"] == ["pxp"] and entries["proxypools"]["kind"] == "ProxyPool"
    assert {k: entries["proxypools/scale"][k] for k in ("group", "version", "kind")} == {
        "group": "autoscaling", "version": "v1", "kind": "Scale"}
    assert "proxypools/status" in entries and "proxies/scale" not in entries
    agg = requests.get(f"{url}/apis", timeout=5, headers={
        "Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"}).json()
    [crawl] = [g for g in agg["items"] if g["metadata"]["name"] == GROUP]
    [pools] = [r for r in crawl["versions"][0]["resources"] if r["resource"] == "proxypools"]
    assert pools["categories"] == ["crawl"] and pools["shortNames"] == ["pxp"]
    assert {s["subresource"]: s["responseKind"] for s in pools["subresources"]} == {
        "status": {"group": GROUP, "version": VERSION, "kind": "ProxyPool"},
        "scale": {"group": "autoscaling", "version": "v1", "kind": "Scale"}}


def test_openapi_publishes_the_schema_and_the_scale_path(cluster):
    url = cluster.fake.url
    root = requests.get(f"{url}/openapi/v3", timeout=5).json()
    doc = requests.get(url + root["paths"]["apis/crawl.example.com/v1alpha1"]["serverRelativeURL"], timeout=5).json()
    schema = doc["components"]["schemas"]["com.example.crawl.v1alpha1.ProxyPool"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": GROUP, "version": VERSION, "kind": "ProxyPool"}]
    surge = schema["properties"]["spec"]["properties"]["rollout"]["properties"]["maxSurge"]
    assert surge["x-kubernetes-int-or-string"] and surge["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    path = doc["paths"]["/apis/crawl.example.com/v1alpha1/namespaces/{namespace}/proxypools/{name}/scale"]
    assert path["patch"]["x-kubernetes-group-version-kind"] == {"group": "autoscaling", "version": "v1",
                                                                "kind": "Scale"}
    assert doc["components"]["schemas"]["io.k8s.api.autoscaling.v1.Scale"]["x-kubernetes-group-version-kind"]


def test_table_has_the_printer_columns(cluster, api):
    create(api)
    api.patch_namespaced_custom_object_status(GROUP, VERSION, NS, P, "squid-k8s-pool", {"status": {
        "replicas": 3, "readyReplicas": 2, "leasableReplicas": 1, "updatedReplicas": 3, "burnedReplicas": 1,
        "recycledReplicas": 4}})
    table = requests.get(f"{cluster.fake.url}/apis/{GROUP}/{VERSION}/namespaces/{NS}/{P}", timeout=5,
                         headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}).json()
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Desired", "Ready", "Leasable", "Updated",
                                                               "Burned", "Recycled", "Age"]
    [row] = table["rows"]
    assert row["cells"][:7] == ["squid-k8s-pool", 3, 2, 1, 3, 1, 4]


# -- kubectl -----------------------------------------------------------------------------------------

@pytest.fixture()
def kubectl(cluster, tmp_path):
    """``kubectl(*args, check=True) -> CompletedProcess`` against the fake."""
    kubeconfig = cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig"))
    env = {"KUBECONFIG": kubeconfig, "KUBECACHEDIR": str(tmp_path / "kube-cache"), "HOME": str(tmp_path),
           "PATH": "/usr/bin:/bin:/usr/local/bin"}

    def run(*args: str, check: bool = True):
        res = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res

    return run


@needs_kubectl
def test_kubectl_apply_get_and_scale(cluster, api, kubectl):
    assert kubectl("apply", "-f", str(SAMPLE)).stdout.strip() == "proxypool.crawl.example.com/squid-k8s-pool created"
    api.patch_namespaced_custom_object_status(GROUP, VERSION, NS, P, "squid-k8s-pool", {"status": {
        "replicas": 3, "readyReplicas": 3, "leasableReplicas": 2, "updatedReplicas": 3}})
    lines = kubectl("get", "pxp").stdout.splitlines()
    assert lines[0].split() == ["NAME", "DESIRED", "READY", "LEASABLE", "UPDATED", "BURNED", "RECYCLED", "AGE"]
    assert lines[1].split()[:5] == ["squid-k8s-pool", "3", "3", "2", "3"]

    out = kubectl("scale", "pxp/squid-k8s-pool", "--replicas=5").stdout
    assert out.strip() == "proxypool.crawl.example.com/squid-k8s-pool scaled"
    pool = get(api)
    assert pool["spec"]["replicas"] == 5 and pool["metadata"]["generation"] == 2
    assert cluster.fake.request_count("patch", "proxypools/scale") == 1

    # with a precondition kubectl reads the Scale and PUTs it back
    kubectl("scale", "proxypool", "squid-k8s-pool", "--current-replicas=5", "--replicas=2")
    assert get(api)["spec"]["replicas"] == 2 and cluster.fake.request_count("update", "proxypools/scale") == 1
    res = kubectl("scale", "pxp/squid-k8s-pool", "--current-replicas=5", "--replicas=4", check=False)
    assert res.returncode == 1 and "Expected replicas to be 5, was 2" in res.stderr
    assert "squid-k8s-pool" in kubectl("get", "crawl", "-o", "name").stdout  # the category


@needs_kubectl
def test_kubectl_delete_cascade_foreground_waits_for_the_members(cluster, api, kubectl):
    pool = create(api)
    ref = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "name": pool["metadata"]["name"],
           "uid": pool["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    api.create_namespaced_custom_object(GROUP, VERSION, NS, "proxies", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
        "metadata": {"name": "member", "finalizers": [FINALIZER], "ownerReferences": [ref]},
        "spec": {"provider": "k8s-local"}})
    kubectl("delete", "pxp", "squid-k8s-pool", "--cascade=foreground", "--wait=false")
    wait_for(lambda: api.get_namespaced_custom_object(GROUP, VERSION, NS, "proxies", "member")["metadata"].get(
        "deletionTimestamp"), 10, "the member deleting")
    assert get(api)["metadata"]["finalizers"] == ["foregroundDeletion"]
    api.patch_namespaced_custom_object(GROUP, VERSION, NS, "proxies", "member", {"metadata": {"finalizers": None}})
    wait_for(lambda: kubectl("get", "pxp", "-o", "name").stdout.strip() == "", 10, "the pool gone")
