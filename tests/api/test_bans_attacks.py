"""Targeted leases under hostile or unlucky use: odd ``target`` spellings, races between API
processes, egress IPs that change under a lease, refusals across scopes, repeated releases, and
the TTLs of everything the ban rules write; real lease scripts on a real Redis."""

from __future__ import annotations

import threading

import pytest
import redis as redis_lib

from app.serving import leases, view as serving
from app.store import keys as redis_keys
from app.serving.bans import BanSettings, Target
from app.serving.leases import Scope
from app.serving.targets import TargetError, registrable_domain
from tests.api.test_bans import _lease, _proxy

pytestmark = pytest.mark.timeout(60)

ANY = leases.Filters()


@pytest.mark.parametrize("spelling", ["bücher.de", "BÜCHER.de", "www.bücher.de.", "https://user:pw@bücher.de:8443/a",
                                      "xn--bcher-kva.de", "WWW.XN--BCHER-KVA.DE", "bücher。de"])
def test_an_idn_host_and_its_punycode_are_one_target(spelling):
    # what an HTTP library hands the SDK as the request's host, in either form
    assert registrable_domain(spelling) == "xn--bcher-kva.de"


@pytest.mark.parametrize("value, expected", [
    ("[2001:db8::1]:8080", "2001:db8::1"), ("2001:DB8::1", "2001:db8::1"), ("http://[::1]/x", "::1"),
    ("EXAMPLE.com.", "example.com"), ("co.uk", "co.uk"), ("http://u:p@a.example.com:1/", "example.com"),
])
def test_ips_ports_credentials_trailing_dots_and_public_suffixes(value, expected):
    assert registrable_domain(value) == expected


@pytest.mark.parametrize("value", ["", " ", ".", "a..b", "-a.com", "a" * 64 + ".com", "x." * 130 + "com",
                                   "exa mple.com", "a\u2620.com", "[::1"])
def test_hostile_targets_are_refused_with_the_reason(value):
    with pytest.raises(TargetError):
        registrable_domain(value)


def test_idn_spellings_share_one_concurrency_limit(redis_client, lease_settings):
    bans = BanSettings()
    _proxy(redis_client, "idn", "198.51.100.60", max_leases=10)
    _lease(redis_client, "a", "bücher.de", lease_settings, bans)
    with pytest.raises(leases.LeaseError) as info:
        _lease(redis_client, "b", "www.xn--bcher-kva.de", lease_settings, bans)
    assert info.value.limited == {"banned": 0, "busy": 1}


@pytest.mark.parametrize("spelling", ["127.0.0.1", "127.1", "2130706433", "0x7f000001", "0x7f.0.0.1", "0177.0.0.1",
                                      "127.0.0.01", "http://127.1:8080/", "[::ffff:127.0.0.1]", "::ffff:7f00:1",
                                      "127.0.0.1."])
def test_an_ipv4_address_is_one_target_however_it_is_spelled(spelling):
    # each of these is the address an HTTP client connects to for that host
    assert registrable_domain(spelling) == "127.0.0.1"


@pytest.mark.parametrize("host", ["1.2.3.08", "1.2.3.4.5", "4294967296", "a.0x1", "example.123"])
def test_a_host_that_is_no_ipv4_address_stays_its_own_target(host):
    assert registrable_domain(host) == host


def test_ipv4_spellings_share_one_concurrency_limit_and_one_ban(redis_client, lease_settings):
    bans = BanSettings(refusal_ips=0)
    _proxy(redis_client, "ip4", "198.51.100.61", max_leases=10)
    held = _lease(redis_client, "a", "203.0.113.9", lease_settings, bans)
    with pytest.raises(leases.LeaseError) as info:
        _lease(redis_client, "b", "3405803785", lease_settings, bans)  # 203.0.113.9 as one number
    assert info.value.limited == {"banned": 0, "busy": 1}
    leases.release(redis_client, "a", held.id, outcome="blocked", settings=lease_settings, bans=bans)
    with pytest.raises(leases.LeaseError) as info:
        _lease(redis_client, "b", "[::ffff:203.0.113.9]:443", lease_settings, bans)
    assert info.value.limited == {"banned": 1, "busy": 0}


def test_one_ban_seen_through_several_leases_of_an_ip_is_one_strike(redis_client, lease_settings):
    """Four leases of one egress IP for one site (``TARGET_CONCURRENCY`` 4; the per-request
    helpers lease per request) all get the site's ban answer: one ban, not four repeated ones
    (it once doubled the cooldown three times: 8 x ``BAN_COOLDOWN_SECONDS``)."""
    bans = BanSettings(concurrency=4, cooldown=10, cooldown_max=3600, refusal_ips=0)
    _proxy(redis_client, "multi", "198.51.100.62", max_leases=10)
    held = [_lease(redis_client, "c", "busy.example", lease_settings, bans) for _ in range(4)]
    ends = []
    for lease in held:
        done = leases.release(redis_client, "c", lease.id, outcome="blocked", settings=lease_settings, bans=bans)
        assert done.banned and done.strikes == 1
        ends.append(done.cooldown_until)
    secs, micros = redis_client.time()
    assert max(ends) - min(ends) < 1 and 8 <= ends[0] - secs - micros / 1e6 <= 10
    # a ban after that one ended is a repeated one: twice as long
    redis_client.delete("po:ban:busy.example")
    got = _lease(redis_client, "c", "busy.example", lease_settings, bans)
    done = leases.release(redis_client, "c", got.id, outcome="failed", settings=lease_settings, bans=bans)
    assert done.strikes == 2


def test_racing_api_processes_never_pass_the_concurrency_limit(redis_url, redis_client, lease_settings):
    bans = BanSettings(concurrency=2)
    for i in range(6):  # six proxies, two egress IPs: at most 2 leases per IP for the target
        _proxy(redis_client, f"race{i}", f"198.51.100.{70 + i % 2}", max_leases=10)
    granted: list[leases.Lease] = []
    refused = []
    start = threading.Barrier(12)

    def worker(n: int) -> None:
        r = redis_lib.Redis.from_url(redis_url, decode_responses=True)
        start.wait()
        for _ in range(3):
            try:
                granted.append(leases.acquire(r, f"c{n}", ANY, ttl=60, settings=lease_settings,
                                              target=Target.of("race.example", bans), bans=bans))
            except leases.LeaseError as exc:
                refused.append(exc.code)
        r.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_ip: dict[str, int] = {}
    for lease in granted:
        per_ip[lease.egress_ip] = per_ip.get(lease.egress_ip, 0) + 1
    assert per_ip == {"198.51.100.70": 2, "198.51.100.71": 2}
    assert len(refused) == 32 and set(refused) == {leases.NO_PROXY_AVAILABLE}


def test_a_second_release_or_a_late_renewal_counts_nothing_twice(redis_client, lease_settings):
    bans = BanSettings(refusal_ips=0)
    _proxy(redis_client, "twice", "198.51.100.80")
    got = _lease(redis_client, "c", "twice.example", lease_settings, bans)
    first = leases.release(redis_client, "c", got.id, outcome="blocked", settings=lease_settings, bans=bans)
    assert first.strikes == 1
    with pytest.raises(leases.LeaseError) as info:
        leases.release(redis_client, "c", got.id, outcome="blocked", settings=lease_settings, bans=bans)
    assert info.value.code == "lease_not_found"
    with pytest.raises(leases.LeaseError):
        leases.renew(redis_client, "c", got.id, ttl=None, settings=lease_settings)
    assert redis_client.get("po:ban-strikes:twice.example|198.51.100.80") in (None, "1")
    assert redis_client.zcard("po:target-leases:twice.example|198.51.100.80") == 0


def test_a_proxy_whose_egress_ip_changes_under_a_lease_still_counts_it(redis_client, lease_settings):
    bans = BanSettings()
    uid = _proxy(redis_client, "moving", "198.51.100.90", max_leases=10)
    held = _lease(redis_client, "a", "moving.example", lease_settings, bans)
    # the probes learn a new egress IP (a VM's DHCP lease renewed, a Pod moved to another node)
    redis_client.hset(redis_keys.proxy(uid), "egressIP", "198.51.100.91")
    # its live lease for the target leaves through the new IP: that IP is at its limit
    with pytest.raises(leases.LeaseError) as info:
        _lease(redis_client, "b", "moving.example", lease_settings, bans)
    assert info.value.limited == {"banned": 0, "busy": 1}
    # a proxy still on the old IP is free for the target
    _proxy(redis_client, "stayed", "198.51.100.90", max_leases=10)
    assert _lease(redis_client, "b", "moving.example", lease_settings, bans).uid == "uid-stayed"
    # a renewal and a blocked release count the lease on the IP it leaves through now
    leases.renew(redis_client, "a", held.id, ttl=None, settings=lease_settings)
    done = leases.release(redis_client, "a", held.id, outcome="blocked", settings=lease_settings, bans=bans)
    assert done.banned
    assert redis_client.zscore("po:ban:moving.example", "198.51.100.91") is not None
    assert redis_client.zscore("po:ban:moving.example", "198.51.100.90") is None


def test_one_scope_refusing_a_target_does_not_refuse_another_scope(redis_client, lease_settings):
    bans = BanSettings(refusal_ips=2, refusal_cooloff=120)
    team_a, team_b = Scope(frozenset({"team-a"})), Scope(frozenset({"team-b"}))
    for i in range(2):
        _proxy(redis_client, f"a{i}", f"198.51.100.{100 + i}", namespace="team-a")
    _proxy(redis_client, "b0", "198.51.100.110", namespace="team-b")
    for _ in range(2):  # team A's crawler (or a hostile client of it) reports the site blocked twice
        got = leases.acquire(redis_client, "crawler-a", ANY, ttl=60, settings=lease_settings, scope=team_a,
                             target=Target.of("shared.example", bans), bans=bans)
        done = leases.release(redis_client, "crawler-a", got.id, outcome="blocked", settings=lease_settings,
                              bans=bans)
    assert done.refused_now
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "crawler-a", ANY, ttl=60, settings=lease_settings, scope=team_a,
                       target=Target.of("shared.example", bans), bans=bans)
    assert info.value.code == leases.TARGET_REFUSING
    # team B neither learns of it nor is denied the site
    got = leases.acquire(redis_client, "crawler-b", ANY, ttl=60, settings=lease_settings, scope=team_b,
                         target=Target.of("shared.example", bans), bans=bans)
    assert got.uid == "uid-b0"


def test_per_client_bans_keep_refusals_per_client(redis_client, lease_settings):
    bans = BanSettings(scope="client", refusal_ips=2, concurrency=5)
    for i in range(2):
        _proxy(redis_client, f"c{i}", f"198.51.100.{120 + i}")
    for _ in range(2):
        got = _lease(redis_client, "noisy", "wall.example", lease_settings, bans)
        leases.release(redis_client, "noisy", got.id, outcome="blocked", settings=lease_settings, bans=bans)
    with pytest.raises(leases.LeaseError):
        _lease(redis_client, "noisy", "wall.example", lease_settings, bans)
    assert _lease(redis_client, "quiet", "wall.example", lease_settings, bans).target == "wall.example"


def test_every_key_the_ban_rules_write_expires(redis_client, lease_settings):
    bans = BanSettings(refusal_ips=3, concurrency=3)
    for i in range(4):
        _proxy(redis_client, f"m{i}", f"198.51.100.{130 + i}", max_leases=10)
    for n in range(40):
        got = _lease(redis_client, "c", f"site{n % 7}.example", lease_settings, bans)
        if n % 3 == 0:
            leases.renew(redis_client, "c", got.id, ttl=30, settings=lease_settings)
        outcome = ("blocked", "failed", "ok", None)[n % 4]
        if outcome:
            leases.release(redis_client, "c", got.id, outcome=outcome, settings=lease_settings, bans=bans)
    # (po:target-ident:<uid> lives as long as the proxy's serving record: one per published proxy,
    # deleted with the record by the withdrawal)
    forever = [k for k in redis_client.scan_iter("po:*")
               if any(p in k for p in ("ban", "target", "refus")) and redis_client.pttl(k) == -1
               and not k.startswith("po:target-ident:")]
    # the fleet-wide index of live cooldowns is one key, trimmed by every ban
    assert forever in ([], ["po:bans"])
    idents = {k.removeprefix("po:target-ident:") for k in redis_client.scan_iter("po:target-ident:*")}
    assert idents <= {f"uid-m{i}" for i in range(4)}
    for uid in idents:
        serving.withdraw(redis_client, uid)
    assert not list(redis_client.scan_iter("po:target-ident:*"))
