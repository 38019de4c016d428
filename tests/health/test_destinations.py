"""Probes are no port scanner and one slow proxy stalls nobody (docs/security.md).

Destination checks use the real resolver (``/etc/hosts``, numeric forms glibc accepts) and
real listeners on loopback; the engine tests run External Proxies in the API fake against real
Squids, with settings that deny loopback the way production does (no ``PROBE_ALLOWED_RANGES``),
or that allow only the addresses a test names.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from app.serving import view as serving
from app.store import keys as redis_keys
from app.probes import engine
from app.probes import probe as p
from app.probes.destinations import DestinationDenied, DestinationPolicy, parse_ranges
from app.probes.settings import HealthSettings
from tests.health.conftest import NET, ORIGIN_ADDRESS
from tests.health.fleet import start_squid
from tests.health.servers import Blackhole
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)


def conds(proxy):
    return {c["type"]: c for c in proxy.status.get("conditions") or ()}


def denied_settings(**kw) -> HealthSettings:
    """Production-like settings: loopback denied unless ``allowed_ranges`` says otherwise."""
    return HealthSettings(echo_url="", provision_deadline=600, concurrency=8, **kw)


def untouched(listener: Blackhole) -> bool:
    """Whether nobody connected to ``listener`` (the kernel queues connections; none queued)."""
    listener.sock.setblocking(False)
    try:
        conn, _ = listener.sock.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


# -- the policy ------------------------------------------------------------------------------
# Addresses here are data for the policy: nothing binds or dials them (literal loopback
# addresses other than 127.0.0.1 are fine in these tests only).

@pytest.mark.parametrize("host", [
    "127.0.0.1", "127.0.3.77", "localhost", "2130706433", "0x7f.1", "::1", "::ffff:127.0.0.1",
    "169.254.169.254", "fe80::1", "0.0.0.0", "metadata.google.internal", "METADATA.google.internal.",
])
def test_the_default_policy_denies_loopback_link_local_and_the_metadata_server(host):
    with pytest.raises(DestinationDenied):
        DestinationPolicy().endpoint_address(host, 3128)


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/computeMetadata/v1/", "http://metadata.google.internal/computeMetadata/v1/",
    "http://localhost:8080/admin", "https://127.1/", "http://[::1]:6379/", "http://[fe80::1]/",
    "http://2130706433/", "http://[::ffff:169.254.169.254]/",
])
def test_the_default_policy_denies_health_urls_there(url):
    with pytest.raises(DestinationDenied, match="denied"):
        DestinationPolicy().check_url(url)


def test_public_addresses_pass_and_unresolvable_url_hosts_are_left_to_the_proxy():
    policy = DestinationPolicy()
    assert policy.endpoint_address("192.0.2.10", 3128) == "192.0.2.10"
    assert policy.endpoint_address("2001:db8::7", 3128) == "2001:db8::7"
    policy.check_url("http://192.0.2.1/generate_204")
    policy.check_url("http://no-such-host.invalid/generate_204")  # the proxy resolves it, in its network
    with pytest.raises(OSError):
        policy.endpoint_address("no-such-host.invalid", 3128)  # an endpoint must resolve here


def test_configured_ranges_are_denied_and_allowed_ranges_carve_exceptions():
    policy = DestinationPolicy(parse_ranges("10.0.0.0/8, fd00::/8"), parse_ranges("127.0.3.0/24"))
    for host in ("10.96.0.1", "fd00::1"):
        with pytest.raises(DestinationDenied, match="denied range"):
            policy.endpoint_address(host, 3128)
    assert policy.endpoint_address("127.0.3.9", 3128) == "127.0.3.9"  # allowed explicitly
    with pytest.raises(DestinationDenied, match=r"127\.0\.0\.0/8"):
        policy.endpoint_address("127.0.0.1", 3128)  # the rest of loopback stays denied
    with pytest.raises(DestinationDenied):
        policy.endpoint_address("metadata.google.internal", 80)  # names are not ranges: always denied


def test_settings_read_the_ranges_from_the_environment(monkeypatch):
    monkeypatch.setenv("PROBE_DENIED_RANGES", "10.0.0.0/8 192.168.0.0/16")
    monkeypatch.setenv("PROBE_ALLOWED_RANGES", "127.0.0.0/8")
    settings = HealthSettings.from_env()
    assert settings.denied_ranges == ("10.0.0.0/8", "192.168.0.0/16")
    policy = settings.destination_policy()
    assert policy.endpoint_address("127.0.0.1", 3128) == "127.0.0.1"
    with pytest.raises(DestinationDenied):
        policy.endpoint_address("192.168.1.1", 3128)
    monkeypatch.setenv("PROBE_DENIED_RANGES", "10.0.0.0/8, cluster")
    with pytest.raises(ValueError, match="PROBE_DENIED_RANGES: not an IP address or CIDR range: 'cluster'"):
        HealthSettings.from_env()


def test_external_denied_ranges_apply_to_what_authors_choose_only():
    """PROBE_EXTERNAL_DENIED_RANGES: External endpoints and health URLs, never a Managed endpoint;
    PROBE_ALLOWED_RANGES does not exempt from it."""
    policy = DestinationPolicy(allowed=parse_ranges("10.0.0.0/8"), external_denied=parse_ranges("10.244.0.0/16"),
                               external_allowed=parse_ranges("10.0.0.0/8"))  # private space on purpose
    assert policy.endpoint_address("10.244.3.7", 3128, external=False) == "10.244.3.7"  # a Squid Pod
    with pytest.raises(DestinationDenied, match=r"in the denied range 10\.244\.0\.0/16"):
        policy.endpoint_address("10.244.3.7", 3128)  # an External endpoint (the default: the safe side)
    with pytest.raises(DestinationDenied, match=r"10\.244\.0\.0/16"):
        policy.endpoint_address("10.244.3.7", 3128, external=True)
    with pytest.raises(DestinationDenied, match=r"health URL host 10\.244\.9\.9 is in the denied range"):
        policy.check_url("http://10.244.9.9:6379/")  # any proxy's health URL
    assert policy.endpoint_address("10.96.0.10", 3128) == "10.96.0.10"  # elsewhere allowed stays allowed
    with pytest.raises(DestinationDenied, match=r"127\.0\.0\.0/8"):
        policy.endpoint_address("127.0.0.1", 3128, external=False)  # the defaults still apply to Managed


def test_settings_read_the_external_ranges_and_name_a_bad_one(monkeypatch):
    monkeypatch.setenv("PROBE_EXTERNAL_DENIED_RANGES", "10.244.0.0/16, fd00:10:244::/56")
    settings = HealthSettings.from_env()
    assert settings.external_denied_ranges == ("10.244.0.0/16", "fd00:10:244::/56")
    policy = settings.destination_policy()
    assert policy.endpoint_address("10.244.1.1", 3128, external=False) == "10.244.1.1"
    with pytest.raises(DestinationDenied):
        policy.endpoint_address("10.244.1.1", 3128)
    for bad in ("pods", "10.244.0.1/16", "10.244.0.0/33"):
        monkeypatch.setenv("PROBE_EXTERNAL_DENIED_RANGES", f"10.0.0.0/8 {bad}")
        with pytest.raises(ValueError) as info:
            HealthSettings.from_env()
        assert str(info.value) == (f"environment variable PROBE_EXTERNAL_DENIED_RANGES: "
                                   f"not an IP address or CIDR range: {bad!r}")


def test_one_denied_address_denies_the_name():
    answers = {"mixed.test": ["192.0.2.10", "169.254.169.254"]}

    def resolver(host, port, type=0):  # getaddrinfo's keyword
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answers[host]]

    with pytest.raises(DestinationDenied, match="resolves to 169.254.169.254"):
        DestinationPolicy(resolver=resolver).endpoint_address("mixed.test", 3128)


def test_the_probe_connects_to_the_address_it_checked(origin, squids, next_address):
    """A name that resolves to an allowed address once: the probe uses that address, not the
    name again (urllib3 cannot resolve ``squid.rebind.test`` at all, so success proves it)."""
    sq = squids(start_squid(next_address()))
    calls = []

    def resolver(host, port, type=0):
        calls.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (sq.address, port))]

    policy = DestinationPolicy(allowed=parse_ranges(f"{sq.address} {origin.address}"), resolver=resolver)
    target = p.ProbeTarget(uid="u1", host="squid.rebind.test", port=sq.port, url=origin.url("/generate_204"))
    result = p.probe(target, policy=policy)
    assert result.ok, result.message
    assert calls == ["squid.rebind.test"]  # resolved once, by the check


# -- through the engine ----------------------------------------------------------------------

def test_an_endpoint_on_loopback_is_refused_without_a_connection(fleet):
    listener = Blackhole(NET.host(5))
    try:
        px = fleet.external("scan", listener.address, listener.port, health={"timeoutSeconds": 1})
        report = fleet.probe([px], denied_settings())
        assert report.failed == 1 and report.reasons == {p.DESTINATION_DENIED: 1}
        healthy = conds(fleet.read("default", "scan"))["Healthy"]
        assert (healthy["status"], healthy["reason"]) == ("False", "DestinationDenied")
        assert "127.0.0.0/8" in healthy["message"]
        assert untouched(listener)
    finally:
        listener.stop()


def test_an_external_endpoint_in_an_external_denied_range_is_refused_but_a_managed_one_is_probed(
        fleet, origin, squids, next_address):
    """The kubernetes provider's case: the Pod range holds the operator's own Squid Pods, so it can
    only be denied to External endpoints (PROBE_EXTERNAL_DENIED_RANGES)."""
    import ipaddress

    sq = squids(start_squid(next_address()))
    pods = str(ipaddress.ip_network(f"{sq.address}/30", strict=False))  # "the Pod range": not the origin
    listener = Blackhole(sq.address)  # another service in the range
    try:
        own = fleet.managed("own", sq.address, sq.port, provider="k8s-local")
        scan = fleet.external("scan", listener.address, listener.port, health={"timeoutSeconds": 1})
        copy = fleet.external("copy", sq.address, sq.port)
        settings = denied_settings(allowed_ranges=("127.0.0.0/8",), external_denied_ranges=(pods,))
        report = fleet.probe([own, scan, copy], settings)
        assert report.succeeded == 1 and report.reasons.get(p.DESTINATION_DENIED) == 2
        assert fleet.read("default", "own").phase == "Ready"
        for name in ("scan", "copy"):
            healthy = conds(fleet.read("default", name))["Healthy"]
            assert (healthy["status"], healthy["reason"]) == ("False", "DestinationDenied"), name
            assert f"in the denied range {pods}" in healthy["message"]
        assert untouched(listener)  # refused without a connection
    finally:
        listener.stop()


def test_the_origin_control_request_honours_the_external_ranges():
    """The worker's own direct GET of a health URL (app.probes.origin) is author-chosen too."""
    from app.probes import origin as origin_mod

    listener = Blackhole(NET.host(6))
    try:
        policy = DestinationPolicy(allowed=parse_ranges("127.0.0.0/8"),
                                   external_denied=parse_ranges(f"{listener.address}/32"))
        result = origin_mod.control(f"http://{listener.address}:{listener.port}/generate_204", 204, 1.0,
                                    policy=policy)
        assert (result.state, result.reason) == (origin_mod.UNKNOWN, p.DESTINATION_DENIED)
        assert untouched(listener)
    finally:
        listener.stop()


def test_a_health_url_in_a_denied_range_is_never_fetched(fleet, origin, squids, next_address):
    sq = squids(start_squid(next_address()))
    before = len(origin.requests)
    # The Squid's own address is allowed; the origin (ORIGIN_ADDRESS) is not.
    settings = denied_settings(allowed_ranges=(f"{sq.address}/32",))
    px = fleet.external("meta", sq.address, sq.port, health={"url": origin.url("/generate_204")})
    fleet.probe([px], settings)
    healthy = conds(fleet.read("default", "meta"))["Healthy"]
    assert (healthy["status"], healthy["reason"]) == ("False", "DestinationDenied")
    assert f"health URL host {ORIGIN_ADDRESS}" in healthy["message"]
    assert len(origin.requests) == before

    for url in ("http://169.254.169.254/computeMetadata/v1/", "http://192.0.2.1/generate_204"):
        fleet.r.delete(redis_keys.proxy(px.uid))
        serving.publish(fleet.r, fleet.read("default", "meta"), address=sq.address, port=sq.port, phase="Running")
        fleet.r.hset(redis_keys.proxy(px.uid), "healthCheck", json.dumps({"url": url, "timeoutSeconds": 2}))
        report = fleet.probe([px], denied_settings(allowed_ranges=(f"{sq.address}/32",),
                                                   denied_ranges=("192.0.2.0/24",)))
        assert report.reasons == {p.DESTINATION_DENIED: 1}, url


def test_allowed_ranges_let_a_local_stack_probe_loopback(fleet, origin, squids, next_address):
    sq = squids(start_squid(next_address()))
    px = fleet.external("local", sq.address, sq.port)
    report = fleet.probe([px], denied_settings(allowed_ranges=("127.0.0.0/8",)))
    assert report.succeeded == 1 and fleet.read("default", "local").phase == "Ready"


@pytest.mark.parametrize("hc,timeout", [
    ({"timeoutSeconds": 86400, "intervalSeconds": 300}, 60),   # the CRD's maximum
    ({"timeoutSeconds": 86400}, 29),                            # below the default interval (30 s)
    ({"timeoutSeconds": 5, "intervalSeconds": 5}, 4),           # equal: below it (docs/security.md, "probe capacity")
    ({"timeoutSeconds": 10, "intervalSeconds": 2}, 1),
    ({"timeoutSeconds": 2, "intervalSeconds": 1}, 0.5),         # 1 s (the CRD refuses it): half of it
    ({"timeoutSeconds": 4, "intervalSeconds": 5}, 4),           # what the CRD admits is kept
    ({}, 10),
])
def test_a_forged_timeout_is_capped_below_the_interval(hc, timeout):
    record = {"address": "192.0.2.10", "port": "3128", "healthCheck": json.dumps(hc)}
    target = engine.target_of("u1", record, HealthSettings(echo_url=""), now=0.0)
    assert target.timeout == timeout
    assert engine.MAX_TIMEOUT_SECONDS == 60


def test_health_default_url_replaces_only_the_crds_default(monkeypatch):
    """HEALTH_DEFAULT_URL (an offline installation, make demo) points defaulted probes elsewhere."""
    from app.resources import DEFAULT_HEALTH_URL

    monkeypatch.setenv("HEALTH_DEFAULT_URL", "http://127.0.0.1:8081/generate_204")
    settings = HealthSettings.from_env()
    for hc in ({}, {"url": DEFAULT_HEALTH_URL}):
        record = {"address": "192.0.2.10", "port": "3128", "healthCheck": json.dumps(hc)}
        assert engine.target_of("u1", record, settings, now=0.0).url == "http://127.0.0.1:8081/generate_204"
    own = {"address": "192.0.2.10", "port": "3128", "healthCheck": json.dumps({"url": "http://example.org/h"})}
    assert engine.target_of("u1", own, settings, now=0.0).url == "http://example.org/h"
    monkeypatch.setenv("HEALTH_DEFAULT_URL", "ftp://example.org/x")
    with pytest.raises(ValueError, match="HEALTH_DEFAULT_URL"):
        HealthSettings.from_env()
    monkeypatch.delenv("HEALTH_DEFAULT_URL")
    assert HealthSettings.from_env().default_url == DEFAULT_HEALTH_URL


# -- item 5: results as they come --------------------------------------------------------------

def test_one_slow_proxy_does_not_delay_the_others_status_writes(fleet, settings, squids, next_address):
    sq = squids(start_squid(next_address()))
    hole = Blackhole(NET.host(6))  # accepts, never answers: the probe waits its whole timeout
    try:
        slow = fleet.external("slow", hole.address, hole.port, health={"timeoutSeconds": 30, "intervalSeconds": 60})
        fast = [fleet.external(f"fast{i}", sq.address, sq.port) for i in range(3)]
        batch = threading.Thread(target=fleet.probe, args=([slow, *fast], settings), daemon=True)
        batch.start()
        wait_for(lambda: all(fleet.read("default", f"fast{i}").phase == "Ready" for i in range(3)), 20,
                 "the fast proxies' Ready status while the slow probe is still waiting")
        assert batch.is_alive(), "the batch ended: the slow probe did not hold"
        assert all(serving.get(fleet.r, px.uid)["healthy"] == "1" for px in fast)
        assert serving.get(fleet.r, slow.uid)["lastProbe"] == ""  # still in flight
    finally:
        hole.stop()  # resets the waiting connection: the slow probe ends now
    batch.join(30)
    assert not batch.is_alive()
    assert serving.get(fleet.r, slow.uid)["lastReason"] in (p.CONNECTION_RESET, p.CONNECTION_FAILED, p.TIMEOUT)


# -- the URL the check reads is the URL the probe sends ---------------------------------------
# urllib.parse and urllib3 (which writes the probe's request line and CONNECT) disagree on some
# URLs: "http://10.0.0.1\@name/" is host "name" to the one and 10.0.0.1 to the other, and a
# percent-encoded host is decoded by urllib3 only.  A check of the wrong parser's host let a
# health URL reach a denied address through the proxy.

@pytest.mark.parametrize("url", [
    "http://127.0.0.1\\@no-such-host.invalid/generate_204",
    "http://127.0.0.1:8080\\@no-such-host.invalid/",
    "https://169.254.169.254\\@no-such-host.invalid/",
    "http://%31%32%37.0.0.1/generate_204",
    "http://%6d%65%74%61%64%61%74%61.google.internal/computeMetadata/v1/",
])
def test_a_health_url_whose_parsers_disagree_is_denied(url):
    with pytest.raises(DestinationDenied, match="health URL"):
        DestinationPolicy().check_url(url)


def test_a_backslash_in_the_authority_cannot_smuggle_a_denied_host_to_the_proxy(fleet, origin, squids, next_address):
    sq = squids(start_squid(next_address()))
    before = len(origin.requests)
    host, port = ORIGIN_ADDRESS, int(origin.url("/").split(":")[2].split("/")[0])
    url = f"http://{host}:{port}\\@no-such-host.invalid/generate_204"  # urllib.parse: host no-such-host.invalid
    px = fleet.external("smuggle", sq.address, sq.port, health={"url": url, "timeoutSeconds": 2})
    report = fleet.probe([px], denied_settings(allowed_ranges=(f"{sq.address}/32",)))
    assert report.reasons == {p.DESTINATION_DENIED: 1}
    assert len(origin.requests) == before  # the origin, in a denied range, was never asked


def test_a_range_written_in_ipv4_mapped_form_denies_the_ipv4_addresses():
    """``::ffff:10.0.0.0/104`` is 10.0.0.0/8: addresses are compared in their IPv4 form, so the
    range must be too (it silently denied nothing)."""
    (net,) = parse_ranges("::ffff:10.244.0.0/112", name="PROBE_EXTERNAL_DENIED_RANGES")
    assert str(net) == "10.244.0.0/16"
    policy = DestinationPolicy(external_denied=parse_ranges("::ffff:10.244.0.0/112"))
    for host in ("10.244.3.7", "::ffff:10.244.3.7"):
        with pytest.raises(DestinationDenied, match=r"10\.244\.0\.0/16"):
            policy.endpoint_address(host, 3128)
    with pytest.raises(DestinationDenied):
        policy.check_url("http://[::ffff:10.244.3.7]/")


def test_a_host_name_the_resolver_cannot_encode_fails_its_own_probe_only(fleet, origin, squids, next_address):
    """``a..b`` (an empty label) or a label over 63 characters passes the CRD's character rule,
    but Python's resolver raises UnicodeError (not OSError) encoding it: the exception left the
    probe and failed the whole batch, so one Proxy author stopped every other Proxy's probes."""
    sq = squids(start_squid(next_address()))
    good = fleet.external("good", sq.address, sq.port)
    bad_url = fleet.external("bad-url", sq.address, sq.port, health={"url": "http://a..b/generate_204"})
    bad_host = fleet.external("bad-host", "x" * 64 + ".example", sq.port)
    report = fleet.probe([good, bad_url, bad_host], denied_settings(allowed_ranges=("127.0.0.0/8",)))
    assert report.succeeded == 1 and report.failed == 2
    assert fleet.read("default", "good").phase == "Ready"
    healthy = conds(fleet.read("default", "bad-host"))["Healthy"]
    assert (healthy["status"], healthy["reason"]) == ("False", p.CONNECTION_FAILED)
    assert "not a valid host name" in healthy["message"]
    assert conds(fleet.read("default", "bad-url"))["Healthy"]["status"] == "False"


def test_a_cached_url_verdict_names_the_host_not_an_earlier_urls_spelling():
    """The verdict of a health URL host is cached by its normalized name (lower case, no trailing
    dot) for url_cache_seconds; the message a Proxy's status shows names that normalized host,
    never how an earlier Proxy's URL happened to spell it."""
    policy = DestinationPolicy(external_denied=parse_ranges("10.244.0.0/16"))
    with pytest.raises(DestinationDenied, match=r"health URL host 10\.244\.9\.9 is in the denied range"):
        policy.check_url("http://10.244.9.9./")  # trailing dot: the same host
    with pytest.raises(DestinationDenied) as caught:
        policy.check_url("http://10.244.9.9/")  # answered from the cache
    assert "host 10.244.9.9 is in the denied range 10.244.0.0/16" in str(caught.value)
    assert "10.244.9.9." not in str(caught.value)
