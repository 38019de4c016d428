"""Ban intelligence end to end: real Scrapy crawls (several spiders at once) through the
middleware with targets, the real API, real Squids each leaving from its own loopback address,
and three local sites on one address told apart by ``Host`` (the Squids resolve their names with
a ``hosts_file``):

* ``banning.test`` bans one source address, the first it sees (a 403 to it, always), and answers
  the others only once :attr:`VirtualSites.together` of them are crawling it at once (the crawls
  then overlap whatever their processes' start-up times on a busy machine);
* ``ratelimited.test`` answers 429 above a per-source-address rate;
* ``wall.test`` refuses everyone (a 403 to every address).

The sites count, per (source address, site), the requests in flight at once.
"""

from __future__ import annotations

import collections
import dataclasses
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import requests

from proxy_operator_client import ApiError, Client

from app.squid import conf as squid_conf
from tests.api.helpers import healthy
from tests.client.conftest import NET, start_all, stop_all
from tests.health.fleet import start_squid
from tests.support.processes import ROOT
from tests.support.slow_relay import SlowRelay

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SITE_ADDRESS = NET.host(50)
SQUIDS = [NET.host(n) for n in range(60, 64)]
#: ratelimited.test: more than this many of its requests from one address within a second get a
#: 429 (the crawls, one request at a time per site and 0.15 s apart, stay under it).
RATE = 12
#: How long banning.test holds a request back waiting for the other crawls (then answers anyway:
#: the test's assertions say what went wrong); below the crawls' DOWNLOAD_TIMEOUT.
TOGETHER_TIMEOUT = 45.0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # http.server API
        sites: VirtualSites = self.server.sites
        source = self.client_address[0]
        host = (self.headers.get("Host") or "").split(":")[0]
        pair = (source, host)
        now = time.monotonic()
        with sites.lock:
            if host == "banning.test" and sites.banned is None:
                sites.banned = source
            if host == "banning.test" and source != sites.banned:
                # an address crawling the site waits for the others: each crawler holds its lease
                # for the site meanwhile, so the crawlers are on as many addresses at once
                sites.crawling.add(source)
                sites.arrived.notify_all()
                sites.arrived.wait_for(lambda: len(sites.crawling) >= sites.together, TOGETHER_TIMEOUT)
            sites.inflight[pair] += 1
            sites.most[pair] = max(sites.most[pair], sites.inflight[pair])
            recent = sites.times[pair]
            recent.append(now)
            while recent and recent[0] < now - 1.0:
                recent.popleft()
            rate = len(recent)
        time.sleep(0.03)  # long enough for overlapping requests to be seen in flight together
        if host == "wall.test" or (host == "banning.test" and source == sites.banned):
            status = 403
        elif host == "ratelimited.test" and rate > RATE:
            status = 429
        else:
            status = 200
        body = f"<html><body>{host}{self.path}</body></html>".encode()
        with sites.lock:
            sites.inflight[pair] -= 1
            sites.records.append({"source": source, "host": host, "path": self.path, "status": status})
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class VirtualSites:
    """The three sites on ``address`` (a free port), told apart by ``Host``."""

    def __init__(self, address: str) -> None:
        self.lock = threading.Lock()
        self.inflight: collections.Counter = collections.Counter()
        self.most: collections.Counter = collections.Counter()
        self.times: dict = collections.defaultdict(collections.deque)
        self.records: list[dict] = []
        self.banned: str | None = None
        #: banning.test answers an address (other than the banned one) once this many addresses
        #: have asked it for a page
        self.together = 0
        self.crawling: set[str] = set()
        self.arrived = threading.Condition(self.lock)
        self.server = http.server.ThreadingHTTPServer((address, 0), _Handler)
        self.server.daemon_threads = True
        self.server.sites = self
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, host: str) -> str:
        """The base URL of the site ``host``."""
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def host_squids():
    """Four Squids, each leaving from its own address, resolving the sites' names to
    :data:`SITE_ADDRESS` (``hosts_file``)."""
    hosts = tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False)
    hosts.write(f"{SITE_ADDRESS} banning.test ratelimited.test wall.test\n")
    hosts.close()
    os.chmod(hosts.name, 0o644)  # Squid reads it as its own user
    policy = squid_conf.SquidPolicy(extra=(f"hosts_file {hosts.name}",))
    procs = start_all([lambda a=a: start_squid(a, policy=policy) for a in SQUIDS])
    yield procs
    stop_all(procs)


def _crawl(api, tmp_path, name: str, bases: list[str], pages: int, settings: dict | None = None) -> subprocess.Popen:
    config = {"api": api.url, "base": bases[0], "bases": bases, "pages": pages, "sessions": 0, "close_after": 0,
              "log": str(tmp_path / f"{name}.log"), "stats": str(tmp_path / f"{name}.json"),
              "settings": {"CONCURRENT_REQUESTS_PER_DOMAIN": 1, "PROXY_OPERATOR_WAIT": 20,
                           "PROXY_OPERATOR_BAN_RETRY_TIMES": 5, "DOWNLOAD_DELAY": 0.15,
                           "DOWNLOAD_DELAY_JITTER": 0, "DOWNLOAD_TIMEOUT": TOGETHER_TIMEOUT + 15,
                           "LOG_LEVEL": "INFO", **(settings or {})}}
    path = tmp_path / f"{name}.config.json"
    path.write_text(json.dumps(config))
    return subprocess.Popen([sys.executable, "-m", "tests.client.crawl", str(path)], cwd=ROOT,
                            env={"PATH": "/usr/bin:/bin", "PROXY_OPERATOR_TOKEN": api.token},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_crawls_with_targets_ban_per_site_and_never_share_an_ip_on_a_site(api, fleet, host_squids, health_settings,
                                                                           tmp_path):
    healthy(fleet, host_squids, health_settings, count=4, max_leases=4)
    sites = VirtualSites(SITE_ADDRESS)
    sites.together = 3  # the three spiders crawl banning.test at once, however late one of them starts
    try:
        both = [sites.url("banning.test"), sites.url("ratelimited.test")]
        crawlers = [_crawl(api, tmp_path, f"spider{n}", both, 24) for n in range(3)]
        walled = _crawl(api, tmp_path, "wall", [sites.url("wall.test")], 6)
        for proc in (*crawlers, walled):
            out, _ = proc.communicate(timeout=100)
            assert proc.returncode == 0, out[-3000:]
        stats = [json.loads((tmp_path / f"spider{n}.json").read_text()) for n in range(3)]
        wall_stats = json.loads((tmp_path / "wall.json").read_text())
        records = list(sites.records)

        # every page of the two good sites was crawled, by every spider
        assert [s.get("test/pages") for s in stats] == [24, 24, 24]
        # the banned address got nothing but 403s from banning.test (the requests a crawler had
        # given its proxy before the first 403 came back, then none: banned fleet-wide), and
        # the other three addresses crawled it
        banned = sites.banned
        banning = [r for r in records if r["host"] == "banning.test"]
        assert {r["status"] for r in banning if r["source"] == banned} == {403}
        assert {r["source"] for r in banning if r["status"] == 200} == set(SQUIDS) - {banned}
        # no (address, site) pair ever had two requests in flight: one crawler per site and IP
        assert sites.most and max(sites.most.values()) == 1, dict(sites.most)
        assert not [r for r in records if r["host"] == "ratelimited.test" and r["status"] == 429]

        # the wall: three different addresses refused (TARGET_REFUSAL_IPS), then no fresh address
        # is spent on it (each address carried the pages its crawler had given it at once)
        wall = [r for r in records if r["host"] == "wall.test"]
        assert len({r["source"] for r in wall}) == 3
        assert wall_stats.get("proxy_operator/errors/target_refusing", 0) >= 1
        assert not wall_stats.get("test/pages")
        # and it cooled nothing down: no proxy has a live ban for it
        answer = requests.get(api.url + "/v1/proxies", headers={"Authorization": f"Bearer {api.token}"}, timeout=5)
        bans = {p["egressIP"]: [b["target"] for b in p["bans"]["active"]] for p in answer.json()["items"]}
        assert bans == {a: (["banning.test"] if a == banned else []) for a in SQUIDS}

        # the banned address keeps serving the other site: four leases for it, one per address
        with Client(api.url, api.token, wait=0) as client:
            held = [client.lease(target="ratelimited.test", ttl=30, renew=False) for _ in SQUIDS]
            assert {lease.egress_ip for lease in held} == set(SQUIDS)
            [through] = [lease for lease in held if lease.egress_ip == banned]
            with through.requests_session() as session:
                assert session.get(sites.url("ratelimited.test") + "/after", timeout=10).status_code == 200
            assert sites.records[-1] == {"source": banned, "host": "ratelimited.test", "path": "/after",
                                         "status": 200}
            for lease in held:
                lease.release()
            # and no other: three addresses for banning.test, then a 503 counting the ban
            other = [client.lease(target="banning.test", ttl=30, renew=False) for _ in SQUIDS[1:]]
            assert banned not in {lease.egress_ip for lease in other}
            with pytest.raises(ApiError) as info:
                client.lease(target="banning.test", wait=0)
            assert "1 with an egress IP banned by banning.test" in info.value.message
            for lease in other:
                lease.release()
    finally:
        sites.stop()


def test_a_retry_is_leased_only_once_the_api_has_the_ban(api, fleet, host_squids, health_settings, tmp_path):
    """Every release reaches the API a second late (a slow network, a busy API): a banned
    request's retry still waits for its ``blocked`` release to be answered before it leases
    for the site again, so the wall is known after exactly three refusals (one per address) and
    no fourth address is spent on it, however fast the retries come."""
    healthy(fleet, host_squids, health_settings, count=4, max_leases=4)
    sites = VirtualSites(SITE_ADDRESS)
    relay = SlowRelay(api.url, delay=1.0)
    try:
        slow = dataclasses.replace(api, url=relay.url)
        out, _ = _crawl(slow, tmp_path, "wall", [sites.url("wall.test")], 6).communicate(timeout=100)
        stats = json.loads((tmp_path / "wall.json").read_text())
        wall = [r for r in sites.records if r["host"] == "wall.test"]
        assert len({r["source"] for r in wall}) == 3, (wall, out[-3000:])
        assert {r["status"] for r in wall} == {403}
        assert stats.get("proxy_operator/errors/target_refusing", 0) >= 1
        assert stats.get("proxy_operator/leases/released/blocked") == 3
        assert relay.held >= 3  # the three blocked releases were held back
    finally:
        relay.stop()
        sites.stop()


def test_a_report_answered_after_the_client_timeout_is_asked_again_before_the_next_lease(
        api, fleet, host_squids, health_settings, tmp_path):
    """The first release's answer comes after ``PROXY_OPERATOR_TIMEOUT`` (a slow API, an answer
    lost with its connection): the SDK asks the API again (the answer says whether the first one
    went through) before the report counts as answered, so the next lease for the site still
    waits for the API to have the ban, and the wall is known after three addresses."""
    healthy(fleet, host_squids, health_settings, count=4, max_leases=4)
    sites = VirtualSites(SITE_ADDRESS)
    relay = SlowRelay(api.url, delay=3.0, count=1)  # only the first release is late
    try:
        slow = dataclasses.replace(api, url=relay.url)
        out, _ = _crawl(slow, tmp_path, "wall", [sites.url("wall.test")], 6,
                        {"PROXY_OPERATOR_TIMEOUT": 1}).communicate(timeout=100)
        stats = json.loads((tmp_path / "wall.json").read_text())
        wall = [r for r in sites.records if r["host"] == "wall.test"]
        assert relay.held == 1
        assert len({r["source"] for r in wall}) == 3, (wall, out[-3000:])
        assert stats.get("proxy_operator/leases/released/blocked") == 3, stats
        assert not stats.get("proxy_operator/errors/release"), stats
    finally:
        relay.stop()
        sites.stop()
