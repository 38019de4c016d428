"""The Scrapy middleware in real crawls: ``proxy_operator_client.scrapy.ProxyLeaseMiddleware``
in a real ``CrawlerProcess`` (a subprocess: Twisted's reactor runs once per process), the real
API, twelve real Squids requiring basic auth (a password full of URL-special characters), each
sending from its own loopback address so the site can tell them apart, and a local site that
bans an address after 20 requests (a 403, or a 200 captcha page only the ban detector sees).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from urllib.parse import quote

import pytest

from app.squid import conf as squid_conf
from proxy_operator_client import ApiError, Client
from tests.client.conftest import NET, PASSWORD, USER, publish_authed, start_all, stop_all
from tests.client.site import BanSite
from tests.health.fleet import htpasswd_file, start_squid
from tests.support.processes import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

SITE_ADDRESS = NET.host(1)
#: A second host name of the crawl's site (another download slot).
SECOND_SITE_ADDRESS = NET.host(5)
CRAWL_SQUIDS = [NET.host(n) for n in range(30, 42)]
PAGES = 200
BAN_AFTER = 20


@pytest.fixture(scope="module")
def crawl_squids():
    """Twelve Squids requiring USER / PASSWORD, each sending from its own address."""
    policy = squid_conf.SquidPolicy(basic_auth_file=htpasswd_file(USER, PASSWORD))
    procs = start_all([lambda a=a: start_squid(a, policy=policy) for a in CRAWL_SQUIDS])
    yield procs
    stop_all(procs)


@pytest.fixture()
def proxies(fleet, redis_client, health_settings, crawl_squids):
    """The twelve Squids published as Proxies ``authed0..11`` (maxLeases 3); name -> address."""
    published = publish_authed(fleet, redis_client, health_settings, crawl_squids)
    return {px.name: sq.address for px, sq in zip(published, crawl_squids)}


def crawl(api, tmp_path, site: BanSite, *, pages: int = PAGES, sessions: int = 0, close_after: int = 0,
          settings: dict | None = None, more_sites: tuple[BanSite, ...] = ()) -> tuple[dict, str]:
    """Run tests/client/crawl.py once (pages spread over ``site`` and ``more_sites`` in turn);
    its stats and its DEBUG log."""
    config = {"api": api.url, "base": site.url, "bases": [s.url for s in (site, *more_sites)], "pages": pages,
              "sessions": sessions, "close_after": close_after,
              "log": str(tmp_path / "scrapy.log"), "stats": str(tmp_path / "stats.json"), "settings": settings or {}}
    (tmp_path / "crawl.json").write_text(json.dumps(config))
    run = subprocess.run([sys.executable, "-m", "tests.client.crawl", str(tmp_path / "crawl.json")], cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin", "PROXY_OPERATOR_TOKEN": api.token}, capture_output=True,
                         text=True, timeout=45)
    (tmp_path / "stderr.txt").write_text(run.stdout + run.stderr)
    log = (tmp_path / "scrapy.log").read_text() if (tmp_path / "scrapy.log").exists() else ""
    assert run.returncode == 0, run.stdout + run.stderr + log[-5000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    return stats, log + run.stdout + run.stderr


def assert_no_secret(api, *texts: str) -> None:
    for text in texts:
        assert api.token not in text and PASSWORD not in text and quote(PASSWORD, safe="") not in text


def test_a_crawl_rotates_through_banned_proxies_and_completes(api, proxies, tmp_path):
    site = BanSite(SITE_ADDRESS, BAN_AFTER)
    try:
        # Up to 16 requests are given the current proxy before its ban shows, so about a third
        # of all answers are bans: ten retries make giving up on a page vanishingly unlikely.
        # Leases for no site in particular (PROXY_OPERATOR_TARGETS off): the per-client cooldown
        # of every proxy this test checks (tests/client/test_scrapy_targets.py: with targets).
        stats, log = crawl(api, tmp_path, site, settings={"PROXY_OPERATOR_BAN_RETRY_TIMES": 10,
                                                          "PROXY_OPERATOR_TARGETS": False})
    finally:
        site.stop()
    # every page was crawled, each through a proxy, and never a captcha page to the spider
    assert stats["test/pages"] == PAGES and "test/captchas" not in stats
    served = {r["path"] for r in site.records if not r["banned"]}
    assert served == {f"/page/{i}" for i in range(PAGES)}
    assert {r["client"] for r in site.records} <= set(proxies.values())
    assert not any(r["proxy_auth"] for r in site.records)  # the Squids consumed the credentials

    # every proxy that served 20 pages was banned, reported blocked once, and not leased again
    banned = {key.split("/", 2)[2] for key in stats if key.startswith("proxy_operator/bans/")}
    banned_names = {name.split("/", 1)[1] for name in banned}
    assert len(banned) >= PAGES // BAN_AFTER - 1 and all(stats[f"proxy_operator/bans/{b}"] == 1 for b in banned)
    assert {r["client"] for r in site.records if r["banned"]} == {proxies[n] for n in banned_names}
    assert {r["status"] for r in site.records if r["banned"]} == {200, 403}  # captchas and 403s both seen
    taken = stats["proxy_operator/leases/taken"]
    assert taken in (len(banned), len(banned) + 1)  # one lease per proxy: a banned one never came back
    assert stats["proxy_operator/bans"] == stats["proxy_operator/leases/released/blocked"] == len(banned)
    assert stats.get("proxy_operator/leases/released/ok", 0) == taken - len(banned)  # released at close
    # banned requests were retried the Scrapy way, none gave up
    assert stats["proxy_operator/retries"] == stats["retry/reason_count/proxy_operator_ban"] >= len(banned)
    assert stats["proxy_operator/banned_responses"] == sum(r["banned"] for r in site.records)
    assert "retry/max_reached" not in stats

    # the banned proxies cool down for this client: it can lease every other proxy, not them
    with Client(api.url, api.token, wait=0) as client:
        assert all(p["leases"]["used"] == 0 for p in client.proxies())  # nothing left leased
        leased = []
        with pytest.raises(ApiError) as info:
            while True:
                leased.append(client.lease(ttl=30).proxy.name)
        assert not set(leased) & banned_names and len(set(leased)) == len(proxies) - len(banned)
        assert f"{len(banned)} cooling down for this client" in info.value.message
    assert_no_secret(api, log, json.dumps(stats), api.proc.log())


def test_closing_the_spider_mid_crawl_releases_every_lease(api, proxies, redis_client, tmp_path):
    site = BanSite(SITE_ADDRESS, 10_000)
    try:
        stats, log = crawl(api, tmp_path, site, sessions=6, close_after=40)
    finally:
        site.stop()
    assert stats["finish_reason"] == "enough" and 40 <= stats["test/pages"] < PAGES
    # one lease per session, each sticky to its proxy, all released when the spider closed
    assert stats["proxy_operator/leases/taken"] == stats["proxy_operator/leases/released/ok"] == 6
    by_session = defaultdict(set)
    for r in site.records:
        by_session[r["path"].split("/")[2]].add(r["client"])
    assert len(by_session) == 6 and all(len(clients) == 1 for clients in by_session.values())
    assert {r["client"] for r in site.records} <= set(proxies.values())
    assert redis_client.zcard("po:lease-expiry") == 0  # no lease live in Redis
    with Client(api.url, api.token) as client:
        assert all(p["leases"]["used"] == 0 for p in client.proxies())
    assert "every lease released" in log
    assert_no_secret(api, log, json.dumps(stats))


def test_no_page_is_fetched_without_a_proxy(api, proxies, tmp_path):
    """No proxy matches the crawl's filter: every request fails with the API's error, none
    reaches the site directly."""
    site = BanSite(SITE_ADDRESS, 10_000)
    try:
        stats, log = crawl(api, tmp_path, site, pages=5,
                           settings={"PROXY_OPERATOR_ZONE": "nowhere", "PROXY_OPERATOR_WAIT": 0})
    finally:
        site.stop()
    assert site.records == [] and "test/pages" not in stats
    assert stats["proxy_operator/errors/no_proxy_available"] >= 1
    assert stats["downloader/exception_type_count/proxy_operator_client.errors.ApiError"] == 5
    assert "proxy_operator/leases/taken" not in stats
    assert_no_secret(api, log)


def test_a_ban_is_retried_only_as_often_as_the_retry_times_say(api, proxies, redis_client, tmp_path):
    """A site banning every request, one ban retry per request: each page is fetched twice (a
    new lease each time), then Scrapy's retry gives up: the banned answer goes on down the
    middleware chain as Scrapy's conventions say (a 403 dropped by HttpErrorMiddleware, a 200
    captcha page to the spider), and every lease is released ``blocked``."""
    pages = 3
    site = BanSite(SITE_ADDRESS, 0)
    try:
        stats, log = crawl(api, tmp_path, site, pages=pages, settings={"PROXY_OPERATOR_BAN_RETRY_TIMES": 1})
    finally:
        site.stop()
    # one retry per page, then no more
    paths = [r["path"] for r in site.records]
    assert sorted(paths) == sorted(f"/page/{i}" for i in range(pages) for _ in range(2)), paths
    assert all(r["banned"] for r in site.records) and {r["client"] for r in site.records} <= set(proxies.values())
    assert stats["retry/count"] == stats["retry/reason_count/proxy_operator_ban"] == pages
    assert stats["proxy_operator/retries"] == pages
    assert stats["retry/max_reached"] == pages
    assert stats["proxy_operator/banned_responses"] == 2 * pages
    # the last answer of each page, as the site sent it, is what the spider's side saw
    last = {r["path"]: r["status"] for r in site.records}
    assert stats.get("httperror/response_ignored_status_count/403", 0) == list(last.values()).count(403)
    assert stats.get("test/captchas", 0) == list(last.values()).count(200)
    assert "test/pages" not in stats
    # the first attempt and its retry went through different proxies (a banned one cools down)
    by_path = defaultdict(list)
    for r in site.records:
        by_path[r["path"]].append(r["client"])
    assert all(len(set(clients)) == 2 for clients in by_path.values()), by_path
    # every lease was banned and released blocked; none is left
    taken = stats["proxy_operator/leases/taken"]
    assert 2 <= taken <= pages + 1
    assert stats["proxy_operator/leases/released/blocked"] == stats["proxy_operator/bans"] == taken
    assert "proxy_operator/leases/released/ok" not in stats and "proxy_operator/errors/release" not in stats
    assert redis_client.zcard("po:lease-expiry") == 0
    with Client(api.url, api.token) as client:
        assert all(p["leases"]["used"] == 0 for p in client.proxies())
    assert_no_secret(api, log, json.dumps(stats))


def test_a_429_is_a_ban_by_default(api, proxies, redis_client, tmp_path):
    """``PROXY_OPERATOR_BAN_CODES`` left at its default: a ``429`` is a ban, like a ``403``.  A
    site answering 429 to everything and ``RETRY_TIMES`` 1: each page is tried through two
    proxies (the ban's retry, never ``RetryMiddleware``'s own retry of a 429 through the banned
    proxy), and every lease taken is released ``blocked``."""
    pages = 2
    site = BanSite(SITE_ADDRESS, 0, ban_status=429)
    try:
        stats, log = crawl(api, tmp_path, site, pages=pages, settings={"RETRY_TIMES": 1})
    finally:
        site.stop()
    assert len(site.records) == 2 * pages and {r["status"] for r in site.records} == {429}
    assert {r["client"] for r in site.records} <= set(proxies.values())
    by_path = defaultdict(list)
    for r in site.records:
        by_path[r["path"]].append(r["client"])
    assert all(len(set(clients)) == 2 for clients in by_path.values()), by_path
    assert stats["proxy_operator/banned_responses"] == 2 * pages
    assert stats["retry/reason_count/proxy_operator_ban"] == stats["proxy_operator/retries"] == pages
    assert not [k for k in stats if k.startswith("retry/reason_count/429")], stats
    taken = stats["proxy_operator/leases/taken"]
    assert 2 <= taken <= pages + 1
    assert stats["proxy_operator/leases/released/blocked"] == stats["proxy_operator/bans"] == taken
    assert redis_client.zcard("po:lease-expiry") == 0
    assert_no_secret(api, log, json.dumps(stats))


def test_each_download_slot_has_its_own_lease(api, proxies, redis_client, tmp_path):
    """Two host names of the site are two download slots: each crawls through its own lease
    (its own proxy), and both are released when the spider closes."""
    pages = 40
    first, second = BanSite(SITE_ADDRESS, 10_000), BanSite(SECOND_SITE_ADDRESS, 10_000)
    try:
        stats, log = crawl(api, tmp_path, first, pages=pages, more_sites=(second,))
    finally:
        first.stop()
        second.stop()
    assert stats["test/pages"] == pages
    assert len(first.records) == len(second.records) == pages // 2
    # one proxy per slot, not the same one
    [first_client] = {r["client"] for r in first.records}
    [second_client] = {r["client"] for r in second.records}
    assert first_client != second_client and {first_client, second_client} <= set(proxies.values())
    # the middleware's own account: slot -> lease on proxy, one each
    taken = dict((slot, (lease, proxy)) for slot, lease, proxy in
                 re.findall(r"proxy-operator: slot (\S+) -> lease ([0-9a-f]+) on \S+/(\S+)", log))
    assert set(taken) == {SITE_ADDRESS, SECOND_SITE_ADDRESS}, taken
    assert taken[SITE_ADDRESS][0] != taken[SECOND_SITE_ADDRESS][0]
    assert proxies[taken[SITE_ADDRESS][1]] == first_client and proxies[taken[SECOND_SITE_ADDRESS][1]] == second_client
    # both leases (and only they) taken, both released at the close
    assert stats["proxy_operator/leases/taken"] == stats["proxy_operator/leases/released/ok"] == 2
    assert "proxy_operator/bans" not in stats
    assert redis_client.zcard("po:lease-expiry") == 0
    with Client(api.url, api.token) as client:
        assert all(p["leases"]["used"] == 0 for p in client.proxies())
    assert_no_secret(api, log, json.dumps(stats))
