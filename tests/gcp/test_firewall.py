"""The firewall opt-in: create ensures an ingress rule for the Squid port to the network tag."""

from __future__ import annotations

import pytest

from app.providers.naming import instance_name, tags_for
from app.providers.base import CreateRequest
from app.errors import Permanent, QuotaExceeded
from tests.gcp.conftest import PROJECT

FIREWALL = {"ensure": True, "sourceRanges": ["10.8.0.0/16", "192.0.2.0/24"]}


def _request(uid: str, port: int = 3128) -> CreateRequest:
    return CreateRequest(name=instance_name(uid), tags=tags_for(uid), namespace="crawl",
                         zone="europe-west1-b", port=port)


def test_rule_is_created_before_the_first_instance_and_waited(fake, make_provider):
    provider = make_provider(firewall=FIREWALL, networkTags=["squid-proxy", "other"], network="proxies")
    provider.create(_request("fw-1"))

    [insert] = fake.calls("POST", r"/global/firewalls$")
    rule = insert.body
    assert rule["name"] == "proxy-operator-gcp-test-3128"
    assert rule["network"] == f"projects/{PROJECT}/global/networks/proxies"
    assert rule["direction"] == "INGRESS"
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["3128"]}]
    assert rule["sourceRanges"] == ["10.8.0.0/16", "192.0.2.0/24"]
    assert rule["targetTags"] == ["squid-proxy"]
    # The global operation was waited on (at the fake) before the instance was inserted.
    wait = fake.calls("POST", r"/global/operations/[^/]+/wait$")
    instance_insert = fake.calls("POST", r"/zones/europe-west1-b/instances$")
    assert wait and fake.requests.index(wait[0]) < fake.requests.index(instance_insert[0])
    assert (PROJECT, "proxy-operator-gcp-test-3128") in fake.firewalls
    assert instance_insert[0].body["tags"]["items"] == ["squid-proxy", "other"]


def test_rule_is_ensured_once_per_port(fake, make_provider):
    provider = make_provider(firewall=dict(FIREWALL, ports=[3128, 8080]))  # 8080 listed on purpose
    provider.create(_request("fw-a"))
    provider.create(_request("fw-b"))
    provider.create(_request("fw-c", port=8080))
    assert len(fake.calls("GET", r"/global/firewalls/")) == 2
    assert sorted(name for _, name in fake.firewalls) == ["proxy-operator-gcp-test-3128", "proxy-operator-gcp-test-8080"]


def test_an_existing_matching_rule_is_left_alone(fake, make_provider):
    make_provider(firewall=FIREWALL).create(_request("fw-1"))
    fresh = make_provider(firewall=FIREWALL)  # another worker process
    fresh.create(_request("fw-2"))
    assert len(fake.calls("POST", r"/global/firewalls$")) == 1
    assert not fake.calls("PATCH")


def test_a_drifted_rule_is_patched_back(fake, make_provider):
    make_provider(firewall=FIREWALL).create(_request("fw-1"))
    changed = dict(FIREWALL, sourceRanges=["10.9.0.0/16"], name="proxy-operator-gcp-test")
    make_provider(firewall=changed).create(_request("fw-2"))
    [patch] = fake.calls("PATCH", r"/global/firewalls/proxy-operator-gcp-test-3128$")
    assert patch.body["sourceRanges"] == ["10.9.0.0/16"]
    assert fake.firewalls[(PROJECT, "proxy-operator-gcp-test-3128")]["sourceRanges"] == ["10.9.0.0/16"]


def test_without_the_opt_in_no_firewall_call_is_made(fake, provider):
    provider.create(_request("fw-none"))
    assert not fake.calls(path_regex=r"/firewalls")


def test_a_refused_rule_stops_the_create(fake, make_provider):
    provider = make_provider(firewall=FIREWALL)
    fake.fail("POST", r"/global/firewalls$", 403, "forbidden", "Required 'compute.firewalls.create' permission")
    with pytest.raises(Permanent, match="compute.firewalls.create"):
        provider.create(_request("fw-denied"))
    assert not fake.calls("POST", r"/instances$")
    fake.fail_operation("firewall.insert", 403, "QUOTA_EXCEEDED", "Quota 'FIREWALLS' exceeded.")
    with pytest.raises(QuotaExceeded, match="FIREWALLS"):
        provider.create(_request("fw-denied"))
    provider.create(_request("fw-denied"))  # heals once the API lets it through
    assert (PROJECT, "proxy-operator-gcp-test-3128") in fake.firewalls
