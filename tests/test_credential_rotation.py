"""Credential rotation end to end on the kubernetes provider.

The real watcher, worker and beat; the API fake with the CRD's admission; the kubelet stand-in
running a real Squid per Pod and mounting the Proxy's credentials Secret the way the kubelet
does for a volume without ``subPath`` (devcluster/kubelet.py): when the Secret changes, the
file in the Pod is swapped atomically a few seconds later (here 6 s, the stand-in for the
kubelet's sync delay), and Squid's ``basic_ncsa_auth`` re-reads it.

The password in ``<proxy>-proxy-auth`` is changed (``password`` and ``htpasswd``, as
docs/observability.md says).  Meanwhile the probes, whose copy of the Secret is re-read every
second here, already send the new password, which the Pod does not know yet; they fall back to
the previous one, so with ``failureThreshold: 1`` the Proxy never leaves Ready.  Once the file
is updated the new password works through Squid, the lease credentials follow, and the old
password stops working within ``squid.credentialsTTL`` (2 s here).
"""

from __future__ import annotations

import base64
import threading

import pytest
import requests
import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from app.squid import conf as squid_conf
from app.resources import GROUP, PLURAL, VERSION
from devcluster.cluster import FakeCluster
from devcluster.kubelet import Kubelet
from devcluster.squid import LOOPBACK_SQUID_BLOCK
from tests.support.origin import origin_server
from tests.support.processes import celery_beat, celery_worker, watcher
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class Recorder(threading.Thread):
    """Every (phase, Healthy status) the Proxy shows, in order."""

    def __init__(self, api, name: str) -> None:
        super().__init__(daemon=True)
        self.api, self.name, self.seen = api, name, []
        self.watch = k8s_watch.Watch()

    def run(self) -> None:
        try:
            for ev in self.watch.stream(k8s.CustomObjectsApi(self.api).list_namespaced_custom_object, GROUP, VERSION,
                                        "default", PLURAL, field_selector=f"metadata.name={self.name}",
                                        timeout_seconds=110):
                status = ev["object"].get("status") or {}
                healthy = next((c["status"] for c in status.get("conditions") or () if c["type"] == "Healthy"), None)
                state = (status.get("phase"), healthy)
                if not self.seen or self.seen[-1] != state:
                    self.seen.append(state)
        except Exception:  # noqa: BLE001 - the fake closing under the stream at teardown
            pass


def through(address: str, url: str, user: str, password: str) -> int:
    """Status of a GET through the Squid at ``address`` with these credentials."""
    proxy = f"http://{user}:{password}@{address}:3128"
    try:
        return requests.get(url, proxies={"http": proxy}, timeout=5).status_code
    except requests.RequestException:
        return 0


def test_a_rotated_password_reaches_the_pod_and_the_proxy_stays_ready(redis_url, tmp_path):
    with FakeCluster(kubelet=False, bookmark_interval=1.0) as cluster, origin_server() as origin:
        kubelet = Kubelet(cluster.fake, secret_sync_delay=6.0).start()
        api = cluster.fake.api_client()
        core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
        providers = tmp_path / "providers.yaml"
        providers.write_text(yaml.safe_dump({"providers": [{
            "name": "k8s-auth", "type": "kubernetes", "checkInterval": "0",
            "squid": {**LOOPBACK_SQUID_BLOCK, "basicAuth": True, "credentialsTTL": "2s"}}]}))
        env = {"KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig")), "REDIS_URL": redis_url,
               "PROVIDERS_CONFIG": str(providers), "RESYNC_INTERVAL": "5", "GC_INTERVAL": "3600",
               "POLL_INITIAL": "0.5", "POLL_MAX": "1", "TASK_SOFT_TIME_LIMIT": "8", "TASK_TIME_LIMIT": "10",
               "BROKER_VISIBILITY_TIMEOUT": "60", "HEALTH_SWEEP_INTERVAL": "1", "EGRESS_ECHO_URL": "",
               "HEALTH_CREDENTIALS_TTL": "1", "PROBE_ALLOWED_RANGES": "127.0.0.0/8"}
        procs = [celery_worker(env, queues="proxies,health", concurrency=2).start(),
                 celery_beat(env, str(tmp_path)).start(), watcher(env).start()]
        recorder = None
        try:
            procs[0].wait_for_log("ready", timeout=60)
            health = f"{origin}/generate_204"
            custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "rotated"},
                "spec": {"provider": "k8s-auth", "healthCheck": {"url": health, "intervalSeconds": 3,
                                                                 "timeoutSeconds": 2, "failureThreshold": 1}}})
            wait_for(lambda: (custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "rotated")
                              .get("status") or {}).get("phase") == "Ready", 60, "the Proxy Ready")
            recorder = Recorder(api, "rotated")
            recorder.start()
            address = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "rotated")["status"][
                "address"]
            secret = core.read_namespaced_secret("rotated-proxy-auth", "default")
            user, old = (base64.b64decode(secret.data[k]).decode() for k in ("username", "password"))
            assert through(address, f"{origin}/x", user, old) == 200

            new = "rotated-N3w-password-0123456789"
            core.patch_namespaced_secret("rotated-proxy-auth", "default", {"stringData": {
                "password": new, "htpasswd": squid_conf.htpasswd_entry(user, new) + "\n"}})
            # the kubelet swaps the Pod's file after its sync delay; then the new password works
            wait_for(lambda: through(address, f"{origin}/x", user, new) == 200, 30, "the new password to work")
            # ... and the old one stops working within credentialsTTL
            wait_for(lambda: through(address, f"{origin}/x", user, old) == 407, 10, "the old password to stop working")
            # the lease credentials (po:auth:<uid>) follow the pair that works
            import redis as redis_lib
            r = redis_lib.Redis.from_url(redis_url, decode_responses=True)
            uid = secret.metadata.owner_references[0].uid
            wait_for(lambda: r.hget(f"po:auth:{uid}", "password") == new, 15, "the lease credentials to follow")
            r.close()
            recorder.watch.stop()
            # Never withdrawn because of its own rotation: Ready and Healthy throughout.
            assert set(recorder.seen) == {("Ready", "True")}, (recorder.seen, custom.get_namespaced_custom_object(
                GROUP, VERSION, "default", PLURAL, "rotated")["status"].get("conditions"))
            logs = "\n".join(p.log() for p in procs)
            assert new not in logs and old not in logs, "a password in the logs"
        finally:
            if recorder is not None:
                recorder.watch.stop()
            for p in procs:
                p.stop()
            kubelet.close()
            api.close()
