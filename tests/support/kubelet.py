"""A kubelet stand-in for the Kubernetes API fake: Squid Pods become real Squids.

When a Pod appears in the fake whose container has the env var ``SQUID_CONF`` (the
squid.conf the kubernetes provider renders with :func:`app.squid.render`), the kubelet:

1. reports the Pod ``Pending`` with the container waiting in ``ContainerCreating`` (the API
   server already made it ``Pending`` without a ``podIP``);
2. starts a real Squid (:class:`tests.support.squid.SquidProcess`) on a loopback address of
   its own (from loopback blocks this process claims, :class:`tests.support.loopback.AddressPool`,
   never reused within the process, so other test runs and xdist workers sharing the loopback
   never get it; or upward from ``first_address`` when given), at the container's first
   ``containerPort`` (else 3128);
3. reports ``Running`` with ``podIP`` = that address, Ready conditions and a running
   container status.

All status writes go through the Pod's status subresource, so watchers see each step as a
MODIFIED event.  When the Pod is deleted (or its deletion starts) the Squid is stopped.

Secret volumes are handled as the real kubelet does: a volume mounted without ``subPath`` is a
directory written the way the kubelet's AtomicWriter writes it (the files in a timestamped
``..<time>`` directory, a ``..data`` symlink to it, and per-file symlinks ``<name> ->
..data/<name>``), and when the Secret changes it is rewritten after ``secret_sync_delay``
seconds by swapping ``..data`` atomically (a rename), so a process that re-reads the file sees
the new content (Kubernetes docs, "Mounted Secrets are updated automatically":
https://kubernetes.io/docs/concepts/configuration/secret/#using-secrets-as-files-from-a-pod;
kubernetes/pkg/volume/util/atomic_writer.go).  A ``subPath`` mount is a copy made at start
and never updated (the real kubelet bind-mounts the file, which the swap never touches).
If Squid fails to start the Pod stays ``Pending`` with the container waiting in
``CrashLoopBackOff`` and the failure is recorded in :attr:`Kubelet.errors`.

``start_squid=False`` (benchmarks with hundreds of Pods) skips the processes: Squid Pods go
straight to ``Running`` with an allocated ``podIP`` that nothing listens on.  Without a
kubelet at all, Pods simply stay ``Pending``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from tests.kubefake import resources as R
from tests.kubefake.errors import ApiError
from tests.kubefake.store import DELETED, Closed, Store, now_rfc3339
from app.squid import DEFAULT_HTPASSWD_PATH
from tests.support.loopback import AddressPool
from tests.support.squid import SquidProcess

log = logging.getLogger("kubelet")

SQUID_CONF_ENV = "SQUID_CONF"

# Addresses are handed out once per process (across Kubelet instances), so a test never gets
# the address of a Squid an earlier test is still stopping.
_allocation_lock = threading.Lock()
_last_allocated = 0
_pod_addresses = AddressPool()
_MERGE = "application/merge-patch+json"


class Kubelet:
    """Runs the Squid Pods of a fake cluster.

    Args:
        fake: a :class:`tests.kubefake.FakeKube` or its :class:`tests.kubefake.Store`.
        start_squid: start real Squid processes (else report Running without a process).
        first_address: first loopback address handed out, upward (default: addresses from
            loopback blocks claimed for this process).
        startup_timeout: seconds a Squid may take to accept connections.
        host_ip: reported as ``status.hostIP``.
        secret_sync_delay: seconds between a Secret change and its volumes' update (the real
            kubelet's sync period plus its cache delay: up to a minute or two).

    Attributes:
        errors: one line per Squid that failed to start (``"<ns>/<pod>: <reason>"``).
    """

    def __init__(self, fake, *, start_squid: bool = True, first_address: str | None = None,
                 startup_timeout: float = 20.0, host_ip: str = "127.0.0.1", secret_sync_delay: float = 1.0) -> None:
        self.store: Store = getattr(fake, "store", fake)
        self.start_squid = start_squid
        self.startup_timeout = startup_timeout
        self.host_ip = host_ip
        self.secret_sync_delay = secret_sync_delay
        # (namespace, secret) -> {pod key: (volume directory, {key: file name})}
        self._secret_volumes: dict[tuple[str, str], dict[tuple, tuple[str, dict[str, str]]]] = {}
        self.errors: list[str] = []
        self._next = int(ipaddress.IPv4Address(first_address)) if first_address else None
        self._squids: dict[tuple[str, str, str], SquidProcess] = {}
        self._addresses: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kubelet")
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "Kubelet":
        """Start following Pod and Secret events (existing Pods are picked up too); return self."""
        sub = self.store.subscribe(R.PODS)
        self._thread = threading.Thread(target=self._run, args=(sub,), name="kubelet", daemon=True)
        self._thread.start()
        secrets = self.store.subscribe(R.SECRETS, resource_version=str(self.store.resource_version))
        self._secret_thread = threading.Thread(target=self._run_secrets, args=(secrets,), name="kubelet-secrets",
                                               daemon=True)
        self._secret_thread.start()
        return self

    def close(self) -> None:
        """Stop following events and stop every Squid."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._secret_thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            squids, self._squids = list(self._squids.values()), {}
        stoppers = [threading.Thread(target=s.stop, daemon=True) for s in squids]  # ~2 s each: in parallel
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(timeout=15)

    def __enter__(self) -> "Kubelet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- queries ---------------------------------------------------------------------------
    def address_of(self, namespace: str, name: str) -> str | None:
        """The loopback address given to Pod ``namespace/name`` (``None`` if none)."""
        with self._lock:
            for (ns, n, _), addr in self._addresses.items():
                if (ns, n) == (namespace, name):
                    return addr or None
        return None

    def squid_of(self, namespace: str, name: str) -> SquidProcess | None:
        """The running Squid of Pod ``namespace/name`` (``None`` if none)."""
        with self._lock:
            for (ns, n, _), squid in self._squids.items():
                if (ns, n) == (namespace, name):
                    return squid
        return None

    def running(self) -> int:
        """How many Squids are running."""
        with self._lock:
            return sum(1 for s in self._squids.values() if s.running())

    # -- event loop ------------------------------------------------------------------------
    def _run(self, sub) -> None:
        while not self._stop.is_set():
            try:
                events = sub.next(0.2)
            except Closed:
                return
            except ApiError:  # history compacted under us: resubscribe from now
                sub = self.store.subscribe(R.PODS, resource_version=str(self.store.resource_version))
                continue
            for ev in events:
                meta = ev.obj["metadata"]
                key = (ev.namespace, ev.name, meta.get("uid", ""))
                if ev.type == DELETED or meta.get("deletionTimestamp"):
                    self._pool.submit(self._stop_pod, key)
                    continue
                with self._lock:
                    known = key in self._addresses
                if known or ev.type != "ADDED":
                    continue
                container = _squid_container(ev.obj)
                if container is None:
                    continue
                with self._lock:
                    self._addresses[key] = ""  # claimed; the address is picked when starting
                self._pool.submit(self._start_pod, key, ev.obj, container)

    def _allocate(self) -> str:
        global _last_allocated
        if self._next is None:
            return _pod_addresses.take()
        with _allocation_lock:
            n = max(self._next, _last_allocated + 1)
            while ipaddress.IPv4Address(n).packed[-1] in (0, 255):
                n += 1
            _last_allocated = self._next = n
            self._next += 1
        return str(ipaddress.IPv4Address(n))

    def _free_address(self, port: int) -> str:
        """Allocate an address where nothing listens on ``port`` yet (other test runs may share lo)."""
        for _ in range(1000):
            address = self._allocate()
            probe = socket.socket()
            try:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((address, port))
                return address
            except OSError:
                continue
            finally:
                probe.close()
        raise RuntimeError(f"no free loopback address for port {port}")

    def _htpasswd(self, key, pod: dict, container: dict) -> tuple[bool, str | None, str | None]:
        """Resolve the Secret volume mounted where the squid.conf's htpasswd file lives, as the
        kubelet would.

        Returns ``(ok, content, path)``: ``(True, None, None)`` when nothing is mounted there;
        ``(False, None, None)`` when the Secret or its key is missing (a real kubelet refuses to
        start the container: CreateContainerConfigError); for a ``subPath`` mount of the file,
        ``(True, content, None)`` (a copy, never updated); for a volume mounted on the file's
        directory, ``(True, None, path)``: the file in a volume directory this kubelet writes and
        keeps up to date with the Secret.
        """
        namespace = key[0]
        directory, _, filename = DEFAULT_HTPASSWD_PATH.rpartition("/")
        mounts = container.get("volumeMounts") or []
        mount = next((m for m in mounts if m.get("mountPath") == DEFAULT_HTPASSWD_PATH and m.get("subPath")), None) \
            or next((m for m in mounts if m.get("mountPath") == directory and not m.get("subPath")), None)
        if mount is None:
            return True, None, None
        volume = next((v for v in (pod.get("spec") or {}).get("volumes") or [] if v.get("name") == mount.get("name")),
                      None)
        source = (volume or {}).get("secret") or {}
        secret_name = source.get("secretName", "")
        if mount.get("subPath"):
            path = mount["subPath"]
            skey = next((i.get("key") for i in source.get("items") or [] if i.get("path") == path), path)
            value = _secret_value(self.store, namespace, {"name": secret_name, "key": skey})
            return value is not None, value, None
        items = {i.get("key"): i.get("path") for i in source.get("items") or []}
        data = _secret_data(self.store, namespace, secret_name)
        if data is None or (items and any(k not in data for k in items)):
            return False, None, None
        files = {items.get(k, k): v for k, v in data.items() if not items or k in items}
        if filename not in files:
            return False, None, None
        volume_dir = tempfile.mkdtemp(prefix="kubelet-volume-")
        os.chmod(volume_dir, 0o755)
        write_atomic(volume_dir, files)
        with self._lock:
            self._secret_volumes.setdefault((namespace, secret_name), {})[key] = (volume_dir, items)
        return True, None, os.path.join(volume_dir, filename)

    def _run_secrets(self, sub) -> None:
        """Rewrite the volumes of a Secret that changed, ``secret_sync_delay`` seconds later."""
        while not self._stop.is_set():
            try:
                events = sub.next(0.2)
            except Closed:
                return
            except ApiError:
                sub = self.store.subscribe(R.SECRETS, resource_version=str(self.store.resource_version))
                continue
            for ev in events:
                if ev.type == "MODIFIED":
                    threading.Timer(self.secret_sync_delay, self._sync_secret, args=(ev.namespace, ev.name)).start()

    def _sync_secret(self, namespace: str, name: str) -> None:
        if self._stop.is_set():
            return
        data = _secret_data(self.store, namespace, name)
        if data is None:
            return  # the real kubelet keeps the last content of a Secret that went away
        with self._lock:
            volumes = list((self._secret_volumes.get((namespace, name)) or {}).values())
        for volume_dir, items in volumes:
            files = {items.get(k, k): v for k, v in data.items() if not items or k in items}
            try:
                write_atomic(volume_dir, files)
            except OSError as exc:  # the Pod went away meanwhile
                log.info("kubelet: volume %s not updated: %s", volume_dir, exc)

    def _start_pod(self, key, pod: dict, container: dict) -> None:
        ns, name, _ = key
        port = _container_port(container)
        if not self.start_squid:
            address = self._allocate()
            with self._lock:
                if key not in self._addresses:
                    return
                self._addresses[key] = address
            self._set_status(key, _running_status(pod, address, self.host_ip))
            return
        self._set_status(key, {"phase": "Pending", "hostIP": self.host_ip, "conditions": [
            _condition("PodScheduled", "True")], "containerStatuses": [
            _container_status(container, waiting={"reason": "ContainerCreating"})]})
        conf = _env_value(container, SQUID_CONF_ENV) or ""
        ok, htpasswd, htpasswd_file = self._htpasswd(key, pod, container)
        if not ok:
            self.errors.append(f"{ns}/{name}: secret for {DEFAULT_HTPASSWD_PATH} not found")
            self._set_status(key, {"phase": "Pending", "containerStatuses": [_container_status(
                container, waiting={"reason": "CreateContainerConfigError",
                                    "message": "secret for the htpasswd mount not found"})]})
            return
        squid, failure = None, ""
        for _ in range(3):  # another process may grab the address between probe and bind
            address = self._free_address(port)
            squid = SquidProcess(address, port, conf, htpasswd=htpasswd, htpasswd_file=htpasswd_file)
            try:
                squid.start(timeout=self.startup_timeout)
            except RuntimeError as exc:
                failure = str(exc).splitlines()[0] if str(exc) else "squid did not start"
                log.error("kubelet: squid for pod %s/%s failed: %s", ns, name, exc)
                squid = None
                break
            time.sleep(0.2)  # a Squid that lost the bind race exits right after start
            if squid.running():
                break
            failure = f"squid on {address}:{port} exited after start: {squid.log()[-300:]}"
            squid.stop()
            squid = None
        if squid is None:
            self.errors.append(f"{ns}/{name}: {failure}")
            self._set_status(key, {"phase": "Pending", "containerStatuses": [_container_status(
                container, waiting={"reason": "CrashLoopBackOff", "message": failure[:200]})]})
            return
        with self._lock:
            wanted = key in self._addresses
            if wanted:
                self._addresses[key] = address
                self._squids[key] = squid
        if not wanted or not self._set_status(key, _running_status(pod, address, self.host_ip)):
            self._stop_pod(key)
            squid.stop()

    def _stop_pod(self, key) -> None:
        with self._lock:
            squid = self._squids.pop(key, None)
            self._addresses.pop(key, None)
            gone = [vols.pop(key) for vols in self._secret_volumes.values() if key in vols]
        if squid is not None:
            squid.stop()
        for volume_dir, _ in gone:
            shutil.rmtree(volume_dir, ignore_errors=True)

    def _set_status(self, key, status: dict) -> bool:
        """Merge-patch the Pod's status if the Pod (same uid) still exists; return whether it did."""
        ns, name, uid = key
        with self.store.cond:
            try:
                current = self.store.get(R.PODS, ns, name)
            except ApiError:
                return False
            meta = current.obj["metadata"]
            if meta.get("uid") != uid or meta.get("deletionTimestamp"):
                return False
            self.store.patch(R.PODS, ns, name, _MERGE, {"status": status}, subresource="status")
            return True


# -- helpers -------------------------------------------------------------------------------
def _squid_container(pod: dict) -> dict | None:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if any(isinstance(e, dict) and e.get("name") == SQUID_CONF_ENV for e in c.get("env") or []):
            return c
    return None


def _secret_value(store, namespace: str, ref: dict) -> str | None:
    """Resolve ``valueFrom.secretKeyRef`` from the fake's store, as the kubelet does at start."""
    import base64

    try:
        with store.cond:
            secret = store.get(R.SECRETS, namespace, ref.get("name", "")).obj
    except ApiError:
        return None
    data = secret.get("data") or {}
    value = data.get(ref.get("key", ""))
    return base64.b64decode(value).decode() if value is not None else None


def _secret_data(store, namespace: str, name: str) -> dict[str, str] | None:
    """Every key of a Secret, decoded (``None`` when it does not exist)."""
    import base64

    try:
        with store.cond:
            secret = store.get(R.SECRETS, namespace, name).obj
    except ApiError:
        return None
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def write_atomic(directory: str, files: dict[str, str]) -> None:
    """Write ``files`` (name -> content) into a volume directory the way the kubelet does.

    The content goes into a new ``..<timestamp>.<random>`` directory; the ``..data`` symlink is
    pointed at it by renaming a fresh symlink over it (one atomic step); each file is a symlink
    ``<name> -> ..data/<name>``; the previous timestamped directory is removed.  Readers that
    open ``<name>`` see the old or the new content, never a mix (kubernetes
    pkg/volume/util/atomic_writer.go).
    """
    stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime())
    new_dir = tempfile.mkdtemp(prefix=stamp, dir=directory)
    os.chmod(new_dir, 0o755)
    for name, content in files.items():
        path = os.path.join(new_dir, name)
        with open(path, "w") as fh:
            fh.write(content)
        os.chmod(path, 0o444)
    data = os.path.join(directory, "..data")
    old = os.readlink(data) if os.path.islink(data) else None
    tmp_link = os.path.join(directory, "..data_tmp")
    if os.path.lexists(tmp_link):
        os.unlink(tmp_link)
    os.symlink(os.path.basename(new_dir), tmp_link)
    os.rename(tmp_link, data)
    for name in files:
        link = os.path.join(directory, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join("..data", name), link)
    if old:
        shutil.rmtree(os.path.join(directory, old), ignore_errors=True)


def _env_value(container: dict, name: str) -> str | None:
    for e in container.get("env") or []:
        if e.get("name") == name:
            return e.get("value")
    return None


def _container_port(container: dict) -> int:
    for p in container.get("ports") or []:
        if isinstance(p, dict) and p.get("containerPort"):
            return int(p["containerPort"])
    m = re.search(r"^http_port\s+(?:\S+:)?(\d+)", _env_value(container, SQUID_CONF_ENV) or "", re.M)
    return int(m.group(1)) if m else 3128


def _condition(ctype: str, status: str) -> dict:
    return {"type": ctype, "status": status, "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}


def _container_status(container: dict, *, waiting: dict | None = None, running: bool = False) -> dict:
    state = {"running": {"startedAt": now_rfc3339()}} if running else {"waiting": waiting or {}}
    status = {"name": container.get("name"), "image": container.get("image"), "imageID": "",
              "ready": running, "started": running, "restartCount": 0, "state": state}
    if running:
        status["containerID"] = f"kubefake://{uuid.uuid4().hex}"
    return status


def _running_status(pod: dict, address: str, host_ip: str) -> dict:
    containers = (pod.get("spec") or {}).get("containers") or []
    return {
        "phase": "Running", "podIP": address, "podIPs": [{"ip": address}],
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "startTime": now_rfc3339(),
        "conditions": [_condition(t, "True") for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
        "containerStatuses": [_container_status(c, running=True) for c in containers],
    }
