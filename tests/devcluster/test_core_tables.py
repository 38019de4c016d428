"""``kubectl get pods`` / ``kubectl get events`` against the API fake show kube-apiserver's columns.

The fake answers ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` for Pods and Events
with the columns of kube-apiserver's printers (``pkg/printers/internalversion/printers.go``):
Pods ``NAME READY STATUS RESTARTS AGE`` (+ ``IP NODE NOMINATED NODE READINESS GATES`` with
``-o wide``), Events ``LAST SEEN TYPE REASON OBJECT MESSAGE``.  Checked with the real kubectl
binary (skipped, saying how to get it, when it is missing) and over HTTP for the cell values.
"""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timedelta, timezone

import pytest
import requests
from kubernetes import client as k8s


TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None,
                                   reason="kubectl is not installed (1.27 or newer, from "
                                          "https://kubernetes.io/docs/tasks/tools/)")
pytestmark = pytest.mark.timeout(60)


def _ago(seconds: int) -> str:
    return (datetime.now(timezone.utc) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture()
def core(api) -> k8s.CoreV1Api:
    """The core API of the session's fake (``fake`` / ``api``: tests/support/kube_fixtures.py)."""
    return k8s.CoreV1Api(api)


@pytest.fixture()
def kubectl(fake, tmp_path):
    """``kubectl(*args) -> stdout`` against the fake (a private kubeconfig and discovery cache)."""
    kubeconfig = fake.write_kubeconfig(str(tmp_path / "kubeconfig"))
    env = {"KUBECONFIG": kubeconfig, "KUBECACHEDIR": str(tmp_path / "kube-cache"), "HOME": str(tmp_path),
           "PATH": "/usr/bin:/bin:/usr/local/bin"}

    def run(*args: str) -> str:
        res = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert res.returncode == 0, f"kubectl {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}"
        return res.stdout

    return run


def _pod(core, namespace: str, name: str, status: dict, *, node: str | None = "local") -> None:
    spec = {"containers": [{"name": "squid", "image": "squid:6"}]}
    if node:
        spec["nodeName"] = node
    core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod",
                                           "metadata": {"name": name, "namespace": namespace}, "spec": spec})
    core.patch_namespaced_pod_status(name, namespace, {"status": status})


def running() -> dict:
    """A Pod status as the kubelet stand-in reports a serving Squid."""
    return {"phase": "Running", "podIP": "127.0.9.2", "podIPs": [{"ip": "127.0.9.2"}],
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}],
            "containerStatuses": [{"name": "squid", "ready": True, "restartCount": 0, "image": "squid:6",
                                   "imageID": "", "state": {"running": {"startedAt": _ago(60)}}}]}


def crashing() -> dict:
    """A Squid that exited 30 s ago, its third restart backing off."""
    return {"phase": "Running", "podIP": "127.0.9.3", "podIPs": [{"ip": "127.0.9.3"}],
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}],
            "containerStatuses": [{"name": "squid", "ready": False, "restartCount": 3, "image": "squid:6",
                                   "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                   "lastState": {"terminated": {"exitCode": 1, "finishedAt": _ago(30)}}}]}


def _namespaces(core, *names: str) -> None:
    for ns in names:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})


def test_pod_table_cells_as_kube_apiserver_prints_them(fake, core):
    _namespaces(core, "crawl")
    _pod(core, "crawl", "squid-a", running())
    _pod(core, "crawl", "squid-b", crashing())
    core.create_namespaced_pod("crawl", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "squid-c"},
                                         "spec": {"containers": [{"name": "squid", "image": "squid:6"}]}})
    table = requests.get(f"{fake.url}/api/v1/namespaces/crawl/pods", headers=TABLE, timeout=5).json()
    assert table["kind"] == "Table"
    assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == [
        ("Name", 0), ("Ready", 0), ("Status", 0), ("Restarts", 0), ("Age", 0),
        ("IP", 1), ("Node", 1), ("Nominated Node", 1), ("Readiness Gates", 1)]
    rows = {r["cells"][0]: r["cells"] for r in table["rows"]}
    assert rows["squid-a"][1:4] == ["1/1", "Running", "0"] and rows["squid-a"][5:] == [
        "127.0.9.2", "local", "<none>", "<none>"]
    assert rows["squid-b"][1:3] == ["0/1", "CrashLoopBackOff"]
    assert rows["squid-b"][3] in ("3 (30s ago)", "3 (31s ago)", "3 (32s ago)")
    assert rows["squid-c"][1:4] == ["0/1", "Pending", "0"] and rows["squid-c"][5:7] == ["<none>", "<none>"]
    one = requests.get(f"{fake.url}/api/v1/namespaces/crawl/pods/squid-a", headers=TABLE, timeout=5).json()
    assert one["kind"] == "Table" and one["rows"][0]["cells"][:3] == ["squid-a", "1/1", "Running"]
    # a deleted Pod with a finalizer is Terminating, as upstream
    core.patch_namespaced_pod("squid-a", "crawl", {"metadata": {"finalizers": ["example.com/hold"]}})
    core.delete_namespaced_pod("squid-a", "crawl")
    one = requests.get(f"{fake.url}/api/v1/namespaces/crawl/pods/squid-a", headers=TABLE, timeout=5).json()
    assert one["rows"][0]["cells"][2] == "Terminating"


def _event(core, namespace: str, name: str, **fields) -> None:
    core.create_namespaced_event(namespace, {"apiVersion": "v1", "kind": "Event",
                                             "metadata": {"name": name, "namespace": namespace}, **fields})


def test_event_table_cells_core_and_events_k8s_io(fake, api, core):
    _namespaces(core, "crawl")
    _event(core, "crawl", "squid-k8s-1.1", type="Warning", reason="ProbeFailed", message=" probe timed out \n",
           involvedObject={"kind": "Proxy", "name": "squid-k8s-1", "namespace": "crawl"},
           source={"component": "proxy-operator"}, count=4, firstTimestamp=_ago(600), lastTimestamp=_ago(300))
    events = k8s.EventsV1Api(api)
    events.create_namespaced_event("crawl", {
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "squid-k8s-1.2"},
        "eventTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "type": "Normal",
        "reason": "Ready", "note": "serving", "action": "Probe", "reportingController": "proxy-operator",
        "reportingInstance": "watcher-0", "regarding": {"kind": "Proxy", "name": "squid-k8s-1"}})
    table = requests.get(f"{fake.url}/api/v1/namespaces/crawl/events", headers=TABLE, timeout=5).json()
    assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == [
        ("Last Seen", 0), ("Type", 0), ("Reason", 0), ("Object", 0), ("Subobject", 1), ("Source", 1),
        ("Message", 0), ("First Seen", 1), ("Count", 1), ("Name", 1)]
    rows = {r["cells"][-1]: r["cells"] for r in table["rows"]}
    assert rows["squid-k8s-1.1"] == ["5m", "Warning", "ProbeFailed", "proxy/squid-k8s-1", "", "proxy-operator",
                                     "probe timed out", "10m", 4, "squid-k8s-1.1"]
    table = requests.get(f"{fake.url}/apis/events.k8s.io/v1/namespaces/crawl/events", headers=TABLE,
                         timeout=5).json()
    rows = {r["cells"][-1]: r["cells"] for r in table["rows"]}
    last, *rest = rows["squid-k8s-1.2"]
    assert last in ("0s", "1s", "2s")
    assert rest[:6] == ["Normal", "Ready", "proxy/squid-k8s-1", "", "proxy-operator, watcher-0", "serving"]
    assert rest[7:] == [1, "squid-k8s-1.2"]


@needs_kubectl
def test_kubectl_get_pods_all_namespaces_and_wide(core, kubectl):
    _namespaces(core, "crawl", "proxy-operator")
    _pod(core, "crawl", "squid-a", running())
    _pod(core, "proxy-operator", "squid-b", crashing())
    lines = [line.split() for line in kubectl("get", "pods", "-A").splitlines()]
    assert lines[0] == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert lines[1][:5] == ["crawl", "squid-a", "1/1", "Running", "0"]
    assert lines[2][:5] == ["proxy-operator", "squid-b", "0/1", "CrashLoopBackOff", "3"]
    assert lines[2][5] in ("(30s", "(31s", "(32s") and lines[2][6] == "ago)"
    wide = kubectl("get", "pods", "-n", "crawl", "-o", "wide").splitlines()
    assert wide[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED", "NODE",
                               "READINESS", "GATES"]
    assert wide[1].split()[:3] == ["squid-a", "1/1", "Running"]
    assert wide[1].split()[5:] == ["127.0.9.2", "local", "<none>", "<none>"]


@needs_kubectl
def test_kubectl_get_events(core, kubectl):
    _namespaces(core, "crawl")
    _event(core, "crawl", "squid-k8s-1.1", type="Warning", reason="ProbeFailed", message="probe timed out",
           involvedObject={"kind": "Proxy", "name": "squid-k8s-1", "namespace": "crawl"},
           source={"component": "proxy-operator"}, count=2, firstTimestamp=_ago(90), lastTimestamp=_ago(3))
    out = kubectl("get", "events", "-n", "crawl").splitlines()
    assert out[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert out[1].split()[1:] == ["Warning", "ProbeFailed", "proxy/squid-k8s-1", "probe", "timed", "out"]
    all_ns = kubectl("get", "events", "-A").splitlines()
    assert all_ns[0].split() == ["NAMESPACE", "LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
