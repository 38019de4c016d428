"""Probes through real Squids on loopback: each outcome is reported as itself."""

from __future__ import annotations

import time

import pytest

from app.squid import conf as squid_conf
from app.probes import probe as p
from tests.health.conftest import NET
from tests.health.fleet import htpasswd_file, start_squid
from tests.health.servers import Blackhole, TLSOrigin, free_port

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def tls_origin():
    server = TLSOrigin(NET.host(2)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def squid(tls_origin):
    """A Squid whose CONNECT policy also allows the TLS origin's port."""
    proc = start_squid(NET.host(5), policy=squid_conf.SquidPolicy(connect_ports=(443, tls_origin.port)))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def auth_squid(tls_origin):
    path = htpasswd_file("crawler", "s3cret-pass")
    proc = start_squid(NET.host(6), policy=squid_conf.SquidPolicy(
        connect_ports=(443, tls_origin.port), basic_auth_file=path))
    yield proc
    proc.stop()


def target(proxy, url, **kw) -> p.ProbeTarget:
    return p.ProbeTarget(uid="u", host=proxy.address, port=proxy.port, url=url, timeout=kw.pop("timeout", 3), **kw)


def test_success_learns_the_egress_ip(squid, origin):
    res = p.probe(target(squid, origin.url("/generate_204"), want_egress=True), echo_url=origin.url("/ip"))
    assert (res.ok, res.reason, res.status) == (True, p.OK, 204)
    assert res.egress_ip == NET.host(5)  # the echo saw the proxy's outgoing address
    assert res.latency_ms > 0


def test_egress_from_a_json_echo_and_errors_from_a_bad_one(squid, origin):
    res = p.probe(target(squid, origin.url("/generate_204"), want_egress=True), echo_url=origin.url("/ip.json"))
    assert res.egress_ip == NET.host(5)
    res = p.probe(target(squid, origin.url("/generate_204"), want_egress=True), echo_url=origin.url("/garbage"))
    assert res.ok and res.egress_ip is None and "not an IP address" in res.egress_error


def test_connection_refused(squid, origin):
    closed = free_port(NET.host(5))
    res = p.probe(p.ProbeTarget("u", NET.host(5), closed, origin.url("/generate_204"), timeout=3))
    assert (res.ok, res.reason) == (False, p.CONNECTION_REFUSED)
    assert f"{NET.host(5)}:{closed}" in res.message


@pytest.mark.parametrize("https", [False, True])
def test_timeout_on_a_proxy_that_never_answers(origin, tls_origin, https):
    hole = Blackhole(NET.host(3))
    try:
        url = tls_origin.url("/generate_204") if https else origin.url("/generate_204")
        t0 = time.monotonic()
        res = p.probe(p.ProbeTarget("u", hole.address, hole.port, url, timeout=1))
        assert (res.ok, res.reason) == (False, p.TIMEOUT)
        assert 0.9 < time.monotonic() - t0 < 5
    finally:
        hole.stop()


def test_proxy_auth_required_for_http_and_connect(auth_squid, origin, tls_origin):
    res = p.probe(target(auth_squid, origin.url("/generate_204")))
    assert (res.ok, res.reason, res.status) == (False, p.PROXY_AUTH_REQUIRED, 407)
    res = p.probe(target(auth_squid, tls_origin.url("/generate_204")))
    assert (res.ok, res.reason, res.status) == (False, p.PROXY_AUTH_REQUIRED, 407)
    wrong = p.probe(target(auth_squid, origin.url("/generate_204"), credentials=("crawler", "wrong")))
    assert wrong.reason == p.PROXY_AUTH_REQUIRED


def test_credentials_pass_and_never_reach_the_origin(auth_squid, origin):
    before = len(origin.requests)
    res = p.probe(target(auth_squid, origin.url("/headers"), expected_status=200,
                         credentials=("crawler", "s3cret-pass")))
    assert res.ok, res.message
    got = origin.requests[before:]
    assert got and all("proxy-authorization" not in {k.lower() for k in r["headers"]} for r in got)
    assert "s3cret-pass" not in repr(target(auth_squid, "http://x/", credentials=("crawler", "s3cret-pass")))


def test_unexpected_status(squid, origin):
    res = p.probe(target(squid, origin.url("/status/200")))
    assert (res.ok, res.reason, res.status) == (False, p.UNEXPECTED_STATUS, 200)
    assert "expected 204" in res.message


def test_unreachable_origin_is_an_unexpected_status_naming_the_proxy_error(squid):
    res = p.probe(target(squid, f"http://{NET.host(2)}:{free_port(NET.host(2))}/generate_204"))
    assert (res.reason, res.status) == (p.UNEXPECTED_STATUS, 503)
    assert "ERR_CONNECT_FAIL" in res.message


def test_tls_error_through_connect(squid, tls_origin):
    res = p.probe(target(squid, tls_origin.url("/generate_204")))
    assert (res.ok, res.reason) == (False, p.TLS_ERROR)
    assert "certificate" in res.message


def test_https_through_connect_with_a_trusted_ca(squid, tls_origin):
    res = p.probe(target(squid, tls_origin.url("/generate_204"), want_egress=True),
                  echo_url=tls_origin.url("/ip"), ca_bundle=tls_origin.cert_path)
    assert res.ok, res.message
    assert res.egress_ip == NET.host(5)


def test_connect_to_a_port_other_than_443_is_refused_by_default(origin, tls_origin, squids):
    plain = squids(start_squid(NET.host(7)))
    res = p.probe(target(plain, tls_origin.url("/generate_204")))
    assert (res.ok, res.reason, res.status) == (False, p.TUNNEL_FAILED, 403)


def test_a_client_outside_the_allowed_ranges_is_refused(origin, squids):
    narrow = squids(start_squid(NET.host(8), policy=squid_conf.SquidPolicy(allowed_ranges=("10.0.0.0/8",))))
    res = p.probe(target(narrow, origin.url("/generate_204")))
    assert (res.reason, res.status) == (p.UNEXPECTED_STATUS, 403)


def test_a_batch_is_probed_concurrently(origin):
    holes = [Blackhole(NET.host(3)) for _ in range(8)]
    try:
        targets = [p.ProbeTarget(str(i), h.address, h.port, origin.url("/generate_204"), timeout=1)
                   for i, h in enumerate(holes)]
        t0 = time.monotonic()
        results = p.probe_many(targets, concurrency=8)
        elapsed = time.monotonic() - t0
    finally:
        for h in holes:
            h.stop()
    assert [r.uid for r in results] == [str(i) for i in range(8)]
    assert all(r.reason == p.TIMEOUT for r in results)
    assert elapsed < 6, f"8 one-second timeouts took {elapsed:.1f}s: probes ran one after another"


@pytest.mark.parametrize("body,expected", [
    (b"203.0.113.7\n", "203.0.113.7"),
    (b'{"ip": "2001:db8::1"}', "2001:db8::1"),
    (b'{"origin": "198.51.100.2, 10.0.0.1"}', "198.51.100.2"),
])
def test_parse_egress(body, expected):
    assert p.parse_egress(body) == expected


@pytest.mark.parametrize("body", [b"", b"hello", b"{not json", b'{"ip": 5}', b"[1]"])
def test_parse_egress_rejects_non_addresses(body):
    with pytest.raises(ValueError):
        p.parse_egress(body)


# -- Retry-After (RFC 9110 §10.2.3): delay-seconds or an HTTP-date, capped at an hour ----------
NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


@pytest.mark.parametrize("value, expected", [
    ("120", 120.0),
    (" 7 ", 7.0),
    ("0", 0.0),
    ("3600", 3600.0),
    ("3601", 3600.0),               # capped at MAX_RETRY_AFTER
    ("999999999999", 3600.0),
])
def test_parse_retry_after_seconds_capped_at_an_hour(value, expected):
    assert p.parse_retry_after(value, now=NOW) == expected


@pytest.mark.parametrize("value, expected", [
    ("Tue, 14 Nov 2023 22:15:20 GMT", 120.0),      # IMF-fixdate, two minutes after NOW
    ("Tuesday, 14-Nov-23 22:14:20 GMT", 60.0),     # obsolete RFC 850 form
    ("Tue Nov 14 22:13:50 2023", 30.0),            # obsolete asctime form
    ("Tue, 14 Nov 2023 22:13:20 GMT", 0.0),        # now
    ("Tue, 14 Nov 2023 21:00:00 GMT", 0.0),        # in the past: no wait, never negative
    ("Tue, 14 Nov 2023 23:13:21 GMT", 3600.0),     # an hour and a second ahead: capped
    ("Wed, 15 Nov 2023 22:13:20 GMT", 3600.0),     # a day ahead: capped
])
def test_parse_retry_after_http_date(value, expected):
    assert p.parse_retry_after(value, now=NOW) == pytest.approx(expected)


def test_parse_retry_after_http_date_defaults_to_the_clock():
    from email.utils import formatdate

    got = p.parse_retry_after(formatdate(time.time() + 90, usegmt=True))
    assert 85 <= got <= 90
    assert p.MAX_RETRY_AFTER == 3600.0


@pytest.mark.parametrize("value", [None, "", "   ", "-5", "1.5", "soon", "Tue, 99 Foo 2023 25:61:00 GMT"])
def test_parse_retry_after_rejects_what_it_cannot_read(value):
    assert p.parse_retry_after(value, now=NOW) is None


def test_parse_retry_after_reads_every_http_date_as_utc_whatever_the_local_zone(monkeypatch):
    """The asctime form has no zone of its own; it is GMT (RFC 9110 §5.6.7), not local time."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert p.parse_retry_after("Tue Nov 14 22:13:50 2023", now=NOW) == pytest.approx(30.0)
        assert p.parse_retry_after("Tue, 14 Nov 2023 22:15:20 GMT", now=NOW) == pytest.approx(120.0)
    finally:
        monkeypatch.undo()
        time.tzset()
