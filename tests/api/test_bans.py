"""Targeted leases: bans per (egress IP, target), per-target concurrency per egress IP, targets
refusing everyone (app.serving.bans), in the real lease scripts on a real Redis, and through the
API's HTTP answers."""

from __future__ import annotations

import pytest

from api import create_app
from api.settings import ApiSettings
from app.resources import Proxy
from app.serving import leases, view as serving
from app.serving.bans import BanSettings, Target, parse_rules, proxy_bans
from app.serving.targets import TargetError, registrable_domain
from app.store import keys as redis_keys
from tests.api.helpers import auth

pytestmark = pytest.mark.timeout(60)

ANY = leases.Filters()


def _proxy(r, name: str, egress: str | None, *, max_leases: int = 5, pool: str | None = None,
           namespace: str = "bans") -> str:
    """Publish one healthy proxy whose probes found the egress IP ``egress``; return its uid."""
    uid = f"uid-{name}"
    proxy = Proxy.from_dict({"metadata": {"name": name, "namespace": namespace, "uid": uid},
                             "spec": {"mode": "External", "endpoint": {"host": "203.0.113.7", "port": 3128},
                                      "maxLeases": max_leases}})
    serving.publish(r, proxy, address="203.0.113.7", port=3128, phase="Ready")
    fields = {"health": "healthy", "healthy": "1"}
    if egress:
        fields["egressIP"] = egress
    if pool:
        fields["pool"] = pool
    r.hset(redis_keys.proxy(uid), mapping=fields)
    leases.reindex(r, uid)
    return uid


def _lease(r, client: str, target: str | None, settings, bans: BanSettings, ttl: int = 60):
    t = Target.of(target, bans) if target else None
    return leases.acquire(r, client, ANY, ttl=ttl, settings=settings, target=t, bans=bans)


def test_the_target_is_the_registrable_domain_from_the_public_suffix_list():
    assert registrable_domain("www.shop.example.co.uk") == "example.co.uk"
    assert registrable_domain("https://Images.Example.COM:8443/a?b") == "example.com"
    assert registrable_domain("user.github.io") == "user.github.io"  # a private suffix of the list
    # not on the list: the host itself, so two local sites stay two targets
    assert registrable_domain("site-a.test") == "site-a.test"
    assert registrable_domain("localhost") == "localhost"
    assert registrable_domain("127.0.0.1:8080") == "127.0.0.1"
    with pytest.raises(TargetError, match="not a host name label"):
        registrable_domain("bad host.com")
    with pytest.raises(TargetError, match="empty"):
        registrable_domain("https://")


def test_concurrency_rules_parse_and_name_the_bad_item():
    assert parse_rules("example.com=2, *.gov=1,pool:crawl/web=4") == (
        ("example.com", 2), ("*.gov", 1), ("pool:crawl/web", 4))
    with pytest.raises(ValueError, match="TARGET_CONCURRENCY_RULES: 'x.com' is not pattern=limit"):
        parse_rules("x.com")
    with pytest.raises(ValueError, match="limit of 'x.com=0'"):
        parse_rules("x.com=0")


@pytest.mark.parametrize("rule", ["*.example.com=4", "www.example.com=4", "WWW.Example.COM.=4",
                                  "*.shop.example.com=4", "example.com=4"])
def test_a_concurrency_rule_naming_a_site_its_hosts_or_their_subdomains_applies_to_the_site(rule):
    # targets are registrable domains: every host of example.com is the target example.com
    assert BanSettings(rules=parse_rules(rule)).limit_for("example.com") == (4, "")
    assert BanSettings(rules=parse_rules(rule)).limit_for("example.org") == (1, "")


def test_concurrency_rules_of_idn_sites_and_suffixes_match_their_targets():
    assert BanSettings(rules=parse_rules("*.bücher.de=3")).limit_for("xn--bcher-kva.de") == (3, "")
    assert BanSettings(rules=parse_rules("*.co.uk=2")).limit_for("example.co.uk") == (2, "")
    with pytest.raises(ValueError, match="TARGET_CONCURRENCY_RULES: 'bad host.com=2'"):
        parse_rules("bad host.com=2")


def test_the_documented_concurrency_rule_lets_its_site_have_that_many_leases_per_ip(redis_client, lease_settings):
    bans = BanSettings(rules=parse_rules("*.example.com=4"))
    _proxy(redis_client, "wide", "198.51.100.8", max_leases=10)
    got = [_lease(redis_client, "c", "www.example.com", lease_settings, bans) for _ in range(4)]
    assert {g.target for g in got} == {"example.com"}
    with pytest.raises(leases.LeaseError):
        _lease(redis_client, "c", "shop.example.com", lease_settings, bans)


def test_a_ban_holds_for_its_egress_ip_and_target_only_and_for_every_client(redis_client, lease_settings):
    bans = BanSettings(concurrency=20)
    a1 = _proxy(redis_client, "a1", "198.51.100.1", max_leases=20)
    a2 = _proxy(redis_client, "a2", "198.51.100.1", max_leases=20)  # same egress IP: one identity
    b = _proxy(redis_client, "b", "198.51.100.2", max_leases=20)
    first = _lease(redis_client, "crawler-a", "www.shop.example.com", lease_settings, bans)
    assert first.target == "example.com"
    other = a2 if first.uid == a1 else (a1 if first.uid == a2 else None)
    done = leases.release(redis_client, "crawler-a", first.id, outcome="blocked", settings=lease_settings,
                          bans=bans)
    assert done.banned and done.target == "example.com" and done.strikes == 1
    assert done.cooldown_until is not None
    banned_ip = redis_client.hget(redis_keys.proxy(first.uid), "egressIP")
    # every proxy of that egress IP is out for that target, for every client
    for client in ("crawler-a", "crawler-b"):
        for _ in range(3):
            got = _lease(redis_client, client, "example.com", lease_settings, bans)
            assert redis_client.hget(redis_keys.proxy(got.uid), "egressIP") != banned_ip
    # and stays leasable for any other target, and without a target
    assert other is None or banned_ip == "198.51.100.1"
    banned_uids = {a1, a2} if banned_ip == "198.51.100.1" else {b}
    seen = {_lease(redis_client, "crawler-a", "other.example", lease_settings, bans).uid for _ in range(8)}
    seen |= {_lease(redis_client, "crawler-a", None, lease_settings, bans).uid for _ in range(4)}
    assert banned_uids <= seen
    # GET /v1/proxies' per-target state
    state = proxy_bans(redis_client, [banned_ip], bans)[0]
    assert [x["target"] for x in state["active"]] == ["example.com"] and state["recent"] == 1


def test_per_client_bans_with_ban_scope_client(redis_client, lease_settings):
    bans = BanSettings(scope="client", concurrency=5)
    _proxy(redis_client, "only", "198.51.100.9")
    got = _lease(redis_client, "crawler-a", "t.example", lease_settings, bans)
    leases.release(redis_client, "crawler-a", got.id, outcome="failed", settings=lease_settings, bans=bans)
    with pytest.raises(leases.LeaseError) as info:
        _lease(redis_client, "crawler-a", "t.example", lease_settings, bans)
    assert info.value.code == leases.NO_PROXY_AVAILABLE and info.value.limited == {"banned": 1, "busy": 0}
    assert _lease(redis_client, "crawler-b", "t.example", lease_settings, bans).uid == "uid-only"


def test_repeated_bans_grow_the_cooldown_up_to_its_cap(redis_client, lease_settings):
    bans = BanSettings(cooldown=10, cooldown_max=35, refusal_ips=0)
    _proxy(redis_client, "one", "198.51.100.3")
    lengths = []
    for _ in range(4):
        redis_client.delete("po:ban:g.example")  # the cooldown ran out (its strikes did not)
        got = _lease(redis_client, "c", "g.example", lease_settings, bans)
        done = leases.release(redis_client, "c", got.id, outcome="blocked", settings=lease_settings, bans=bans)
        secs, micros = redis_client.time()
        lengths.append(round(done.cooldown_until - secs - micros / 1e6))
    assert lengths == [10, 20, 35, 35]


def test_one_egress_ip_serves_a_target_to_one_crawler_at_a_time(redis_client, lease_settings):
    bans = BanSettings()
    p1 = _proxy(redis_client, "p1", "198.51.100.4", max_leases=10)
    p2 = _proxy(redis_client, "p2", "198.51.100.4", max_leases=10)
    held = _lease(redis_client, "crawler-a", "site.example", lease_settings, bans, ttl=40)
    with pytest.raises(leases.LeaseError) as info:
        _lease(redis_client, "crawler-b", "site.example", lease_settings, bans)
    err = info.value
    assert err.code == leases.NO_PROXY_AVAILABLE and err.limited == {"banned": 0, "busy": 2}
    assert "2 with an egress IP at site.example's concurrency limit (1 live lease per egress IP)" in err.message
    assert 38 <= err.retry_after <= 40  # when the held lease expires
    # other targets and untargeted leases still get the same proxies
    assert _lease(redis_client, "crawler-b", "else.example", lease_settings, bans).uid in (p1, p2)
    assert _lease(redis_client, "crawler-b", None, lease_settings, bans).uid in (p1, p2)
    # releasing (as ok) frees the egress IP for the target
    leases.release(redis_client, "crawler-a", held.id, outcome="ok", settings=lease_settings, bans=bans)
    assert _lease(redis_client, "crawler-b", "site.example", lease_settings, bans).uid in (p1, p2)


def test_concurrency_limits_per_target_pattern_and_per_pool(redis_client, lease_settings):
    bans = BanSettings(rules=parse_rules("*.wide=3,pool:bans/web=2"))
    _proxy(redis_client, "w", "198.51.100.5", max_leases=10, pool="web")
    got = [_lease(redis_client, "c", "x.wide", lease_settings, bans) for _ in range(3)]
    assert len(got) == 3
    with pytest.raises(leases.LeaseError):
        _lease(redis_client, "c", "x.wide", lease_settings, bans)
    assert len([_lease(redis_client, "c", "narrow.example", lease_settings, bans) for _ in range(2)]) == 2
    with pytest.raises(leases.LeaseError) as info:
        _lease(redis_client, "c", "narrow.example", lease_settings, bans)
    assert "its pool's limit" in info.value.message


def test_a_target_refusing_everyone_is_cooled_off_not_the_pool(redis_client, lease_settings):
    bans = BanSettings(refusal_ips=3, refusal_window=60, refusal_cooloff=120)
    for i in range(4):
        _proxy(redis_client, f"r{i}", f"198.51.100.{20 + i}")
    last = None
    for _ in range(3):
        got = _lease(redis_client, "c", "wall.example", lease_settings, bans)
        last = leases.release(redis_client, "c", got.id, outcome="blocked", settings=lease_settings, bans=bans)
    assert last is not None and last.refused_now and not last.banned and last.refusing_until
    # the IPs it refused are not banned: no live cooldown is left, for it or any other target
    assert redis_client.zcard("po:bans") == 0 and not redis_client.exists("po:ban:wall.example")
    with pytest.raises(leases.LeaseError) as info:
        _lease(redis_client, "c", "wall.example", lease_settings, bans)
    assert info.value.code == leases.TARGET_REFUSING and 119 <= info.value.retry_after <= 120
    assert "wall.example" in info.value.message
    # every proxy serves other targets
    assert len({_lease(redis_client, "c", "fine.example", lease_settings, bans).uid for _ in range(4)}) == 4


def test_a_withdrawn_proxy_no_longer_holds_its_egress_ip_for_the_target(redis_client, lease_settings):
    """Two proxies behind one egress IP: the live targeted lease of one that leaves the serving
    view (deleted, withdrawn by the health engine) stops counting against the IP's concurrency."""
    bans = BanSettings()
    p1 = _proxy(redis_client, "w1", "198.51.100.40", max_leases=10)
    p2 = _proxy(redis_client, "w2", "198.51.100.40", max_leases=10)
    held = _lease(redis_client, "crawler-a", "site.example", lease_settings, bans, ttl=300)
    with pytest.raises(leases.LeaseError):
        _lease(redis_client, "crawler-b", "site.example", lease_settings, bans)
    serving.withdraw(redis_client, held.uid)
    assert _lease(redis_client, "crawler-b", "site.example", lease_settings, bans).uid == ({p1, p2} - {held.uid}).pop()
    # releasing the withdrawn proxy's lease later still answers and takes nothing from the new one
    leases.release(redis_client, "crawler-a", held.id, outcome="ok", settings=lease_settings, bans=bans)
    assert redis_client.zcard("po:target-leases:site.example|198.51.100.40") == 1


def _outcomes(r, ident: str) -> tuple[int, int]:
    """(targeted leases, bans) of ``ident`` in its per-minute counts."""
    counts = r.hgetall(redis_keys.ip_outcomes(ident))
    return (sum(int(v) for k, v in counts.items() if k.startswith("l")),
            sum(int(v) for k, v in counts.items() if k.startswith("b")))


def test_targeted_leases_and_their_bans_are_counted_per_egress_ip_and_minute(redis_client, lease_settings):
    bans = BanSettings(refusal_ips=0, history=600)
    _proxy(redis_client, "c1", "198.51.100.50")
    _proxy(redis_client, "c2", "198.51.100.50")  # the same identity
    key = redis_keys.ip_outcomes("198.51.100.50")
    # buckets from long ago, more than two histories' worth (10 minutes: 4 x 10 + 2 fields)
    redis_client.hset(key, mapping={f"{kind}{n}": 1 for n in range(1, 22) for kind in "lb"})
    for site, outcome in (("a.example", "blocked"), ("b.example", "ok"), ("c.example", "failed"),
                          ("d.example", "ok")):
        got = _lease(redis_client, "crawler", site, lease_settings, bans)
        leases.release(redis_client, "crawler", got.id, outcome=outcome, settings=lease_settings, bans=bans)
    _lease(redis_client, "crawler", None, lease_settings, bans)  # untargeted: not counted
    assert _outcomes(redis_client, "198.51.100.50") == (4, 2)
    # the old buckets were dropped when this minute's bucket started
    assert all(int(field[1:]) > 21 for field in redis_client.hkeys(key))
    assert 600_000 < redis_client.pttl(key) <= 660_000  # the history and one bucket


def test_a_refusing_target_takes_its_bans_out_of_the_ban_counts(redis_client, lease_settings):
    bans = BanSettings(refusal_ips=3, refusal_window=60)
    for i in range(3):
        _proxy(redis_client, f"t{i}", f"198.51.100.{60 + i}")
    for _ in range(3):
        got = _lease(redis_client, "c", "wall.example", lease_settings, bans)
        leases.release(redis_client, "c", got.id, outcome="blocked", settings=lease_settings, bans=bans)
    # the site refused all three: none of them was banned, for the ban ratio either
    assert [_outcomes(redis_client, f"198.51.100.{60 + i}") for i in range(3)] == [(1, 0)] * 3


def test_untargeted_leases_keep_the_per_client_cooldown(redis_client, lease_settings):
    bans = BanSettings()
    _proxy(redis_client, "u", "198.51.100.30")
    got = _lease(redis_client, "crawler-a", None, lease_settings, bans)
    done = leases.release(redis_client, "crawler-a", got.id, outcome="blocked", settings=lease_settings, bans=bans)
    assert done.target is None and not done.banned and done.cooldown_until
    with pytest.raises(leases.LeaseError):
        _lease(redis_client, "crawler-a", None, lease_settings, bans)
    assert _lease(redis_client, "crawler-b", None, lease_settings, bans).uid == "uid-u"


def test_the_api_answers_targets_with_statuses_and_retry_after(redis_client, redis_url, tokens_file, lease_settings):
    settings = ApiSettings(redis_url=redis_url, tokens_file=tokens_file, leases=lease_settings,
                           bans=BanSettings(refusal_ips=1, refusal_cooloff=90))
    http = create_app(settings).test_client()
    _proxy(redis_client, "h", "198.51.100.40")
    bad = http.post("/v1/leases", json={"target": "no such host"}, headers=auth())
    assert bad.status_code == 400 and bad.json["field"] == "target"
    first = http.post("/v1/leases", json={"target": "https://www.api.example.org/x"}, headers=auth())
    assert first.status_code == 201 and first.json["target"] == "example.org"
    busy = http.post("/v1/leases", json={"target": "example.org"}, headers=auth())
    assert busy.status_code == 503 and busy.json["target"] == "example.org" and busy.json["busy"] == 1
    assert int(busy.headers["Retry-After"]) > 1
    rel = http.delete(f"/v1/leases/{first.json['leaseId']}?outcome=blocked", headers=auth())
    assert rel.status_code == 200 and rel.json["target"] == "example.org" and rel.json["targetRefusingUntil"]
    refused = http.post("/v1/leases", json={"target": "example.org"}, headers=auth())
    assert refused.status_code == 429 and refused.json["error"] == "target_refusing"
    assert 89 <= int(refused.headers["Retry-After"]) <= 90
    metrics = http.get("/metrics").get_data(as_text=True)
    assert 'proxy_operator_target_refusals_total{event="refusing_started",target="example.org"} 1.0' in metrics
    assert "proxy_operator_target_cooldowns_active 0.0" in metrics


def test_a_target_given_as_a_long_url_is_taken_by_its_host(redis_client, redis_url, tokens_file, lease_settings):
    """The API takes a URL as ``target`` (its host counts): a page URL with a long path and query
    is one, and a host name is at most 253 characters whatever the URL around it."""
    settings = ApiSettings(redis_url=redis_url, tokens_file=tokens_file, leases=lease_settings, bans=BanSettings())
    http = create_app(settings).test_client()
    _proxy(redis_client, "u", "198.51.100.41")
    url = "https://www.shop.example.net/search?q=" + "x" * 600 + "&page=2"
    got = http.post("/v1/leases", json={"target": url}, headers=auth())
    assert got.status_code == 201 and got.json["target"] == "example.net", got.json
    huge = http.post("/v1/leases", json={"target": "https://example.net/" + "x" * 5000}, headers=auth())
    assert huge.status_code == 400 and huge.json["field"] == "target" and "2048" in huge.json["message"]
    long_host = http.post("/v1/leases", json={"target": "https://" + "a." * 130 + "com/"}, headers=auth())
    assert long_host.status_code == 400 and long_host.json["field"] == "target"
    assert "at most 253" in long_host.json["message"]
