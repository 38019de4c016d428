"""Real parts for the kvm provider's tests and benchmark: libvirtd, sshd, an image server.

* :class:`LibvirtDaemon` — ``libvirtd`` + ``virtlogd`` as root in a private mount and network
  namespace (``unshare -m -n``): /etc/libvirt, /run, /var/lib/libvirt, /var/log/libvirt and
  /var/cache/libvirt are bind-mounted from a temp dir, so nothing of this machine's libvirt
  state or network is touched.  Its read-write socket lives in the temp dir, reachable from
  outside the namespaces.  A dir pool ``default``, an isolated network ``default`` (with
  dnsmasq DHCP inside the namespace) and a bridge ``br-po`` are configured the way an admin
  would: XML files + autostart links read at daemon start.
* :class:`Sshd` — OpenSSH's sshd on 127.0.0.1:<free port> with its own host key and one
  authorized key; stop/start keep the port and host key (a "restart").
* :class:`ImageServer` — a loopback HTTP server serving images, counting GETs per path.
* :func:`make_keys`, :func:`known_hosts_line`, :func:`qcow2` — test material.

Usable from tests (tests/kvm/conftest.py) and from bench/kvm.py.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.loopback import free_port  # re-exported: bench/kvm.py and tests use it
from tests.support.waiting import wait_for

# no-ping: dnsmasq otherwise pings every address for 3 s before offering it.
NETWORK_XML = """<network xmlns:dnsmasq="http://libvirt.org/schemas/network/dnsmasq/1.0">
  <name>default</name>
  <bridge name="virbr-po" stp="off"/>
  <ip address="10.213.0.1" netmask="255.255.255.0">
    <dhcp><range start="10.213.0.10" end="10.213.0.250"/></dhcp>
  </ip>
  <dnsmasq:options><dnsmasq:option value="no-ping"/></dnsmasq:options>
</network>
"""
BRIDGE = "br-po"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """Return every descendant of ``pid`` (children first level first)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill(pids: list[int], timeout: float = 5.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    for pid in pids:
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# -- keys ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Keys:
    """Generated key material: the client key pair and one host key pair (paths)."""

    client_key: Path
    client_pub: Path
    host_key: Path
    host_pub: Path
    other_host_pub: Path


def make_keys(directory: Path) -> Keys:
    """Generate an ed25519 client key, an ed25519 host key and an unrelated host key in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in ("client", "host", "other"):
        key = directory / f"{name}_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"proxy-operator-test-{name}",
                        "-f", str(key)], check=True)
        paths[name] = key
    return Keys(paths["client"], Path(str(paths["client"]) + ".pub"), paths["host"],
                Path(str(paths["host"]) + ".pub"), Path(str(paths["other"]) + ".pub"))


def known_hosts_line(address: str, port: int, host_pub: Path) -> str:
    """Return the known_hosts line ``[address]:port <type> <key>`` (``address`` alone on port 22)."""
    keytype, blob = host_pub.read_text().split()[:2]
    name = address if port == 22 else f"[{address}]:{port}"
    return f"{name} {keytype} {blob}\n"


def qcow2(path: Path, size: str = "16M") -> bytes:
    """Create an empty qcow2 image of virtual ``size`` at ``path`` with qemu-img; return its bytes."""
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), size], check=True)
    return path.read_bytes()


# -- sshd ---------------------------------------------------------------------------------------
class Sshd:
    """OpenSSH sshd on 127.0.0.1:``port`` accepting ``authorized_pub`` for the current user.

    Args:
        directory: where config, logs and the pid file go.
        host_key: private host key path.
        authorized_pub: public key to authorize.
        port: port to bind (a free one when ``None``).
    """

    def __init__(self, directory: Path, host_key: Path, authorized_pub: Path, port: int | None = None) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.log = self.dir / "sshd.log"
        self.log.touch()
        (self.dir / "authorized_keys").write_text(authorized_pub.read_text())
        self.conf = self.dir / "sshd_config"
        self.conf.write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}",
            f"PidFile {self.dir / 'sshd.pid'}", f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            "UsePAM no", "StrictModes no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes", "PermitRootLogin prohibit-password", "AllowStreamLocalForwarding yes",
            "AllowTcpForwarding local", "X11Forwarding no", "LogLevel VERBOSE", "MaxStartups 100",
        ]) + "\n")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Sshd":
        """Start sshd and wait until it sends its banner."""
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(self.conf), "-E", str(self.log)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def banner() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    return s.recv(64).startswith(b"SSH-")
            except OSError:
                return False

        wait_for(banner, 10, f"sshd on port {self.port}")
        return self

    def stop(self) -> None:
        """Stop sshd and every session it serves (a dropped link for the client)."""
        if self.proc is None:
            return
        _kill(_descendants(self.proc.pid))
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def accepted(self) -> int:
        """Return how many publickey authentications sshd has accepted (from its log)."""
        return self.log.read_text().count("Accepted publickey")


# -- image server -------------------------------------------------------------------------------
@dataclass
class ImageServer:
    """A loopback HTTP server: ``put(path, data)`` serves bytes, ``gets[path]`` counts GETs.

    ``delays[path]`` seconds are slept before answering a GET of ``path`` (a slow download:
    a create that is still in progress).  ``redirects[path] = location`` answers 302 to
    ``location``; a path in ``no_length`` is served without ``Content-Length`` (the body ends
    when the connection closes).
    """

    files: dict[str, bytes] = field(default_factory=dict)
    gets: dict[str, int] = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    no_length: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # http.server API
                server.gets[self.path] = server.gets.get(self.path, 0) + 1
                time.sleep(server.delays.get(self.path, 0))
                if self.path in server.redirects:
                    self.send_response(302)
                    self.send_header("Location", server.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                if self.path not in server.no_length:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def put(self, path: str, data: bytes) -> tuple[str, str]:
        """Serve ``data`` at ``path``; return ``(url, sha256 hex)``."""
        self.files[path] = data
        return f"http://127.0.0.1:{self.port}{path}", hashlib.sha256(data).hexdigest()

    def stop(self) -> None:
        """Stop serving."""
        self.httpd.shutdown()
        self.httpd.server_close()


# -- libvirtd -----------------------------------------------------------------------------------
class LibvirtDaemon:
    """A private libvirtd (+ virtlogd) in its own mount and network namespaces.

    Attributes:
        root: the temp dir holding everything.
        socket: the read-write libvirt socket (usable from outside the namespaces).
        pool_dir: the directory of storage pool ``default``.
        nvram_dir: where libvirt keeps UEFI NVRAM files (``/var/lib/libvirt/qemu/nvram`` inside).
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="kvm-libvirtd-"))
        self.root.chmod(0o755)
        for sub in ("etc", "run", "lib", "log", "cache", "sock", "pool"):
            (self.root / sub).mkdir(exist_ok=True)
        self.socket = self.root / "sock" / "libvirt-sock"
        self.pool_dir = self.root / "pool"
        self.nvram_dir = self.root / "lib" / "qemu" / "nvram"
        self.pid: int | None = None

    def _write_config(self) -> None:
        etc = self.root / "etc"
        (etc / "qemu.conf").write_text(
            'user = "root"\ngroup = "root"\ndynamic_ownership = 0\nsecurity_driver = "none"\n'
            'cgroup_controllers = [ ]\nnamespaces = [ ]\n')
        (etc / "libvirtd.conf").write_text("\n".join([
            f'unix_sock_dir = "{self.root / "sock"}"', f'admin_unix_sock_dir = "{self.root / "sock"}"',
            'auth_unix_rw = "none"', 'auth_unix_ro = "none"', 'unix_sock_rw_perms = "0770"',
            "listen_tcp = 0", "listen_tls = 0", f'log_outputs = "3:file:{self.root / "libvirtd.log"}"',
        ]) + "\n")
        (etc / "virtlogd.conf").write_text(f'log_outputs = "3:file:{self.root / "virtlogd.log"}"\n')
        storage = etc / "storage"
        (storage / "autostart").mkdir(parents=True, exist_ok=True)
        (storage / "default.xml").write_text(
            f"<pool type='dir'><name>default</name><target><path>{self.pool_dir}</path></target></pool>\n")
        link = storage / "autostart" / "default.xml"
        if not link.exists():
            link.symlink_to("/etc/libvirt/storage/default.xml")
        networks = etc / "qemu" / "networks"
        (networks / "autostart").mkdir(parents=True, exist_ok=True)
        (networks / "default.xml").write_text(NETWORK_XML)
        link = networks / "autostart" / "default.xml"
        if not link.exists():
            link.symlink_to("/etc/libvirt/qemu/networks/default.xml")

    def start(self) -> "LibvirtDaemon":
        """Start virtlogd and libvirtd in fresh namespaces; wait for the socket."""
        self._write_config()
        r = self.root
        script = "\n".join([
            "set -e",
            f"mount --bind {r / 'etc'} /etc/libvirt",
            f"mount --bind {r / 'run'} /run",
            "mkdir -p /run/libvirt",
            f"mount --bind {r / 'lib'} /var/lib/libvirt",
            f"mount --bind {r / 'log'} /var/log/libvirt",
            f"mount --bind {r / 'cache'} /var/cache/libvirt",
            "ip link set lo up",
            f"ip link add {BRIDGE} type bridge",
            f"ip link set {BRIDGE} up",
            "virtlogd -d",
            f"libvirtd -d -f /etc/libvirt/libvirtd.conf -p {r / 'libvirtd.pid'}",
        ])
        subprocess.run(["unshare", "-m", "-n", "--propagation", "private", "sh", "-c", script], check=True)
        pidfile = r / "libvirtd.pid"
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() and self.socket.exists(), 15,
                 "libvirtd socket")
        self.pid = int(pidfile.read_text().strip())
        # Autostarted network: dnsmasq's pid file appears once the bridge and DHCP are up.
        wait_for(lambda: (r / "run" / "libvirt" / "network" / "default.pid").exists(), 15, "network default")
        return self

    def nsenter(self, *cmd: str, **kwargs) -> subprocess.CompletedProcess:
        """Run ``cmd`` inside the daemon's mount and network namespaces."""
        return subprocess.run(["nsenter", "-t", str(self.pid), "-m", "-n", *cmd], **kwargs)

    def stop(self) -> None:
        """Destroy every domain, stop networks, stop the daemons, remove the temp dir."""
        try:
            import libvirt
            conn = libvirt.open(f"qemu+unix:///system?socket={self.socket}")
            for dom in conn.listAllDomains(0):
                try:
                    if dom.isActive():
                        dom.destroy()
                except libvirt.libvirtError:
                    pass
            for net in conn.listAllNetworks(0):
                try:
                    if net.isActive():
                        net.destroy()
                except libvirt.libvirtError:
                    pass
            conn.close()
        except Exception:  # noqa: BLE001 - best effort; the kills below finish the job
            pass
        pids = []
        if self.pid:
            pids.append(self.pid)
        for pidfile in [self.root / "run" / "virtlogd.pid", *(self.root / "run" / "libvirt").rglob("*.pid")]:
            try:
                pids.append(int(pidfile.read_text().strip()))
            except (OSError, ValueError):
                pass
        _kill([p for p in pids if _pid_alive(p)])
        shutil.rmtree(self.root, ignore_errors=True)


# -- provider config ----------------------------------------------------------------------------
def kvm_entry(*, user: str, port: int, key_file: Path | str, known_hosts_file: Path | str, hosts: list[dict],
              images: dict | None = None, machine_types: dict | None = None, ssh: dict | None = None,
              name: str = "kvm-test", **block: object) -> dict:
    """Return one providers-config entry of type kvm (the YAML shape users write)."""
    return {"name": name, "type": "kvm", "kvm": {
        "ssh": {"user": user, "port": port, "keyFile": str(key_file), "knownHostsFile": str(known_hosts_file),
                "connectTimeout": "3s", "handshakeTimeout": "5s", "keepaliveInterval": "5s", **(ssh or {})},
        "images": images or {},
        "machineTypes": machine_types if machine_types is not None else {
            "small": {"vcpus": 1, "memoryMiB": 128, "diskGiB": 1}},
        "hosts": hosts,
        "callTimeout": "30s",
        **block,
    }}


def provider_config(entry: dict):
    """Parse ``entry`` with the real config loader; return its :class:`app.config.providers.ProviderConfig`."""
    from app.wiring import parse_config as parse
    return parse({"providers": [entry]}, "<kvm-test>").providers[0]


class Rig:
    """One libvirtd, one sshd in front of it, an image server and keys: what a kvm host needs.

    Args:
        directory: scratch directory (keys, sshd files, known_hosts).
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.keys = make_keys(directory / "keys")
        self.daemon = LibvirtDaemon()
        self.sshd = Sshd(directory / "sshd", self.keys.host_key, self.keys.client_pub)
        self.images = ImageServer()
        self.known_hosts = directory / "known_hosts"

    def start(self) -> "Rig":
        """Start the daemon and sshd; write known_hosts for the sshd."""
        self.daemon.start()
        self.sshd.start()
        self.known_hosts.write_text(known_hosts_line("127.0.0.1", self.sshd.port, self.keys.host_pub))
        return self

    def stop(self) -> None:
        """Stop everything (best effort, each part regardless of the others)."""
        for stop in (self.sshd.stop, self.daemon.stop, self.images.stop):
            try:
                stop()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                pass

    def host(self, name: str = "h1", **extra: object) -> dict:
        """Return a host entry dialling this rig's sshd and daemon socket (domainType qemu)."""
        return {"name": name, "address": "127.0.0.1", "port": self.sshd.port, "domainType": "qemu",
                "libvirtSocket": str(self.daemon.socket), **extra}

    def entry(self, hosts: list[dict] | None = None, **kwargs) -> dict:
        """Return a kvm providers-config entry for this rig (see :func:`kvm_entry`)."""
        import getpass
        kwargs.setdefault("user", getpass.getuser())
        kwargs.setdefault("port", 22)
        kwargs.setdefault("key_file", self.keys.client_key)
        kwargs.setdefault("known_hosts_file", self.known_hosts)
        return kvm_entry(hosts=hosts or [self.host()], **kwargs)


DHCP_CLIENT = Path(__file__).with_name("dhcp_client.py")


class FakeGuest:
    """Plays a guest on the rig's network: a DHCP client in its own namespace with the domain's MAC.

    The namespace hangs off the network's bridge through a veth, so the real dnsmasq of the
    libvirt network hands it a lease recorded for that MAC, exactly as for a booted guest
    without the agent.  Use as a context manager; the namespace is removed on exit.
    """

    def __init__(self, rig: "Rig", tag: str, bridge: str = "virbr-po") -> None:
        self.rig, self.bridge = rig, bridge
        self.veth, self.netns = "vpo" + tag[-6:], "guest-" + tag[-6:]

    def __enter__(self) -> "FakeGuest":
        ns = self.rig.daemon.nsenter
        ns("ip", "netns", "add", self.netns, check=True)
        ns("ip", "link", "add", self.veth, "type", "veth", "peer", "name", self.veth + "p", check=True)
        ns("ip", "link", "set", self.veth + "p", "master", self.bridge, "up", check=True)
        ns("ip", "link", "set", self.veth, "netns", self.netns, check=True)
        ns("ip", "netns", "exec", self.netns, "ip", "link", "set", self.veth, "up", check=True)
        return self

    def lease(self, mac: str, client_id: str) -> str:
        """Acquire a lease for ``mac`` (DHCP client-id ``client_id``); return the address."""
        import sys as _sys

        out = self.rig.daemon.nsenter("ip", "netns", "exec", self.netns, _sys.executable, str(DHCP_CLIENT),
                                      self.veth, mac, client_id, capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"dhcp client failed: {out.stderr}")
        return out.stdout.strip()

    def __exit__(self, *exc) -> None:
        self.rig.daemon.nsenter("ip", "netns", "del", self.netns)
