"""Responses the proxy makes itself are not bans: a real Scrapy crawl (tests/client/crawl.py)
through real Squids rendered by the product (app/squid/conf.py) that refuse the crawl's site (a
denied destination: ``403`` ``ERR_ACCESS_DENIED``), cannot reach it (``503``
``ERR_CONNECT_FAIL``) or refuse a CONNECT to it.  The middleware logs the proxy's refusal with
Squid's reason and the class of the rule that refused, keeps the lease and reports no ban (no
proxy cools down); a site's own headers of the operator's names never get through the proxy."""

from __future__ import annotations

import http.server
import threading

import pytest
import requests

from proxy_operator_client import Client
from tests.api.helpers import healthy
from tests.client.conftest import NET, start_strict_squids, stop_all
from tests.client.site import BanSite
from tests.client.test_scrapy import crawl
from tests.health.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

#: The crawl's site: loopback, a destination the proxies deny.
DENIED_SITE = NET.host(1)
#: The health origin's address (``client_origin``), the only loopback address the proxies may reach.
REACHABLE = NET.host(2)
SQUIDS = [NET.host(n) for n in range(50, 53)]


@pytest.fixture(scope="module")
def strict_squids():
    """Three Squids with the product's destination rules: loopback denied but for REACHABLE."""
    procs = start_strict_squids(SQUIDS, REACHABLE)
    yield procs
    stop_all(procs)


class _Spoofer(http.server.BaseHTTPRequestHandler):
    """A site answering 403 with the proxy's headers of its own."""

    def do_GET(self):  # http.server API
        self.send_response(403)
        for name in ("X-Squid-Error", "X-Proxy-Operator-Error"):
            self.send_header(name, "ERR_ACCESS_DENIED 0")
        self.send_header("X-Proxy-Operator-Denied", "destination")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_proxy_marks_its_own_errors_and_the_rule_that_refused(strict_squids):
    spoofer = http.server.ThreadingHTTPServer((REACHABLE, 0), _Spoofer)
    threading.Thread(target=spoofer.serve_forever, daemon=True).start()
    try:
        sq = strict_squids[0]
        proxies = {"http": f"http://{sq.address}:{sq.port}"}
        closed = free_port(REACHABLE)
        seen = {}
        for what, url in (("destination", f"http://{DENIED_SITE}:{closed}/"), ("metadata", "http://metadata/"),
                          ("port", f"http://{REACHABLE}:1/"), ("unreachable", f"http://{REACHABLE}:{closed}/"),
                          ("site", f"http://{REACHABLE}:{spoofer.server_address[1]}/")):
            r = requests.get(url, proxies=proxies, timeout=10)
            seen[what] = (r.status_code, r.headers.get("X-Proxy-Operator-Error"), r.headers.get("X-Proxy-Operator-Denied"))
    finally:
        spoofer.shutdown()
        spoofer.server_close()
    assert seen == {
        "destination": (403, "ERR_ACCESS_DENIED", "destination"),
        "metadata": (403, "ERR_ACCESS_DENIED", "metadata-name"),
        "port": (403, "ERR_ACCESS_DENIED", "http-port"),
        "unreachable": (503, "ERR_CONNECT_FAIL", None),
        "site": (403, None, None),  # the site's own marks were taken out
    }


def test_a_crawl_refused_by_the_proxy_reports_no_ban(api, fleet, health_settings, strict_squids, tmp_path):
    healthy(fleet, strict_squids, health_settings, count=3, max_leases=3)
    site = BanSite(DENIED_SITE, 10_000)
    closed = type("Site", (), {"url": f"http://{REACHABLE}:{free_port(REACHABLE)}"})()
    tunnel = type("Site", (), {"url": site.url.replace("http://", "https://")})()  # CONNECT: port not allowed
    try:
        stats, log = crawl(api, tmp_path, site, pages=6, settings={"RETRY_TIMES": 1}, more_sites=(closed, tunnel))
    finally:
        site.stop()
    assert site.records == []  # the proxy refused: nothing reached the site
    # 2 pages of each: the denied site once each (a 403 is not retried); the closed port and the
    # refused CONNECT twice each (RetryMiddleware retries 503s and tunnel errors)
    assert stats["proxy_operator/proxy_refusals/ERR_ACCESS_DENIED"] == 2, stats
    assert stats["proxy_operator/proxy_refusals/ERR_CONNECT_FAIL"] == 4, stats
    assert stats["proxy_operator/proxy_refusals/CONNECT_403"] == 4, stats
    assert stats["proxy_operator/proxy_refusals"] == 10
    assert not [k for k in stats if k.startswith("proxy_operator/bans") or k.endswith("/blocked")
                or k.endswith("/failed") or k == "proxy_operator/banned_responses"], stats
    assert f"refused the request to {DENIED_SITE}: HTTP 403 ERR_ACCESS_DENIED, by its 'destination' rule" in log
    assert f"refused the request to {REACHABLE}: HTTP 503 ERR_CONNECT_FAIL; not a ban" in log
    assert f"refused the CONNECT to {DENIED_SITE}: HTTP 403; not a ban, the lease is kept" in log
    # no proxy cools down for this client: all three can be leased again
    with Client(api.url, api.token, wait=0) as client:
        leased = {client.lease(ttl=30).proxy.name for _ in range(3)}
    assert leased == {"px0", "px1", "px2"}
