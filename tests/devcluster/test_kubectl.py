"""The real ``kubectl`` against the API fake: what a user types works as against kube-apiserver.

Each test runs the kubectl binary (skipped, saying how to get it, when it is not installed)
with a kubeconfig from :meth:`FakeKube.write_kubeconfig` and a private discovery cache:
apply with validation (OpenAPI v3 from the CRDs; ``fieldValidation=Strict`` refusals; an
unknown kind or version refused in kube-apiserver's words, through OpenAPI v2 as protobuf),
``explain``, ``get`` with the CRD's printer columns (Table answers, also on ``-w``),
server-side apply with field managers and conflicts, ``wait`` for a condition and for
deletion, ``describe`` with Events, ``delete``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from kubernetes import client as k8s

from app.resources import GROUP, PLURAL, VERSION
from devcluster.cluster import FakeCluster
from tests.support.kubectl import Kubectl, needs_kubectl

pytestmark = [pytest.mark.timeout(60), needs_kubectl]
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "deploy" / "samples" / "proxy_kubernetes.yaml"


@pytest.fixture()
def cluster():
    """The API fake with Proxy admission through the real CRD (no kubelet)."""
    with FakeCluster(kubelet=False) as c:
        yield c


@pytest.fixture()
def kubectl(cluster, tmp_path) -> Kubectl:
    """``kubectl(*args, check=True, input=None) -> CompletedProcess`` against the fake."""
    return Kubectl(cluster.fake, tmp_path)


def _custom(cluster) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(cluster.fake.api_client())


def _set_status(cluster, name: str, status: dict) -> None:
    _custom(cluster).patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, name,
                                                           {"status": status})


def _ready_status(ready: str = "True") -> dict:
    cond = {"lastTransitionTime": "2030-01-01T00:00:00Z", "message": "probe ok", "reason": "ProbeOK"}
    return {"phase": "Ready", "address": "10.42.0.17", "egressIP": "203.0.113.9", "bannedTargets": 2,
            "conditions": [{**cond, "type": "Healthy", "status": ready}, {**cond, "type": "Ready", "status": ready}]}


def test_apply_with_validation_and_get_shows_the_printer_columns(cluster, kubectl):
    out = kubectl("apply", "-f", str(SAMPLE))
    assert out.stdout.strip() == "proxy.crawl.example.com/squid-k8s-1 created"
    # validation on: kubectl read the OpenAPI v3 document and left field checks to the server
    assert cluster.fake.request_count("create", "proxies") == 1
    _set_status(cluster, "squid-k8s-1", _ready_status())
    lines = kubectl("get", "px").stdout.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "PROVIDER", "ADDRESS", "EGRESS", "IP", "HEALTHY", "BURNED", "AGE"]
    cells = lines[1].split()
    assert cells[:7] == ["squid-k8s-1", "Ready", "k8s-local", "10.42.0.17", "203.0.113.9", "True", "2"]
    assert cells[7].endswith("s")  # the age, e.g. "0s"


def test_apply_refuses_unknown_fields_and_rule_violations(kubectl, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: bad}\n"
                   "spec: {provider: k8s-local, replicas: 3}\n")
    res = kubectl("apply", "-f", str(bad), check=False)
    assert res.returncode == 1
    assert 'strict decoding error: unknown field "spec.replicas"' in res.stderr
    bad.write_text("apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: bad}\n"
                   "spec: {mode: External}\n")
    res = kubectl("apply", "-f", str(bad), check=False)
    assert res.returncode == 1 and "is invalid" in res.stderr and "spec" in res.stderr
    assert kubectl("get", "px", "-o", "name").stdout.strip() == ""


@pytest.mark.parametrize("api_version, kind", [(f"{GROUP}/{VERSION}", "Proxi"), (f"{GROUP}/v1alpha2", "Proxy")])
def test_apply_of_an_unknown_kind_or_version_answers_as_a_real_server(kubectl, tmp_path, api_version, kind):
    manifest = tmp_path / "typo.yaml"
    manifest.write_text(f"apiVersion: {api_version}\nkind: {kind}\nmetadata: {{name: typo}}\n"
                        "spec: {provider: k8s-local}\n")
    res = kubectl("apply", "-f", str(manifest), check=False)
    assert res.returncode == 1
    # kubectl validated with OpenAPI v2 (protobuf), found no schema for the kind, and the REST
    # mapping refused it: the words of kubectl against kube-apiserver
    assert f'no matches for kind "{kind}" in version "{api_version}"' in res.stderr, res.stderr
    assert "ensure CRDs are installed first" in res.stderr
    assert "failed to download openapi" not in res.stderr and "failed to check CRD" not in res.stderr
    assert kubectl("get", "px", "-o", "name").stdout.strip() == ""


def test_explain_reads_the_crd_schema(kubectl):
    out = kubectl("explain", "proxy.spec").stdout
    assert "KIND:       Proxy" in out and "VERSION:    v1alpha1" in out
    assert "maxLeases\t<integer>" in out and "healthCheck\t<Object>" in out
    leaf = kubectl("explain", "px.spec.maxLeases").stdout
    assert "FIELD: maxLeases <integer>" in leaf and "drain" in leaf


def test_get_watch_prints_rows_as_they_change(cluster, kubectl):
    proc = kubectl.popen("get", "px", "-w")
    try:
        time.sleep(1.0)
        kubectl("apply", "-f", str(SAMPLE))
        time.sleep(0.5)
        _set_status(cluster, "squid-k8s-1", _ready_status())
        time.sleep(1.5)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert lines[0][:3] == ["NAME", "PHASE", "PROVIDER"]
    assert ["squid-k8s-1", "k8s-local"] == lines[1][:2]
    assert lines[-1][:6] == ["squid-k8s-1", "Ready", "k8s-local", "10.42.0.17", "203.0.113.9", "True"]


def test_server_side_apply_managers_and_conflicts(cluster, kubectl, tmp_path):
    out = kubectl("apply", "--server-side", "-f", str(SAMPLE)).stdout
    assert "serverside-applied" in out
    obj = _custom(cluster).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-k8s-1")
    [entry] = obj["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"], entry["fieldsType"]) == ("kubectl", "Apply", "FieldsV1")
    assert "f:maxLeases" in entry["fieldsV1"]["f:spec"]

    changed = tmp_path / "changed.yaml"
    changed.write_text(SAMPLE.read_text().replace("maxLeases: 5 ", "maxLeases: 7 "))
    res = kubectl("apply", "--server-side", "--field-manager=crawler-team", "-f", str(changed), check=False)
    assert res.returncode == 1
    assert ('Apply failed with 1 conflict: conflict with "kubectl" using crawl.example.com/v1alpha1: '
            '.spec.maxLeases') in res.stderr
    assert "--force-conflicts" in res.stderr  # kubectl recognised the server's conflict

    kubectl("apply", "--server-side", "--field-manager=crawler-team", "--force-conflicts", "-f", str(changed))
    obj = _custom(cluster).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-k8s-1")
    assert obj["spec"]["maxLeases"] == 7
    owners = {e["manager"]: e["fieldsV1"]["f:spec"] for e in obj["metadata"]["managedFields"]}
    assert "f:maxLeases" in owners["crawler-team"] and "f:maxLeases" not in owners["kubectl"]
    assert "f:provider" in owners["kubectl"] and "f:provider" in owners["crawler-team"]  # equal values: shared

    # the first manager re-applying its old value now conflicts with the new owner
    res = kubectl("apply", "--server-side", "-f", str(SAMPLE), check=False)
    assert res.returncode == 1 and 'conflict with "crawler-team"' in res.stderr


def test_wait_for_condition_and_for_delete(cluster, kubectl):
    kubectl("apply", "-f", str(SAMPLE))
    waiter = kubectl.popen("wait", "--for=condition=Ready", "px/squid-k8s-1", "--timeout=20s")
    time.sleep(1.0)
    assert waiter.poll() is None  # not Ready yet
    _set_status(cluster, "squid-k8s-1", _ready_status())
    out, _ = waiter.communicate(timeout=20)
    assert waiter.returncode == 0, out
    assert "proxy.crawl.example.com/squid-k8s-1 condition met" in out

    res = kubectl("wait", "--for=condition=Ready=False", "px/squid-k8s-1", "--timeout=1s", check=False)
    assert res.returncode == 1 and "timed out" in res.stderr

    # a finalizer holds the object: wait --for=delete returns once it is really gone
    _custom(cluster).patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-k8s-1",
                                                    {"metadata": {"finalizers": ["crawl.example.com/cleanup"]}})
    kubectl("delete", "px", "squid-k8s-1", "--wait=false")
    waiter = kubectl.popen("wait", "--for=delete", "px/squid-k8s-1", "--timeout=20s")
    time.sleep(1.0)
    assert waiter.poll() is None
    _custom(cluster).patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-k8s-1",
                                                    {"metadata": {"finalizers": None}})
    out, _ = waiter.communicate(timeout=20)
    assert waiter.returncode == 0, out


def test_describe_shows_conditions_and_events(cluster, kubectl):
    kubectl("apply", "-f", str(SAMPLE))
    _set_status(cluster, "squid-k8s-1", _ready_status())
    obj = _custom(cluster).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-k8s-1")
    core = k8s.CoreV1Api(cluster.fake.api_client())
    for name, uid, reason in (("squid-k8s-1", obj["metadata"]["uid"], "BecameReady"),
                              ("squid-k8s-1", "an-older-proxy-uid", "FromAnOldProxy"),
                              ("other", "x", "NotThisOne")):
        core.create_namespaced_event("default", {
            "metadata": {"generateName": f"{name}."}, "reason": reason, "type": "Normal",
            "message": f"{reason} message", "source": {"component": "proxy-operator"}, "count": 1,
            "firstTimestamp": "2030-01-01T00:00:00Z", "lastTimestamp": "2030-01-01T00:00:00Z",
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "name": name,
                               "namespace": "default", "uid": uid}})
    out = kubectl("describe", "px", "squid-k8s-1").stdout
    assert "Phase:" in out and "Ready" in out and "Conditions:" in out
    events = out.split("Events:", 1)[1]
    assert "BecameReady" in events and "BecameReady message" in events and "proxy-operator" in events
    assert "FromAnOldProxy" not in events and "NotThisOne" not in events  # selected by name and uid


def test_delete(cluster, kubectl):
    kubectl("apply", "-f", str(SAMPLE))
    out = kubectl("delete", "-f", str(SAMPLE)).stdout
    assert 'proxy.crawl.example.com "squid-k8s-1" deleted' in out
    assert cluster.fake.store.items("proxies") == []


def test_openapi_documents_and_tables_over_http(cluster):
    """The documents kubectl reads, checked directly (content types, GVK extensions, Table shape)."""
    import requests

    url = cluster.fake.url
    root = requests.get(f"{url}/openapi/v3", timeout=5).json()
    gv = root["paths"]["apis/crawl.example.com/v1alpha1"]["serverRelativeURL"]
    doc = requests.get(url + gv, timeout=5).json()
    schema = doc["components"]["schemas"]["com.example.crawl.v1alpha1.Proxy"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": GROUP, "version": VERSION, "kind": "Proxy"}]
    assert schema["properties"]["spec"]["properties"]["maxLeases"]["type"] == "integer"
    v2 = requests.get(f"{url}/openapi/v2", headers={"Accept": "application/json"}, timeout=5)
    assert v2.headers["Content-Type"] == "application/json"
    assert "com.example.crawl.v1alpha1.Proxy" in v2.json()["definitions"]
    for accept in ("application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
                   "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"):
        proto = requests.get(f"{url}/openapi/v2", timeout=5, headers={"Accept": accept})
        # the type kube-openapi answers either with (one Go's mime package can parse)
        assert proto.headers["Content-Type"] == "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
        assert proto.content.startswith(b"\x0a\x032.0")  # Document.swagger (field 1) = "2.0"
        assert b"com.example.crawl.v1alpha1.Proxy" in proto.content
    assert requests.get(f"{url}/openapi/v2", timeout=5, headers={"Accept": "application/xml"}).status_code == 406
    crds = requests.get(f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", timeout=5).json()
    assert crds["kind"] == "CustomResourceDefinitionList"
    assert f"proxies.{GROUP}" in {c["metadata"]["name"] for c in crds["items"]}
    agg = requests.get(f"{url}/apis", timeout=5, headers={
        "Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"})
    assert agg.headers["Content-Type"].startswith("application/json;g=apidiscovery.k8s.io;v=v2")
    [crawl] = [g for g in agg.json()["items"] if g["metadata"]["name"] == GROUP]
    assert {r["resource"] for r in crawl["versions"][0]["resources"]} == {"proxies", "providerhealths", "proxypools"}
    table = requests.get(f"{url}/apis/{GROUP}/{VERSION}/proxies", timeout=5,
                         headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}).json()
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Phase", "Provider", "Address",
                                                               "Egress IP", "Healthy", "Burned", "Age"]
    assert json.loads(json.dumps(table["rows"])) == []
