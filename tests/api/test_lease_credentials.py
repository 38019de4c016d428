"""Credentials for crawlers: a proxy with basic auth is leased with its credentials, and only
the lease answer carries them.

A real Squid demands a password full of URL-special characters; the credentials live in the
Proxy's Secret (in the Kubernetes API fake) as the reconciler leaves them; the health engine
probes with them and copies them for the API; ``proxy-operator api`` (the real command) hands
them out in the lease, percent-encoded in ``proxyUrl`` and plain in ``proxyAuth``; a crawler
uses ``proxyUrl`` as is.  Nothing else (``/v1/proxies``, errors, ``/metrics``, the logs, the
serving record) ever shows them.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
import requests
from kubernetes import client as k8s

from app.serving import leases, view as serving
from app.store import keys as redis_keys
from app.squid import conf as squid_conf
from app.probes.credentials import SecretCredentials
from app.kube.gateway import KubernetesGateway
from tests.api.helpers import NET
from tests.api.served import TOKEN, request, start_api
from tests.health.fleet import htpasswd_file, start_squid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

USER = "crawler-7"
#: Every character that means something in a URL's authority, and a few more.
PASSWORD = "p$a@s:s%2Fw/o#r?d&+ =!"
SECRET = "authed-proxy-auth"


@pytest.fixture()
def authed(fake, fleet, redis_client, health_settings):
    """A healthy Proxy on a Squid that requires USER/PASSWORD, published with its Secret
    named as the reconciler does for a provider with ``squid.basicAuth``."""
    sq = start_squid(NET.host(24), policy=squid_conf.SquidPolicy(basic_auth_file=htpasswd_file(USER, PASSWORD)))
    api_client = fake.api_client()
    try:
        px = fleet.external("authed", sq.address, sq.port, max_leases=3)
        secret = squid_conf.credentials_secret(SECRET, "default", username=USER, password=PASSWORD)
        # owned by the Proxy, as the reconciler leaves it: the probes use no other Secret
        secret["metadata"]["ownerReferences"] = [{"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                                                  "name": px.name, "uid": px.uid, "controller": True}]
        k8s.CoreV1Api(api_client).create_namespaced_secret("default", secret)
        serving.publish(redis_client, px, address=sq.address, port=sq.port, phase="Running", auth_secret=SECRET)
        assert redis_client.exists(redis_keys.auth(px.uid)) == 0
        credentials = SecretCredentials(KubernetesGateway(api_client))
        assert fleet.probe([px], health_settings, credentials=credentials).succeeded == 1
        yield px, sq
    finally:
        api_client.close()
        sq.stop()


def test_the_lease_carries_the_credentials_and_a_crawler_uses_its_url(authed, redis_url, redis_client, api_origin,
                                                                     tmp_path):
    px, sq = authed
    proc, port = start_api(tmp_path, redis_url)
    try:
        status, headers, body = request(port, "POST", "/v1/leases", b'{"ttlSeconds": 60}')
        assert status == 201
        assert headers["cache-control"] == "no-store"  # no cache in between keeps the credentials
        lease = json.loads(body)
        assert lease["proxyUrl"] == f"http://{USER}:{quote(PASSWORD, safe='')}@{sq.address}:{sq.port}"
        assert "%24" in lease["proxyUrl"] and "%40" in lease["proxyUrl"] and "%3A" in lease["proxyUrl"]
        assert lease["proxyAuth"] == {"username": USER, "password": PASSWORD}
        assert (lease["host"], lease["port"]) == (sq.address, sq.port)

        # the URL works as is through the real Squid, and the origin never sees the credentials
        seen = requests.get(api_origin.url("/headers"), proxies={"http": lease["proxyUrl"]}, timeout=10)
        assert seen.status_code == 200 and "proxy-authorization" not in {k.lower() for k in seen.json()}
        bare = f"http://{sq.address}:{sq.port}"
        assert requests.get(api_origin.url("/headers"), proxies={"http": bare}, timeout=10).status_code == 407

        status, headers, body = request(port, "POST", f"/v1/leases/{lease['leaseId']}/renew", b"{}")
        assert status == 200 and json.loads(body)["proxyAuth"] == lease["proxyAuth"]
        assert headers["cache-control"] == "no-store"

        # ... and nothing else shows them
        encoded = quote(PASSWORD, safe="")
        others = [request(port, "GET", "/v1/proxies")[2], request(port, "GET", "/metrics", token=None)[2],
                  request(port, "GET", "/openapi.json", token=None)[2],
                  request(port, "POST", "/v1/leases", b'{"zone": "nowhere"}')[2],
                  request(port, "DELETE", f"/v1/leases/{lease['leaseId']}")[2]]
        assert json.loads(others[0])["items"][0]["name"] == "authed"
        for text in others:
            assert PASSWORD.encode() not in text and encoded.encode() not in text
    finally:
        proc.stop()
    log = proc.log()
    assert PASSWORD not in log and encoded not in log and TOKEN not in log
    record = serving.get(redis_client, px.uid)
    assert record["authSecret"] == SECRET and not any(PASSWORD in v for v in record.values())
    assert redis_client.hgetall(redis_keys.auth(px.uid)) == {"username": USER, "password": PASSWORD}


def test_credentials_follow_the_proxy(authed, redis_client, lease_settings, health_settings, fleet):
    """A proxy that requires credentials not copied yet is not leased (the 503 says so);
    republished without basic auth, or withdrawn, its copy is gone."""
    px, sq = authed
    got = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    assert (got.username, got.password) == (USER, PASSWORD) and PASSWORD not in repr(got)
    leases.release(redis_client, "c", got.id, outcome="ok", settings=lease_settings)

    redis_client.delete(redis_keys.auth(px.uid))  # as after an upgrade, before the next probe
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=lease_settings)
    assert "1 awaiting their basic-auth credentials" in info.value.message

    redis_client.hset(redis_keys.auth(px.uid), mapping={"username": USER, "password": PASSWORD})
    serving.publish(redis_client, px, address=sq.address, port=sq.port, phase="Running")  # basicAuth turned off
    assert redis_client.exists(redis_keys.auth(px.uid)) == 0

    serving.publish(redis_client, px, address=sq.address, port=sq.port, phase="Running", auth_secret=SECRET)
    assert fleet.probe([px], health_settings, credentials=lambda rec: (USER, PASSWORD)).succeeded == 1
    assert redis_client.exists(redis_keys.auth(px.uid)) == 1
    serving.withdraw(redis_client, px.uid)
    assert redis_client.exists(redis_keys.auth(px.uid)) == 0
