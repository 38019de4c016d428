"""Targets in the Python SDK against the real API, real Squids and local sites: the per-request
helpers lease for the request's host, a ban holds for that site only, and a site refusing
every egress IP is answered ``429 target_refusing`` without cooling the pool down."""

from __future__ import annotations

import http.server
import threading

import pytest

from proxy_operator_client import ApiError, Client
from tests.api.helpers import healthy
from tests.client.conftest import NET
from tests.client.site import BanSite

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def _sources(site: BanSite, *, status: int | None = None) -> list[str]:
    with site.lock:
        return [r["client"] for r in site.records if status is None or r["status"] == status]


def test_a_ban_by_one_site_leaves_the_ip_serving_the_others(api, fleet, client_squids, health_settings):
    healthy(fleet, client_squids, health_settings, count=3, max_leases=3)
    strict = BanSite(NET.host(30), limit=1, ban_status=403)  # each address: one page, then 403
    lenient = BanSite(NET.host(31), limit=1000)
    try:
        with Client(api.url, api.token, wait=5) as client:
            session = client.requests_session(ttl=30)
            first = session.get(strict.url + "/page/1", timeout=10)
            assert first.status_code == 200 and first.lease.target == NET.host(30)
            banned = session.get(strict.url + "/page/2", timeout=10)
            if banned.status_code == 200:  # another IP answered; the third request bans one
                banned = session.get(strict.url + "/page/3", timeout=10)
            assert banned.status_code == 403
            [burned] = _sources(strict, status=403)
            # the burned address never reaches the strict site again...
            after = len(strict.records)
            for n in range(4):
                session.get(strict.url + f"/page/{10 + n}", timeout=10)
            assert burned not in _sources(strict)[after:]
            # ...and keeps serving the other site (the least loaded proxy: it is leased first)
            for n in range(3):
                assert session.get(lenient.url + f"/page/{n}", timeout=10).status_code == 200
            assert burned in _sources(lenient)
            session.close()
    finally:
        strict.stop()
        lenient.stop()


def test_a_site_refusing_every_ip_is_refused_with_429_and_cools_nothing_down(api, fleet, client_squids,
                                                                             health_settings):
    healthy(fleet, client_squids, health_settings, count=3, max_leases=3)
    wall = BanSite(NET.host(32), limit=0, ban_status=403)  # refuses everyone
    try:
        with Client(api.url, api.token, wait=0) as client:
            session = client.requests_session(ttl=30)
            statuses = [session.get(wall.url + f"/page/{n}", timeout=10).status_code for n in range(3)]
            assert statuses == [403, 403, 403] and len(set(_sources(wall))) == 3  # three different IPs
            with pytest.raises(ApiError) as info:
                session.get(wall.url + "/page/4", timeout=10)
            err = info.value
            assert err.status == 429 and err.code == "target_refusing" and err.target == NET.host(32)
            assert err.retry_after and 250 < err.retry_after <= 300
            assert len(wall.records) == 3  # no fourth IP was spent on it
            with pytest.raises(ApiError, match="target_refusing"):
                client.lease(target=wall.url, wait=0)
            # no proxy is cooled down: every one is leasable for other sites and without a target
            held = [client.lease(target="other.example.com", ttl=30, renew=False) for _ in range(3)]
            assert len({lease.host for lease in held}) == 3
            for lease in held:
                lease.release()
            session.close()
    finally:
        wall.stop()


def test_httpx_helper_leases_per_request_and_reports_bans(api, fleet, client_squids, health_settings):
    healthy(fleet, client_squids, health_settings, count=3, max_leases=3)
    strict = BanSite(NET.host(33), limit=0, ban_status=403)
    try:
        with Client(api.url, api.token, wait=0) as client:
            with client.httpx_client(lease={"ttl": 30}, timeout=10) as http:
                assert http.get(strict.url + "/page/1").status_code == 403
                assert http.get(strict.url + "/page/2").status_code == 403
            # two different IPs were tried: the first was banned for this site after its 403
            assert len(set(_sources(strict))) == 2
            state = {p["egressIP"]: p["bans"] for p in client.proxies()}
            banned = [ip for ip, b in state.items() if any(x["target"] == NET.host(33) for x in b["active"])]
            assert sorted(banned) == sorted(set(_sources(strict)))
    finally:
        strict.stop()


class _Redirector(http.server.BaseHTTPRequestHandler):
    """A site that sends every page to another site (``server.to``)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):  # http.server API
        self.server.sources.append(self.client_address[0])
        self.send_response(302)
        self.send_header("Location", self.server.to + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_redirect_to_another_site_is_leased_and_reported_for_that_site(api, fleet, client_squids, health_settings):
    """requests follows a redirect inside the session: each hop goes through a lease for its own
    host (the other site's bans and limit hold for it), and the other site's ban answer bans
    the IP for that site, not for the site that redirected."""
    healthy(fleet, client_squids, health_settings, count=3, max_leases=3)
    wall = BanSite(NET.host(35), limit=0, ban_status=403)
    hop = http.server.ThreadingHTTPServer((NET.host(34), 0), _Redirector)
    hop.daemon_threads, hop.to, hop.sources = True, wall.url, []
    threading.Thread(target=hop.serve_forever, daemon=True).start()
    start = f"http://{NET.host(34)}:{hop.server_address[1]}"
    try:
        with Client(api.url, api.token, wait=0) as client:
            with client.requests_session(ttl=30) as session:
                resp = session.get(start + "/page/1", timeout=10)
            assert resp.status_code == 403 and [r.status_code for r in resp.history] == [302]
            assert resp.lease.target == NET.host(35) and resp.history[0].lease.target == NET.host(34)
            state = {p["egressIP"]: [b["target"] for b in p["bans"]["active"]] for p in client.proxies()}
            assert sorted(t for targets in state.values() for t in targets) == [NET.host(35)]
            assert state[_sources(wall)[0]] == [NET.host(35)]
    finally:
        hop.shutdown()
        hop.server_close()
        wall.stop()
