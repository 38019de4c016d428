"""A kubelet stand-in for the Kubernetes API fake: Squid Pods become real Squids.

When a Pod appears in the fake whose container has the env var ``SQUID_CONF`` (the
squid.conf the kubernetes provider renders with :func:`app.squid.conf.render`), the kubelet:

1. reports the Pod ``Pending`` with the container waiting in ``ContainerCreating`` (the API
   server already made it ``Pending`` without a ``podIP``);
2. gives the Pod a loopback address of its own, kept for the Pod's life as a Pod IP is (from
   loopback blocks this process claims, :class:`devcluster.loopback.AddressPool`, never
   reused within the process, so other test runs and xdist workers sharing the loopback never
   get it; or upward from ``first_address`` when given), and starts a real Squid
   (:class:`devcluster.squid.SquidProcess`) there at the container's first
   ``containerPort`` (else 3128);
3. reports ``Running`` with ``podIP`` = that address, Ready conditions and a running
   container status.

The container runs with ``restartPolicy: Always`` as the real kubelet runs it (Kubernetes docs,
"Container restarts": https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-restarts):
a Squid that fails to start (exits, or does not listen within ``startup_timeout``) or that
exits by itself later is started again on the same address after a back-off that doubles from
``restart_backoff`` up to ``max_restart_backoff`` (the real kubelet: 10 s doubling up to 5 min,
reset after the container ran for 10 minutes, here after twice the cap).  Between attempts the
Pod is ``Running`` with its ``podIP`` but not Ready, its container ``waiting`` with reason
``CrashLoopBackOff`` (``back-off <s>s restarting failed container=...``), ``lastState.terminated``
holding the exit code (``128 + N`` for signal ``N``, 137 for a Squid stopped because it did not
listen in time) and ``restartCount`` counting the restarts; this is the kubelet's phase rule
(a container that terminated and will restart counts as running).  Each failure is also a line
of :attr:`Kubelet.errors`.  A Squid stopped through its own
:meth:`~devcluster.squid.SquidProcess.stop` (a test taking the endpoint down on purpose) is
left stopped.

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
A Secret missing at start leaves the Pod ``Pending`` with the container waiting in
``CreateContainerConfigError``.

``start_squid=False`` (benchmarks with hundreds of Pods) skips the processes: Squid Pods go
straight to ``Running`` with an allocated ``podIP`` that nothing listens on.  Without a
kubelet at all, Pods simply stay ``Pending``.
"""

from __future__ import annotations

import dataclasses
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

from app.squid.conf import DEFAULT_HTPASSWD_PATH
from devcluster.apiserver import resources as R
from devcluster.apiserver.errors import ApiError
from devcluster.apiserver.store import DELETED, Closed, Store, now_rfc3339
from devcluster.loopback import AddressPool
from devcluster.squid import SquidProcess, SquidStartError

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
        fake: a :class:`devcluster.apiserver.FakeKube` or its :class:`devcluster.apiserver.Store`.
        start_squid: start real Squid processes (else report Running without a process).
        first_address: first loopback address handed out, upward (default: addresses from
            loopback blocks claimed for this process).
        startup_timeout: seconds a Squid may take to accept connections.
        host_ip: reported as ``status.hostIP``.
        secret_sync_delay: seconds between a Secret change and its volumes' update (the real
            kubelet's sync period plus its cache delay: up to a minute or two).
        restart_backoff: seconds before the first restart of a Squid that failed or exited (> 0).
        max_restart_backoff: the cap of the doubling back-off, seconds (>= ``restart_backoff``).

    Attributes:
        errors: one line per Squid start that failed or Squid that exited (``"<ns>/<pod>: <reason>"``).

    Raises:
        ValueError: a back-off out of range.
    """

    def __init__(self, fake, *, start_squid: bool = True, first_address: str | None = None,
                 startup_timeout: float = 20.0, host_ip: str = "127.0.0.1", secret_sync_delay: float = 1.0,
                 restart_backoff: float = 0.5, max_restart_backoff: float = 8.0) -> None:
        if not 0 < restart_backoff <= max_restart_backoff:
            raise ValueError(f"Kubelet back-off: want 0 < restart_backoff <= max_restart_backoff, "
                             f"got {restart_backoff} and {max_restart_backoff}")
        self.store: Store = getattr(fake, "store", fake)
        self.start_squid = start_squid
        self.startup_timeout = startup_timeout
        self.restart_backoff, self.max_restart_backoff = restart_backoff, max_restart_backoff
        self.host_ip = host_ip
        self.secret_sync_delay = secret_sync_delay
        # (namespace, secret) -> {pod key: (volume directory, {key: file name})}
        self._secret_volumes: dict[tuple[str, str], dict[tuple, tuple[str, dict[str, str]]]] = {}
        self.errors: list[str] = []
        self._next = int(ipaddress.IPv4Address(first_address)) if first_address else None
        self._squids: dict[tuple[str, str, str], SquidProcess] = {}
        self._addresses: dict[tuple[str, str, str], str] = {}
        self._containers: dict[tuple[str, str, str], _Container] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kubelet")
        self._thread: threading.Thread | None = None
        self._watcher: threading.Thread | None = None

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
        self._watcher = threading.Thread(target=self._watch_squids, name="kubelet-squids", daemon=True)
        self._watcher.start()
        return self

    def close(self) -> None:
        """Stop following events, cancel pending restarts and stop every Squid."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._secret_thread.join(timeout=5)
            self._watcher.join(timeout=5)
        with self._lock:
            timers = [c.timer for c in self._containers.values() if c.timer is not None]
        for timer in timers:
            timer.cancel()
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
    def _events(self, sub, resource):
        """Yield the watch events of ``sub`` (on ``resource``) until the kubelet stops or the store closes.

        A history compacted under the watch resubscribes from now.
        """
        while not self._stop.is_set():
            try:
                events = sub.next(0.2)
            except Closed:
                return
            except ApiError:  # history compacted under us: resubscribe from now
                sub = self.store.subscribe(resource, resource_version=str(self.store.resource_version))
                continue
            yield from events

    def _run(self, sub) -> None:
        for ev in self._events(sub, R.PODS):
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

    def _pod_address(self, port: int) -> str:
        """Allocate a Pod IP for a Squid listening on ``port``.

        From claimed loopback blocks (the default) the next address is this process's alone, so
        it is taken as it is: a port someone holds there anyway (a listener on the wildcard
        address holds it on every address) makes the Squid fail and crash-loop until it is
        free, as a ``hostNetwork`` Pod's container does on a real node.  Upward from
        ``first_address`` (not claimed, other runs may share it) the first address where
        nothing listens on ``port`` yet.

        Raises:
            RuntimeError: upward from ``first_address``, no such address among the next 1000.
        """
        if self._next is None:
            return self._allocate()
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
        for ev in self._events(sub, R.SECRETS):
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
            self._set_status(key, _running_status(_Container(pod=pod, spec=container, port=port, address=address,
                                                             start_time=now_rfc3339()), self.host_ip))
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
        try:
            address = self._pod_address(port)  # the Pod IP: the sandbox's, kept across container restarts
        except RuntimeError as exc:
            log.error("kubelet: no address for pod %s/%s: %s", ns, name, exc)
            self.errors.append(f"{ns}/{name}: {exc}")
            return
        with self._lock:
            if key not in self._addresses:
                return  # deleted meanwhile
            self._addresses[key] = address
            self._containers[key] = _Container(pod=pod, spec=container, port=port, conf=conf, htpasswd=htpasswd,
                                               htpasswd_file=htpasswd_file, address=address,
                                               start_time=now_rfc3339())
        self._run_container(key)

    def _run_container(self, key) -> None:
        """Start the Squid of Pod ``key`` once; on failure, schedule the next start after the back-off."""
        with self._lock:
            c = self._containers.get(key)
            if c is None or self._stop.is_set():
                return
            c.timer = None
        squid = SquidProcess(c.address, c.port, c.conf, htpasswd=c.htpasswd, htpasswd_file=c.htpasswd_file)
        started_at = now_rfc3339()
        try:
            squid.start(timeout=self.startup_timeout)
        except SquidStartError as exc:
            log.error("kubelet: squid for pod %s/%s failed: %s", key[0], key[1], exc)
            code = exc.returncode if exc.returncode is not None else 137  # stopped: it never listened
            self._container_ended(key, c, _exit_code(code), _failure_summary(exc), started_at)
            return
        with self._lock:
            wanted = self._containers.get(key) is c and not self._stop.is_set()
            if wanted:
                self._squids[key] = squid
                c.running_since, c.started_at = time.monotonic(), started_at
        if not wanted or not self._set_status(key, _running_status(c, self.host_ip)):
            self._stop_pod(key)
            squid.stop()

    def _container_ended(self, key, c: "_Container", exit_code: int, message: str, started_at: str) -> None:
        """Record that Pod ``key``'s Squid ended (``exit_code``), report CrashLoopBackOff, schedule a restart."""
        ns, name, uid = key
        with self._lock:
            if self._containers.get(key) is not c or self._stop.is_set():
                return
            ran = time.monotonic() - c.running_since if c.running_since is not None else 0.0
            if ran >= 2 * self.max_restart_backoff:
                c.backoff = 0.0  # ran long enough: the back-off starts over
            c.backoff = min(c.backoff * 2, self.max_restart_backoff) if c.backoff else self.restart_backoff
            c.running_since = None
            c.last_terminated = {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed",
                                 "message": message[:1000], "startedAt": started_at, "finishedAt": now_rfc3339(),
                                 "containerID": f"kubefake://{uuid.uuid4().hex}"}
            delay = c.backoff
            self.errors.append(f"{ns}/{name}: {message}")
        waiting = {"reason": "CrashLoopBackOff",
                   "message": f"back-off {delay:g}s restarting failed container={c.spec.get('name')} "
                              f"pod={name}_{ns}({uid})"}
        self._set_status(key, _crash_loop_status(c, self.host_ip, waiting))
        timer = threading.Timer(delay, self._restart, args=(key, c))
        timer.daemon = True
        with self._lock:
            if self._containers.get(key) is not c or self._stop.is_set():
                return
            c.timer = timer
            timer.start()

    def _restart(self, key, c: "_Container") -> None:
        with self._lock:
            if self._containers.get(key) is not c or self._stop.is_set():
                return
            c.restart_count += 1
        try:
            self._pool.submit(self._run_container, key)
        except RuntimeError:  # closing: the pool takes no more work
            pass

    def _watch_squids(self) -> None:
        """Notice Squids that exited by themselves (not through their ``stop()``) and restart them."""
        while not self._stop.wait(0.2):
            with self._lock:
                ended = [(key, squid, code) for key, squid in self._squids.items()
                         if (code := squid.exited()) is not None]
                for key, _, _ in ended:
                    del self._squids[key]
                containers = {key: self._containers.get(key) for key, _, _ in ended}
            for key, squid, code in ended:
                text = squid.log()
                squid.stop()
                c = containers[key]
                if c is None:
                    continue
                fatal = [line for line in text.splitlines() if "FATAL" in line]
                message = f"squid exited with code {code}" + (f": {fatal[-1]}" if fatal else "")
                log.error("kubelet: squid for pod %s/%s exited: %s", key[0], key[1], message)
                self._container_ended(key, c, _exit_code(code), message, c.started_at or now_rfc3339())

    def _stop_pod(self, key) -> None:
        with self._lock:
            squid = self._squids.pop(key, None)
            self._addresses.pop(key, None)
            c = self._containers.pop(key, None)
            gone = [vols.pop(key) for vols in self._secret_volumes.values() if key in vols]
        if c is not None and c.timer is not None:
            c.timer.cancel()
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
@dataclasses.dataclass
class _Container:
    """One Pod's Squid container as the kubelet keeps it between starts.

    ``backoff`` is the delay before the next restart, seconds (0: none yet); ``running_since``
    the monotonic time its Squid became ready (``None`` while not running); ``started_at`` and
    ``start_time`` RFC 3339 times of the container's last start and of the Pod's.
    """

    pod: dict
    spec: dict
    port: int
    address: str
    start_time: str
    conf: str = ""
    htpasswd: str | None = None
    htpasswd_file: str | None = None
    restart_count: int = 0
    backoff: float = 0.0
    last_terminated: dict | None = None
    running_since: float | None = None
    started_at: str | None = None
    timer: threading.Timer | None = None


def _exit_code(returncode: int) -> int:
    """A container runtime's exit code for ``Popen.returncode`` (``-N``, signal ``N``: ``128 + N``)."""
    return 128 - returncode if returncode < 0 else returncode


def _failure_summary(exc: SquidStartError) -> str:
    """One line on why a Squid did not start: how it ended and its last FATAL line (else its last line)."""
    lines = [line for line in exc.log.splitlines() if line.strip()]
    fatal = [line for line in lines if "FATAL" in line] or lines[-1:]
    how = (f"exited with code {exc.returncode}" if exc.returncode is not None
           else f"not listening after {exc.elapsed:.1f} s")
    return f"squid on {exc.address}:{exc.port} {how}" + (f": {fatal[-1]}" if fatal else "")


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


def _container_status(container: dict, *, waiting: dict | None = None, running: bool = False,
                      restart_count: int = 0, last_terminated: dict | None = None,
                      started_at: str | None = None) -> dict:
    state = {"running": {"startedAt": started_at or now_rfc3339()}} if running else {"waiting": waiting or {}}
    status = {"name": container.get("name"), "image": container.get("image"), "imageID": "",
              "ready": running, "started": running, "restartCount": restart_count, "state": state,
              "lastState": {"terminated": last_terminated} if last_terminated else {}}
    if running:
        status["containerID"] = f"kubefake://{uuid.uuid4().hex}"
    return status


def _pod_network(c: _Container, host_ip: str) -> dict:
    return {"podIP": c.address, "podIPs": [{"ip": c.address}], "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
            "startTime": c.start_time}


def _running_status(c: _Container, host_ip: str) -> dict:
    """Status of a Pod whose Squid runs and is ready."""
    containers = (c.pod.get("spec") or {}).get("containers") or []
    return {
        "phase": "Running", **_pod_network(c, host_ip),
        "conditions": [_condition(t, "True") for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
        "containerStatuses": [
            _container_status(x, running=True, restart_count=c.restart_count, last_terminated=c.last_terminated,
                              started_at=c.started_at) if x.get("name") == c.spec.get("name")
            else _container_status(x, running=True) for x in containers],
    }


def _crash_loop_status(c: _Container, host_ip: str, waiting: dict) -> dict:
    """Status of a Pod whose Squid ended and waits for its restart: ``Running`` (restartPolicy
    Always: a container that terminated and will restart counts as running, kubelet's getPhase),
    not Ready."""
    name = c.spec.get("name")
    unready = {"reason": "ContainersNotReady", "message": f"containers with unready status: [{name}]"}
    return {
        "phase": "Running", **_pod_network(c, host_ip),
        "conditions": [_condition("PodScheduled", "True"), _condition("Initialized", "True"),
                       {**_condition("ContainersReady", "False"), **unready}, {**_condition("Ready", "False"), **unready}],
        "containerStatuses": [_container_status(c.spec, waiting=waiting, restart_count=c.restart_count,
                                                last_terminated=c.last_terminated)],
    }
