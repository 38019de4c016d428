"""GET /v1/proxies: filters, health, egress IP, leaving and re-entering discovery."""

from __future__ import annotations

import pytest

from devcluster.squid import SquidProcess
from tests.api.helpers import NET, auth, healthy
from tests.health.fleet import start_squid

pytestmark = pytest.mark.timeout(60)


def names(resp) -> list[str]:
    assert resp.status_code == 200, resp.get_json()
    return [p["name"] for p in resp.get_json()["items"]]


def test_lists_healthy_proxies_with_egress_ip_and_lease_usage(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=2, max_leases=4, labels={"tier": "gold"})
    client.post("/v1/leases", headers=auth(), json={})
    items = client.get("/v1/proxies", headers=auth()).get_json()["items"]
    assert [p["name"] for p in items] == ["px0", "px1"]
    first = items[0]
    assert first["address"] == api_squids[0].address and first["port"] == api_squids[0].port
    assert first["egressIP"] == api_squids[0].address  # learnt through the proxy from the IP echo
    assert first["health"]["healthy"] is True and first["health"]["state"] == "healthy"
    assert first["health"]["lastProbeTime"].endswith("Z") and first["health"]["latencyMs"] >= 0
    assert first["labels"] == {"tier": "gold"}
    assert sorted(p["leases"]["used"] for p in items) == [0, 1]
    assert {p["leases"]["max"] for p in items} == {4}


def test_filters(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=4, provider="kvm-lab", zones=["lab1", "lab2"],
            labels=lambda i: {"tier": "gold" if i < 2 else "silver", "idx": str(i)})
    healthy(fleet, api_squids, health_settings, count=1, namespace="other", prefix="ext")
    q = lambda s: names(client.get(f"/v1/proxies?{s}", headers=auth()))  # noqa: E731
    assert q("") == ["px0", "px1", "px2", "px3", "ext0"]  # by namespace, then name
    assert q("provider=kvm-lab") == ["px0", "px1", "px2", "px3"]
    assert q("zone=lab2") == ["px1", "px3"]
    assert q("namespace=other") == ["ext0"]
    assert q("selector=tier%3Dgold") == ["px0", "px1"]
    assert q("selector=tier!%3Dgold") == ["px2", "px3", "ext0"]
    assert q("selector=idx%20in%20(0,3)") == ["px0", "px3"]
    assert q("selector=idx%20notin%20(0,3),tier") == ["px1", "px2"]
    assert q("selector=!tier") == ["ext0"]
    assert q("provider=kvm-lab&zone=lab1&selector=tier%3Dsilver") == ["px2"]
    assert q("healthy=false") == []


@pytest.mark.parametrize("query,field,code", [
    ("selector=tier%3D%3D%3Dx", "selector", "invalid_field"),
    ("selector=a%20in%20()", "selector", "invalid_field"),
    ("healthy=yes", "healthy", "invalid_field"),
    ("provider=", "provider", "invalid_field"),
    ("colour=red", "colour", "unknown_parameter"),
    ("zone=a&zone=b", "zone", "invalid_field"),
])
def test_bad_queries_name_the_field(client, query, field, code):
    resp = client.get(f"/v1/proxies?{query}", headers=auth())
    assert resp.status_code == 400
    body = resp.get_json()
    assert (body["error"], body["field"]) == (code, field)


def test_an_unhealthy_proxy_leaves_discovery_and_comes_back(client, fleet, health_settings):
    sq = start_squid(NET.host(20))
    try:
        px = fleet.external("flaky", sq.address, sq.port)
        fleet.probe([px], health_settings)
        assert names(client.get("/v1/proxies?healthy=true", headers=auth())) == ["flaky"]
        assert client.post("/v1/leases", headers=auth(), json={"ttlSeconds": 5}).status_code == 201

        sq.stop()
        fleet.probe([px], health_settings)  # failureThreshold 1
        assert names(client.get("/v1/proxies?healthy=true", headers=auth())) == []
        unhealthy = client.get("/v1/proxies?healthy=false", headers=auth()).get_json()["items"]
        assert unhealthy[0]["health"]["reason"] == "ConnectionRefused"
        resp = client.post("/v1/leases", headers=auth(), json={})
        assert resp.status_code == 503 and resp.get_json()["error"] == "no_proxy_available"

        sq = SquidProcess(sq.address, sq.port).start()
        fleet.probe([px], health_settings)
        assert names(client.get("/v1/proxies?healthy=true", headers=auth())) == ["flaky"]
        assert client.post("/v1/leases", headers=auth(), json={}).status_code == 201
    finally:
        sq.stop()
