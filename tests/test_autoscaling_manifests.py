"""deploy/autoscaling: KEDA ScaledObjects for the shared workers, an HPA for the API.

The component is rendered offline with ``kubectl kustomize`` (skipped when kubectl is absent,
like tests/test_deploy.py, whose helpers are reused) in the two ways deploy/autoscaling's
kustomization.yaml documents: as a component of an overlay on top of deploy/default, and in
deploy/default's own ``components`` after ../network-policies. The queue names are never
listed here: they come from the product (workers/celery_app.py's queues, built from
workers.routing), and a real Redis shows that the lists KEDA reads are where kombu puts a task
sent through the product's Celery app, and what proxy_operator_queue_depth counts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from app.config.settings import Settings
from tests.test_deploy import (DEPLOY, KUBECTL, _admits, _env, _kind, _pod_labels, _process_command,
                               _secret_ref, needs_kubectl)
from workers import routing

try:  # the one definition of a KVM host queue's name: app.dispatch.proxies, or workers.routing before it moved
    from app.store.queues import kvm_queue
except ImportError:  # pragma: no cover - older layout
    kvm_queue = routing.kvm_queue

pytestmark = pytest.mark.timeout(120)

COMPONENT = DEPLOY / "autoscaling"
KEDA_OPERATOR = {"app": "keda-operator", "name": "keda-operator", "app.kubernetes.io/name": "keda-operator"}
KVM_PREFIX = kvm_queue("p", "h")[:-len("p.h")]  # "kvm."


def shared_queues() -> set[str]:
    """The queues every shared worker may serve: those the product's Celery app declares
    (workers/celery_app.py builds them from workers.routing's PROXIES, HEALTH, GC; kvm host
    queues are created on demand and never declared there)."""
    from workers.celery_app import celery_app

    declared = {q.name for q in celery_app.conf.task_queues}
    assert {routing.PROXIES, routing.HEALTH, routing.GC} <= declared
    return declared


def _rel(tmp: Path, target: Path) -> str:
    return os.path.relpath(target, tmp)


def _write_on_top_of_default(tmp: Path) -> None:
    """An overlay a user writes: deploy/default and a KVM host's worker, plus the component."""
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [_rel(tmp, DEPLOY / "default"), _rel(tmp, DEPLOY / "kvm-worker" / "kvm-lab-lab1")],
        "components": [_rel(tmp, COMPONENT)],
    }))


def _write_inside_default(tmp: Path) -> None:
    """deploy/default itself with ../autoscaling added after ../network-policies (and the KVM
    host's worker uncommented), as its comments say."""
    kust = yaml.safe_load((DEPLOY / "default" / "kustomization.yaml").read_text())

    def moved(entry: str) -> str:
        return _rel(tmp, (DEPLOY / "default" / entry).resolve()) if entry.startswith("..") else entry

    kust["resources"] = [moved(e) for e in kust["resources"]] + [_rel(tmp, DEPLOY / "kvm-worker" / "kvm-lab-lab1")]
    assert kust["components"][-1] == "../network-policies"
    kust["components"] = [moved(e) for e in kust["components"]] + [_rel(tmp, COMPONENT)]
    for gen in kust.get("configMapGenerator", []):
        for f in gen.get("files", []):
            shutil.copy(DEPLOY / "default" / f, tmp / f)
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(kust))


def _kustomize(tmp: Path) -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(tmp)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize failed:\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module", params=["on-top-of-default", "inside-default"])
def rendered(request, tmp_path_factory) -> list[dict]:
    if KUBECTL is None:
        pytest.skip("kubectl (for `kubectl kustomize`) is not installed")
    tmp = tmp_path_factory.mktemp(request.param)
    {"on-top-of-default": _write_on_top_of_default, "inside-default": _write_inside_default}[request.param](tmp)
    return _kustomize(tmp)


def _container(deploy: dict) -> dict:
    [c] = deploy["spec"]["template"]["spec"]["containers"]
    return c


def _consumed_queues(deploy: dict) -> list[str]:
    """The queues a Celery worker Deployment consumes (its ``-Q``), [] for any other process."""
    cmd = _process_command(_container(deploy))
    if cmd[:4] != ["celery", "-A", "workers", "worker"] or "-Q" not in cmd:
        return []
    return cmd[cmd.index("-Q") + 1].split(",")


def _triggers(so: dict) -> list[dict]:
    return so["spec"]["triggers"]


def _scalers(docs: list[dict]) -> list[dict]:
    """Every ScaledObject and HorizontalPodAutoscaler of a render."""
    return list(_kind(docs, "ScaledObject").values()) + list(_kind(docs, "HorizontalPodAutoscaler").values())


def _target(docs: list[dict], scaler: dict) -> dict:
    ref = scaler["spec"]["scaleTargetRef"]
    assert ref.get("kind", "Deployment") == "Deployment" and ref.get("apiVersion", "apps/v1") == "apps/v1", ref
    deployments = _kind(docs, "Deployment")
    assert ref["name"] in deployments, f"{scaler['kind']} {scaler['metadata']['name']} targets missing {ref['name']}"
    target = deployments[ref["name"]]
    assert target["metadata"]["namespace"] == scaler["metadata"]["namespace"]
    return target


# -- the ScaledObjects -------------------------------------------------------------------------

@needs_kubectl
def test_every_scaled_object_targets_a_rendered_worker_of_the_shared_queues(rendered):
    shared = shared_queues()
    assert shared and not any(q.startswith(KVM_PREFIX) for q in shared)
    objects = _kind(rendered, "ScaledObject")
    assert objects, "the component renders no ScaledObject"
    scaled_queues = set()
    for name, so in objects.items():
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        target = _target(rendered, so)
        consumed = _consumed_queues(target)
        assert consumed, f"ScaledObject {name} targets {target['metadata']['name']}, which is no Celery worker"
        assert set(consumed) <= shared, f"{target['metadata']['name']} consumes {consumed}: not only shared queues"
        lists = [t["metadata"]["listName"] for t in _triggers(so)]
        assert all(t["type"] == "redis" for t in _triggers(so))
        assert len(lists) == len(set(lists)), f"{name}: a queue twice"
        # each trigger names a queue the product declares and the target consumes, and every
        # queue it consumes has a trigger (a backlog on any of them adds replicas)
        assert set(lists) <= shared, f"{name}: {set(lists) - shared} are not queues of the product"
        assert set(lists) == set(consumed), f"{name} scales on {lists}, its Deployment consumes {consumed}"
        spec = so["spec"]
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]  # never to zero: see the YAML
        for t in _triggers(so):
            assert int(t["metadata"]["listLength"]) >= 1
        assert not scaled_queues & set(lists), f"{name}: {scaled_queues & set(lists)} scaled twice"
        scaled_queues |= set(lists)
    assert scaled_queues == shared, f"no ScaledObject for {shared - scaled_queues}"


@needs_kubectl
def test_each_shared_queue_has_one_worker_and_health_only_the_health_worker(rendered):
    """worker keeps proxies and gc, health-worker alone serves (and scales on) health: probe
    batches never hold the children that start creates, and a health backlog adds health-workers."""
    consumers: dict[str, list[str]] = {}
    for name, deploy in _kind(rendered, "Deployment").items():
        for queue in _consumed_queues(deploy):
            if not queue.startswith(KVM_PREFIX):
                consumers.setdefault(queue, []).append(name)
    assert consumers == {routing.PROXIES: ["worker"], routing.GC: ["worker"], routing.HEALTH: ["health-worker"]}
    objects = {so["spec"]["scaleTargetRef"]["name"]: {t["metadata"]["listName"] for t in _triggers(so)}
               for so in _kind(rendered, "ScaledObject").values()}
    assert objects == {"worker": {routing.PROXIES, routing.GC}, "health-worker": {routing.HEALTH}}


@needs_kubectl
def test_kvm_host_workers_are_never_scaled(rendered):
    deployments = _kind(rendered, "Deployment")
    kvm = {n: d for n, d in deployments.items()
           if any(q.startswith(KVM_PREFIX) for q in _consumed_queues(d))}
    assert kvm, "the render should include the kvm-lab/lab1 worker"
    targets = {s["spec"]["scaleTargetRef"]["name"] for s in _scalers(rendered)}
    for name, deploy in kvm.items():
        assert name not in targets, f"{name} serves a KVM host queue: one replica, never scaled"
        assert deploy["spec"]["replicas"] == 1, name  # the component's patches leave it alone
        assert _pod_labels(deploy)["app.kubernetes.io/component"] == "kvm-worker"
    for so in _kind(rendered, "ScaledObject").values():
        for t in _triggers(so):
            assert not t["metadata"]["listName"].startswith(KVM_PREFIX), t


@needs_kubectl
def test_scaled_objects_log_in_with_the_redis_secret_the_deployments_use(rendered):
    auths = _kind(rendered, "TriggerAuthentication")
    deployments = _kind(rendered, "Deployment")
    services = _kind(rendered, "Service")
    redis_ref = _secret_ref(_env(_container(deployments["redis"])), "REDIS_PASSWORD_KEDA")
    assert redis_ref == {"name": "proxy-operator-redis-keda", "key": "password", "optional": True}
    redis_ref = {"name": redis_ref["name"], "key": "password"}  # what the Redis server itself requires
    for name, so in _kind(rendered, "ScaledObject").items():
        target = _target(rendered, so)
        env = _env(_container(target))
        assert _secret_ref(env, "REDIS_PASSWORD")["name"] == "proxy-operator-redis-" + env["REDIS_USERNAME"]["value"]
        url = urlsplit(env["REDIS_URL"]["value"])
        for t in _triggers(so):
            meta = t["metadata"]
            assert not {"password", "passwordFromEnv", "username"} & set(meta), f"{name}: credentials in the trigger"
            ref = t["authenticationRef"]
            assert ref.get("kind", "TriggerAuthentication") == "TriggerAuthentication"
            assert ref["name"] in auths, f"{name}: TriggerAuthentication {ref['name']} is not rendered"
            auth = auths[ref["name"]]
            assert auth["metadata"]["namespace"] == so["metadata"]["namespace"]
            secrets = {s["parameter"]: {"name": s["name"], "key": s["key"]} for s in auth["spec"]["secretTargetRef"]}
            # the keda ACL user (queue lengths only), with the password the Redis server gives it
            # (created by hand: deploy/autoscaling/README.md)
            assert secrets == {"password": redis_ref, "username": {"name": redis_ref["name"], "key": "username"}}, secrets
            # the Service the Deployments reach as redis://redis:6379/<db>, named across namespaces
            host, port = meta["address"].rsplit(":", 1)
            svc = services[url.hostname]
            assert host == f"{url.hostname}.{svc['metadata']['namespace']}.svc"
            assert int(port) == url.port and any(p["port"] == url.port for p in svc["spec"]["ports"])
            assert meta.get("databaseIndex", "0") == (url.path.strip("/") or "0")
    # the password is never rendered from the tree
    assert not _kind(rendered, "Secret")


@needs_kubectl
def test_keda_reaches_redis_through_the_network_policy(rendered):
    policy = _kind(rendered, "NetworkPolicy")["redis"]
    deployments = _kind(rendered, "Deployment")
    assert _admits(policy, KEDA_OPERATOR, "keda", {}, "redis")
    # ... and only KEDA's operator, only from its namespace; the operator's Pods as before
    assert not _admits(policy, KEDA_OPERATOR, "default", {}, "redis")
    assert not _admits(policy, {"app": "keda-operator-metrics-apiserver"}, "keda", {}, "redis")
    assert not _admits(policy, {"app": "something"}, "keda", {}, "redis")
    for name in ("watcher", "worker", "health-worker", "beat", "api", "flower"):
        assert _admits(policy, _pod_labels(deployments[name]), "proxy-operator", {}, "redis"), name


# -- the API's HPA, replicas, grace period ----------------------------------------------------

@needs_kubectl
def test_the_hpa_scales_the_api_on_cpu_and_the_api_requests_cpu(rendered):
    [hpa] = _kind(rendered, "HorizontalPodAutoscaler").values()
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = _target(rendered, hpa)
    assert target["metadata"]["name"] == "api" and _pod_labels(target)["app.kubernetes.io/component"] == "api"
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    assert metric["resource"]["target"]["averageUtilization"] > 0
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    # Utilization is computed against the request: without one the HPA cannot compute it
    for c in target["spec"]["template"]["spec"]["containers"]:
        assert (c.get("resources") or {}).get("requests", {}).get("cpu"), f"api/{c['name']}: no CPU request"


@needs_kubectl
def test_the_autoscalers_own_the_replicas_of_what_they_scale_and_nothing_else(rendered):
    deployments = _kind(rendered, "Deployment")
    targets = [s["spec"]["scaleTargetRef"]["name"] for s in _scalers(rendered)]
    assert len(targets) == len(set(targets)), "a Deployment with two autoscalers (KEDA's HPA and another) would flap"
    for name, deploy in deployments.items():
        if name in targets:
            assert "replicas" not in deploy["spec"], f"{name}: `kubectl apply` would reset the autoscaler's count"
        else:
            assert deploy["spec"]["replicas"] >= 1, name


@needs_kubectl
def test_a_worker_removed_by_a_scale_down_may_finish_its_tasks(rendered):
    for so in _kind(rendered, "ScaledObject").values():
        target = _target(rendered, so)
        env = {e["name"]: e.get("value") for e in _container(target).get("env", [])}
        limit = float(env.get("TASK_TIME_LIMIT") or Settings().task_time_limit)  # the hard limit it runs with
        assert target["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > limit


# -- other layouts -----------------------------------------------------------------------------

@needs_kubectl
def test_on_deploy_base_without_network_policies_it_adds_none(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [_rel(tmp_path, DEPLOY / "base")], "components": [_rel(tmp_path, COMPONENT)]}))
    docs = _kustomize(tmp_path)
    # a lone policy selecting Redis would shut every operator Pod out of it
    assert not _kind(docs, "NetworkPolicy")
    assert _kind(docs, "ScaledObject") and _kind(docs, "HorizontalPodAutoscaler")


@needs_kubectl
def test_references_follow_a_name_prefix(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namePrefix": "team-",
        "resources": [_rel(tmp_path, DEPLOY / "base")], "components": [_rel(tmp_path, COMPONENT)]}))
    docs = _kustomize(tmp_path)
    auths = _kind(docs, "TriggerAuthentication")
    for scaler in _scalers(docs):
        assert _target(docs, scaler)["metadata"]["name"].startswith("team-")
    for so in _kind(docs, "ScaledObject").values():
        assert all(t["authenticationRef"]["name"] in auths for t in _triggers(so))


# -- the lists KEDA reads are where the product's tasks wait ------------------------------------

@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
@needs_kubectl
def test_keda_reads_the_lists_a_queued_task_waits_in_and_the_metric_counts(tmp_path, redis_url, redis_client):
    from workers.celery_app import celery_app
    from workers.metrics_server import QueueDepthCollector

    _write_on_top_of_default(tmp_path)
    docs = _kustomize(tmp_path)
    # Nothing in the product sets a priority: kombu's Redis transport then keeps every message of
    # queue q in the list q (priority 0), the only list a KEDA redis trigger reads per queue.
    assert celery_app.conf.task_default_priority is None
    sent = {"proxies": "proxy.poll", "health": "health.probe_batch", "gc": "gc.sweep"}
    with celery_app.connection_for_write(redis_url) as conn:
        channel = conn.default_channel
        for n, queue in enumerate(sorted(shared_queues())):
            for _ in range(n + 1):  # a different depth per queue: 1, 2, 3
                celery_app.send_task(sent.get(queue, "proxy.poll"), args=["ns", "p", "uid", 0], queue=queue,
                                     connection=conn)
        expected = {q: n + 1 for n, q in enumerate(sorted(shared_queues()))}
        for so in _kind(docs, "ScaledObject").values():
            queues = _consumed_queues(_target(docs, so))
            [family] = QueueDepthCollector(lambda: redis_client, queues).collect()
            exported = {s.labels["queue"]: s.value for s in family.samples}
            for t in _triggers(so):
                list_name = t["metadata"]["listName"]
                assert channel._q_for_pri(list_name, channel.default_priority) == list_name
                assert redis_client.type(list_name) == "list"
                assert redis_client.llen(list_name) == expected[list_name], list_name
                # proxy_operator_queue_depth{queue=...} of the workers reports the same depth
                assert exported[list_name] == expected[list_name], list_name
