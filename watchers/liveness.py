"""The watcher's liveness endpoint: ``GET /healthz`` answers 200 or 503 with a one-line reason.

A Kubernetes liveness probe restarts the container on 503.  What "alive" means is decided
by the caller's ``check() -> (ok, reason)`` (see :func:`watchers.main.run`): a leader is
alive while its stream makes progress, a standby while it can reach the Lease.
"""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

log = logging.getLogger(__name__)

Check = Callable[[], "tuple[bool, str]"]


class Progress:
    """When something last demonstrably worked (monotonic seconds).

    Args:
        clock: monotonic clock, injectable for tests.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last = clock()

    def mark(self) -> None:
        """Record progress now."""
        self.last = self.clock()

    def age(self) -> float:
        """Seconds since the last progress."""
        return self.clock() - self.last


def parse_bind(bind: str) -> tuple[str, int]:
    """Split ``"host:port"`` (host defaults to 127.0.0.1; port may be 0 for any free port).

    Raises:
        ValueError: the port is missing or not a number in 0..65535.
    """
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"health bind address {bind!r}: expected host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


def serve(bind: str, check: Check) -> ThreadingHTTPServer:
    """Serve ``/healthz`` on ``bind`` in a daemon thread; return the server (``shutdown()`` it).

    Raises:
        ValueError: bad ``bind``.
        OSError: the address cannot be bound.
    """
    host, port = parse_bind(bind)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/healthz", "/livez"):
                self._reply(404, "not found")
                return
            try:
                ok, reason = check()
            except Exception as exc:  # noqa: BLE001 - a broken check is a failed check
                ok, reason = False, f"check failed: {type(exc).__name__}"
            self._reply(200 if ok else 503, ("ok: " if ok else "unhealthy: ") + reason)

        def _reply(self, code: int, text: str) -> None:
            body = (text + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="healthz",
                     daemon=True).start()
    log.info("liveness endpoint on http://%s:%d/healthz", *server.server_address[:2])
    return server
