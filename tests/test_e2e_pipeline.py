"""End to end: real watcher, Celery worker and beat processes against the API fake.

The processes are started through their real commands (``proxy-operator watch``,
``celery -A workers worker``, ``celery -A workers beat``) with a private Redis; the fake
admits Proxies through the real CRD and its kubelet stand-in runs a real Squid per Pod on a
loopback address of its own.  This is what a user sees after ``kubectl apply -f deploy/samples/...``.
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

from app.providers.pods.provider import LABEL_MANAGED_BY, LABEL_PROXY_UID
from app.resources import GROUP, PLURAL, VERSION
from tests.support.cluster import FakeCluster
from tests.support.origin import origin_server
from tests.support.squid import LOOPBACK_SQUID_BLOCK
from tests.support.waiting import wait_for
from tests.support.processes import celery_beat, celery_worker, watcher
from tests.support.redis_server import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "deploy" / "samples" / "proxy_kubernetes.yaml"
SECRET_USER_DATA = "#cloud-config\n# e2e-user-data-marker-7f3a9c\npackages: [squid]\n"
SECRET_TOKEN = "e2e-bearer-token-marker-51d2e0"


@pytest.fixture()
def cluster():
    with FakeCluster(bookmark_interval=1.0) as c:
        yield c


@pytest.fixture()
def origin():
    """A local origin (see :func:`tests.support.origin.origin_server`)."""
    with origin_server() as url:
        yield url


@pytest.fixture()
def operator_env(cluster, redis_url, tmp_path):
    """Environment of the operator processes: kubeconfig (with a marker token), providers config."""
    kubeconfig = cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig"))
    doc = yaml.safe_load(Path(kubeconfig).read_text())
    doc["users"][0]["user"]["token"] = SECRET_TOKEN
    Path(kubeconfig).write_text(yaml.safe_dump(doc))
    providers = tmp_path / "providers.yaml"
    # the kubelet's Squids must reach the origin on loopback: declared like an operator would
    providers.write_text(yaml.safe_dump({"providers": [{"name": "k8s-local", "type": "kubernetes",
                                                        "checkInterval": "10s", "squid": LOOPBACK_SQUID_BLOCK}]}))
    return {
        "KUBECONFIG": kubeconfig, "REDIS_URL": redis_url, "PROVIDERS_CONFIG": str(providers),
        "RESYNC_INTERVAL": "3", "GC_INTERVAL": "3600", "POLL_INITIAL": "0.5", "POLL_MAX": "2",
        "RETRY_INITIAL": "0.5", "RETRY_MAX": "2", "TASK_SOFT_TIME_LIMIT": "8", "TASK_TIME_LIMIT": "10",
        "BROKER_VISIBILITY_TIMEOUT": "60", "LOG_LEVEL": "DEBUG",
        "PROBE_ALLOWED_RANGES": "127.0.0.0/8",  # the kubelet's Squids run on loopback
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


def apply_file(cluster, path: Path, **overrides) -> dict:
    """``kubectl apply -f`` of a Proxy manifest (create)."""
    body = yaml.safe_load(path.read_text())
    body["metadata"].update(overrides)
    ns = body["metadata"].get("namespace", "default")
    return custom(cluster).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def get_proxy(cluster, name: str, ns: str = "default") -> dict | None:
    try:
        return custom(cluster).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def managed_pods(cluster) -> list:
    return k8s.CoreV1Api(cluster.fake.api_client()).list_pod_for_all_namespaces(
        label_selector=f"{LABEL_MANAGED_BY}=proxy-operator").items


class PhaseRecorder(threading.Thread):
    """Watches one Proxy and records every distinct phase it shows, in order."""

    def __init__(self, cluster, name: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.name, self.phases = cluster, name, []
        self.watch = k8s_watch.Watch()

    def run(self) -> None:
        try:
            for ev in self.watch.stream(custom(self.cluster).list_namespaced_custom_object, GROUP, VERSION,
                                        "default", PLURAL, field_selector=f"metadata.name={self.name}",
                                        timeout_seconds=120):
                phase = (ev["object"].get("status") or {}).get("phase")
                if phase and (not self.phases or self.phases[-1] != phase):
                    self.phases.append(phase)
        except Exception:  # noqa: BLE001 - the fake closing under the stream at teardown
            pass


def test_sample_proxy_goes_running_serves_traffic_and_is_deleted(cluster, operator, origin):
    recorder = PhaseRecorder(cluster, "squid-k8s-1")
    recorder.start()
    time.sleep(0.3)
    created = apply_file(cluster, SAMPLE)
    uid = created["metadata"]["uid"]

    proxy = wait_for(lambda: (p := get_proxy(cluster, "squid-k8s-1")) and
                     (p.get("status") or {}).get("phase") == "Running" and p, 60, "Proxy Running")
    [pod] = managed_pods(cluster)
    assert pod.metadata.labels[LABEL_PROXY_UID] == uid
    assert pod.metadata.labels[LABEL_MANAGED_BY] == "proxy-operator"
    container = pod.spec.containers[0]
    assert container.image == "ubuntu/squid:latest" and container.ports[0].container_port == 3128
    squid_address = cluster.kubelet.address_of(pod.metadata.namespace, pod.metadata.name)
    assert squid_address and squid_address.startswith("127.")
    assert proxy["status"]["address"] == squid_address
    assert proxy["status"]["providerID"] == f"default/{pod.metadata.name}"
    assert "crawl.example.com/cleanup" in proxy["metadata"]["finalizers"]
    wait_for(lambda: recorder.phases[-1:] == ["Running"], 5, "recorder to see Running")
    # A new Proxy has no phase (it reads Pending) until the create's write-ahead makes it
    # Provisioning; Pending is written only when a create stops before that (docs/observability.md).
    assert recorder.phases[:2] == ["Provisioning", "Running"]

    response = requests.get(f"{origin}/through-the-proxy", proxies={"http": f"http://{squid_address}:3128"}, timeout=10)
    assert response.status_code == 200 and response.json()["path"] == "/through-the-proxy"

    # Provider requests are counted by the metrics decorator, aggregated across prefork children.
    scrape = requests.get(operator["worker"].metrics_url, timeout=5).text
    assert ('proxy_operator_provider_requests_total{operation="create",outcome="ok",'
            'provider="k8s-local",type="kubernetes"} 1.0') in scrape

    # kubectl delete: the Pod goes first, then the Proxy (finalizer released).
    custom(cluster).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-k8s-1")
    wait_for(lambda: get_proxy(cluster, "squid-k8s-1") is None, 30, "Proxy deleted")
    assert managed_pods(cluster) == []
    assert cluster.kubelet.squid_of("default", pod.metadata.name) is None
    recorder.watch.stop()


def test_skip_cleanup_deletes_the_proxy_and_keeps_the_pod(cluster, operator):
    apply_file(cluster, SAMPLE, name="squid-keep", annotations={"crawl.example.com/skip-cleanup": "true"})
    wait_for(lambda: (p := get_proxy(cluster, "squid-keep")) and (p.get("status") or {}).get("phase") == "Running",
             60, "Proxy Running")
    custom(cluster).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-keep")
    wait_for(lambda: get_proxy(cluster, "squid-keep") is None, 30, "Proxy deleted")
    time.sleep(1)
    assert len(managed_pods(cluster)) == 1


def test_delete_during_a_slow_pod_create_leaks_nothing(cluster, operator):
    """kubectl delete while the Pod create is still in flight: the finalizer waits, no Pod leaks."""
    cluster.fake.delay_next("create", "pods", seconds=5)
    apply_file(cluster, SAMPLE, name="squid-slow")
    wait_for(lambda: cluster.fake.request_count("create", "pods") >= 1, 30, "the Pod create to be sent")
    custom(cluster).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "squid-slow")
    wait_for(lambda: get_proxy(cluster, "squid-slow") is None, 60, "Proxy deleted")
    # The create landed (the request was in flight), and nothing of it is left.
    wait_for(lambda: managed_pods(cluster) == [], 15, "no Pod left")
    time.sleep(3)  # a resync period: nothing comes back either
    assert managed_pods(cluster) == []
    assert cluster.fake.request_count("create", "pods") == 1


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
        apply_file(cluster, SAMPLE, name="squid-kill")
        wait_for(lambda: cluster.fake.request_count("create", "pods") >= 1, 30, "the Pod create to be sent")
        worker.kill()
        wait_for(lambda: len(managed_pods(cluster)) == 1, 10, "the in-flight Pod create to land")
        replacement = celery_worker(operator_env, name="replacement").start()
        try:
            wait_for(lambda: (p := get_proxy(cluster, "squid-kill")) and
                     (p.get("status") or {}).get("phase") == "Running", 90, "Proxy Running after restart")
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
        body = yaml.safe_load(SAMPLE.read_text())
        for name, cloud_init in (("squid-inline", {"inline": SECRET_USER_DATA}),
                                 ("squid-secret", {"secretRef": {"name": "ci-secret", "key": "user-data"}})):
            body["metadata"]["name"] = name
            body["spec"]["cloudInit"] = cloud_init
            custom(cluster).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
        for name in ("squid-inline", "squid-secret"):
            wait_for(lambda: (p := get_proxy(cluster, name)) and (p.get("status") or {}).get("phase") == "Running",
                     60, f"{name} Running")
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


@pytest.mark.skipif(__import__("shutil").which("kubectl") is None,
                    reason="kubectl is not installed (1.27 or newer, from "
                           "https://kubernetes.io/docs/tasks/tools/)")
def test_kubectl_apply_get_and_delete_as_a_user_would(cluster, operator, tmp_path):
    """The real kubectl: apply with validation, wait, get with printer columns, delete (finalizer honoured)."""
    import subprocess

    env = {"KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp_path / "user-kubeconfig"), token="a-user"),
           "KUBECACHEDIR": str(tmp_path / "kcache"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin:/usr/local/bin"}

    def kubectl(*args: str) -> str:
        res = subprocess.run(["kubectl", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stdout}\n{res.stderr}"
        return res.stdout

    assert kubectl("apply", "-f", "deploy/samples/proxy_kubernetes.yaml").strip() == \
        "proxy.crawl.example.com/squid-k8s-1 created"
    kubectl("wait", "--for=jsonpath={.status.phase}=Running", "px/squid-k8s-1", "--timeout=50s")
    [header, row] = kubectl("get", "px").splitlines()
    assert header.split()[:4] == ["NAME", "PHASE", "PROVIDER", "ADDRESS"]
    [pod] = managed_pods(cluster)
    address = cluster.kubelet.address_of(pod.metadata.namespace, pod.metadata.name)
    assert row.split()[:4] == ["squid-k8s-1", "Running", "k8s-local", address]
    assert "Provisioning" in kubectl("describe", "px", "squid-k8s-1").split("Events:", 1)[1]
    # kubectl delete waits until the operator removed the Pod and released its finalizer
    assert 'proxy.crawl.example.com "squid-k8s-1" deleted' in kubectl("delete", "px", "squid-k8s-1", "--timeout=30s")
    assert get_proxy(cluster, "squid-k8s-1") is None and managed_pods(cluster) == []
