"""Real Squid processes on loopback, for the kubelet stand-in and the tests (Debian's ``squid`` package).

``SquidProcess(address, port, conf)`` runs ``squid -n <service name> -N -f <conf>`` with the
product's squid.conf plus test-only overrides (pid, logs and cache under a temp dir owned by user
``proxy``, DNS pinned to 127.0.0.1, instant shutdown), bound to ``address:port``.

Each process gets a service name of its own (``-n``).  Squid 5, even without SMP workers,
creates shared-memory segments named after the service name at start
(``/dev/shm/<name>-cf__metadata.shm``, ``-cf__queues.shm``, ``-cf__readers.shm``) and keeps
them until it shuts down cleanly.  It creates each with ``O_EXCL``; when the name exists it
unlinks it and tries once more.  With the default name ``squid`` shared by every Squid on the
machine (any test run, any xdist worker), two Squids starting at the same moment both unlink,
one creates, and the other's second try fails: it exits with code 1 and ``FATAL:
Ipc::Mem::Segment::create failed to shm_open(/squid-cf__metadata.shm): (17) File exists``
(observed: about 1 start in 200 with 40 starting at once on 2 busy cores).  In a real cluster
every container has its own ``/dev/shm``; the service name gives each test Squid the same
isolation, and :meth:`SquidProcess.stop` removes its segments (a killed Squid leaves them).

The product denies loopback destinations and plain HTTP to ports other than 80/443
(app/squid/conf.py); test origins run on loopback (``127.0.0.0/8``) at ephemeral ports, so every test proxy that
must reach one declares it the way an operator would: :func:`loopback_policy` (a
:class:`app.squid.conf.SquidPolicy`) or :data:`LOOPBACK_SQUID_BLOCK` (a providers-config ``squid:``
block).  Nothing here rewrites the product's rules.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from typing import Callable

from app.squid import conf as squid_conf
from devcluster.loopback import free_port

SQUID_BIN = shutil.which("squid") or "/usr/sbin/squid"

#: Destinations test origins live on (exempted from the product's loopback denial).
LOOPBACK_DESTINATIONS = ("127.0.0.0/8",)
#: Plain-HTTP ports test origins use (ephemeral ports) on top of the product's 80/443.
TEST_HTTP_PORTS = ("1024-65535",)
#: The providers-config ``squid:`` keys that let a provider's proxies reach loopback test origins.
LOOPBACK_SQUID_BLOCK = {"allowedDestinations": list(LOOPBACK_DESTINATIONS),
                        "httpPorts": [80, 443, *TEST_HTTP_PORTS]}


def loopback_policy(policy: squid_conf.SquidPolicy | None = None) -> squid_conf.SquidPolicy:
    """Return ``policy`` (default: the product default) that may also reach origins on loopback.

    Adds :data:`LOOPBACK_DESTINATIONS` to ``allowed_destinations`` and :data:`TEST_HTTP_PORTS`
    to ``http_ports``; everything else (metadata names and addresses, link-local, ports of
    CONNECT) stays as the product renders it.
    """
    policy = policy or squid_conf.SquidPolicy()
    return dataclasses.replace(
        policy, allowed_destinations=(*policy.allowed_destinations, *LOOPBACK_DESTINATIONS),
        http_ports=(*policy.http_ports, *TEST_HTTP_PORTS))


def test_overrides(workdir: str) -> tuple[str, ...]:
    """Directives that make a product squid.conf runnable as an unprivileged test process."""
    return (
        "cache_effective_user proxy",
        f"pid_filename {workdir}/squid.pid",
        f"cache_log {workdir}/cache.log",
        f"access_log {workdir}/access.log",
        f"coredump_dir {workdir}",
        "netdb_filename none",
        "pinger_enable off",
        "shutdown_lifetime 0 seconds",
        "dns_nameservers 127.0.0.1",
        "max_filedescriptors 1024",
    )


def localize(conf: str, address: str, workdir: str, htpasswd_path: str | None = None) -> str:
    """Rewrite a product squid.conf to bind ``address`` and keep its files in ``workdir``.

    With ``htpasswd_path``, the basic-auth helper reads that file instead of the instance path.
    """
    out = []
    for line in conf.splitlines():
        m = re.match(r"^http_port\s+(?:\S+:)?(\d+)(.*)$", line)
        if m:
            line = f"http_port {address}:{m.group(1)}{m.group(2)}"
        m = re.match(r"^(auth_param basic program \S+) \S+$", line)
        if m and htpasswd_path:
            line = f"{m.group(1)} {htpasswd_path}"
        if line.split(" ", 1)[0] in {"pid_filename", "cache_log", "access_log", "coredump_dir"}:
            continue
        out.append(line)
    return "\n".join(out + list(test_overrides(workdir))) + "\n"


class SquidStartError(RuntimeError):
    """A Squid that did not become ready.

    Attributes:
        address / port: where it was to listen.
        returncode: its exit code, or ``None`` when it was still running (and was stopped)
            at the deadline.
        elapsed: seconds from ``Popen`` to giving up.
        log: the tail of its stderr and cache.log.
        bind_failed: whether it exited because ``address:port`` was taken (``Address already in
            use`` in its log): the caller may retry on another port or address.
    """

    def __init__(self, address: str, port: int, returncode: int | None, elapsed: float, log: str) -> None:
        self.address, self.port, self.returncode, self.elapsed, self.log = address, port, returncode, elapsed, log
        self.bind_failed = returncode is not None and "Address already in use" in log
        how = f"exited with code {returncode}" if returncode is not None else "was still not listening (stopped)"
        super().__init__(f"squid on {address}:{port} did not start: {how} after {elapsed:.2f} s"
                         f"{' (the port was taken)' if self.bind_failed else ''}; log:\n{log or '(empty)'}")


class SquidProcess:
    """One real Squid bound to ``address:port``.

    Args:
        address: loopback address, ``127.0.0.1`` or one of a claimed block (:mod:`devcluster.loopback`).
        port: TCP port.
        conf: product squid.conf text (default: :func:`app.squid.conf.render` of
            :func:`loopback_policy`: loopback clients and loopback origins allowed).
        htpasswd: content of the basic-auth password file the conf refers to (written into the
            workdir, readable by Squid's helper), or ``None``.
        htpasswd_file: instead of ``htpasswd``, an existing file the helper reads where it is
            (a volume the kubelet stand-in keeps up to date), or ``None``.
        netns: name of a network namespace to run in (``ip netns exec``; see
            :mod:`tests.support.netns`), or ``None`` for the host's.  Readiness is then read
            from Squid's cache.log, since the namespace's addresses are out of this process's reach.
    """

    def __init__(self, address: str, port: int, conf: str | None = None, htpasswd: str | None = None,
                 netns: str | None = None, htpasswd_file: str | None = None) -> None:
        self.address, self.port, self.netns = address, port, netns
        self.workdir = tempfile.mkdtemp(prefix="squid-")
        os.chmod(self.workdir, 0o777)
        conf = conf or squid_conf.render(port, loopback_policy())
        htpasswd_path = htpasswd_file
        if htpasswd is not None:
            htpasswd_path = os.path.join(self.workdir, "htpasswd")
            with open(htpasswd_path, "w") as fh:
                fh.write(htpasswd)
            os.chmod(htpasswd_path, 0o644)
        self.conf_path = os.path.join(self.workdir, "squid.conf")
        with open(self.conf_path, "w") as fh:
            fh.write(localize(conf, address, self.workdir, htpasswd_path))
        #: ``-n`` of this Squid: letters and digits, at most 32 (Squid's limits), unique machine-wide.
        self.service_name = "sqt" + uuid.uuid4().hex[:24]
        self.proc: subprocess.Popen | None = None
        #: Set by :meth:`stop`: from then on the process ending is no crash (see :meth:`exited`).
        self.stop_requested = False

    @property
    def url(self) -> str:
        """``http://address:port``."""
        return f"http://{self.address}:{self.port}"

    def start(self, timeout: float = 20.0) -> "SquidProcess":
        """Start Squid and wait until it listens on ``address:port``; return self.

        Ready means: the process is alive, its cache.log says ``Accepting HTTP Socket
        connections at ... local=<address>:<port>`` (Squid logs it after ``listen()``
        succeeded) and, outside a network namespace, a TCP connection to ``address:port``
        succeeds.  A connection alone proves nothing: another process may listen there (or on
        the wildcard address at that port) while this Squid died on ``bind``.

        Raises:
            SquidStartError: Squid exited, or was still not ready after ``timeout`` seconds;
                it carries the exit code, the elapsed time and Squid's stderr and cache.log
                (read before the working directory is removed).
        """
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        with open(os.path.join(self.workdir, "stderr.log"), "wb") as stderr:
            self.proc = subprocess.Popen(
                [*prefix, SQUID_BIN, "-n", self.service_name, "-N", "-f", self.conf_path],
                stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
            )
        started = time.monotonic()
        deadline = started + timeout
        host = f"[{self.address}]" if ":" in self.address else self.address
        listening = f"local={host}:{self.port} "
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if not any(listening in line for line in self.log().splitlines()
                       if "Accepting HTTP Socket connections" in line):
                time.sleep(0.05)
                continue
            if self.netns:
                return self
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.05)
                continue
            if self.proc.poll() is None:
                return self
        elapsed = time.monotonic() - started
        returncode = self.proc.poll()
        log_text = self.log()
        self.stop()
        raise SquidStartError(self.address, self.port, returncode, elapsed, log_text)

    def log(self) -> str:
        """Return squid's stderr and cache.log (for failure messages)."""
        text = ""
        for name in ("stderr.log", "cache.log"):
            try:
                with open(os.path.join(self.workdir, name), errors="replace") as fh:
                    text += fh.read()[-4000:]
            except OSError:
                pass
        return text

    def running(self) -> bool:
        """Whether the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def exited(self) -> int | None:
        """The exit code of a Squid that ended by itself (it crashed, or something outside killed it).

        ``None`` while it runs, before :meth:`start`, and once :meth:`stop` was called (a stop on
        purpose is no exit).  ``-N`` means it was killed by signal ``N`` (as
        :attr:`subprocess.Popen.returncode`).
        """
        proc = self.proc
        if proc is None or self.stop_requested:
            return None
        return proc.poll()

    def stop(self) -> None:
        """Stop Squid (SIGTERM, then SIGKILL after 5 s) and remove its files and shared-memory segments."""
        self.stop_requested = True
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=5)
        self.proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)
        for segment in glob.glob(f"/dev/shm/{self.service_name}-*.shm"):  # left behind when it was killed
            try:
                os.unlink(segment)
            except OSError:
                pass

    def __enter__(self) -> "SquidProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def start_on_free_port(address: str, conf_for_port: Callable[[int], str] | None = None, *, attempts: int = 3,
                       timeout: float = 20.0, **kwargs) -> SquidProcess:
    """Start a Squid on ``address`` at a port the kernel says is free; return it running.

    The port is free when :func:`devcluster.loopback.free_port` looks, not necessarily when
    Squid binds it tens of milliseconds later (a wildcard listener another process opens in
    between takes it on every address).  A Squid that exits because its port was taken
    (:attr:`SquidStartError.bind_failed`) is started again on a fresh port, up to ``attempts``
    times in all; any other failure is raised at once.

    Args:
        address: loopback address to listen on.
        conf_for_port: product squid.conf text for a port (default: :func:`app.squid.conf.render` of
            :func:`loopback_policy`).
        attempts: starts tried at most (each on a new port), >= 1.
        timeout: seconds each start may take (:meth:`SquidProcess.start`).
        **kwargs: passed on to :class:`SquidProcess` (``htpasswd``, ``htpasswd_file``).

    Raises:
        ValueError: ``attempts`` < 1.
        SquidStartError: the start failed for another reason than a taken port, or every
            attempt found its port taken (the message says so and lists the ports tried).
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    conf_for_port = conf_for_port or (lambda port: squid_conf.render(port, loopback_policy()))
    tried: list[int] = []
    while True:
        port = free_port(address)
        tried.append(port)
        try:
            return SquidProcess(address, port, conf_for_port(port), **kwargs).start(timeout=timeout)
        except SquidStartError as exc:
            if not exc.bind_failed:
                raise
            if len(tried) >= attempts:
                raise SquidStartError(address, port, exc.returncode, exc.elapsed,
                                      f"every port tried on {address} was taken by the time Squid bound it "
                                      f"(ports {', '.join(map(str, tried))}); last log:\n{exc.log}") from exc
