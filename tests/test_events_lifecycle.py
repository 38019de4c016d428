"""The Events of a whole Proxy lifecycle, through the real processes (docs/observability.md, "Events").

Watcher, worker and beat started through their real commands, the API fake with the CRD's
admission and its kubelet stand-in (a real Squid per Pod), a private Redis, a local health
origin.  One Proxy goes through: create, Ready, its Squid dies (Unhealthy), its Pod is
deleted (recreated), a spec change (replaced) whose create first meets a namespace quota
(QuotaExceeded), Ready again, deletion.  A second Proxy whose health URL never answers
fails by the provisioning deadline.  ``kubectl describe px`` reads these Events; each
happening is told once.  (``InstanceStarted``, the start of a stopped instance, cannot happen
to a Pod: tests/kvm and tests/gcp pin it.)
"""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client as k8s

from app.providers.kubernetes.provider import LABEL_MANAGED_BY
from app.resources import GROUP, PLURAL, VERSION
from devcluster.cluster import FakeCluster
from devcluster.redis_server import free_port
from devcluster.squid import LOOPBACK_SQUID_BLOCK
from tests.support.origin import origin_server
from tests.support.processes import celery_beat, celery_worker, watcher
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

QUOTA_MESSAGE = ('pods "x" is forbidden: exceeded quota: compute-resources, requested: cpu=100m, '
                 'used: cpu=2, limited: cpu=2')


def proxy_body(name: str, health_url: str, image: str | None = None) -> dict:
    spec = {"mode": "Managed", "provider": "k8s-local", "endpoint": {"port": 3128},
            "healthCheck": {"url": health_url, "intervalSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 1}}
    if image:
        spec["placement"] = {"image": image}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": name, "namespace": "default"},
            "spec": spec}


def story(api, uid: str) -> list[tuple[str, str]]:
    """``(type, reason)`` of every Event about the object ``uid``, in the order they were created."""
    events = [e for e in k8s.CoreV1Api(api).list_namespaced_event("default").items if e.involved_object.uid == uid]
    events.sort(key=lambda e: int(e.metadata.resource_version))
    return [(e.type, e.reason) for e in events]


def test_a_whole_lifecycle_tells_its_story_in_events(redis_url, tmp_path):
    with FakeCluster(bookmark_interval=1.0) as cluster, origin_server() as origin:
        api = cluster.fake.api_client()
        custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
        providers = tmp_path / "providers.yaml"
        providers.write_text(yaml.safe_dump({"providers": [{
            "name": "k8s-local", "type": "kubernetes", "checkInterval": "0", "squid": LOOPBACK_SQUID_BLOCK,
            "kubernetes": {"image": "ubuntu/squid:latest", "images": ["ubuntu/squid:edge"]}}]}))
        env = {"KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig")), "REDIS_URL": redis_url,
               "PROVIDERS_CONFIG": str(providers), "RESYNC_INTERVAL": "2", "GC_INTERVAL": "3600",
               "POLL_INITIAL": "0.5", "POLL_MAX": "1", "RETRY_INITIAL": "0.5", "RETRY_MAX": "1",
               "QUOTA_BACKOFF": "1", "TASK_SOFT_TIME_LIMIT": "8", "TASK_TIME_LIMIT": "10",
               "BROKER_VISIBILITY_TIMEOUT": "60", "HEALTH_SWEEP_INTERVAL": "1", "EGRESS_ECHO_URL": "",
               "HEALTH_PROVISION_DEADLINE": "12", "PROBE_ALLOWED_RANGES": "127.0.0.0/8"}
        procs = [celery_worker(env, concurrency=2).start(), celery_beat(env, str(tmp_path)).start(),
                 watcher(env).start()]
        try:
            procs[0].wait_for_log("ready", timeout=60)
            created = custom.create_namespaced_custom_object(
                GROUP, VERSION, "default", PLURAL, proxy_body("storied", f"{origin}/generate_204"))
            uid = created["metadata"]["uid"]
            dead_port = free_port()  # nothing listens: this one is never healthy
            doomed = custom.create_namespaced_custom_object(
                GROUP, VERSION, "default", PLURAL, proxy_body("doomed", f"http://127.0.0.1:{dead_port}/generate_204"))

            def phase(name: str = "storied") -> str | None:
                obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
                return (obj.get("status") or {}).get("phase")

            def pod():
                pods = core.list_pod_for_all_namespaces(label_selector=f"{LABEL_MANAGED_BY}=proxy-operator").items
                return next((p for p in pods if p.metadata.labels.get("crawl.example.com/proxy-uid") == uid), None)

            wait_for(lambda: phase() == "Ready", 40, "storied Ready")
            # Its Squid dies: the Pod still looks Running, the probes say Unhealthy.
            first = pod()
            cluster.kubelet.squid_of("default", first.metadata.name).stop()
            wait_for(lambda: phase() == "Unhealthy", 20, "storied Unhealthy")
            # Its Pod goes away: recreated, Ready again.
            core.delete_namespaced_pod(first.metadata.name, first.metadata.namespace)
            wait_for(lambda: (p := pod()) is not None and p.metadata.uid != first.metadata.uid, 30, "a new Pod")
            wait_for(lambda: phase() == "Ready", 40, "storied Ready after the recreate")
            # A spec change replaces the instance; the first create meets a namespace quota.
            cluster.fake.fail_next("create", "pods", code=403, reason="Forbidden", message=QUOTA_MESSAGE)
            custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "storied",
                                                  {"spec": {"placement": {"image": "ubuntu/squid:edge"}}})
            wait_for(lambda: (p := pod()) is not None and p.spec.containers[0].image == "ubuntu/squid:edge"
                     and phase() == "Ready", 40, "storied replaced and Ready")
            wait_for(lambda: phase("doomed") == "Failed", 40, "doomed Failed by the provisioning deadline")
            custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "storied")
            wait_for(lambda: ("Normal", "InstanceDeleted") in story(api, uid), 30, "the deletion's Event")

            assert story(api, uid) == [  # (an object without a phase reads Pending: no Event for that)
                ("Normal", "Provisioning"), ("Normal", "Running"), ("Normal", "Ready"),
                ("Warning", "Unhealthy"),
                ("Warning", "InstanceLost"), ("Normal", "Running"), ("Normal", "Ready"),
                ("Normal", "Replacing"), ("Warning", "QuotaExceeded"), ("Normal", "Running"), ("Normal", "Ready"),
                ("Normal", "Terminating"), ("Normal", "InstanceDeleted"),
            ]
            doomed_story = story(api, doomed["metadata"]["uid"])
            assert doomed_story[-1] == ("Warning", "ProvisioningDeadlineExceeded")
            assert doomed_story.count(("Warning", "ProvisioningDeadlineExceeded")) == 1
            unhealthy = [e for e in core.list_namespaced_event("default").items
                         if e.involved_object.uid == uid and e.reason == "Unhealthy"][0]
            assert unhealthy.message.startswith("ConnectionRefused:")  # the probe reason leads
        finally:
            for p in procs:
                p.stop()
            api.close()
