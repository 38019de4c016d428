"""POST /v1/leases, renew, release: selection, capacity, ownership, cooldown, TTL, sessions."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import requests

from api import create_app
from app.serving import leases
from app.squid import conf as squid_conf
from tests.api.helpers import NET, TOKEN_B, auth, excluded, healthy
from tests.health.fleet import htpasswd_file, start_squid

pytestmark = pytest.mark.timeout(60)


def lease(client, token=None, **body):
    return client.post("/v1/leases", headers=auth(token) if token else auth(), json=body)


def test_a_lease_names_the_proxy_and_its_expiry(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=1, max_leases=2)
    t0 = time.time()
    resp = lease(client, ttlSeconds=120)
    assert resp.status_code == 201
    body = resp.get_json()
    sq = api_squids[0]
    assert body["proxyUrl"] == f"http://{sq.address}:{sq.port}"
    assert (body["host"], body["port"], body["egressIP"]) == (sq.address, sq.port, sq.address)
    assert len(body["leaseId"]) == 32 and resp.headers["Location"] == f"/v1/leases/{body['leaseId']}"
    assert body["ttlSeconds"] == 120 and body["sticky"] is False and body["sessionKey"] is None
    assert body["proxy"] == {"namespace": "default", "name": "px0", "provider": None, "zone": None}
    assert body["leases"] == {"used": 1, "max": 2}
    expires = time.mktime(time.strptime(body["expiresAt"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert t0 + 118 < expires < t0 + 122
    assert lease(client).get_json()["ttlSeconds"] == 60  # the default TTL


def test_least_loaded_first_and_never_over_max_leases(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=3, max_leases=2)
    got = [lease(client).get_json()["proxy"]["name"] for _ in range(6)]
    assert sorted(got[:3]) == ["px0", "px1", "px2"]  # each proxy once before any gets a second
    assert sorted(got) == ["px0", "px0", "px1", "px1", "px2", "px2"]
    resp = lease(client)
    assert resp.status_code == 503
    body = resp.get_json()
    assert body["error"] == "no_proxy_available" and body["message"].endswith(excluded(3, full=3))


def test_max_leases_zero_is_not_leasable_but_listed(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=1, max_leases=0)
    assert lease(client).status_code == 503
    items = client.get("/v1/proxies", headers=auth()).get_json()["items"]
    assert items[0]["leases"] == {"used": 0, "max": 0} and items[0]["health"]["healthy"] is True


def test_filters_apply_to_leases(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=4, provider="gcp-eu", zones=["z1", "z2"],
            labels=lambda i: {"tier": "gold" if i % 2 else "silver"})
    for _ in range(3):
        body = lease(client, zone="z2", selector="tier=gold").get_json()
        assert body["proxy"]["zone"] == "z2" and body["proxy"]["name"] in ("px1", "px3")
    assert lease(client, provider="other").status_code == 503
    resp = lease(client, selector="tier in (")
    assert resp.status_code == 400 and resp.get_json()["field"] == "selector"


def test_only_the_owner_renews_or_releases(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=1)
    lease_id = lease(client).get_json()["leaseId"]
    for resp in (client.post(f"/v1/leases/{lease_id}/renew", headers=auth(TOKEN_B)),
                 client.delete(f"/v1/leases/{lease_id}", headers=auth(TOKEN_B))):
        assert resp.status_code == 403 and resp.get_json()["error"] == "not_lease_owner"
    assert client.post(f"/v1/leases/{lease_id}/renew", headers=auth()).status_code == 200
    resp = client.delete(f"/v1/leases/{lease_id}", headers=auth())
    assert resp.status_code == 200
    assert resp.get_json() == {"leaseId": lease_id, "released": True, "outcome": "ok", "wasLive": True,
                               "cooldownUntil": None}
    again = client.delete(f"/v1/leases/{lease_id}", headers=auth())
    assert again.status_code == 404 and again.get_json()["error"] == "lease_not_found"
    assert client.post(f"/v1/leases/{'0' * 32}/renew", headers=auth()).status_code == 404
    assert client.delete("/v1/leases/not-an-id", headers=auth()).get_json()["error"] == "lease_not_found"


def test_blocked_or_failed_cools_the_proxy_down_for_that_client_only(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=2, max_leases=5)
    first = lease(client).get_json()
    bad_proxy = first["proxy"]["name"]
    resp = client.delete(f"/v1/leases/{first['leaseId']}?outcome=blocked", headers=auth())
    assert resp.get_json()["cooldownUntil"] is not None
    # crawler-a never gets that proxy while it cools down, even though it is now least loaded
    for _ in range(4):
        assert lease(client).get_json()["proxy"]["name"] != bad_proxy
    # crawler-b is not affected
    assert lease(client, TOKEN_B).get_json()["proxy"]["name"] == bad_proxy
    # failed counts the same way
    other = lease(client).get_json()
    client.delete(f"/v1/leases/{other['leaseId']}?outcome=failed", headers=auth())
    resp = lease(client)
    assert resp.status_code == 503 and "2 cooling down for this client" in resp.get_json()["message"]
    bad = client.delete(f"/v1/leases/{other['leaseId']}?outcome=maybe", headers=auth())
    assert bad.status_code == 400 and bad.get_json()["field"] == "outcome"


def test_a_cooldown_ends(api_settings, fleet, api_squids, health_settings):
    app = create_app(replace(api_settings, leases=replace(api_settings.leases, cooldown=1)))
    c = app.test_client()
    healthy(fleet, api_squids, health_settings, count=1)
    lid = lease(c).get_json()["leaseId"]
    c.delete(f"/v1/leases/{lid}?outcome=blocked", headers=auth())
    assert lease(c).status_code == 503
    time.sleep(1.2)
    assert lease(c).status_code == 201


def test_leases_expire_by_ttl(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=1, max_leases=1)
    short = lease(client, ttlSeconds=1).get_json()
    assert lease(client, TOKEN_B).status_code == 503  # full
    time.sleep(1.2)
    taken = lease(client, TOKEN_B)
    assert taken.status_code == 201  # the expired lease no longer counts
    resp = client.post(f"/v1/leases/{short['leaseId']}/renew", headers=auth())
    assert resp.status_code == 404 and resp.get_json()["error"] == "lease_expired"
    # an expired lease can still be released to report its outcome
    done = client.delete(f"/v1/leases/{short['leaseId']}?outcome=blocked", headers=auth())
    assert done.status_code == 200 and done.get_json()["wasLive"] is False


def test_renew_extends_the_lease(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=1, max_leases=1)
    first = lease(client, ttlSeconds=1).get_json()
    renewed = client.post(f"/v1/leases/{first['leaseId']}/renew", headers=auth(), json={"ttlSeconds": 4})
    assert renewed.status_code == 200
    body = renewed.get_json()
    assert body["leaseId"] == first["leaseId"] and body["ttlSeconds"] == 4 and body["expiresAt"] > first["expiresAt"]
    time.sleep(1.3)
    assert lease(client, TOKEN_B).status_code == 503  # still held thanks to the renewal
    again = client.post(f"/v1/leases/{first['leaseId']}/renew", headers=auth())
    assert again.status_code == 200 and again.get_json()["ttlSeconds"] == 4  # default: the last TTL
    bad = client.post(f"/v1/leases/{first['leaseId']}/renew", headers=auth(), json={"ttlSeconds": 601})
    assert bad.status_code == 400 and bad.get_json()["field"] == "ttlSeconds"


def test_renew_ends_a_lease_whose_proxy_turned_unhealthy(client, fleet, health_settings):
    sq = start_squid(NET.host(22))
    try:
        px = fleet.external("fragile", sq.address, sq.port)
        fleet.probe([px], health_settings)
        lid = lease(client).get_json()["leaseId"]
        sq.stop()
        fleet.probe([px], health_settings)  # failureThreshold 1: unhealthy now
        resp = client.post(f"/v1/leases/{lid}/renew", headers=auth())
        assert resp.status_code == 409 and resp.get_json()["error"] == "proxy_unavailable"
        assert client.delete(f"/v1/leases/{lid}", headers=auth()).status_code == 404  # the lease ended
    finally:
        sq.stop()


def test_sticky_sessions(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=3, max_leases=3)
    first = lease(client, sessionKey="shop-42").get_json()
    assert first["sticky"] is False and first["sessionKey"] == "shop-42"
    again = lease(client, sessionKey="shop-42").get_json()
    # the same proxy although the other two are less loaded
    assert again["proxy"]["name"] == first["proxy"]["name"] and again["sticky"] is True
    assert again["leases"]["used"] == 2
    # another client's session with the same key is separate
    assert lease(client, TOKEN_B, sessionKey="shop-42").get_json()["sticky"] is False
    # once the proxy is blocked for this client, the session moves and sticks to the new one
    client.delete(f"/v1/leases/{again['leaseId']}?outcome=blocked", headers=auth())
    moved = lease(client, sessionKey="shop-42").get_json()
    assert moved["proxy"]["name"] != first["proxy"]["name"] and moved["sticky"] is False
    assert lease(client, sessionKey="shop-42").get_json()["proxy"]["name"] == moved["proxy"]["name"]
    bad = lease(client, sessionKey="has space")
    assert bad.status_code == 400 and bad.get_json()["field"] == "sessionKey"


@pytest.mark.parametrize("body,status,code,field", [
    ('{"ttlSeconds": 0}', 400, "invalid_field", "ttlSeconds"),
    ('{"ttlSeconds": 601}', 400, "invalid_field", "ttlSeconds"),
    ('{"ttlSeconds": "60"}', 400, "invalid_field", "ttlSeconds"),
    ('{"ttlSeconds": true}', 400, "invalid_field", "ttlSeconds"),
    ('{"ttlSeconds": 1.5}', 400, "invalid_field", "ttlSeconds"),
    ('{"zone": 5}', 400, "invalid_field", "zone"),
    ('{"colour": "red"}', 400, "unknown_field", "colour"),
    ('{"ttlSeconds": ', 400, "bad_json", None),
    ('[1, 2]', 400, "bad_json", None),
    ('\t', 400, "bad_json", None),          # whitespace alone is no JSON document (only no body is {})
])
def test_bad_lease_requests_name_the_field(client, body, status, code, field):
    resp = client.post("/v1/leases", headers={**auth(), "Content-Type": "application/json"}, data=body)
    assert resp.status_code == status
    got = resp.get_json()
    assert got["error"] == code and got.get("field") == field


def test_a_non_json_body_is_415(client):
    resp = client.post("/v1/leases", headers={**auth(), "Content-Type": "text/plain"}, data="ttl=5")
    assert resp.status_code == 415 and resp.get_json()["error"] == "unsupported_media_type"


def test_lease_metrics(client, fleet, api_squids, health_settings):
    healthy(fleet, api_squids, health_settings, count=1, max_leases=1)
    lease(client)
    lease(client)
    text = client.get("/metrics").get_data(as_text=True)
    assert "proxy_operator_leases_active 1.0" in text
    assert 'proxy_operator_lease_requests_total{operation="acquire",outcome="no_proxy_available"}' in text


def test_through_a_leased_proxy_the_origin_never_sees_proxy_authorization(
        client, fleet, health_settings, api_origin):
    user, password = squid_conf.generate_credentials()
    sq = start_squid(NET.host(21), policy=squid_conf.SquidPolicy(basic_auth_file=htpasswd_file(user, password)))
    try:
        px = fleet.external("authed", sq.address, sq.port)
        report = fleet.probe([px], health_settings, credentials=lambda rec: (user, password))
        assert report.succeeded == 1
        body = lease(client).get_json()
        proxy = body["proxyUrl"].replace("http://", f"http://{user}:{password}@")
        r = requests.get(api_origin.url("/headers"), proxies={"http": proxy}, timeout=5)
        assert r.status_code == 200
        seen = {k.lower() for k in r.json()}
        assert "proxy-authorization" not in seen
        assert "via" not in seen and "x-forwarded-for" not in seen
        # and the proxy really required the credentials
        r = requests.get(api_origin.url("/headers"), proxies={"http": body["proxyUrl"]}, timeout=5)
        assert r.status_code == 407
    finally:
        sq.stop()


def test_lease_functions_directly(redis_client, fleet, api_squids, health_settings, lease_settings):
    """The library layer used by the API: the same rules without HTTP."""
    healthy(fleet, api_squids, health_settings, count=1, max_leases=1)
    got = leases.acquire(redis_client, "a", leases.Filters(), ttl=30, settings=lease_settings)
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "b", leases.Filters(), ttl=30, settings=lease_settings)
    assert info.value.code == leases.NO_PROXY_AVAILABLE
    assert leases.live_leases(redis_client) == 1
    with pytest.raises(ValueError):
        leases.release(redis_client, "a", got.id, outcome="meh", settings=lease_settings)
    assert leases.release(redis_client, "a", got.id, outcome="ok", settings=lease_settings).live is True
    assert leases.live_leases(redis_client) == 0
