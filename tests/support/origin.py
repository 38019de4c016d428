"""Origin servers for requests sent through a proxy under test.

:func:`origin_server` serves in this process on loopback.  Run as a script
(``python tests/support/origin.py ADDRESS:PORT ...``, what :meth:`tests.support.netns.NetNamespace.origin`
starts inside a network namespace) it serves on every pair, prints ``READY`` once it does and
``HIT <address:port> <request line>`` for each request.  Standard library only: the script
runs without the repository on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import sys
import threading
from typing import Any, Iterator


def send_json(handler: http.server.BaseHTTPRequestHandler, payload: dict[str, Any]) -> None:
    """Answer the request ``handler`` serves with 200 and ``payload`` as JSON."""
    body = json.dumps(payload).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class OriginHandler(http.server.BaseHTTPRequestHandler):
    """``.../generate_204`` answers 204 (a health-check URL, when :attr:`health_url` is on); any
    other path answers 200 with :meth:`payload` as JSON, so a test can see what reached the origin."""

    #: Whether ``.../generate_204`` answers 204 (else it is a path like any other).
    health_url = True

    def payload(self) -> dict[str, Any]:
        """What a 200 answer carries: the path and the request headers."""
        return {"path": self.path, "headers": dict(self.headers)}

    def seen(self) -> None:
        """Called first for each request (a subclass reports it)."""

    def do_GET(self) -> None:  # http.server API
        """Answer a GET (see the class docstring)."""
        self.seen()
        if self.health_url and self.path.endswith("/generate_204"):
            self.send_response(204)
            self.end_headers()
            return
        send_json(self, self.payload())

    def log_message(self, *args: Any) -> None:
        """Log nothing."""


@contextlib.contextmanager
def origin_server() -> Iterator[str]:
    """Serve on 127.0.0.1:<free port>; yield its base URL.

    ``.../generate_204`` answers 204 (a health-check URL); any other path answers 200 with
    ``{"path": ..., "headers": {...}}`` so a test can see what reached the origin.
    """
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OriginHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def _tagged(tag: str) -> type[OriginHandler]:
    """A handler that prints ``HIT <tag> <request line>`` and answers ``{"server": tag, "headers"}``."""

    class Tagged(OriginHandler):
        health_url = False

        def seen(self) -> None:
            print("HIT", tag, self.requestline, flush=True)

        def payload(self) -> dict[str, Any]:
            return {"server": tag, "headers": dict(self.headers)}

    return Tagged


def serve(pairs: list[str]) -> None:
    """Serve on every ``address:port`` (``[v6]:port`` too), print ``READY``, then serve forever."""
    for pair in pairs:
        host, _, port = pair.rpartition(":")
        host = host.strip("[]")

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        server = Server((host, int(port)), _tagged(pair))
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("READY", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    serve(sys.argv[1:])
