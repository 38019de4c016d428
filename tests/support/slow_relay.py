"""An HTTP relay in front of the real discovery API that holds one kind of request back: every
request whose method is in ``delayed`` waits ``delay`` seconds before it is forwarded (a
release stuck behind a slow network or a busy API), every other goes through at once (with
``count``, only the first ``count`` of them are held back).  With
``fail``, the first ``fail`` of those requests are answered ``500`` and never forwarded (an API
process dying under a release, a proxy in front of the API failing)."""

from __future__ import annotations

import http.server
import threading
import time

import requests


class SlowRelay:
    """Serve on ``127.0.0.1:<free port>`` and forward to ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str, *, delayed: frozenset[str] = frozenset({"DELETE"}), delay: float = 1.0,
                 fail: int = 0, count: int | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.delayed = delayed
        self.delay = delay
        self.count = count  # how many of those requests are held back (None: every one)
        self.fail = fail  # delayed requests still to answer 500
        self.held = 0  # requests held back so far
        self.failed: list[str] = []  # the paths (and queries) answered 500
        self.lock = threading.Lock()
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with relay.lock:
                    holding = self.command in relay.delayed and (relay.count is None or relay.held < relay.count)
                if holding:
                    with relay.lock:
                        relay.held += 1
                        failing = relay.fail > 0
                        if failing:
                            relay.fail -= 1
                            relay.failed.append(self.path)
                    time.sleep(relay.delay)
                    if failing:
                        self.send_response(500)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                answer = requests.request(self.command, relay.upstream + self.path, headers=headers, data=body,
                                          timeout=30, allow_redirects=False)
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length",
                                            "content-encoding"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()
