"""The kubelet stand-in: Squid Pods in the fake become real Squids on loopback addresses of their own."""

from __future__ import annotations

import http.server
import ipaddress
import os
import signal
import socket
import threading
import time
import urllib.request

import pytest
from kubernetes import client as k8s
from kubernetes import watch

from app.squid import conf as squid_conf
from devcluster.kubelet import Kubelet
from devcluster.squid import loopback_policy
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)


def squid_pod(name: str, port: int = 3128, conf: str | None = None) -> dict:
    return {"metadata": {"name": name, "labels": {"app": "squid"}}, "spec": {"containers": [{
        "name": "squid", "image": "ubuntu/squid:latest", "ports": [{"containerPort": port}],
        "env": [{"name": "SQUID_CONF", "value": conf or squid_conf.render(port, loopback_policy())}]}]}}


@pytest.fixture
def origin():
    """A local HTTP origin answering 204 on 127.0.0.1."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/generate_204"
    server.shutdown()
    server.server_close()


def port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def test_squid_pod_runs_a_real_squid_and_reports_its_address(kube, kube_client, origin):
    core = k8s.CoreV1Api(kube_client)
    mark = core.list_pod_for_all_namespaces().metadata.resource_version
    with Kubelet(kube) as kubelet:
        created = core.create_namespaced_pod("proxies", squid_pod("px-1"))
        assert created.status.phase == "Pending" and created.status.pod_ip is None
        pod = wait_for(lambda: (p := core.read_namespaced_pod("px-1", "proxies")).status.phase == "Running" and p,
                       what="pod Running")
        address = pod.status.pod_ip
        assert ipaddress.ip_address(address) in ipaddress.ip_network("127.0.0.0/8")
        assert ipaddress.ip_address(address) not in ipaddress.ip_network("127.0.0.0/24")  # claimed, not shared
        assert kubelet.address_of("proxies", "px-1") == address
        assert pod.status.container_statuses[0].ready is True
        # watchers saw Pending -> Pending(ContainerCreating) -> Running through the status path
        phases = [(e["type"], e["object"].status.phase, e["object"].status.pod_ip) for e in watch.Watch().stream(
            core.list_pod_for_all_namespaces, resource_version=mark, timeout_seconds=1)]
        assert phases[0] == ("ADDED", "Pending", None)
        assert phases[-1] == ("MODIFIED", "Running", address)
        assert all(ip is None for _, phase, ip in phases if phase == "Pending")
        # an HTTP request through that address reaches the local origin
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://{address}:3128"}))
        with opener.open(origin, timeout=10) as resp:
            assert resp.status == 204
        squid = kubelet.squid_of("proxies", "px-1")
        assert squid is not None and squid.running()
        core.delete_namespaced_pod("px-1", "proxies")
        wait_for(lambda: not squid.running(), what="squid stopped")
        wait_for(lambda: not port_open(address, 3128), what="port closed")
        assert kubelet.address_of("proxies", "px-1") is None


def test_each_pod_gets_its_own_address_and_port(kube, kube_client):
    core = k8s.CoreV1Api(kube_client)
    with Kubelet(kube) as kubelet:
        core.create_namespaced_pod("a", squid_pod("one"))
        core.create_namespaced_pod("b", squid_pod("two", port=8080))
        pods = wait_for(lambda: (ps := core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items)
                        and len(ps) == 2 and ps, what="both pods Running")
        addresses = {p.metadata.name: p.status.pod_ip for p in pods}
        assert len(set(addresses.values())) == 2
        assert port_open(addresses["one"], 3128) and port_open(addresses["two"], 8080)
        assert kubelet.running() == 2
    # closing the kubelet stops its Squids
    assert not port_open(addresses["one"], 3128)


def test_pods_without_squid_conf_are_left_pending(kube, kube_client):
    core = k8s.CoreV1Api(kube_client)
    with Kubelet(kube):
        core.create_namespaced_pod("a", {"metadata": {"name": "plain"}, "spec": {"containers": [
            {"name": "c", "image": "busybox"}]}})
        core.create_namespaced_pod("a", squid_pod("sq"))
        wait_for(lambda: core.read_namespaced_pod("sq", "a").status.phase == "Running", what="squid pod Running")
        assert core.read_namespaced_pod("plain", "a").status.phase == "Pending"


def test_without_squid_processes_pods_run_with_an_address_only(kube, kube_client):
    core = k8s.CoreV1Api(kube_client)
    with Kubelet(kube, start_squid=False) as kubelet:
        core.create_namespaced_pod("a", squid_pod("fast"))
        pod = wait_for(lambda: (p := core.read_namespaced_pod("fast", "a")).status.phase == "Running" and p,
                       timeout=5, what="pod Running")
        assert pod.status.pod_ip and kubelet.running() == 0
        assert not port_open(pod.status.pod_ip, 3128)


def test_a_squid_that_cannot_start_crash_loops_with_a_doubling_back_off(kube, kube_client):
    core = k8s.CoreV1Api(kube_client)
    mark = core.list_pod_for_all_namespaces().metadata.resource_version
    with Kubelet(kube, startup_timeout=5, restart_backoff=0.2, max_restart_backoff=0.8) as kubelet:
        core.create_namespaced_pod("a", squid_pod("broken", conf="this_is_not_a_directive yes\n"))
        status = wait_for(lambda: (s := core.read_namespaced_pod("broken", "a").status).container_statuses
                          and s.container_statuses[0].restart_count >= 4
                          and s.container_statuses[0].state.waiting is not None and s,
                          what="four restarts")
        # the kubelet's phase rule: a container that terminated and will restart counts as running
        assert status.phase == "Running" and status.pod_ip == kubelet.address_of("a", "broken")
        cs = status.container_statuses[0]
        assert cs.state.waiting.reason == "CrashLoopBackOff" and not cs.ready
        assert cs.last_state.terminated.exit_code == 1 and "this_is_not_a_directive" in cs.last_state.terminated.message
        assert {c.type: c.status for c in status.conditions}["Ready"] == "False"
        assert len(kubelet.errors) >= 4 and all(e.startswith("a/broken: ") for e in kubelet.errors)
        # each failure's back-off doubles from 0.2 s and stops at 0.8 s; the restarts are counted
        seen = {}
        for e in watch.Watch().stream(core.list_namespaced_pod, "a", resource_version=mark, timeout_seconds=1):
            cs = (e["object"].status.container_statuses or [None])[0]
            if cs is not None and cs.state.waiting is not None and cs.state.waiting.reason == "CrashLoopBackOff":
                seen[cs.restart_count] = cs.state.waiting.message.split(" restarting")[0]
        assert [seen.get(n) for n in range(5)] == [
            "back-off 0.2s", "back-off 0.4s", "back-off 0.8s", "back-off 0.8s", "back-off 0.8s"]


def proxied_status(address: str, port: int, url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://{address}:{port}"}))
    with opener.open(url, timeout=10) as resp:
        return resp.status


def test_a_squid_whose_port_is_taken_is_restarted_until_it_runs(kube, kube_client, origin):
    """A transient start failure never wedges a Pod: the kubelet retries on the Pod's own address."""
    core = k8s.CoreV1Api(kube_client)
    # The Pod's port is taken on every address (a listener on the wildcard address, the kernel's
    # pick of a free port), so its first start exits with "Address already in use".
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    busy = holder.getsockname()[1]
    try:
        with Kubelet(kube, restart_backoff=0.5, max_restart_backoff=1.0) as kubelet:
            core.create_namespaced_pod("a", squid_pod("unlucky", port=busy))
            failed = wait_for(lambda: (s := core.read_namespaced_pod("unlucky", "a").status).container_statuses
                              and s.container_statuses[0].last_state.terminated is not None and s,
                              what="a failed first start")
            holder.close()
            cs = failed.container_statuses[0]
            assert cs.last_state.terminated.exit_code == 1
            assert "Unable to open HTTP Socket" in cs.last_state.terminated.message
            assert kubelet.errors and f":{busy}" in kubelet.errors[0]
            address = failed.pod_ip
            pod = wait_for(lambda: (p := core.read_namespaced_pod("unlucky", "a")).status.container_statuses[0].ready
                           and p, timeout=20, what="pod Ready after the restart")
            cs = pod.status.container_statuses[0]
            assert pod.status.phase == "Running" and pod.status.pod_ip == address  # the Pod keeps its IP
            assert cs.state.running is not None and cs.restart_count >= 1 and cs.last_state.terminated.exit_code == 1
            assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"
            assert proxied_status(address, busy, origin) == 204
    finally:
        holder.close()


def test_a_squid_that_dies_is_restarted_but_one_stopped_on_purpose_is_not(kube, kube_client, origin):
    core = k8s.CoreV1Api(kube_client)
    with Kubelet(kube, restart_backoff=0.5, max_restart_backoff=1.0) as kubelet:
        core.create_namespaced_pod("a", squid_pod("crashy"))
        pod = wait_for(lambda: (p := core.read_namespaced_pod("crashy", "a")).status.phase == "Running" and p,
                       what="pod Running")
        address, first = pod.status.pod_ip, kubelet.squid_of("a", "crashy")
        os.kill(first.proc.pid, signal.SIGKILL)  # dies from outside, as an OOM kill would
        pod = wait_for(lambda: (p := core.read_namespaced_pod("crashy", "a")).status.container_statuses[0].ready
                       and p.status.container_statuses[0].restart_count == 1 and p, timeout=20, what="restarted")
        cs = pod.status.container_statuses[0]
        assert cs.last_state.terminated.exit_code == 137 and pod.status.pod_ip == address
        again = kubelet.squid_of("a", "crashy")
        assert again is not first and again.running() and proxied_status(address, 3128, origin) == 204
        # a test that takes the endpoint down on purpose keeps it down
        again.stop()
        time.sleep(2)
        assert kubelet.running() == 0 and not port_open(address, 3128)
        assert core.read_namespaced_pod("crashy", "a").status.container_statuses[0].restart_count == 1


def test_pods_that_existed_before_the_kubelet_are_started(kube, kube_client):
    core = k8s.CoreV1Api(kube_client)
    core.create_namespaced_pod("a", squid_pod("early"))
    with Kubelet(kube, start_squid=False):
        wait_for(lambda: core.read_namespaced_pod("early", "a").status.phase == "Running", timeout=5,
                 what="pod Running")


def _my_squids() -> list[int]:
    """PIDs of the Squid processes this test process started (its children running squid)."""
    me = str(os.getpid())
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().split(b"\0")
        except OSError:
            continue
        if fields[1] == me and cmd and cmd[0].endswith(b"squid"):
            out.append(int(pid))
    return out


def test_a_pod_deleted_during_its_back_off_is_not_restarted(kube, kube_client):
    core = k8s.CoreV1Api(kube_client)
    others = set(_my_squids())  # Squids of session fixtures sharing this worker process
    with Kubelet(kube, startup_timeout=5, restart_backoff=1.5, max_restart_backoff=1.5) as kubelet:
        core.create_namespaced_pod("a", squid_pod("doomed", conf="this_is_not_a_directive yes\n"))
        wait_for(lambda: (s := core.read_namespaced_pod("doomed", "a").status).container_statuses
                 and s.container_statuses[0].state.waiting is not None
                 and s.container_statuses[0].state.waiting.reason == "CrashLoopBackOff", what="a back-off")
        failures = len(kubelet.errors)
        core.delete_namespaced_pod("doomed", "a")
        time.sleep(3)  # twice the back-off: a restart would have failed (and been counted) by now
        assert len(kubelet.errors) == failures, kubelet.errors
        assert kubelet.running() == 0 and kubelet.address_of("a", "doomed") is None
        assert set(_my_squids()) - others == set()
