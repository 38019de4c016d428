"""RBAC exactly as used: what each of the operator's processes asks the Kubernetes API is
what deploy/rbac grants that process's own ServiceAccount, nothing missing and nothing unused.

The real watcher, worker (``-Q proxies,gc``), health-worker (``-Q health``) and beat run through a
whole lifecycle against the API fake (CRD admission, kubelet stand-in with real Squids), each
with a kubeconfig whose bearer token only it uses; the fake records every ``(verb, group,
resource, namespace)`` sent with each token (:meth:`devcluster.apiserver.server.FakeKube.audit`).  The
lifecycle: a stale ProviderHealth pruned at start, leader election (acquire, renew, release), a
Proxy with generated basic-auth credentials applied, Running, probed to Ready through its Squid
with those credentials, a provider check written to its ProviderHealth, a GC sweep, a Proxy
released with skip-cleanup (its Pod labelled abandoned), a delete (Pod and Secret gone), and an
autoscaled ProxyPool (its stream watched, members created with an ownerReference, its status
written, ``spec.replicas`` lowered through the scale subresource, a member marked draining and
deleted).  Each process's requests are then compared with the rules of the roles deploy/rbac
binds to ``proxy-operator-<process>`` (beat's: none).  The per-host KVM workers' requests are
checked in tests/kvm/test_e2e_worker.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from app.resources import GROUP, PLURAL, VERSION
from devcluster.squid import LOOPBACK_SQUID_BLOCK
from tests.support.processes import celery_beat, celery_worker, watcher
from tests.support.waiting import wait_for
from tests.support.stack_fixtures import cluster, origin  # noqa: F401 - pytest fixtures

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[1]
RBAC = ROOT / "deploy" / "rbac"
SAMPLE = ROOT / "deploy" / "samples" / "proxy_kubernetes.yaml"
#: The components that talk to the Kubernetes API, each with its own ServiceAccount
#: (``proxy-operator-<component>`` in the operator's namespace) and here its own token.
TOKENS = {"watcher": "rbac-audit-watcher-5d1f", "beat": "rbac-audit-beat-8a02",
          "worker": "rbac-audit-worker-3c9e", "health-worker": "rbac-audit-health-worker-71b4"}
OPERATOR_NAMESPACE = "proxy-operator"


def rbac_docs() -> list[dict]:
    """Every document of deploy/rbac."""
    return [d for p in sorted(RBAC.glob("*.yaml")) if p.name != "kustomization.yaml"
            for d in yaml.safe_load_all(p.read_text()) if d]


def grants_of(service_account: str) -> set[tuple[str, str, str, str | None]]:
    """``(verb, group, resource, namespace)`` granted by deploy/rbac to the ServiceAccount
    ``service_account`` of the operator's namespace: ClusterRoles through ClusterRoleBindings
    (``namespace`` None: everywhere), Roles through RoleBindings (their namespace).  Kubernetes
    RBAC: https://kubernetes.io/docs/reference/access-authn-authz/rbac/
    """
    docs = rbac_docs()
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("ClusterRole", "Role")}
    grants = set()
    for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        subjects = {(s.get("namespace"), s["name"]) for s in binding["subjects"] if s["kind"] == "ServiceAccount"}
        if (OPERATOR_NAMESPACE, service_account) not in subjects:
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role = roles[(ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])]
        for rule in role.get("rules") or ():
            assert not rule.get("resourceNames"), "resourceNames are not modelled here"
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        grants.add((verb, group, resource, scope))
    return grants


def granted(request: tuple, grants: set) -> bool:
    verb, group, resource, namespace = request
    return (verb, group, resource, None) in grants or (
        namespace is not None and (verb, group, resource, namespace) in grants)


def unused(grants: set, found: set) -> list:
    """The grants no request in ``found`` used (a cluster-wide grant is used by a request in
    any namespace)."""
    used = {(v, g, r) for v, g, r, _ in found}
    used_in = {(v, g, r, ns) for v, g, r, ns in found if ns is not None}
    return sorted((g for g in grants if (g[:3] not in used if g[3] is None else g not in used_in)), key=str)


def _custom(cluster) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(cluster.fake.api_client())


def _proxy(cluster, name: str) -> dict | None:
    try:
        return _custom(cluster).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _phase(cluster, name: str) -> str | None:
    return ((_proxy(cluster, name) or {}).get("status") or {}).get("phase")


def _apply(cluster, name: str, origin: str, annotations: dict | None = None) -> dict:
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["name"] = name
    body["metadata"]["annotations"] = annotations or {}
    body["spec"]["healthCheck"] = {"url": f"{origin}/generate_204", "intervalSeconds": 2, "timeoutSeconds": 1}
    return _custom(cluster).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)


def test_the_operator_uses_exactly_what_deploy_rbac_grants(cluster, origin, redis_url, tmp_path):
    audits = {component: cluster.fake.audit(token) for component, token in TOKENS.items()}
    providers = tmp_path / "providers.yaml"
    providers.write_text(yaml.safe_dump({"providers": [{
        "name": "k8s-local", "type": "kubernetes", "checkInterval": "10s",
        "squid": {"basicAuth": True, "allowedSourceRanges": ["127.0.0.0/8"], **LOOPBACK_SQUID_BLOCK}}]}))
    env = {
        "REDIS_URL": redis_url, "PROVIDERS_CONFIG": str(providers),
        "RESYNC_INTERVAL": "3", "GC_INTERVAL": "2", "POLL_INITIAL": "0.5", "POLL_MAX": "2",
        "RETRY_INITIAL": "0.5", "RETRY_MAX": "2", "TASK_SOFT_TIME_LIMIT": "8", "TASK_TIME_LIMIT": "10",
        "BROKER_VISIBILITY_TIMEOUT": "60", "HEALTH_SWEEP_INTERVAL": "1", "EGRESS_ECHO_URL": "",
        "PROBE_ALLOWED_RANGES": "127.0.0.0/8",  # the kubelet's Squids and the origin are on loopback
    }
    # A ProviderHealth of a provider no longer configured: the watcher prunes it at start.
    _custom(cluster).create_cluster_custom_object(GROUP, VERSION, "providerhealths", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProviderHealth",
        "metadata": {"name": "retired", "labels": {"app.kubernetes.io/managed-by": "proxy-operator"}}})

    def own(component: str) -> dict:
        """``env`` with a kubeconfig carrying the component's own token."""
        kubeconfig = cluster.fake.write_kubeconfig(str(tmp_path / f"kubeconfig-{component}"), token=TOKENS[component])
        return {**env, "KUBECONFIG": kubeconfig}

    # the processes as deploy/base runs them: the worker on proxies and gc, the health-worker on health
    procs = [celery_worker(own("worker"), queues="proxies,gc").start(),
             celery_worker(own("health-worker"), queues="health", name="health-worker").start(),
             celery_beat(own("beat"), str(tmp_path)).start(), watcher(own("watcher")).start()]
    worker, health_worker, _, watch = procs
    def sent(request: tuple) -> bool:
        return any(request in audit for audit in list(audits.values()))
    try:
        worker.wait_for_log("ready", timeout=60)
        health_worker.wait_for_log("ready", timeout=60)
        watch.wait_for_log("leading: streaming Proxy events", timeout=30)

        _apply(cluster, "px-auth", origin)
        wait_for(lambda: _phase(cluster, "px-auth") == "Ready", 90, "px-auth Ready (probed with its credentials)")
        core = k8s.CoreV1Api(cluster.fake.api_client())
        assert core.read_namespaced_secret("px-auth-proxy-auth", "default").metadata.owner_references

        _apply(cluster, "px-keep", origin, {"crawl.example.com/skip-cleanup": "true"})
        wait_for(lambda: _phase(cluster, "px-keep") in ("Running", "Ready"), 60, "px-keep Running")
        _custom(cluster).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "px-keep")
        wait_for(lambda: _proxy(cluster, "px-keep") is None, 30, "px-keep released")

        _custom(cluster).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "px-auth")
        wait_for(lambda: _proxy(cluster, "px-auth") is None, 30, "px-auth deleted")
        with pytest.raises(k8s.ApiException):
            core.read_namespaced_secret("px-auth-proxy-auth", "default")

        def health_written():
            try:
                obj = _custom(cluster).get_cluster_custom_object(GROUP, VERSION, "providerhealths", "k8s-local")
            except k8s.ApiException:
                return False
            return bool((obj.get("status") or {}).get("targets"))

        wait_for(health_written, 60, "the provider check's ProviderHealth")

        # An autoscaled pool of two with no load: the autoscaler lowers it to one (scale
        # subresource) and the member it drops is marked draining, then deleted.
        _custom(cluster).create_namespaced_custom_object(GROUP, VERSION, "default", "proxypools", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": "audited"},
            "spec": {"replicas": 2, "autoscale": {"minReplicas": 1, "maxReplicas": 2, "scaleDownDelaySeconds": 0},
                     "template": {"metadata": {"labels": {"app": "audited"}}, "spec": {
                         "provider": "k8s-local", "healthCheck": {"url": f"{origin}/generate_204",
                                                                  "intervalSeconds": 2, "timeoutSeconds": 1}}}}})
        wait_for(lambda: sent(("patch", GROUP, "proxypools/scale", "default"))
                 and sent(("delete", GROUP, PLURAL, "default")), 120, "the pool scaled down by its autoscaler")
        wait_for(lambda: ("list", "", "pods", None) in audits["worker"] and sent(("list", GROUP, PLURAL, None)),
                 30, "a GC sweep")
        wait_for(lambda: sent(("create", "", "events", "default")), 10, "an Event")
    finally:
        for p in procs:
            p.stop()  # the watcher releases its Lease on the way out

    found = {component: set(audit) for component, audit in audits.items()}
    everything = set().union(*found.values())
    assert ("delete", GROUP, "providerhealths", None) in everything  # the stale one was pruned
    assert ("patch", "", "pods", "default") in everything  # the abandoned label of px-keep's Pod
    report = []
    for component, requests in sorted(found.items()):
        grants = grants_of(f"proxy-operator-{component}")
        missing = sorted((r for r in requests if not granted(r, grants)), key=str)
        if missing:
            report.append(f"{component}: requests deploy/rbac does not grant: {missing}")
        if unused(grants, requests):
            report.append(f"{component}: grants in deploy/rbac it never used: {unused(grants, requests)}")
    assert report == [], "\n".join(report) + "\n\nsent:\n" + "\n".join(
        f"{c}: {sorted(r, key=str)}" for c, r in sorted(found.items()))
    for component in ("watcher", "beat"):
        assert not any(r in ("pods", "secrets") for _, _, r, _ in grants_of(f"proxy-operator-{component}")), component
