"""A tiny origin run inside the rig's network namespace (``python ns_origin.py ADDRESS PORT``).

``/generate_204`` answers 204 (the health URL); any other path answers 200 with
``{"path": ..., "client": <peer address>}`` so a test sees the request came from the guest.
Each request is printed on stdout as ``<client> <path>``.
"""

from __future__ import annotations

import http.server
import json
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    """Answer GETs as the module docstring says."""

    def do_GET(self):  # http.server API
        print(self.client_address[0], self.path, flush=True)
        if self.path.endswith("/generate_204"):
            self.send_response(204)
            self.end_headers()
            return
        body = json.dumps({"path": self.path, "client": self.client_address[0]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
