"""End to end: real watcher, Celery worker and beat processes against the API fake.

The processes are started through their real commands (``proxy-operator watch``,
``celery -A workers worker``, ``celery -A workers beat``) with a private Redis; the fake
admits Proxies through the real CRD and its kubelet stand-in runs a real Squid per Pod on a
loopback address of its own.  The pipeline tests (the sample from apply to Running to delete,
skip-cleanup, delete during a slow create) apply, read and delete Proxies with the real
``kubectl`` (:class:`tests.support.kubectl.Kubectl`; skipped with the reason when it is not
installed), as a user does after ``kubectl apply -f deploy/samples/...``; there the Python client
only looks behind the scenes (the Pods the operator made, the fake's request counts).  The
robustness tests (a worker killed mid-create, no secrets in logs) create Proxies with the Python
client, so they run without kubectl too.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import pytest
import redis as redis_lib
import requests
import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from app.providers.kubernetes.config import DEFAULT_IMAGE
from app.providers.kubernetes.provider import LABEL_MANAGED_BY, LABEL_PROXY_UID
from app.resources import GROUP, PLURAL, VERSION
from tests.support.kubectl import Kubectl, needs_kubectl
from devcluster.squid import LOOPBACK_SQUID_BLOCK
from tests.support.waiting import wait_for
from tests.support.processes import celery_beat, celery_worker, watcher
from devcluster.redis_server import free_port
from tests.support.stack_fixtures import cluster, origin  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "deploy" / "samples" / "proxy_kubernetes.yaml"
SECRET_USER_DATA = "#cloud-config\n# e2e-user-data-marker-7f3a9c\npackages: [squid]\n"
SECRET_TOKEN = "e2e-bearer-token-marker-51d2e0"


@pytest.fixture()
def kubectl(cluster, tmp_path) -> Kubectl:
    """The user's kubectl against the fake, run from the repository root (``-f deploy/samples/...``)."""
    return Kubectl(cluster.fake, tmp_path / "user", cwd=ROOT)


def with_operator_env(**overrides: str):
    """Decorate a test so :func:`operator_env` (and the processes started from it) takes
    ``overrides`` (environment variable -> value, strings) over its defaults, for a test that
    needs e.g. longer task time limits than the rest of the file."""
    def mark(test):
        test.operator_env_overrides = overrides
        return test
    return mark


@pytest.fixture()
def operator_env(request, cluster, redis_url, tmp_path):
    """Environment of the operator processes: kubeconfig (with a marker token), providers config.

    Short task time limits (soft 8 s, hard 10 s) keep the per-Proxy lock and a delete's wait
    for an in-flight create (hard limit + 10 s) short; a test decorated with
    :func:`with_operator_env` gets its overrides on top."""
    kubeconfig = cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig"))
    doc = yaml.safe_load(Path(kubeconfig).read_text())
    doc["users"][0]["user"]["token"] = SECRET_TOKEN
    Path(kubeconfig).write_text(yaml.safe_dump(doc))
    providers = tmp_path / "providers.yaml"
    # the kubelet's Squids must reach the origin on loopback: declared like an operator would
    providers.write_text(yaml.safe_dump({"providers": [{"name": "k8s-local", "type": "kubernetes",
                                                        "checkInterval": "10s", "squid": LOOPBACK_SQUID_BLOCK}],
                                         # the tests' Proxies in "default" carry cloud-init
                                         "tenancy": {"cloudInitNamespaces": ["default"]}}))
    return {
        "KUBECONFIG": kubeconfig, "REDIS_URL": redis_url, "PROVIDERS_CONFIG": str(providers),
        "RESYNC_INTERVAL": "3", "GC_INTERVAL": "3600", "POLL_INITIAL": "0.5", "POLL_MAX": "2",
        "RETRY_INITIAL": "0.5", "RETRY_MAX": "2", "TASK_SOFT_TIME_LIMIT": "8", "TASK_TIME_LIMIT": "10",
        "BROKER_VISIBILITY_TIMEOUT": "60", "LOG_LEVEL": "DEBUG",
        "PROBE_ALLOWED_RANGES": "127.0.0.0/8",  # the kubelet's Squids run on loopback
        **getattr(request.function, "operator_env_overrides", {}),
    }


@pytest.fixture()
def operator(operator_env, tmp_path):
    """watcher + worker + beat, started through their real commands."""
    metrics_port = free_port()
    (tmp_path / "prom").mkdir()
    worker_env = {**operator_env, "METRICS_BIND": f"127.0.0.1:{metrics_port}",
                  "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")}
    procs = {
        "worker": celery_worker(worker_env).start(),
        "beat": celery_beat(operator_env, str(tmp_path)).start(),
        "watcher": watcher(operator_env).start(),
    }
    procs["worker"].wait_for_log("ready", timeout=60)
    procs["worker"].metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    yield procs
    for p in procs.values():
        p.stop()


def custom(cluster) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(cluster.fake.api_client())


def sample_manifest(name: str, annotations: dict | None = None, **spec) -> str:
    """The sample Proxy manifest as YAML for ``kubectl apply -f -``, renamed, with ``annotations``
    and ``spec`` fields added."""
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["name"] = name
    if annotations:
        body["metadata"]["annotations"] = annotations
    body["spec"].update(spec)
    return yaml.safe_dump(body)


def create(cluster, name: str, **spec) -> None:
    """Create the sample Proxy renamed to ``name`` (``spec`` fields added) with the Python client,
    for the tests that must run without kubectl (a worker killed mid-create, secrets in logs)."""
    body = yaml.safe_load(sample_manifest(name, **spec))
    custom(cluster).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)


def phase(cluster, name: str) -> str | None:
    """The Proxy's ``status.phase`` read with the Python client (``None``: no phase, or no Proxy)."""
    try:
        obj = custom(cluster).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return (obj.get("status") or {}).get("phase")


def wait_running(kubectl: Kubectl, name: str, timeout: int = 60) -> None:
    """``kubectl wait --for=jsonpath={.status.phase}=Running px/NAME`` (``timeout`` seconds)."""
    kubectl("wait", "--for=jsonpath={.status.phase}=Running", f"px/{name}", f"--timeout={timeout}s",
            timeout=timeout + 15)


def managed_pods(cluster) -> list:
    return k8s.CoreV1Api(cluster.fake.api_client()).list_pod_for_all_namespaces(
        label_selector=f"{LABEL_MANAGED_BY}=proxy-operator").items


class PhaseWatch(threading.Thread):
    """``kubectl get px --watch`` (custom columns NAME, PHASE): every distinct phase the Proxy
    ``name`` shows, in order, in :attr:`phases` (rows without a phase, ``<none>``, left out).

    :attr:`watching` is set once kubectl's watch request was answered (its ``-v=6`` request log;
    the watch starts at the resourceVersion of its list, so nothing after that is missed)."""

    def __init__(self, kubectl: Kubectl, name: str) -> None:
        super().__init__(daemon=True)
        self.name, self.phases, self.watching = name, [], threading.Event()
        self.proc = kubectl.popen("get", "px", "--watch", "-v=6", "--no-headers",
                                  "-o", "custom-columns=NAME:.metadata.name,PHASE:.status.phase")

    def run(self) -> None:
        for line in self.proc.stdout:
            if "watch=true" in line and " 200 OK " in line:
                self.watching.set()
            cells = line.split()
            if len(cells) == 2 and cells[0] == self.name and cells[1] != "<none>" and \
                    (not self.phases or self.phases[-1] != cells[1]):
                self.phases.append(cells[1])

    def stop(self) -> None:
        """End the kubectl process and the reading thread."""
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.join(timeout=5)


@needs_kubectl
def test_sample_proxy_goes_running_serves_traffic_and_is_deleted(cluster, operator, origin, kubectl):
    """As a user: ``kubectl apply`` the sample, ``get px -w`` and ``wait`` until Running, read it
    (``get -o json``, the printer columns, ``describe`` with Events), use its Squid, ``kubectl delete``
    (which returns once the operator removed the Pod and released the finalizer)."""
    watch = PhaseWatch(kubectl, "squid-k8s-1")
    watch.start()
    try:
        assert watch.watching.wait(20), "kubectl get px -w did not start watching within 20 s"
        assert kubectl("apply", "-f", "deploy/samples/proxy_kubernetes.yaml").stdout.strip() == \
            "proxy.crawl.example.com/squid-k8s-1 created"
        wait_running(kubectl, "squid-k8s-1")
        proxy = json.loads(kubectl("get", "px", "squid-k8s-1", "-o", "json").stdout)

        [pod] = managed_pods(cluster)
        assert pod.metadata.labels[LABEL_PROXY_UID] == proxy["metadata"]["uid"]
        assert pod.metadata.labels[LABEL_MANAGED_BY] == "proxy-operator"
        container = pod.spec.containers[0]
        assert container.image == DEFAULT_IMAGE and container.ports[0].container_port == 3128
        squid_address = cluster.kubelet.address_of(pod.metadata.namespace, pod.metadata.name)
        assert squid_address and squid_address.startswith("127.")
        assert proxy["status"]["address"] == squid_address
        assert proxy["status"]["providerID"] == f"default/{pod.metadata.name}"
        assert "crawl.example.com/cleanup" in proxy["metadata"]["finalizers"]
        wait_for(lambda: watch.phases[-1:] == ["Running"], 5, "kubectl get px -w to show Running")
        # A new Proxy has no phase (it reads Pending) until the create's write-ahead makes it
        # Provisioning; Pending is written only when a create stops before that (docs/observability.md).
        assert watch.phases[:2] == ["Provisioning", "Running"]

        [header, row] = kubectl("get", "px").stdout.splitlines()
        assert header.split()[:4] == ["NAME", "PHASE", "PROVIDER", "ADDRESS"]
        assert row.split()[:4] == ["squid-k8s-1", "Running", "k8s-local", squid_address]
        assert "Provisioning" in kubectl("describe", "px", "squid-k8s-1").stdout.split("Events:", 1)[1]

        response = requests.get(f"{origin}/through-the-proxy", proxies={"http": f"http://{squid_address}:3128"},
                                timeout=10)
        assert response.status_code == 200 and response.json()["path"] == "/through-the-proxy"

        # Provider requests are counted by the metrics decorator, aggregated across prefork children.
        scrape = requests.get(operator["worker"].metrics_url, timeout=5).text
        assert ('proxy_operator_provider_requests_total{operation="create",outcome="ok",'
                'provider="k8s-local",type="kubernetes"} 1.0') in scrape

        # kubectl delete: the Pod goes first, then the Proxy (finalizer released); kubectl waits for both.
        assert kubectl("delete", "px", "squid-k8s-1", "--timeout=30s", timeout=45).stdout.strip() == \
            'proxy.crawl.example.com "squid-k8s-1" deleted'
        gone = kubectl("get", "px", "squid-k8s-1", check=False)
        assert gone.returncode == 1 and 'proxies.crawl.example.com "squid-k8s-1" not found' in gone.stderr
        assert managed_pods(cluster) == []
        assert cluster.kubelet.squid_of("default", pod.metadata.name) is None
    finally:
        watch.stop()


@needs_kubectl
def test_skip_cleanup_deletes_the_proxy_and_keeps_the_pod(cluster, operator, kubectl):
    kubectl("apply", "-f", "-", input=sample_manifest("squid-keep", {"crawl.example.com/skip-cleanup": "true"}))
    wait_running(kubectl, "squid-keep")
    kubectl("delete", "px", "squid-keep", "--timeout=30s", timeout=45)  # returns once the Proxy is gone
    time.sleep(1)
    assert len(managed_pods(cluster)) == 1


def history(list_call, *args, since: str, **kwargs) -> list[tuple[str, str, int, bool]]:
    """Every watch event of ``list_call(*args, **kwargs)`` after resourceVersion ``since``, as
    ``(type, name, resourceVersion, deleting)`` in order (``deleting``: the object carries a
    ``deletionTimestamp``); a 1 s watch, the fake replays its history.  The fake's
    resourceVersions are one global counter, so they order writes across resources."""
    events = []
    for e in k8s_watch.Watch().stream(list_call, *args, resource_version=since, timeout_seconds=1, **kwargs):
        obj = e["object"]
        if isinstance(obj, dict):
            meta = obj["metadata"]
            name, rv, deleting = meta["name"], meta["resourceVersion"], bool(meta.get("deletionTimestamp"))
        else:
            meta = obj.metadata
            name, rv, deleting = meta.name, meta.resource_version, meta.deletion_timestamp is not None
        events.append((e["type"], name, int(rv), deleting))
    return events


#: Seconds the API fake holds the Pod create in the slow-create test.
SLOW_POD_CREATE = 8


@needs_kubectl
# The create step (its API requests plus the 8 s Pod create) must finish within the soft time
# limit, or the test would pin a create cut short by the limit instead of a slow one that lands.
@with_operator_env(TASK_SOFT_TIME_LIMIT="20", TASK_TIME_LIMIT="25")
def test_delete_during_a_slow_pod_create_leaks_nothing(cluster, operator, kubectl):
    """kubectl delete while the Pod create is still in flight (the API fake holds it 8 s): the
    create lands, the finalizer is released only after that Pod is gone, no Pod leaks or doubles."""
    core = k8s.CoreV1Api(cluster.fake.api_client())
    mark = core.list_pod_for_all_namespaces().metadata.resource_version
    cluster.fake.delay_next("create", "pods", seconds=SLOW_POD_CREATE)
    kubectl("apply", "-f", "-", input=sample_manifest("squid-slow"))
    wait_for(lambda: cluster.fake.request_count("create", "pods") >= 1, 30, "the Pod create to be sent")
    kubectl("delete", "px", "squid-slow", "--timeout=60s", timeout=75)  # returns once the Proxy is gone
    assert managed_pods(cluster) == []

    # resourceVersions are the server's order of writes: the Proxy's deletion started before the
    # Pod landed (the create was in flight), and the Proxy went (its finalizer released) only
    # after that Pod was gone.
    pods = history(core.list_pod_for_all_namespaces, since=mark, label_selector=f"{LABEL_MANAGED_BY}=proxy-operator")
    proxies = [e for e in history(custom(cluster).list_cluster_custom_object, GROUP, VERSION, PLURAL, since=mark)
               if e[1] == "squid-slow"]
    assert len({e[1] for e in pods}) == 1, pods  # one Pod ever: none duplicated
    assert pods[0][0] == "ADDED" and pods[-1][0] == "DELETED", pods
    deletion_started = min(rv for _, _, rv, deleting in proxies if deleting)
    [proxy_gone] = [rv for t, _, rv, _ in proxies if t == "DELETED"]
    assert deletion_started < pods[0][2] < pods[-1][2] < proxy_gone, (pods, proxies)
    # The worker got the create's answer (not cut short by the task time limit): the create that
    # finished after the Proxy started terminating is the one this test pins.
    log = operator["worker"].log()
    assert f"created pod default/{pods[0][1]}" in log and "Soft time limit" not in log

    time.sleep(3)  # a resync period: nothing comes back either
    assert managed_pods(cluster) == []  # counted at the end: 0 leaked
    assert cluster.fake.request_count("create", "pods") == 1  # 0 duplicated


def test_bad_manifest_is_rejected_with_the_rule_message(cluster):
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["name"] = "bad"
    del body["spec"]["provider"]
    with pytest.raises(k8s.ApiException) as err:
        custom(cluster).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    assert err.value.status == 422
    assert "provider" in json.loads(err.value.body)["message"]


def test_worker_killed_mid_create_leaves_one_pod_and_a_running_proxy(cluster, operator_env, tmp_path):
    # The Pod create is answered slowly, so the worker is SIGKILLed while it waits for it.
    cluster.fake.delay_next("create", "pods", seconds=3)
    worker = celery_worker(operator_env, name="victim").start()
    beat = celery_beat(operator_env, str(tmp_path)).start()
    watch = watcher(operator_env).start()
    try:
        worker.wait_for_log("ready", timeout=60)
        create(cluster, "squid-kill")
        wait_for(lambda: cluster.fake.request_count("create", "pods") >= 1, 30, "the Pod create to be sent")
        worker.kill()
        wait_for(lambda: len(managed_pods(cluster)) == 1, 10, "the in-flight Pod create to land")
        replacement = celery_worker(operator_env, name="replacement").start()
        try:
            # Provisioned: Running, or already judged by the health worker (Ready / Unhealthy).
            provisioned = {"Running", "Ready", "Unhealthy"}
            try:
                wait_for(lambda: phase(cluster, "squid-kill") in provisioned, 120, "Proxy Running after restart")
            except AssertionError as exc:
                status = custom(cluster).get_namespaced_custom_object(
                    GROUP, VERSION, "default", PLURAL, "squid-kill").get("status")
                raise AssertionError(f"{exc}; status: {status}; replacement worker log:\n"
                                     f"{replacement.log()[-4000:]}") from None
            assert len(managed_pods(cluster)) == 1
        finally:
            replacement.stop()
    finally:
        for p in (watch, beat, worker):
            p.stop()


def test_no_user_data_or_credentials_in_logs_task_messages_or_flower(cluster, operator, operator_env, redis_url):
    from tests.support.processes import BIN, Process

    port = free_port()
    flower = Process("flower", [str(BIN / "celery"), "-A", "workers", "flower", "--address=127.0.0.1",
                                f"--port={port}"], {**operator_env, "FLOWER_UNAUTHENTICATED_API": "true"}).start()
    try:
        # Flower shows tasks only from events it received: wait until it sees the beat's resync.
        wait_for(lambda: _flower_tasks(port), 60, "Flower to receive task events")
        core = k8s.CoreV1Api(cluster.fake.api_client())
        core.create_namespaced_secret("default", k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name="ci-secret"), string_data={"user-data": SECRET_USER_DATA}))
        for name, cloud_init in (("squid-inline", {"inline": SECRET_USER_DATA}),
                                 ("squid-secret", {"secretRef": {"name": "ci-secret", "key": "user-data"}})):
            create(cluster, name, cloudInit=cloud_init)
        for name in ("squid-inline", "squid-secret"):
            wait_for(lambda n=name: phase(cluster, n) == "Running", 60, f"{name} Running")
        tasks = wait_for(lambda: (t := _flower_tasks(port)) and any(v.get("name") == "proxy.create"
                                                                  for v in t.values()) and t,
                         30, "Flower to list the create tasks")
        flower_text = json.dumps(tasks)
        broker = redis_lib.Redis.from_url(redis_url)
        broker_text = " ".join(_dump(broker, k) for k in broker.scan_iter(count=1000))
        logs = "\n".join(p.log() for p in operator.values()) + flower.log()
        assert "proxy.create" in logs  # the logs we search are the real ones
        for haystack, where in ((logs, "process logs"), (flower_text, "Flower"), (broker_text, "Redis/broker")):
            assert "e2e-user-data-marker" not in haystack, f"user-data leaked into {where}"
            assert SECRET_TOKEN not in haystack, f"API token leaked into {where}"
    finally:
        flower.stop()


def _flower_tasks(port: int) -> dict | None:
    try:
        r = requests.get(f"http://127.0.0.1:{port}/api/tasks", timeout=2)
    except requests.RequestException:
        return None
    return r.json() if r.ok and r.json() else None


def _decode(raw: bytes) -> str:
    """Return a broker value as text, with kombu's base64 message bodies decoded."""
    text = raw.decode(errors="replace")
    try:
        msg = json.loads(text)
    except ValueError:
        return text
    if isinstance(msg, list) and msg and isinstance(msg[0], dict):  # unacked: [message, exchange, key]
        msg = msg[0]
    if isinstance(msg, dict) and msg.get("properties", {}).get("body_encoding") == "base64":
        text += " " + base64.b64decode(msg["body"]).decode(errors="replace")
    return text


def _dump(r, key: bytes) -> str:
    kind = r.type(key).decode()
    if kind == "string":
        return _decode(r.get(key) or b"")
    if kind == "list":
        return " ".join(_decode(v) for v in r.lrange(key, 0, -1))
    if kind == "hash":
        return " ".join(_decode(v) for v in r.hgetall(key).values())
    if kind == "set":
        return " ".join(v.decode(errors="replace") for v in r.smembers(key))
    if kind == "zset":
        return " ".join(v.decode(errors="replace") for v in r.zrange(key, 0, -1))
    return ""
