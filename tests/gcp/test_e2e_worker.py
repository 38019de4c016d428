"""End to end through the real processes: watcher, Celery worker and beat, with a gcp provider
whose apiEndpoint is the Compute REST fake.

``kubectl apply`` of the gcp sample takes the Proxy to Running (instance inserted with the
Secret's cloud-init as user-data, the zone operation waited at the fake) and ``kubectl
delete`` removes the instance and releases the Proxy.  A quota error from the fake, at the
call and inside the operation, shows as the ``QuotaExceeded`` condition and the long quota
backoff before the next attempt.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from app.resources import GROUP, PLURAL, VERSION
from app.providers.gcp.startup import STARTUP_SCRIPT
from devcluster.cluster import FakeCluster
from tests.support.processes import celery_beat, celery_worker, watcher
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "deploy" / "samples" / "proxy_gcp.yaml"
PROJECT = "demo-project"
QUOTA_BACKOFF = 3.0


@pytest.fixture()
def cluster():
    with FakeCluster(kubelet=False, bookmark_interval=1.0) as c:
        yield c


@pytest.fixture()
def operator(cluster, compute, redis_url, tmp_path):
    """watcher + worker + beat, configured with the sample's gcp provider pointed at the fake."""
    providers = tmp_path / "providers.yaml"
    providers.write_text(yaml.safe_dump({"providers": [{
        "name": "gcp-eu", "type": "gcp", "checkInterval": "10s",
        "gcp": {"project": PROJECT, "zones": ["europe-west1-b"], "apiEndpoint": compute.url, "anonymous": True,
                "requestTimeout": "5s", "operationTimeout": "10s", "wireLogging": {"enabled": True}},
    }], "tenancy": {"cloudInitNamespaces": ["default"]}}))  # the sample carries cloud-init
    env = {
        "KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig")), "REDIS_URL": redis_url,
        "PROVIDERS_CONFIG": str(providers), "RESYNC_INTERVAL": "3600", "GC_INTERVAL": "3600",
        "POLL_INITIAL": "0.5", "POLL_MAX": "1", "RETRY_INITIAL": "0.3", "RETRY_MAX": "0.6",
        "QUOTA_BACKOFF": str(QUOTA_BACKOFF), "TASK_SOFT_TIME_LIMIT": "20", "TASK_TIME_LIMIT": "25",
        "BROKER_VISIBILITY_TIMEOUT": "120", "LOG_LEVEL": "DEBUG",
        "PROBE_ALLOWED_RANGES": "127.0.0.0/8",  # the Compute fake's instances are on loopback
    }
    procs = {"worker": celery_worker(env).start(), "beat": celery_beat(env, str(tmp_path)).start(),
             "watcher": watcher(env).start()}
    procs["worker"].wait_for_log("ready", timeout=60)
    yield procs
    for p in procs.values():
        p.stop()


def _apply_sample(cluster, name: str) -> tuple[dict, str]:
    secret, proxy = list(yaml.safe_load_all(SAMPLE.read_text()))
    try:
        k8s.CoreV1Api(cluster.fake.api_client()).create_namespaced_secret("default", secret)
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
    proxy["metadata"]["name"] = name
    created = k8s.CustomObjectsApi(cluster.fake.api_client()).create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, proxy)
    return created, secret["stringData"]["user-data"]


def _proxy(cluster, name: str) -> dict | None:
    try:
        return k8s.CustomObjectsApi(cluster.fake.api_client()).get_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, name)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _phase(cluster, name: str) -> str | None:
    p = _proxy(cluster, name)
    return ((p or {}).get("status") or {}).get("phase")


def _condition(cluster, name: str, ctype: str) -> dict | None:
    p = _proxy(cluster, name) or {}
    return next((c for c in (p.get("status") or {}).get("conditions", []) if c["type"] == ctype), None)


def test_gcp_proxy_goes_running_and_is_deleted(cluster, compute, operator):
    created, user_data = _apply_sample(cluster, "squid-gcp-e2e")
    uid = created["metadata"]["uid"]
    proxy = wait_for(lambda: _phase(cluster, "squid-gcp-e2e") in ("Running", "Ready", "Unhealthy")
                  and _proxy(cluster, "squid-gcp-e2e"), 60, "Proxy Running")

    [(key, inst)] = list(compute.instances.items())
    project, zone, name = key
    assert (project, zone) == (PROJECT, "europe-west1-b")
    assert proxy["status"]["providerID"] == f"projects/{PROJECT}/zones/europe-west1-b/instances/{name}"
    assert proxy["status"]["address"] == inst["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
    [insert] = compute.calls("POST", r"/zones/europe-west1-b/instances$")
    assert insert.body["labels"] == {"managed-by": "proxy-operator", "proxy-uid": uid}
    items = {i["key"]: i["value"] for i in insert.body["metadata"]["items"]}
    assert items["user-data"] == user_data  # byte for byte from the Secret
    # The operator's squid.conf and the startup-script that installs it whatever the user-data does.
    assert "http_access deny metadata_dst" in items["squid-conf"]
    assert items["startup-script"] == STARTUP_SCRIPT
    assert insert.body["machineType"] == "zones/europe-west1-b/machineTypes/e2-micro"
    assert compute.calls("POST", r"/zones/europe-west1-b/operations/[^/]+-insert/wait$")  # waited at the fake

    k8s.CustomObjectsApi(cluster.fake.api_client()).delete_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "squid-gcp-e2e")
    wait_for(lambda: _proxy(cluster, "squid-gcp-e2e") is None, 30, "Proxy deleted")
    assert compute.instances == {}
    assert compute.calls("POST", r"/zones/europe-west1-b/operations/[^/]+-delete/wait$")

    logs = "\n".join(p.log() for p in operator.values())
    assert "squid-gcp-e2e" in operator["worker"].log()  # the logs we search are the real ones
    assert "Only the crawlers' network" not in logs and "acl crawlers" not in logs  # no user-data


def test_quota_exceeded_from_the_call_and_the_operation_shows_as_condition(cluster, compute, operator):
    compute.fail("POST", r"/zones/europe-west1-b/instances$", 403, "QUOTA_EXCEEDED",
                 "Quota 'CPUS' exceeded.  Limit: 8.0 in region europe-west1.")
    compute.fail_operation("insert", 403, "QUOTA_EXCEEDED", "Quota 'IN_USE_ADDRESSES' exceeded.  Limit: 4.0")
    _apply_sample(cluster, "squid-gcp-quota")

    cond = wait_for(lambda: (c := _condition(cluster, "squid-gcp-quota", "Provisioned")) and
                 c["reason"] == "QuotaExceeded" and c, 30, "QuotaExceeded condition")
    assert cond["status"] == "False" and "Quota" in cond["message"]
    wait_for(lambda: _phase(cluster, "squid-gcp-quota") in ("Running", "Ready", "Unhealthy"), 60, "Proxy Running")
    # Both quota errors (HTTP 403 at the insert, then inside its operation) were recorded as
    # QuotaExceeded, and the third attempt created the instance.
    quota_lines = [line for line in operator["worker"].log().splitlines() if "quota exceeded" in line]
    assert any("Quota 'CPUS' exceeded" in line for line in quota_lines)
    assert any("Quota 'IN_USE_ADDRESSES' exceeded" in line for line in quota_lines)
    assert len(compute.calls("POST", r"/zones/europe-west1-b/instances$")) == 3
    assert len(compute.instances) == 1
    assert _condition(cluster, "squid-gcp-quota", "Provisioned")["status"] == "True"


def test_quota_exceeded_backs_off_before_the_next_insert(cluster, compute, operator):
    message = "Quota 'CPUS' exceeded.  Limit: 8.0 in region europe-west1."
    compute.fail("POST", r"/zones/europe-west1-b/instances$", 403, "QUOTA_EXCEEDED", message, times=2)
    _apply_sample(cluster, "squid-gcp-backoff")
    wait_for(lambda: _phase(cluster, "squid-gcp-backoff") in ("Running", "Ready", "Unhealthy"), 60, "Proxy Running")
    inserts = compute.calls("POST", r"/zones/europe-west1-b/instances$")
    assert len(inserts) == 3  # two quota errors, then success
    gaps = [b.at - a.at for a, b in zip(inserts, inserts[1:])]
    # Each retry waited the quota backoff, far longer than a Transient retry (<= 0.6 s here).
    assert all(gap >= QUOTA_BACKOFF * 0.9 for gap in gaps), gaps
