"""Metrics wiring of the deploy tree: every worker serves /metrics and Prometheus finds it.

The worker, health-worker and KVM worker Deployments set ``METRICS_BIND`` (workers/metrics_server.py) and
``PROMETHEUS_MULTIPROC_DIR``, and wrap the Celery command in a shell line that wipes and
recreates that directory before ``exec``-ing the process (prometheus-client's multiprocess
mode needs an existing, empty directory at start).  The api (``proxy-operator api``, two granian
workers) prepares its own directory (app/observability/multiproc.py; tests/api/test_server.py checks the sums
over its workers), so it needs neither the variable nor the wrapper.  The wrapper is run here for real with
``sh``; the ServiceMonitor is matched against the rendered Services the way the Prometheus
Operator does (label selector, then port name).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.test_deploy import KUBECTL, _kind, _process_command, render

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(KUBECTL is None, reason="kubectl (for `kubectl kustomize`) is not installed")]


@pytest.fixture(scope="module")
def default_docs() -> list[dict]:
    return render("default")


@pytest.fixture(scope="module")
def kvm_docs() -> list[dict]:
    return render("kvm-worker/kvm-lab-lab1")


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _matches(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels + matchExpressions) against ``labels``."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": labels.get(key) not in values,
              "Exists": key in labels,
              "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _scraped(monitor: dict, services: list[dict]) -> dict[str, set[str]]:
    """Service name -> port names the ServiceMonitor scrapes on it."""
    wanted = {e["port"] for e in monitor["spec"]["endpoints"]}
    namespaces = monitor["spec"].get("namespaceSelector", {}).get("matchNames")
    out = {}
    for svc in services:
        if namespaces and svc["metadata"].get("namespace") not in namespaces:
            continue
        if not _matches(monitor["spec"]["selector"], svc["metadata"].get("labels") or {}):
            continue
        ports = {p["name"] for p in svc["spec"]["ports"]} & wanted
        if ports:
            out[svc["metadata"]["name"]] = ports
    return out


def _assert_serves_metrics(deploy: dict, service: dict) -> None:
    """The Deployment's container serves /metrics on a named port the Service targets."""
    name = deploy["metadata"]["name"]
    pod = deploy["spec"]["template"]["spec"]
    [c] = pod["containers"]
    env = _env(c)
    host, _, port = env["METRICS_BIND"].rpartition(":")
    assert host == "0.0.0.0", f"{name}: metrics must listen on the pod IP, got {env['METRICS_BIND']}"
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    assert ports.get("metrics") == int(port), f"{name}: no containerPort 'metrics' = {port}"
    # The multiprocess directory lives on the /tmp emptyDir (the root filesystem is read-only).
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    emptydirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    assert env["PROMETHEUS_MULTIPROC_DIR"].startswith("/tmp/") and mounts["/tmp"] in emptydirs
    assert _process_command(c)[:4] == ["celery", "-A", "workers", "worker"]
    # The Service selects exactly these pods and targets the metrics port.
    assert service["spec"].get("clusterIP") == "None"
    assert service["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert {"name": "metrics", "port": int(port), "targetPort": "metrics"} in service["spec"]["ports"]


@pytest.mark.parametrize("name", ["worker", "health-worker"])
def test_worker_serves_metrics_and_is_scraped(name, default_docs):
    deploy = _kind(default_docs, "Deployment")[name]
    service = _kind(default_docs, "Service")[f"{name}-metrics"]
    _assert_serves_metrics(deploy, service)
    # each metrics Service selects its own Deployment's pods only (one scrape per pod)
    others = [d["metadata"]["name"] for d in _kind(default_docs, "Deployment").values()
              if service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()]
    assert others == [name]
    [monitor] = [d for d in render("prometheus") if d["kind"] == "ServiceMonitor"]
    scraped = _scraped(monitor, list(_kind(default_docs, "Service").values()))
    assert scraped[f"{name}-metrics"] == {"metrics"}
    assert scraped["api"] == {"http"} and scraped["flower"] == {"http"}
    assert "redis" not in scraped


@pytest.mark.parametrize("component", ["watcher", "beat"])
def test_watcher_and_beat_serve_metrics_and_are_scraped(component, default_docs):
    """Single-process: METRICS_BIND on a named port, a headless Service, the ServiceMonitor."""
    deploy = _kind(default_docs, "Deployment")[component]
    service = _kind(default_docs, "Service")[f"{component}-metrics"]
    [c] = deploy["spec"]["template"]["spec"]["containers"]
    host, _, port = _env(c)["METRICS_BIND"].rpartition(":")
    assert host == "0.0.0.0" and {"name": "metrics", "containerPort": int(port)} in c["ports"]
    assert "PROMETHEUS_MULTIPROC_DIR" not in _env(c)  # one process: nothing to aggregate
    assert service["spec"].get("clusterIP") == "None"
    assert service["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert {"name": "metrics", "port": int(port), "targetPort": "metrics"} in service["spec"]["ports"]
    [monitor] = [d for d in render("prometheus") if d["kind"] == "ServiceMonitor"]
    assert _scraped(monitor, [service]) == {service["metadata"]["name"]: {"metrics"}}


def test_prometheus_kustomization_ships_the_rules_and_the_dashboard():
    docs = render("prometheus")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "PrometheusRule", "ServiceMonitor"]
    [dashboard] = [d for d in docs if d["kind"] == "ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "grafana-dashboard.json" in dashboard["data"]


def test_kvm_worker_serves_metrics_and_is_scraped(kvm_docs):
    [deploy] = [d for d in kvm_docs if d["kind"] == "Deployment"]
    [service] = [d for d in kvm_docs if d["kind"] == "Service"]
    assert service["metadata"]["name"] == "kvm-worker-metrics-kvm-lab-lab1"
    assert service["spec"]["selector"]["crawl.example.com/kvm-queue"] == "kvm.kvm-lab.lab1"
    _assert_serves_metrics(deploy, service)
    [monitor] = [d for d in render("prometheus") if d["kind"] == "ServiceMonitor"]
    assert _scraped(monitor, [service]) == {service["metadata"]["name"]: {"metrics"}}


def test_multiprocess_processes_get_a_multiproc_dir(default_docs, kvm_docs):
    """Every process that forks (Celery prefork, ``proxy-operator api --workers N``) aggregates
    metrics over its children: Celery through the wrapper, the api by itself."""
    deployments = {**_kind(default_docs, "Deployment"),
                   **{d["metadata"]["name"]: d for d in kvm_docs if d["kind"] == "Deployment"}}
    forking = {}
    for name, deploy in deployments.items():
        [c] = deploy["spec"]["template"]["spec"]["containers"]
        cmd = _process_command(c) if "command" in c else c["args"]  # redis: image entrypoint + args
        prefork = cmd[:4] == ["celery", "-A", "workers", "worker"]
        if prefork:
            forking[name] = c
        elif cmd[:2] == ["proxy-operator", "api"]:
            # no wrapper: it makes its own directory under /tmp, which must be writable
            assert int(cmd[cmd.index("--workers") + 1]) > 1 and c["command"] == cmd, name
            pod = deploy["spec"]["template"]["spec"]
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert mounts["/tmp"] in {v["name"] for v in pod["volumes"] if "emptyDir" in v}, name
    assert set(forking) == {"worker", "health-worker", "kvm-worker-kvm-lab-lab1"}
    for name, c in forking.items():
        assert _env(c).get("PROMETHEUS_MULTIPROC_DIR", "").startswith("/tmp/"), name
        assert c["command"][:2] == ["sh", "-c"] and "mkdir -p" in c["command"][2], name


@pytest.mark.parametrize("which", ["worker", "health-worker", "kvm-worker"])
def test_wrapper_starts_the_process_with_an_empty_multiproc_dir(which, default_docs, kvm_docs, tmp_path):
    """Run the container's real command line with sh: stale files of a previous run are gone."""
    if which == "kvm-worker":
        [deploy] = [d for d in kvm_docs if d["kind"] == "Deployment"]
    else:
        deploy = _kind(default_docs, "Deployment")[which]
    [c] = deploy["spec"]["template"]["spec"]["containers"]
    assert c["command"][:2] == ["sh", "-c"] and shutil.which("sh")
    prom = tmp_path / "prometheus"
    prom.mkdir()
    (prom / "counter_1.db").write_bytes(b"stale samples of a crashed run")
    probe = ["sh", "-c", 'test -d "$PROMETHEUS_MULTIPROC_DIR" && ls -A "$PROMETHEUS_MULTIPROC_DIR" && echo "argv: $*"',
             "probe", "-Q", "x"]
    out = subprocess.run(c["command"] + probe, env={"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(prom)},
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "argv: -Q x\n"  # the directory exists, is empty, and the args arrive intact
    missing = tmp_path / "not" / "yet"
    out = subprocess.run(c["command"] + ["true"], capture_output=True, text=True, timeout=10,
                         env={"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(missing)})
    assert out.returncode == 0 and missing.is_dir()
    out = subprocess.run(c["command"] + ["true"], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=10)
    assert out.returncode != 0 and "PROMETHEUS_MULTIPROC_DIR" in out.stderr
