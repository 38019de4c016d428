"""A process-wide guard refusing name lookups and connections off loopback, for tests of cloud
providers whose SDKs would otherwise reach the internet on a misconfiguration (gcp, aws).

Use :func:`loopback_only` as an autouse fixture of an area (``from tests.support.netguard import
loopback_only``).
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
from typing import Any

import pytest


class _Guard:
    """A ``sys.addaudithook`` hook refusing name lookups and connections off loopback.

    Audit hooks cannot be removed, so the hook is installed once and only acts while
    :attr:`active`; every refused attempt is recorded in :attr:`violations` (and raised as
    ``PermissionError`` into the caller, so nothing is sent).
    """

    def __init__(self) -> None:
        self.active = False
        self.violations: list[str] = []
        self._lock = threading.Lock()

    @staticmethod
    def _loopback_host(host: Any) -> bool:
        if host in (None, "", b"", "localhost", b"localhost"):
            return True
        if isinstance(host, bytes):
            host = host.decode("ascii", "replace")
        try:
            return ipaddress.ip_address(str(host).split("%", 1)[0]).is_loopback
        except ValueError:
            return False

    def _refuse(self, what: str) -> None:
        with self._lock:
            self.violations.append(what)
        raise PermissionError(f"test network guard: {what} is not loopback")

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
            sock, address = args[0], args[-1]
            if getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6):
                host = address[0] if isinstance(address, tuple) and address else address
                if not self._loopback_host(host):
                    self._refuse(f"{event} to {address!r}")
        elif event == "socket.getaddrinfo":
            if not self._loopback_host(args[0]):
                self._refuse(f"name lookup of {args[0]!r}")
        elif event in ("socket.gethostbyname", "socket.gethostbyaddr"):
            if not self._loopback_host(args[0]):
                self._refuse(f"{event} of {args[0]!r}")


_GUARD = _Guard()
sys.addaudithook(_GUARD)


@pytest.fixture(autouse=True)
def loopback_only():
    """The test runs with the guard on and fails if anything tried to leave loopback."""
    _GUARD.violations.clear()
    _GUARD.active = True
    try:
        yield _GUARD
    finally:
        _GUARD.active = False
    assert not _GUARD.violations, f"non-loopback network access attempted: {_GUARD.violations}"
