"""A real Debian guest VM, from ``kubectl apply`` to a lease, through the real processes.

The guest image is built from Debian packages by :mod:`tests.kvm.guest_image` (cached by its
recipe, see docs/testing.md); it carries cloud-init, Squid and the QEMU guest agent but none
of our configuration.  Everything else is the product:

* the Proxy (basic auth on) is applied to the API fake; the watcher routes it to the host
  worker ``proxy-operator worker --kvm-host kvm-lab/h1``, which over SSH fetches the image from
  a local HTTP server with its sha256 into the pool, makes the overlay and our seed ISO, and
  starts the domain (``domainType: qemu``: TCG here);
* in the guest, cloud-init applies *our* user-data and vendor-data: the squid.conf with its
  ACLs and the htpasswd, the guest agent; the host worker takes the address from the guest
  agent (its log names the source; the DHCP lease, which comes earlier under TCG, is not used:
  the Proxy stays Provisioning, ``WaitingForGuestAgent``, until the agent answers, well within
  the default ``agentAddressTimeout``); the file the Proxy's user-data writes is read back
  through the guest agent (``guest-file-open``/``guest-file-read``);
* the general worker (``celery -A workers worker -Q proxies,health,gc``) probes the health URL
  through the guest's Squid with the Proxy's credentials and the Proxy goes Ready;
* ``proxy-operator api`` leases it; a request through the leased proxy URL reaches the origin,
  which sees it come from the guest's address; without credentials the guest's Squid answers
  407, and with them it refuses (403 from Squid) a destination in the provider's
  ``deniedDestinations`` and loopback, while the exempted origin stays reachable;
* deleting the Proxy destroys the domain and removes its overlay and seed volumes.

The guest lives on the rig's libvirt network inside the rig's private network namespace.
The processes that must reach it (the general worker, the origin, the client of the lease)
run in that namespace (``nsenter -n``); Redis and the API fake stay on this machine's
loopback and are carried into the namespace, at the same 127.0.0.1 ports, by socat pairs
over unix sockets.  Nothing touches this machine's own network.  The origin listens on the
network's gateway address, which the providers config declares in ``squid.allowedDestinations``
and ``squid.httpPorts`` as an operator would.

Skips (with the reason) without root or the binaries, or when the image cannot be built
(no tools, no network to the Debian mirror).  Run it alone with ``pytest -m guest``.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tty
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlsplit

import libvirt
import libvirt_qemu
import pytest
import requests
import yaml
from kubernetes import client as k8s

from app.resources import GROUP, PLURAL, VERSION
from devcluster.cluster import FakeCluster
from tests.kvm import guest_image, harness
from tests.support.processes import BIN, Process, celery_beat, watcher
from tests.support.waiting import wait_for

# libvirt prints every error to stderr by default; the console tap's retries are expected ones.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)

pytestmark = [pytest.mark.guest, pytest.mark.slow, pytest.mark.timeout(1500)]

GATEWAY = "10.213.0.1"  # the rig's libvirt network (tests/kvm/harness.py NETWORK_XML)
DENIED_RANGE = "10.213.0.0/24"  # squid.deniedDestinations: the guest's own network, bar the gateway
TOKEN = "guest-test-token"
NAME = "squid-guest-1"
ORIGIN = Path(__file__).with_name("ns_origin.py")
BOOT_TIMEOUT = 480  # ~90 s measured under TCG with 2 vCPUs; shared cores in CI
# cloud-init applies our squid.conf after boot: 40-180 s measured under TCG, 180 s with the
# machine loaded (the whole suite beside it); the Proxy goes Ready at the next probe after that.
READY_TIMEOUT = 420


@pytest.fixture(scope="session")
def guest_qcow2():
    """The cached guest image (built on first use); skips with the reason when it cannot be built."""
    if shutil.which("socat") is None:
        pytest.skip("missing binary: socat")
    started = time.monotonic()
    try:
        path = guest_image.ensure_image()
    except guest_image.BuildUnavailable as exc:
        pytest.skip(str(exc))
    print(f"\nguest image {path} ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return path


class Netns:
    """Runs commands in the rig's network namespace (this machine's mount namespace kept)."""

    def __init__(self, rig: harness.Rig) -> None:
        self.pid = rig.daemon.pid

    def argv(self, *cmd: str) -> list[str]:
        """Return ``cmd`` prefixed to run in the namespace."""
        return ["nsenter", "-t", str(self.pid), "-n", *cmd]


def _bridge(ns: Netns, port: int, sockdir: str, name: str) -> list[Process]:
    """Carry 127.0.0.1:``port`` of this machine to 127.0.0.1:``port`` inside the namespace."""
    sock = f"{sockdir}/{name}.sock"
    outside = Process(f"fwd-{name}-out", ["socat", f"UNIX-LISTEN:{sock},fork,unlink-early",
                                          f"TCP:127.0.0.1:{port}"], {}).start()
    wait_for(lambda: Path(sock).exists(), 10, f"{sock}")
    inside = Process(f"fwd-{name}-in", ns.argv("socat", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
                                               f"UNIX-CONNECT:{sock}"), {}).start()
    return [outside, inside]


class ConsoleTap:
    """Records the guest's serial console (``console=ttyS0``) from the moment its domain runs.

    A background thread waits for the domain named by the Proxy's ``status.instanceName``,
    reads the pty libvirt gave its serial port (``<serial type='pty'><source path=...>`` in the
    live XML), in raw mode so nothing is echoed back to the guest, and keeps what the guest
    prints, so a guest that never reports an address leaves its boot log in the failure.
    """

    def __init__(self, socket_path: str, instance_name) -> None:
        self._socket = socket_path
        self._instance_name = instance_name  # () -> str | None
        self._chunks: list[bytes] = []
        self._stop = threading.Event()
        self._note = "console not attached"
        self._thread = threading.Thread(target=self._run, name="guest-console", daemon=True)

    def start(self) -> "ConsoleTap":
        self._thread.start()
        return self

    def _pty(self, conn) -> str | None:
        name = self._instance_name()
        if not name:
            return None
        root = ET.fromstring(conn.lookupByName(name).XMLDesc(0))
        source = root.find("./devices/serial[@type='pty']/source")
        return source.get("path") if source is not None else None

    def _run(self) -> None:
        try:
            conn = libvirt.open(f"qemu+unix:///system?socket={self._socket}")
        except libvirt.libvirtError as exc:
            self._note = f"console: cannot connect: {exc}"
            return
        fd = None
        try:
            while fd is None and not self._stop.is_set():
                try:
                    path = self._pty(conn)
                    if path:
                        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
                        tty.setraw(fd)
                        self._note = f"console {path}"
                except Exception as exc:  # noqa: BLE001 - a diagnostic aid: record why and try again
                    self._note = f"console not attached yet: {exc}"
                if fd is None:
                    time.sleep(0.5)
            while fd is not None and not self._stop.is_set():
                ready, _, _ = select.select([fd], [], [], 0.5)
                if ready:
                    try:
                        data = os.read(fd, 4096)
                    except OSError as exc:  # EIO once the domain is gone
                        self._note += f" (closed: {exc.strerror})"
                        break
                    if not data:
                        break
                    self._chunks.append(data)
        finally:
            if fd is not None:
                os.close(fd)
            try:
                conn.close()
            except libvirt.libvirtError:
                pass

    def text(self, tail: int = 6000) -> str:
        """Return the last ``tail`` characters the guest printed, ANSI escapes left in."""
        out = b"".join(self._chunks).decode("utf-8", "replace")
        return f"({self._note}, {len(out)} characters)\n{out[-tail:]}"

    def stop(self) -> None:
        self._stop.set()


def _custom(cluster) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(cluster.fake.api_client())


def _proxy(cluster) -> dict | None:
    try:
        return _custom(cluster).get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, NAME)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _status(cluster) -> dict:
    return (_proxy(cluster) or {}).get("status") or {}


def _agent(dom, command: str, **arguments) -> dict:
    """Run one QEMU guest agent command in the guest; return its ``return`` value."""
    answer = libvirt_qemu.qemuAgentCommand(dom, json.dumps({"execute": command, "arguments": arguments}), 30, 0)
    return json.loads(answer)["return"]


def _guest_file(dom, path: str) -> bytes:
    """Read a file inside the guest through its agent (``guest-file-open``/``-read``/``-close``)."""
    handle = _agent(dom, "guest-file-open", path=path, mode="r")
    try:
        data, eof = b"", False
        while not eof:
            chunk = _agent(dom, "guest-file-read", handle=handle, count=65536)
            data += base64.b64decode(chunk.get("buf-b64", ""))
            eof = chunk.get("eof", True) or not chunk.get("count")
        return data
    finally:
        _agent(dom, "guest-file-close", handle=handle)


def _squid_answer(ns: Netns, proxy_url: str, url: str) -> tuple[str, str]:
    """Return (status code, response headers) of a GET of ``url`` through ``proxy_url``, in the namespace."""
    got = subprocess.run(ns.argv("curl", "-sS", "--noproxy", "", "-o", "/dev/null", "-D", "-", "-w", "%{http_code}",
                                 "--max-time", "30", "-x", proxy_url, url),
                         capture_output=True, text=True, timeout=60)
    headers, _, code = got.stdout.rpartition("\n\n")  # text mode: CRLFs are read as "\n"
    return code.strip(), headers + got.stderr


def test_real_guest_goes_ready_is_leased_and_deleted(rig, guest_qcow2, tmp_path, redis_server, redis_url):
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    ns = Netns(rig)
    data = guest_qcow2.read_bytes()
    url, sha = rig.images.put(f"/images/guest-{guest_image.recipe_key()}.qcow2", data)
    origin_port = harness.free_port()
    entry = rig.entry(
        name="kvm-lab", hosts=[rig.host("h1")], imageTimeout="300s",
        images={"debian-12": {"url": url, "sha256": sha, "format": "qcow2", "firmware": "uefi"}},
        machine_types={"small": {"vcpus": 2, "memoryMiB": 1024, "diskGiB": 3}})
    providers = tmp_path / "providers.yaml"
    providers.write_text(yaml.safe_dump({"providers": [{
        **entry, "checkInterval": 0,
        # The origin sits on the network's gateway at an ephemeral port: declared as an
        # operator would (the product's Squid refuses undeclared ports).
        # The rest of the network is denied (the origin on the gateway exempted from that).
        "squid": {"allowedDestinations": [f"{GATEWAY}/32"], "deniedDestinations": [DENIED_RANGE],
                  "httpPorts": [80, 443, origin_port], "basicAuth": True}}],
        "tenancy": {"cloudInitNamespaces": ["default"]}}))
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"sharedNamespaces: [\"*\"]\nclients:\n  - {{name: crawler-a, token: {TOKEN}}}\n")
    sockdir = tempfile.mkdtemp(prefix="po-guest-")
    procs: list[Process] = []
    taps: list[ConsoleTap] = []
    conn = libvirt.open(f"qemu+unix:///system?socket={rig.daemon.socket}")
    try:
        with FakeCluster(kubelet=False, bookmark_interval=1.0) as cluster:
            env = {"KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig")),
                   "REDIS_URL": redis_url, "PROVIDERS_CONFIG": str(providers), "API_TOKENS_FILE": str(tokens),
                   "RESYNC_INTERVAL": "3600", "GC_INTERVAL": "3600", "POLL_INITIAL": "1", "POLL_MAX": "3",
                   "RETRY_INITIAL": "1", "RETRY_MAX": "3", "HEALTH_SWEEP_INTERVAL": "2", "EGRESS_ECHO_URL": "",
                   "HEALTH_CREDENTIALS_TTL": "5", "LOG_LEVEL": "INFO",
                   # the health URL is the origin on the network's gateway, a private address:
                   # allowed on purpose, as an operator would
                   "PROBE_EXTERNAL_ALLOWED_RANGES": f"{GATEWAY}/32"}
            # Redis and the API fake, reachable inside the namespace at the same addresses.
            procs += _bridge(ns, redis_server.port, sockdir, "redis")
            procs += _bridge(ns, urlsplit(cluster.fake.url).port, sockdir, "kube")
            origin = Process("origin", ns.argv(sys.executable, str(ORIGIN), GATEWAY, str(origin_port)), {}).start()
            procs.append(origin)
            general = Process("general", ns.argv(
                str(BIN / "celery"), "-A", "workers", "worker", "-Q", "proxies,health,gc", "-E",
                "--without-gossip", "--without-mingle", "--concurrency", "2", "--loglevel", "INFO",
                "-n", "general@%h"), env).start()
            host_worker = Process("kvm-worker", [str(BIN / "proxy-operator"), "worker", "--kvm-host", "kvm-lab/h1",
                                                 "--concurrency", "1"], env).start()
            api_port = harness.free_port()
            api = Process("api", [str(BIN / "proxy-operator"), "api", "--bind", f"127.0.0.1:{api_port}",
                                  "--workers", "1"], env).start()
            procs += [general, host_worker, api, celery_beat(env, str(tmp_path)).start(), watcher(env).start()]
            general.wait_for_log("ready", 90)
            host_worker.wait_for_log("ready", 90)
            api_url = f"http://127.0.0.1:{api_port}"
            auth = {"Authorization": f"Bearer {TOKEN}"}
            wait_for(lambda: requests.get(f"{api_url}/healthz", timeout=5).ok, 30, "the API to answer")
            marks["processes up"] = time.monotonic() - t0

            user_data = "#cloud-config\nwrite_files:\n  - path: /etc/proxy-operator-test\n    content: ours\n"
            created = _custom(cluster).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": NAME},
                "spec": {"provider": "kvm-lab",
                         "placement": {"zone": "h1", "image": "debian-12", "machineType": "small"},
                         "cloudInit": {"inline": user_data},
                         "healthCheck": {"url": f"http://{GATEWAY}:{origin_port}/generate_204",
                                         "intervalSeconds": 5, "timeoutSeconds": 4}}})
            uid = created["metadata"]["uid"]
            applied = time.monotonic()
            console = ConsoleTap(rig.daemon.socket, lambda: _status(cluster).get("instanceName")).start()
            taps.append(console)

            def diagnose() -> str:
                return (f"status: {json.dumps(_status(cluster))}\n--- kvm worker\n{host_worker.log()[-4000:]}"
                        f"\n--- general\n{general.log()[-4000:]}\n--- guest console\n{console.text()}")

            try:
                st = wait_for(lambda: (s := _status(cluster)).get("phase") == "Running" or
                              s.get("phase") == "Ready" and s, BOOT_TIMEOUT, "Proxy Running (guest agent address)")
                marks["Running (address from the agent)"] = time.monotonic() - applied
                wait_for(lambda: _status(cluster).get("phase") == "Ready", READY_TIMEOUT, "Proxy Ready (probe through Squid)")
                marks["Ready (health probe through the guest's Squid)"] = time.monotonic() - applied
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{diagnose()}") from None
            st = _status(cluster)
            name, address = st["instanceName"], st["address"]
            assert st["providerID"] == f"hosts/h1/domains/{name}"
            assert address.startswith("10.213.0.") and address != GATEWAY

            # Where the address came from: the host worker logs the source of each address it
            # finds, and the guest agent is the only one it may use within agentAddressTimeout
            # (default 5 min; the agent answers ~90 s after start under TCG).  A fallback to the
            # DHCP lease would show as GuestAgentUnavailable in the condition and a WARNING line.
            log_lines = host_worker.log().splitlines()
            sources = [line.split(": address ", 1)[1] for line in log_lines
                       if f"kvm host h1: domain {name}: address " in line]
            print(f"\naddress sources (host worker): {sources}", file=sys.stderr)
            assert sources == [f"{address} from the guest agent"], sources
            provisioned = next(c for c in st["conditions"] if c["type"] == "Provisioned")
            assert (provisioned["status"], provisioned["reason"]) == ("True", "InstanceRunning"), provisioned
            assert not any("the guest is degraded" in line for line in log_lines)
            waited = [line for line in log_lines if f"domain {name} runs; waiting up to" in line]
            print(f"waited for the agent: {waited}", file=sys.stderr)
            dom = conn.lookupByName(name)
            agent = dom.interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, 0)
            assert any(a["addr"] == address for i in agent.values() for a in (i.get("addrs") or [])), agent
            # cloud-init applied the Proxy's own user-data: the file it writes, read in the guest.
            assert _guest_file(dom, "/etc/proxy-operator-test").rstrip(b"\n") == b"ours"
            assert uid in dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, "https://crawl.example.com/proxy-operator/kvm/v1", 0)
            xml = dom.XMLDesc(0)
            assert 'type="qemu"' in xml or "type='qemu'" in xml
            # The health probes reached the origin through the guest (source = the guest).
            assert f"{address} /generate_204" in origin.log()

            lease = wait_for(lambda: (r := requests.post(f"{api_url}/v1/leases", json={"ttlSeconds": 120},
                                                         headers=auth, timeout=15)).status_code == 201 and r.json(),
                             60, "a lease")
            marks["leased"] = time.monotonic() - applied
            assert lease["proxy"]["name"] == NAME
            proxy_url = lease["proxyUrl"]
            assert urlsplit(proxy_url).hostname == address
            assert lease.get("proxyAuth", {}).get("username")  # basic auth is on
            got = subprocess.run(ns.argv("curl", "-sS", "--max-time", "30", "-x", proxy_url,
                                         f"http://{GATEWAY}:{origin_port}/through-the-lease"),
                                 capture_output=True, text=True, timeout=60)
            assert got.returncode == 0, got.stderr
            body = json.loads(got.stdout)
            assert body == {"path": "/through-the-lease", "client": address}
            # Without the credentials the guest's Squid refuses (our squid.conf's auth ACL).
            bare = proxy_url.replace(urlsplit(proxy_url).netloc, f"{address}:{urlsplit(proxy_url).port}")
            denied = subprocess.run(ns.argv("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time",
                                            "30", "-x", bare, f"http://{GATEWAY}:{origin_port}/no-auth"),
                                    capture_output=True, text=True, timeout=60)
            assert denied.stdout == "407", (denied.stdout, denied.stderr)
            # With them, our squid.conf's destination ACLs: a host of deniedDestinations (not
            # exempted by allowedDestinations) and loopback are refused by Squid itself.
            for refused in (f"http://10.213.0.2:{origin_port}/denied-destination",
                            f"http://127.0.0.1:{origin_port}/loopback"):
                code, headers = _squid_answer(ns, proxy_url, refused)
                assert code == "403" and "Server: squid" in headers, (refused, code, headers)
            assert "/denied-destination" not in origin.log() and "/loopback" not in origin.log()
            requests.delete(f"{api_url}/v1/leases/{lease['leaseId']}?outcome=ok", headers=auth, timeout=15)

            pool = conn.storagePoolLookupByName("default")
            ours = {v.name() for v in pool.listAllVolumes(0) if name in v.name()}
            assert len(ours) == 2, ours  # overlay + seed
            deleting = time.monotonic()
            _custom(cluster).delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, NAME)
            wait_for(lambda: _proxy(cluster) is None, 120, "the Proxy to be deleted")
            marks["deleted"] = time.monotonic() - deleting
            with pytest.raises(libvirt.libvirtError):
                conn.lookupByName(name)
            pool.refresh(0)
            assert not {v.name() for v in pool.listAllVolumes(0) if name in v.name()}
    finally:
        for tap in taps:
            tap.stop()
        conn.close()
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(sockdir, ignore_errors=True)
        marks["total"] = time.monotonic() - t0
        for tap in taps:
            print(f"\nguest console: {tap.text(300)}", file=sys.stderr)
        print("\nreal guest timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in marks.items()), file=sys.stderr)
