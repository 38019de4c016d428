"""A local origin server for requests sent through a proxy under test."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # http.server API
        if self.path.endswith("/generate_204"):
            self.send_response(204)
            self.end_headers()
            return
        body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def origin_server():
    """Serve on 127.0.0.1:<free port>; yield its base URL.

    ``.../generate_204`` answers 204 (a health-check URL); any other path answers 200 with
    ``{"path": ..., "headers": {...}}`` so a test can see what reached the origin.
    """
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
