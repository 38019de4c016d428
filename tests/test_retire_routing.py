"""``instance.retire`` delivered on a queue that is not its instance's, through a real Celery worker.

Every sender routes the task with ``Router.queue_for_instance`` (a kvm instance runs on its
host's queue, ``kvm.<provider>.<host>``).  A stale or forged message on another queue (here
``proxies``, served by the general worker) naming a domain on host ``h2`` must be dropped with
one warning before the worker dials ``h2``: a dead host would stall that worker through the
retries.  The kvm provider has real key material (a client key, a known_hosts entry for the
host), and both hosts point at a reserved loopback port nobody listens on, so a dial gets as
far as the TCP connect and is refused there.  The stray message never dials; a message naming
an unknown provider is dropped with no retry; correctly routed messages still run (the
kubernetes Pod one names is deleted, and the h2 message on h2's queue dials h2, is refused and
is retried).
"""

from __future__ import annotations

import re
import time
import uuid

import pytest
from celery import Celery
from kubernetes import client as k8s

from devcluster.loopback import reserve_port
from tests.kvm.harness import known_hosts_line, kvm_entry, make_keys
from tests.support.processes import celery_worker
from tests.support.retire import replaced_pod, retire_lines, retire_pattern, send_retire, worker_env
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

H2_QUEUE = "kvm.kvm-lab.h2"


def _kvm_lab(tmp_path, dead_port: int) -> dict:
    """The providers-config entry ``kvm-lab``: hosts h1 and h2 on 127.0.0.1:``dead_port``, with a
    fresh ed25519 client key and a known_hosts file listing a host key for that address, so a
    dial loads its material and fails only at the TCP connect."""
    keys = make_keys(tmp_path / "keys")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(known_hosts_line("127.0.0.1", dead_port, keys.host_pub))
    hosts = [{"name": name, "address": "127.0.0.1", "port": dead_port} for name in ("h1", "h2")]
    return kvm_entry(name="kvm-lab", user="nobody", port=dead_port, key_file=keys.client_key,
                     known_hosts_file=known_hosts, hosts=hosts)


def test_a_retire_on_the_wrong_queue_is_dropped_before_dialling_its_host(kube, kube_client, redis_url, tmp_path):
    dead = reserve_port()  # bound, never listening: every connect to it is refused
    port = dead.getsockname()[1]
    env = worker_env(kube, redis_url, tmp_path, [_kvm_lab(tmp_path, port)], RETRY_INITIAL="0.2", RETRY_MAX="0.5")
    refused = re.compile(rf"kvm kvm-lab host h2: dial failed: .*TCP: connect to 127\.0\.0\.1:{port}: "
                         r"Connection refused")
    core = k8s.CoreV1Api(kube_client)
    worker = celery_worker(env, queues=f"proxies,{H2_QUEUE}", concurrency=1, name="retire-routing").start()
    client = Celery("test-client", broker=redis_url)

    def explain() -> str:
        return worker.log()[-4000:]

    try:
        worker.wait_for_log("ready.", timeout=60)
        uid = str(uuid.uuid4())
        stray = f"hosts/h2/domains/px-{uid[:8]}"
        sent = send_retire(client, uid, provider="kvm-lab", provider_id=stray, queue="proxies")
        wait_for(lambda: retire_lines(worker.log(), stray), 20, "the stray retire to be handled", explain=explain)
        time.sleep(3.0)  # a worker that dialled h2 logs the refusal and retries within this
        lines = retire_lines(worker.log(), stray)
        assert len(lines) == 1 and " WARNING " in lines[0], "\n".join(lines)
        assert "delivered on proxies" in lines[0] and f"belongs on {H2_QUEUE}" in lines[0], lines[0]
        log = worker.log()
        assert f"instance.retire[{sent.id}] succeeded" in log, log[-4000:]
        assert not re.search(r"instance\.retire\[[^\]]+\] retry:", log), log[-4000:]
        assert "dial failed" not in log and "retrying in" not in log, log[-4000:]

        # An unknown provider is dropped too, with no retry (nothing to route it by).
        unknown = send_retire(client, uid, provider="gone-provider", provider_id=stray, queue=H2_QUEUE)
        dropped = retire_pattern(stray) + r" provider 'gone-provider' is not configured; dropped"
        wait_for(lambda: re.search(dropped, worker.log()), 20, "the unknown provider's retire to be dropped",
                 explain=explain)
        time.sleep(2.0)  # a retry of it would be logged within this (RETRY_INITIAL is 0.2 s)
        log = worker.log()
        assert f"instance.retire[{unknown.id}] succeeded" in log, log[-4000:]
        assert f"instance.retire[{unknown.id}] retry:" not in log, log[-4000:]
        assert len(retire_lines(log, stray)) == 2, "\n".join(retire_lines(log, stray))
        assert "dial failed" not in log, log[-4000:]

        # Correctly routed: the kubernetes Pod on proxies is deleted ...
        pod_uid = replaced_pod(core)
        send_retire(client, pod_uid)
        wait_for(lambda: not core.list_namespaced_pod("default").items, 20, "the replaced Pod to be deleted",
                 explain=explain)
        # ... and the h2 domain on h2's own queue dials h2's port: refused, so retried.
        send_retire(client, uid, provider="kvm-lab", provider_id=stray, queue=H2_QUEUE)
        wait_for(lambda: refused.search(worker.log()), 30, "the correctly routed retire to dial h2", explain=explain)
        wait_for(lambda: re.search(retire_pattern(stray) + r" DialError; retrying in", worker.log()), 30,
                 "the refused dial to be retried", explain=explain)
    finally:
        worker.stop()
        client.close()
        dead.close()
