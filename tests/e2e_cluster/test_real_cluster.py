"""The real-cluster suite (marker ``e2e``): the operator against a real kube-apiserver.

What a user does on day one, end to end: install the CRDs from ``deploy/crd``, run the
watcher (``proxy-operator watch``) and a Celery worker (``celery -A workers worker``) on this
machine with a private Redis, ``kubectl apply`` ``deploy/samples/proxy_kubernetes.yaml`` into a
throwaway namespace, wait until the Proxy is Running with a Squid Pod behind it, delete it,
and check that the Pod is gone. The namespace is deleted afterwards, whatever happened.

Runs only when asked to, on a cluster you can spare (kind, k3d, minikube)::

    KUBECONFIG=~/.kube/kind.yaml PROXY_OPERATOR_E2E=1 .venv/bin/pytest -m e2e tests/e2e_cluster

The watcher watches Proxies in every namespace, so the test refuses to run (skips) when the
cluster already has Proxies, ProviderHealth objects of other providers, or a live watcher
Lease: a running operator would race this one, and this one would reconcile foreign Proxies.
The cluster must be able to pull ``ubuntu/squid`` and to create Pods in a fresh namespace.

Environment:
    KUBECONFIG                      the cluster (required)
    PROXY_OPERATOR_E2E=1            consent (required)
    PROXY_OPERATOR_E2E_TIMEOUT      seconds to wait for Running, default 300 (image pull)
    PROXY_OPERATOR_E2E_APPLY_CRDS=0 the CRDs are installed already; do not write them
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "deploy" / "crd"
SAMPLE = ROOT / "deploy" / "samples" / "proxy_kubernetes.yaml"
GROUP, VERSION, PLURAL = "crawl.example.com", "v1alpha1", "proxies"
PROVIDER = "k8s-local"  # the provider the sample names
LEASE_NAME = "proxy-operator-watcher"

ENABLED = bool(os.environ.get("KUBECONFIG")) and os.environ.get("PROXY_OPERATOR_E2E") == "1"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not ENABLED, reason="real-cluster suite: set KUBECONFIG and PROXY_OPERATOR_E2E=1"),
]


def _wait(predicate, timeout: float, what: str, interval: float = 1.0, context=lambda: ""):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{context()}")
        time.sleep(interval)


class Cluster:
    """The clients of the cluster named by KUBECONFIG."""

    def __init__(self) -> None:
        from kubernetes import client, config

        self.k8s = client
        self.api = config.new_client_from_config(config_file=os.environ["KUBECONFIG"].split(os.pathsep)[0])
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.ext = client.ApiextensionsV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)

    def missing(self, call, *args, **kwargs):
        """Run ``call``; return its result, or ``None`` when the API answers 404 Not Found."""
        try:
            return call(*args, **kwargs)
        except self.k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def get_proxy(self, ns: str, name: str) -> dict | None:
        return self.missing(self.custom.get_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, name)


def _preflight(c: Cluster, namespace: str) -> None:
    """Skip unless the cluster is free of other operators' state (see the module docstring)."""
    proxies = c.missing(c.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
    foreign = [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in (proxies or {}).get("items", [])
               if p["metadata"]["namespace"] != namespace]
    if foreign:
        pytest.skip(f"the cluster already has Proxies ({', '.join(foreign[:5])}); use a throwaway cluster")
    health = c.missing(c.custom.list_cluster_custom_object, GROUP, VERSION, "providerhealths")
    others = [h["metadata"]["name"] for h in (health or {}).get("items", []) if h["metadata"]["name"] != PROVIDER]
    if others:
        pytest.skip(f"the cluster has ProviderHealth objects of other providers ({', '.join(others)}); "
                    "the watcher would prune them: use a throwaway cluster")
    leases = c.coord.list_lease_for_all_namespaces(field_selector=f"metadata.name={LEASE_NAME}").items
    now = datetime.now(timezone.utc)
    for lease in leases:
        spec = lease.spec
        renewed = spec.renew_time or spec.acquire_time
        if spec.holder_identity and renewed and \
                now - renewed < timedelta(seconds=(spec.lease_duration_seconds or 15) * 2):
            pytest.skip(f"a proxy-operator watcher ({spec.holder_identity}) holds lease "
                        f"{lease.metadata.namespace}/{LEASE_NAME}: an operator runs in this cluster")


def _apply_crds(c: Cluster) -> None:
    """``kubectl apply -f deploy/crd``: create, or replace keeping the resourceVersion; wait Established."""
    names = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") != "CustomResourceDefinition":
            continue
        name = doc["metadata"]["name"]
        names.append(name)
        current = c.missing(c.ext.read_custom_resource_definition, name)
        if current is None:
            c.ext.create_custom_resource_definition(doc)
        else:
            doc["metadata"]["resourceVersion"] = current.metadata.resource_version
            c.ext.replace_custom_resource_definition(name, doc)
    assert names, f"no CRDs under {CRD_DIR}"

    def established():
        for name in names:
            crd = c.ext.read_custom_resource_definition(name)
            conds = {x.type: x.status for x in (crd.status.conditions or [])} if crd.status else {}
            if conds.get("Established") != "True":
                return False
        return True

    _wait(established, 60, f"CRDs {', '.join(names)} Established")


@pytest.fixture()
def cluster() -> Cluster:
    return Cluster()


@pytest.fixture()
def namespace(cluster):
    """A fresh namespace, deleted at the end (Proxies left in it first lose their finalizer)."""
    name = f"proxy-operator-e2e-{uuid.uuid4().hex[:8]}"
    cluster.core.create_namespace(cluster.k8s.V1Namespace(metadata=cluster.k8s.V1ObjectMeta(
        name=name, labels={"app.kubernetes.io/created-by": "proxy-operator-e2e"})))
    yield name
    leftovers = cluster.missing(cluster.custom.list_namespaced_custom_object, GROUP, VERSION, name, PLURAL) or {}
    for px in leftovers.get("items", []):
        # The operator is stopped by now: release the finalizer so the namespace can go.
        cluster.missing(cluster.custom.patch_namespaced_custom_object, GROUP, VERSION, name, PLURAL,
                        px["metadata"]["name"], {"metadata": {"finalizers": None}})
    cluster.missing(cluster.core.delete_namespace, name)


@pytest.fixture()
def operator(cluster, namespace, tmp_path):
    """Private Redis + the watcher + a Celery worker, as local processes using KUBECONFIG."""
    from devcluster.redis_server import RedisServer
    from tests.support.processes import BIN, Process, celery_worker

    _preflight(cluster, namespace)
    if os.environ.get("PROXY_OPERATOR_E2E_APPLY_CRDS", "1") != "0":
        _apply_crds(cluster)
    redis = RedisServer()
    providers = tmp_path / "providers.yaml"
    # No namespace: each Pod goes to its Proxy's namespace (the throwaway one).
    providers.write_text(f"providers:\n  - name: {PROVIDER}\n    type: kubernetes\n")
    env = {"REDIS_URL": redis.url, "PROVIDERS_CONFIG": str(providers), "POLL_INITIAL": "1", "POLL_MAX": "5",
           "RETRY_INITIAL": "1", "RETRY_MAX": "10", "LOG_LEVEL": "INFO"}
    logdir = tempfile.mkdtemp(prefix="e2e-cluster-")
    procs = {
        "worker": celery_worker(env, name="e2e-worker"),
        # The leader-election Lease goes into the throwaway namespace too.
        "watcher": Process("watcher", [str(BIN / "proxy-operator"), "watch", "--lease-namespace", namespace,
                                       "--identity", f"e2e-{namespace}"], env, logdir=logdir),
    }
    try:
        for p in procs.values():
            p.start()
        procs["worker"].wait_for_log("ready", timeout=90)
        yield procs
    finally:
        for p in procs.values():
            p.stop()
        redis.stop()


def _logs(procs: dict) -> str:
    return "\n".join(f"--- {name} (last 3000 characters)\n{p.log()[-3000:]}" for name, p in procs.items())


def test_sample_proxy_runs_a_squid_pod_and_deletion_removes_it(cluster, namespace, operator):
    from app.providers.kubernetes.provider import LABEL_MANAGED_BY, LABEL_PROXY_UID

    timeout = float(os.environ.get("PROXY_OPERATOR_E2E_TIMEOUT", "300"))
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["namespace"] = namespace
    name = body["metadata"]["name"]
    created = cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    uid = created["metadata"]["uid"]

    def context() -> str:
        return f"Proxy: {yaml.safe_dump(cluster.get_proxy(namespace, name))}\n{_logs(operator)}"

    proxy = _wait(lambda: (p := cluster.get_proxy(namespace, name)) and
                  (p.get("status") or {}).get("phase") in ("Running", "Ready", "Unhealthy") and p,
                  timeout, f"Proxy {namespace}/{name} Running", context=context)
    status = proxy["status"]
    assert "crawl.example.com/cleanup" in proxy["metadata"]["finalizers"]
    pod_ns, _, pod_name = status["providerID"].partition("/")
    assert pod_ns == namespace and pod_name == status["instanceName"]
    pod = cluster.core.read_namespaced_pod(pod_name, namespace)
    assert pod.metadata.labels[LABEL_MANAGED_BY] == "proxy-operator"
    assert pod.metadata.labels[LABEL_PROXY_UID] == uid
    assert pod.status.phase == "Running" and status["address"] == pod.status.pod_ip
    assert pod.spec.containers[0].ports[0].container_port == status["port"] == 3128

    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    _wait(lambda: cluster.get_proxy(namespace, name) is None, 180,
          "the Proxy to go (its finalizer is released after the Pod delete)", context=context)
    _wait(lambda: cluster.missing(cluster.core.read_namespaced_pod, pod_name, namespace) is None, 180,
          f"Pod {namespace}/{pod_name} to be gone", context=lambda: _logs(operator))
