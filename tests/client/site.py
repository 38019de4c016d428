"""A local site that bans crawler addresses, for the Scrapy tests.

Pages ``/page/<n>`` and ``/s/<session>/<n>`` answer 200 with a small HTML page.  Each client
address (a Squid's outgoing address) gets ``limit`` answers; after that the address is banned:
a ``403``, or, for addresses whose last octet is odd, a ``200`` captcha page (which only a
ban-detection callable recognises); or always the status ``ban_status`` when one is given.  Every request is recorded.
"""

from __future__ import annotations

import collections
import http.server
import threading

CAPTCHA = b"<html><body><form>Please solve this captcha to continue</form></body></html>"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # http.server API
        site: BanSite = self.server.site
        client = self.client_address[0]
        with site.lock:
            site.counts[client] += 1
            banned = site.counts[client] > site.limit
        if not banned:
            status, body = 200, f"<html><body>{self.path}</body></html>".encode()
        elif site.ban_status is not None:
            status, body = site.ban_status, b"banned\n"
        elif int(client.rsplit(".", 1)[1]) % 2:
            status, body = 200, CAPTCHA
        else:
            status, body = 403, b"banned\n"
        with site.lock:
            site.records.append({"client": client, "path": self.path, "status": status, "banned": banned,
                                 "proxy_auth": "proxy-authorization" in {k.lower() for k in self.headers}})
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class BanSite:
    """The site on ``address`` (a free port), banning each client address after ``limit``
    requests (with ``ban_status`` when given, else a 403 or a captcha page).

    Attributes:
        records: every request: ``{"client", "path", "status", "banned", "proxy_auth"}``.
        counts: requests per client address.
    """

    def __init__(self, address: str, limit: int, ban_status: int | None = None) -> None:
        self.limit = limit
        self.ban_status = ban_status
        self.lock = threading.Lock()
        self.records: list[dict] = []
        self.counts: collections.Counter = collections.Counter()
        self.server = http.server.ThreadingHTTPServer((address, 0), _Handler)
        self.server.daemon_threads = True
        self.server.site = self
        self.url = f"http://{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()
