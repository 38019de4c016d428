"""``instance.retire`` delivered on a queue that is not its instance's, through a real Celery worker.

Every sender routes the task with ``Router.queue_for_instance`` (a kvm instance runs on its
host's queue, ``kvm.<provider>.<host>``).  A stale or forged message on another queue (here
``proxies``, served by the general worker) naming a domain on host ``h2`` must be dropped with
one warning before the worker dials ``h2``: a dead host would stall that worker through the
retries.  Both kvm hosts point at a loopback port nobody listens on, so nothing is ever reached.
A correctly routed message still runs (the kubernetes Pod it names is deleted; the h2 message
on h2's queue reaches the provider), and a message naming an unknown provider is dropped.
"""

from __future__ import annotations

import re
import time
import uuid

import pytest
import yaml
from celery import Celery
from kubernetes import client as k8s

from app.providers.pods.provider import LABEL_MANAGED_BY, LABEL_PROXY_UID
from tests.kvm.harness import kvm_entry
from tests.support.loopback import reserve_port
from tests.support.processes import celery_worker
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

H2_QUEUE = "kvm.kvm-lab.h2"


def _env(kube, redis_url, tmp_path, dead_port: int) -> dict[str, str]:
    """A worker's environment: ``k8s-local`` on the API fake and ``kvm-lab`` with hosts h1 and h2
    on a dead loopback port; the test's Redis, GC off, short backoffs."""
    hosts = [{"name": name, "address": "127.0.0.1", "port": dead_port} for name in ("h1", "h2")]
    kvm = kvm_entry(name="kvm-lab", user="nobody", port=dead_port, key_file=tmp_path / "id_ed25519",
                    known_hosts_file=tmp_path / "known_hosts", hosts=hosts)
    providers = tmp_path / "providers.yaml"
    providers.write_text(yaml.safe_dump({"providers": [
        {"name": "k8s-local", "type": "kubernetes", "checkInterval": "0s"}, {**kvm, "checkInterval": "0s"}]}))
    return {"KUBECONFIG": kube.write_kubeconfig(str(tmp_path / "kubeconfig")), "REDIS_URL": redis_url,
            "PROVIDERS_CONFIG": str(providers), "GC_INTERVAL": "3600", "BROKER_VISIBILITY_TIMEOUT": "60",
            "EGRESS_ECHO_URL": "", "LOG_LEVEL": "INFO", "RETRY_INITIAL": "0.2", "RETRY_MAX": "0.5"}


def _retire_lines(log: str, provider_id: str) -> list[str]:
    """The worker's own log lines about retiring ``provider_id``."""
    return [line for line in log.splitlines() if f"retire {provider_id}:" in line]


def test_a_retire_on_the_wrong_queue_is_dropped_before_dialling_its_host(kube, kube_client, redis_url, tmp_path):
    dead = reserve_port()  # bound, never listening: every dial is refused
    env = _env(kube, redis_url, tmp_path, dead.getsockname()[1])
    core = k8s.CoreV1Api(kube_client)
    worker = celery_worker(env, queues=f"proxies,{H2_QUEUE}", concurrency=1, name="retire-routing").start()
    client = Celery("test-client", broker=redis_url)
    try:
        worker.wait_for_log("ready.", timeout=60)
        uid = str(uuid.uuid4())
        stray = f"hosts/h2/domains/px-{uid[:8]}"
        client.send_task("instance.retire", args=["kvm-lab", stray, "default", "gone", uid], queue="proxies")
        deadline = time.monotonic() + 20
        while not _retire_lines(worker.log(), stray):
            assert time.monotonic() < deadline, f"the stray retire was never handled; log:\n{worker.log()[-4000:]}"
            time.sleep(0.1)
        time.sleep(3.0)  # a worker that dialled h2 logs its failure and retries within this
        lines = _retire_lines(worker.log(), stray)
        assert len(lines) == 1 and " WARNING " in lines[0], "\n".join(lines) or worker.log()[-4000:]
        assert "delivered on proxies" in lines[0] and f"belongs on {H2_QUEUE}" in lines[0], lines[0]
        log = worker.log()
        assert not re.search(r"instance\.retire\[[^\]]+\] retry:", log), log[-4000:]
        assert "DialError" not in log and "retrying in" not in log, log[-4000:]

        # An unknown provider is dropped too, with no retry (nothing to route it by).
        client.send_task("instance.retire", args=["gone-provider", stray, "default", "gone", uid], queue=H2_QUEUE)
        worker.wait_for_log(f"retire {stray}: provider 'gone-provider' is not configured", timeout=20)

        # Correctly routed: the kubernetes Pod on proxies is deleted ...
        pod_uid = str(uuid.uuid4())
        core.create_namespaced_pod("default", k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name="replaced-pod", labels={LABEL_MANAGED_BY: "proxy-operator",
                                                                   LABEL_PROXY_UID: pod_uid}),
            spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="squid", image="squid")])))
        client.send_task("instance.retire", args=["k8s-local", "default/replaced-pod", "default", "gone", pod_uid],
                         queue="proxies")
        wait_for(lambda: not core.list_namespaced_pod("default").items, 20, "the replaced Pod to be deleted")
        # ... and the h2 domain on h2's own queue reaches the provider (h2 is dead: a retry).
        client.send_task("instance.retire", args=["kvm-lab", stray, "default", "gone", uid], queue=H2_QUEUE)
        wait_for(lambda: re.search(rf"retire {re.escape(stray)}: \w+; retrying in", worker.log()), 30,
                 "the correctly routed retire to reach h2")
    finally:
        worker.stop()
        client.close()
        dead.close()
