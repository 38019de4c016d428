"""A private network namespace for tests that need addresses the host must not get.

``NetNamespace(addresses=[...])`` creates ``ip netns add po-<random>``, brings its loopback up,
adds a veth pair inside it (both ends in the namespace; ``veth0`` carries the given addresses;
a veth because the ``dummy`` driver is not always available) (link-local ``169.254.x.y/16``, the
metadata address ``169.254.169.254/32``, TEST-NET or RFC 1918 ones), and runs commands in it
with ``ip netns exec``.  Nothing is added to the host's own namespace; :meth:`close` stops
every process started through :meth:`popen` and deletes the namespace.  Needs root and
iproute2 (``.ci/apt-packages.txt``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

IP = shutil.which("ip") or "/usr/sbin/ip"

#: The origin script (:func:`tests.support.origin.serve`): ``python ORIGIN <address:port> ...`` serves on
#: every pair and prints ``HIT <address:port> <request line>`` for each request (flushed), answering
#: 200 with JSON ``{"server": "<address:port>", "headers": {...}}``.
ORIGIN = Path(__file__).with_name("origin.py")


def available() -> str | None:
    """Return why namespaces cannot be used here (``None`` when they can)."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if not os.path.exists(IP):
        return "needs iproute2 (ip)"
    return None


class NetNamespace:
    """One network namespace with a local interface carrying test addresses; a context manager.

    Args:
        addresses: ``address/prefix`` strings put on the interface ``veth0``.
    Attributes:
        name: the namespace name (``po-`` + 8 hex characters).
    """

    def __init__(self, addresses: list[str]) -> None:
        self.name = "po-" + uuid.uuid4().hex[:8]
        self.addresses = list(addresses)
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> "NetNamespace":
        subprocess.run([IP, "netns", "add", self.name], check=True)
        try:
            self._ip("link", "set", "lo", "up")
            self._ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1")
            self._ip("link", "set", "veth1", "up")
            self._ip("link", "set", "veth0", "up")
            for addr in self.addresses:
                self._ip("addr", "add", addr, "dev", "veth0", *(("nodad",) if ":" in addr else ()))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ip(self, *args: str) -> None:
        subprocess.run([IP, "-n", self.name, *args], check=True, capture_output=True)

    def run(self, *cmd: str, **kwargs) -> subprocess.CompletedProcess:
        """Run ``cmd`` inside the namespace and wait (``subprocess.run`` keyword arguments)."""
        return subprocess.run([IP, "netns", "exec", self.name, *cmd], **kwargs)

    def popen(self, *cmd: str, **kwargs) -> subprocess.Popen:
        """Start ``cmd`` inside the namespace in its own session; :meth:`close` stops it."""
        proc = subprocess.Popen([IP, "netns", "exec", self.name, *cmd], start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def origin(self, *pairs: str) -> subprocess.Popen:
        """Start :data:`ORIGIN` on ``address:port`` pairs; return it once it serves.

        Its stdout carries one ``HIT <pair> <request line>`` per request (read it after
        stopping it with :meth:`stop`).
        """
        proc = self.popen(sys.executable, str(ORIGIN), *pairs, stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if line.strip() != "READY":
            self.stop(proc)
            raise RuntimeError(f"origin in {self.name} did not start: {line!r}")
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen) -> None:
        """Stop one process started by :meth:`popen` (SIGTERM to its session, then SIGKILL)."""
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)

    def close(self) -> None:
        """Stop every process started here and delete the namespace."""
        for proc in self._procs:
            try:
                self.stop(proc)
            except Exception:  # noqa: BLE001 - keep cleaning up
                pass
        self._procs.clear()
        subprocess.run([IP, "netns", "del", self.name], capture_output=True)
