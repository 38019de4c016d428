"""The API's Redis ACL user (deploy/base/redis-users.acl, app/store/acl.py) is enough for every
route, and no more.

A real redis-server started with the ACL users of deploy/; the reconciler's create step runs as
the ``worker`` user, the health engine as ``health-worker`` (it copies a proxy's basic-auth
credentials), and the real ``proxy-operator api`` as ``api``: it leases, renews, releases and
lists without one refusal in Redis's ACL log.  The API user reads the credentials copies (the
lease answer carries them) but cannot write the serving records or the copies, queue a task,
broadcast remote control or run a script of its own.
"""

from __future__ import annotations

import json

import pytest
import redis as redis_lib
from kubernetes import client as k8s

from app.store import acl as redis_acl, keys as redis_keys

from app.serving import view as serving
from app.squid import conf as squid_conf
from app.probes.credentials import SecretCredentials
from app.kube.gateway import KubernetesGateway
from tests.api.helpers import NET
from tests.api.served import request, start_api
from tests.health.fleet import Fleet, htpasswd_file, start_squid
from tests.support.acl_redis import AclRedis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

USER = "crawler-acl"
PASSWORD = "acl-proxy-password-7"
SECRET = "acl-authed-proxy-auth"  # the name the reconciler gives it


@pytest.fixture(scope="module")
def acl():
    server = AclRedis()
    yield server
    server.stop()


@pytest.fixture()
def published(acl, fake, api_origin, api_squids, health_settings):
    """Two healthy proxies, one with basic auth, created as the worker and probed as the health worker."""
    acl.reset()
    api_client = fake.api_client()
    worker, health = acl.client("worker"), acl.client("health-worker")
    sq = start_squid(NET.host(25), policy=squid_conf.SquidPolicy(basic_auth_file=htpasswd_file(USER, PASSWORD)))
    try:
        url = api_origin.url("/generate_204")
        as_worker, as_health = Fleet(api_client, worker, url), Fleet(api_client, health, url)
        plain = as_worker.external("acl-plain", api_squids[0].address, api_squids[0].port, max_leases=2)
        authed = as_worker.external("acl-authed", sq.address, sq.port, max_leases=2)
        secret = squid_conf.credentials_secret(SECRET, "default", username=USER, password=PASSWORD)
        secret["metadata"]["ownerReferences"] = [{"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                                                  "name": authed.name, "uid": authed.uid, "controller": True}]
        k8s.CoreV1Api(api_client).create_namespaced_secret("default", secret)
        serving.publish(worker, authed, address=sq.address, port=sq.port, phase="Running", auth_secret=SECRET)
        report = as_health.probe([plain, authed], health_settings,
                                 credentials=SecretCredentials(KubernetesGateway(api_client)))
        assert report.succeeded == 2, report
        assert acl.denials() == []
        yield plain, authed
    finally:
        worker.close()
        health.close()
        api_client.close()
        sq.stop()


def test_the_api_user_serves_every_route_without_a_refusal(acl, published, tmp_path):
    plain, authed = published
    proc, port = start_api(tmp_path, acl.server.url, env=acl.env("api"))
    try:
        got = {}
        for _ in range(2):  # both proxies (maxLeases 2 each, least loaded first)
            status, _, body = request(port, "POST", "/v1/leases", b'{"ttlSeconds": 60}')
            assert status == 201, body
            lease = json.loads(body)
            got[lease["proxy"]["name"]] = lease
        assert got["acl-authed"]["proxyAuth"] == {"username": USER, "password": PASSWORD}
        for lease in got.values():
            status, _, body = request(port, "POST", f"/v1/leases/{lease['leaseId']}/renew", b"{}")
            assert status == 200, body
        status, _, body = request(port, "GET", "/v1/proxies")
        assert status == 200 and {p["name"] for p in json.loads(body)["items"]} == {"acl-plain", "acl-authed"}
        assert request(port, "GET", "/metrics", token=None)[0] == 200
        assert request(port, "GET", "/healthz", token=None)[0] == 200
        status, _, body = request(port, "DELETE", f"/v1/leases/{got['acl-plain']['leaseId']}")
        assert status == 200 and json.loads(body)["released"] is True, body
        # a blocked outcome starts a cooldown and ends the session's binding (the client keys)
        status, _, body = request(port, "DELETE", f"/v1/leases/{got['acl-authed']['leaseId']}?outcome=blocked")
        assert status == 200 and json.loads(body)["outcome"] == "blocked", body
        status, _, body = request(port, "POST", "/v1/leases", b'{"zone": "nowhere"}')
        assert status == 503, body
        # targeted leases: bans per (egress IP, site), per-IP concurrency and the ban ratio's
        # counts, with the proxy's target identity kept outside its serving record
        status, _, body = request(port, "POST", "/v1/leases", b'{"ttlSeconds": 60, "target": "www.shop.example.com"}')
        assert status == 201, body
        targeted = json.loads(body)
        status, _, body = request(port, "POST", f"/v1/leases/{targeted['leaseId']}/renew", b"{}")
        assert status == 200, body
        status, _, body = request(port, "DELETE", f"/v1/leases/{targeted['leaseId']}?outcome=blocked")
        assert status == 200 and json.loads(body)["cooldownUntil"], body
        # (both proxies are one Squid: one egress IP, banned for the site, free for the others)
        status, _, body = request(port, "POST", "/v1/leases", b'{"ttlSeconds": 60, "target": "shop.example.com"}')
        assert status == 503 and json.loads(body)["banned"] >= 1, body
        status, _, body = request(port, "POST", "/v1/leases", b'{"ttlSeconds": 60, "target": "news.example.org"}')
        assert status == 201, body
    finally:
        proc.stop()
    assert acl.denials() == [], proc.log()[-3000:]


def test_the_api_user_reads_the_credentials_but_writes_nothing_of_the_workers(acl, published):
    plain, authed = published
    api = acl.client("api")
    try:
        # the lease answer carries the credentials, so the API must read the copies
        assert api.hgetall(redis_keys.auth(authed.uid)) == {"username": USER, "password": PASSWORD}
        refused = [
            lambda: api.hset(redis_keys.proxy(plain.uid), "address", "192.0.2.66"),  # redirect a crawler
            lambda: api.hset(redis_keys.auth(authed.uid), "password", "x"),
            lambda: api.delete(redis_keys.auth(authed.uid)),
            lambda: api.srem(redis_keys.PROXIES, plain.uid),
            lambda: api.zadd(redis_keys.HEALTH_DUE, {plain.uid: 0}),
            lambda: api.lpush("proxies", "{}"),  # queue a task
            lambda: api.sadd("_kombu.binding.proxies", "x"),
            lambda: api.publish(redis_acl.PIDBOX, "{}"),  # remote control
            lambda: api.set(redis_keys.proxy_lock(plain.uid), "x"),
            lambda: api.get(redis_keys.REDBEAT_PREFIX + ":lock"),
            lambda: api.eval("return 1", 0),
            lambda: api.keys("*"),
            lambda: api.flushall(),
            lambda: api.config_get("requirepass"),
        ]
        for i, attempt in enumerate(refused):
            with pytest.raises(redis_lib.exceptions.NoPermissionError):
                attempt()
                pytest.fail(f"attempt {i} was allowed")
    finally:
        api.close()
