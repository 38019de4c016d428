"""Real Squid processes on loopback for tests (Debian's ``squid`` package).

``SquidProcess(address, port, conf)`` runs ``squid -N -f <conf>`` with the product's
squid.conf plus test-only overrides (pid, logs and cache under a temp dir owned by user
``proxy``, DNS pinned to 127.0.0.1, instant shutdown), bound to ``address:port``.

The product denies loopback destinations and plain HTTP to ports other than 80/443
(app/squid.py); test origins run on loopback (``127.0.0.0/8``) at ephemeral ports, so every test proxy that
must reach one declares it the way an operator would: :func:`loopback_policy` (a
:class:`app.squid.SquidPolicy`) or :data:`LOOPBACK_SQUID_BLOCK` (a providers-config ``squid:``
block).  Nothing here rewrites the product's rules.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

from app import squid as squid_conf

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


class SquidProcess:
    """One real Squid bound to ``address:port``.

    Args:
        address: loopback address, ``127.0.0.1`` or one of a claimed block (:mod:`tests.support.loopback`).
        port: TCP port.
        conf: product squid.conf text (default: :func:`app.squid.render` of
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
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """``http://address:port``."""
        return f"http://{self.address}:{self.port}"

    def start(self, timeout: float = 20.0) -> "SquidProcess":
        """Start Squid and wait until it accepts connections; raise RuntimeError with its log otherwise."""
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.proc = subprocess.Popen(
            [*prefix, SQUID_BIN, "-N", "-f", self.conf_path],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.workdir, "stderr.log"), "wb"),
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.netns:
                if "Accepting HTTP Socket connections" in self.log():
                    return self
                time.sleep(0.05)
                continue
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"squid on {self.address}:{self.port} did not start: {self.log()}")

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

    def stop(self) -> None:
        """Stop Squid (SIGTERM, then SIGKILL after 5 s) and remove its files."""
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

    def __enter__(self) -> "SquidProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
