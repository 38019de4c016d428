"""The watcher process logic (watchers.main.run): election + stream + liveness, end to end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client as k8s

from devcluster.apiserver import FakeKube
from devcluster.loopback import free_port
from tests.support.waiting import wait_until
from watchers.leader import ElectionSettings
from watchers.main import WatcherSettings, run
from watchers.stream import StreamSettings

G, V, P = "crawl.example.com", "v1alpha1", "proxies"
NS, LEASE = "proxy-operator", "proxy-operator-watcher"
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(90)

FAST = WatcherSettings(
    stream=StreamSettings(server_timeout=30, read_timeout=1.0, backoff_initial=0.05, backoff_max=0.3),
    election=ElectionSettings(lease_duration=1.5, renew_deadline=1.0, retry_period=0.1, request_timeout=2.0))


def healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def create(custom_api, ns: str, name: str) -> None:
    custom_api.create_namespaced_custom_object(G, V, ns, P, {"apiVersion": f"{G}/{V}", "kind": "Proxy",
                                                             "metadata": {"name": name}, "spec": {"provider": "k8s"}})


class Watcher:
    """watchers.main.run in a thread, recording what it hands over."""

    def __init__(self, fake: FakeKube, identity: str, settings: WatcherSettings = FAST) -> None:
        self.identity = identity
        self.events: list[tuple[str, str]] = []
        self.port = free_port()
        self.stop = threading.Event()
        self.client = fake.api_client()
        self.thread = threading.Thread(target=run, args=(self.on_event,), kwargs=dict(
            lease_namespace=NS, lease_name=LEASE, identity=identity, health_bind=f"127.0.0.1:{self.port}",
            stop=self.stop, settings=settings, api_client=self.client), daemon=True)

    def on_event(self, etype: str, obj: dict) -> None:
        self.events.append((etype, obj["metadata"]["name"]))

    def names(self) -> set[str]:
        return {n for _, n in list(self.events)}

    def start(self) -> "Watcher":
        self.thread.start()
        wait_until(lambda: healthz_ok(self.port), 5, f"{self.identity} /healthz up")
        return self

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), f"{self.identity} did not stop"
        self.client.close()


def healthz_ok(port: int) -> bool:
    try:
        return healthz(port)[0] in (200, 503)
    except OSError:
        return False


def lease_holder(fake: FakeKube) -> str | None:
    return ((fake.store.find("leases", NS, LEASE) or {}).get("spec") or {}).get("holderIdentity")


def test_one_leader_streams_and_a_standby_takes_over(fake, custom_api):
    create(custom_api, "ns1", "existing")
    a = Watcher(fake, "a").start()
    wait_until(lambda: "existing" in a.names(), 5, "a lists")
    b = Watcher(fake, "b").start()
    try:
        assert healthz(a.port) == (200, "ok: leader, streaming\n")
        assert healthz(b.port) == (200, "ok: standby\n")
        create(custom_api, "ns1", "while-a")
        wait_until(lambda: "while-a" in a.names(), 5, "a sees while-a")
        time.sleep(0.3)
        assert b.events == []
        a.halt()  # stops streaming, then releases the lease
        assert lease_holder(fake) in (None, "b")
        wait_until(lambda: lease_holder(fake) == "b", 3, "b holds the lease")
        create(custom_api, "ns2", "after-a")
        wait_until(lambda: {"existing", "while-a", "after-a"} <= b.names(), 5, "b sees everything")
        assert ("SYNC", "existing") in b.events and ("ADDED", "after-a") in b.events
        assert "after-a" not in a.names()
        assert healthz(b.port)[0] == 200 and "leader" in healthz(b.port)[1]
    finally:
        b.halt()
    assert lease_holder(fake) is None  # released on shutdown


def test_losing_the_lease_stops_the_stream(fake, custom_api):
    a = Watcher(fake, "a").start()
    try:
        wait_until(lambda: lease_holder(fake) == "a", 3, "a leads")
        wait_until(lambda: fake.open_watches(P) == 1, 3, "a streams")
        coord = k8s.CoordinationV1Api(a.client)
        lease = coord.read_namespaced_lease(LEASE, NS)
        lease.spec.holder_identity = "intruder"
        coord.replace_namespaced_lease(LEASE, NS, lease)
        wait_until(lambda: fake.open_watches(P) == 0, 3, "a stops streaming")
        create(custom_api, "ns1", "under-intruder")
        time.sleep(0.3)
        assert "under-intruder" not in a.names()
        assert healthz(a.port) == (200, "ok: standby\n")
        # the intruder never renews; a takes the lease back and resumes without missing anything
        wait_until(lambda: "under-intruder" in a.names(), 6, "a resumes")
        assert lease_holder(fake) == "a"
    finally:
        a.halt()


def test_healthz_fails_when_the_leaders_stream_stalls(fake, custom_api):
    slow = WatcherSettings(
        stream=StreamSettings(server_timeout=60, read_timeout=30.0, backoff_initial=0.05, backoff_max=0.3),
        election=FAST.election, liveness_window=1.0)
    a = Watcher(fake, "a", slow).start()
    try:
        wait_until(lambda: fake.open_watches(P) == 1, 3, "a streams")
        time.sleep(1.2)
        assert healthz(a.port)[0] == 200  # bookmarks every 0.2 s count as progress
        fake.hang_watches(P)
        wait_until(lambda: healthz(a.port)[0] == 503, 3, "503 on a stalled stream")
        assert "no progress" in healthz(a.port)[1]
        fake.release_hung_watches()  # the connection drops; the watcher reconnects
        wait_until(lambda: healthz(a.port)[0] == 200, 5, "healthy again")
    finally:
        a.halt()


def test_settings_from_the_environment():
    s = WatcherSettings.from_env({"WATCH_TIMEOUT": "5", "WATCH_READ_TIMEOUT": "2.5", "LEASE_DURATION": "3",
                                  "LEASE_RENEW_DEADLINE": "2", "LEASE_RETRY_PERIOD": "0.5",
                                  "WATCHER_LIVENESS_WINDOW": "7"})
    assert s.stream.server_timeout == 5 and s.stream.read_timeout == 2.5
    assert (s.election.lease_duration, s.election.renew_deadline, s.election.retry_period) == (3, 2, 0.5)
    assert s.window == 7
    assert WatcherSettings.from_env({}).window == 90 + 30 + 30
    with pytest.raises(ValueError, match="WATCH_READ_TIMEOUT"):
        WatcherSettings.from_env({"WATCH_READ_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match="renew_deadline"):
        WatcherSettings.from_env({"LEASE_DURATION": "1", "LEASE_RENEW_DEADLINE": "2"})


def test_a_subprocess_reaches_the_fake_through_kubeconfig_and_stops_on_sigterm(fake, custom_api, tmp_path):
    create(custom_api, "ns1", "listed")
    kubeconfig = fake.write_kubeconfig(str(tmp_path / "kubeconfig"))
    port = free_port()
    code = (
        "import sys\n"
        "from watchers.main import run\n"
        "run(lambda t, o: print(t, o['metadata']['name'], flush=True), lease_namespace='proxy-operator',"
        f" identity='sub', health_bind='127.0.0.1:{port}')\n"
        "print('exited', flush=True)\n")
    env = {**os.environ, "KUBECONFIG": kubeconfig, "WATCH_READ_TIMEOUT": "2", "LEASE_DURATION": "2",
           "LEASE_RENEW_DEADLINE": "1.5", "LEASE_RETRY_PERIOD": "0.2"}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_until(lambda: "SYNC listed\n" in lines, 30, "the subprocess lists")
        wait_until(lambda: fake.open_watches(P) == 1, 5, "the subprocess watches")
        create(custom_api, "ns1", "watched")
        wait_until(lambda: "ADDED watched\n" in lines, 5, "the subprocess sees the new Proxy")
        assert healthz(port)[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, proc.stderr.read()
        reader.join(timeout=5)
        assert lines[-1] == "exited\n"
        assert lease_holder(fake) is None, "the lease is released on SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
