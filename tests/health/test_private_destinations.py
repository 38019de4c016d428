"""Private address space is out of reach of what Proxy authors choose, unless the operator allows it.

An External Proxy's endpoint and every health URL are chosen by whoever may write a Proxy; by
default they may not point the health worker at RFC 1918, CGNAT (``100.64.0.0/10``) or unique
local IPv6 (``fc00::/7``) addresses.  A Managed proxy's endpoint (a Squid Pod in the cluster's
private Pod range) is still probed.  ``PROBE_EXTERNAL_ALLOWED_RANGES`` lifts the default.

Addresses in the policy tests are data: nothing binds or dials them.  The engine test probes
real Squids on loopback through the API fake and checks nothing was fetched.
"""

from __future__ import annotations

import json

import pytest

from app.store import keys as redis_keys
from app.probes import probe as p
from app.probes.destinations import DestinationDenied, DestinationPolicy, parse_ranges
from app.probes.settings import HealthSettings
from tests.health.fleet import start_squid

pytestmark = pytest.mark.timeout(90)

PRIVATE = ["10.96.0.10", "172.16.5.4", "172.31.255.254", "192.168.1.1", "100.64.0.1", "100.127.255.254",
           "fc00::1", "fd12:3456::7", "::ffff:10.1.2.3", "::ffff:192.168.0.9"]
PUBLIC = ["100.63.255.255", "100.128.0.1", "172.32.0.1", "192.0.2.10", "2001:db8::1", "fe00::1"]


@pytest.mark.parametrize("address", PRIVATE)
def test_private_addresses_are_denied_to_external_endpoints_and_health_urls_by_default(address):
    policy = DestinationPolicy()
    with pytest.raises(DestinationDenied, match="PROBE_EXTERNAL_ALLOWED_RANGES"):
        policy.endpoint_address(address, 3128)  # an External endpoint
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(DestinationDenied, match=r"denied range .*PROBE_EXTERNAL_ALLOWED_RANGES"):
        policy.check_url(f"http://{host}:8080/generate_204")
    assert policy.endpoint_address(address, 3128, external=False)  # a Managed proxy's Pod: probed


@pytest.mark.parametrize("address", PUBLIC)
def test_addresses_next_to_the_private_ranges_pass(address):
    policy = DestinationPolicy()
    assert policy.endpoint_address(address, 3128) == address
    policy.check_url(f"http://{f'[{address}]' if ':' in address else address}/generate_204")


def test_only_the_external_allowed_ranges_lift_the_private_default():
    # PROBE_ALLOWED_RANGES exempts from the loopback/link-local defaults, not from this one
    policy = DestinationPolicy(allowed=parse_ranges("10.0.0.0/8"))
    with pytest.raises(DestinationDenied, match=r"10\.0\.0\.0/8"):
        policy.endpoint_address("10.1.1.1", 3128)
    policy = DestinationPolicy(external_allowed=parse_ranges("10.20.0.0/16, fd00::/8"),
                               external_denied=parse_ranges("10.20.30.0/24"))
    assert policy.endpoint_address("10.20.1.1", 3128) == "10.20.1.1"
    policy.check_url("http://10.20.1.1/generate_204")
    assert policy.endpoint_address("fd00::5", 3128) == "fd00::5"
    for address in ("10.21.0.1", "fc00::5", "192.168.0.1"):  # the rest of private space stays denied
        with pytest.raises(DestinationDenied):
            policy.endpoint_address(address, 3128)
    with pytest.raises(DestinationDenied, match=r"10\.20\.30\.0/24$"):
        policy.endpoint_address("10.20.30.1", 3128)  # the operator's explicit denial wins
    with pytest.raises(DestinationDenied, match=r"127\.0\.0\.0/8"):
        DestinationPolicy(external_allowed=parse_ranges("0.0.0.0/0")).endpoint_address("127.0.0.1", 3128)


def test_settings_read_the_external_allowed_ranges_and_name_a_bad_one(monkeypatch):
    monkeypatch.delenv("PROBE_EXTERNAL_ALLOWED_RANGES", raising=False)
    with pytest.raises(DestinationDenied):
        HealthSettings.from_env().destination_policy().endpoint_address("10.5.5.5", 3128)
    monkeypatch.setenv("PROBE_EXTERNAL_ALLOWED_RANGES", "10.5.0.0/16, fd00::/8")
    settings = HealthSettings.from_env()
    assert settings.external_allowed_ranges == ("10.5.0.0/16", "fd00::/8")
    assert settings.destination_policy().endpoint_address("10.5.5.5", 3128) == "10.5.5.5"
    monkeypatch.setenv("PROBE_EXTERNAL_ALLOWED_RANGES", "10.5.0.0/16 lan")
    with pytest.raises(ValueError) as info:
        HealthSettings.from_env()
    assert str(info.value) == ("environment variable PROBE_EXTERNAL_ALLOWED_RANGES: "
                               "not an IP address or CIDR range: 'lan'")


def test_a_private_health_url_is_never_fetched_and_the_condition_says_why(fleet, squids, next_address):
    sq = squids(start_squid(next_address()))
    settings = HealthSettings(echo_url="", provision_deadline=600, concurrency=8, allowed_ranges=("127.0.0.0/8",))
    ext = fleet.external("lan-ext", sq.address, sq.port, health={"url": "http://10.0.0.1/", "timeoutSeconds": 2})
    own = fleet.managed("lan-own", sq.address, sq.port, provider="k8s-local")
    fleet.r.hset(redis_keys.proxy(own.uid), "healthCheck",
                 json.dumps({"url": "http://[fd00::1]/", "timeoutSeconds": 2}))  # a Managed proxy's URL too
    report = fleet.probe([ext, own], settings)
    assert report.reasons == {p.DESTINATION_DENIED: 2} and report.succeeded == 0
    healthy = {c["type"]: c for c in fleet.read("default", "lan-ext").status["conditions"]}["Healthy"]
    assert (healthy["status"], healthy["reason"]) == ("False", "DestinationDenied")
    assert "health URL host 10.0.0.1 is in the denied range 10.0.0.0/8" in healthy["message"]
    assert "PROBE_EXTERNAL_ALLOWED_RANGES" in healthy["message"]
