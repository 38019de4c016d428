"""What the SDK's per-request helpers (``Client.requests_session``, ``Client.httpx_client``)
report for answers that are not the site's: real Squids rendered by the product that refuse a
destination (``403 ERR_ACCESS_DENIED``), refuse a CONNECT (``403``), and a site too slow for the
caller's timeout.  None of them is the site banning the egress IP: the lease ends ``ok``, no
(IP, site) ban is recorded and the site is never taken for one refusing every IP."""

from __future__ import annotations

import http.server
import threading
import time

import httpx
import pytest
import requests

from proxy_operator_client import Client
from tests.api.helpers import healthy
from tests.client.conftest import NET, start_strict_squids, stop_all
from tests.client.site import BanSite

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

#: A destination the proxies deny (loopback, not REACHABLE).
DENIED_SITE = NET.host(1)
#: The only loopback address the proxies may reach.
REACHABLE = NET.host(2)
SQUIDS = [NET.host(n) for n in range(54, 57)]


@pytest.fixture(scope="module")
def strict_squids():
    """Three Squids with the product's destination rules: loopback denied but for REACHABLE."""
    procs = start_strict_squids(SQUIDS, REACHABLE)
    yield procs
    stop_all(procs)


def _active_bans(client: Client) -> dict:
    return {p["egressIP"]: [b["target"] for b in p["bans"]["active"]] for p in client.proxies()}


def test_the_proxys_own_refusals_are_no_ban_of_the_site(api, fleet, health_settings, strict_squids):
    healthy(fleet, strict_squids, health_settings, count=3, max_leases=3)
    site = BanSite(DENIED_SITE, 10_000)
    try:
        with Client(api.url, api.token, wait=0) as client:
            with client.requests_session(ttl=30) as session:
                # four refusals of the destination by the proxy (more than TARGET_REFUSAL_IPS)
                for n in range(4):
                    resp = session.get(f"{site.url}/page/{n}", timeout=10)
                    assert resp.status_code == 403 and resp.headers["X-Proxy-Operator-Error"] == "ERR_ACCESS_DENIED"
                    assert resp.lease.released.outcome == "ok"
                # a CONNECT the proxy refuses (the port is not one of its connectPorts)
                with pytest.raises(requests.exceptions.ProxyError):
                    session.get(site.url.replace("http://", "https://") + "/tunnel", timeout=10)
            with client.httpx_client(lease={"ttl": 30}, timeout=10) as hx:
                assert hx.get(f"{site.url}/page/9").status_code == 403
                with pytest.raises(httpx.ProxyError):
                    hx.get(site.url.replace("http://", "https://") + "/tunnel")
            assert site.records == []  # nothing reached the site
            assert _active_bans(client) == {a: [] for a in SQUIDS}
            # and the site is not taken for one refusing everyone
            client.lease(target=DENIED_SITE, ttl=30, renew=False).release()
    finally:
        site.stop()


class _Slow(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # http.server API
        time.sleep(1.5)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def test_a_site_slower_than_the_callers_timeout_bans_nothing(api, fleet, health_settings, strict_squids):
    healthy(fleet, strict_squids, health_settings, count=3, max_leases=3)
    slow = http.server.ThreadingHTTPServer((REACHABLE, 0), _Slow)
    slow.daemon_threads = True
    threading.Thread(target=slow.serve_forever, daemon=True).start()
    url = f"http://{REACHABLE}:{slow.server_address[1]}/"
    try:
        with Client(api.url, api.token, wait=0) as client:
            with client.httpx_client(lease={"ttl": 30}, timeout=0.5) as hx:
                with pytest.raises(httpx.ReadTimeout):
                    hx.get(url)
            with client.requests_session(ttl=30) as session:
                with pytest.raises(requests.exceptions.ReadTimeout):
                    session.get(url, timeout=0.5)
            assert _active_bans(client) == {a: [] for a in SQUIDS}
    finally:
        slow.shutdown()
        slow.server_close()
