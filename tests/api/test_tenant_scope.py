"""The trust boundary between teams: who may add a proxy, and which proxies a client may use.

Through the real parts: Proxies in the API fake reconciled by the real create step with the
operator's ``tenancy:`` settings, probed by the health engine through real Squids (and an
editor's own recording listener), leased through ``proxy-operator api`` (granian) with a tokens
file that scopes its clients.
"""

from __future__ import annotations

import http.server
import json
import os
import threading

import pytest
import yaml

from app.store import keys as redis_keys
from app.proxy.reconcile import Context, Ref, create
from app.wiring import parse_config
from tests.api.helpers import NET
from tests.api.served import request, start_api

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

TEAM_A = "team-a-token-0123456789abcdef"
TEAM_B = "team-b-token-0123456789abcdef"
LEGACY = "legacy-token-0123456789abcdef"
SECRET_HEADERS = {"Cookie": "session=team-b-secret-cookie", "Authorization": "Basic dGVhbS1iOnNlY3JldA=="}


class _Recorder(http.server.BaseHTTPRequestHandler):
    """An editor's listener posing as a proxy: answers probes like one, records every request."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.server.seen.append({"method": self.command, "target": self.path, "headers": dict(self.headers.items())})
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self) -> None:  # http.server API
        if self.path.endswith("/generate_204"):
            self._answer(204)
        elif self.path.endswith("/ip"):
            self._answer(200, (self.client_address[0] + "\n").encode())
        else:
            self._answer(200, b"recorded\n")

    def do_CONNECT(self) -> None:
        self._answer(200)


@pytest.fixture()
def recorder():
    server = http.server.ThreadingHTTPServer((NET.host(30), 0), _Recorder)
    server.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _context(fleet, tenancy: dict | None) -> Context:
    """The reconcile context of a worker whose providers config has this ``tenancy:`` block."""
    doc = {"providers": []}
    if tenancy is not None:
        doc["tenancy"] = tenancy
    config = parse_config(doc, "providers.yaml")
    return Context(kube=fleet.ctx.kube, registry=fleet.ctx.registry, redis=fleet.r, settings=fleet.ctx.settings,
                   tenancy=config.tenancy)


def _external(fleet, ctx, name: str, namespace: str, host: str, port: int, owner: dict | None = None):
    spec = {"mode": "External", "endpoint": {"host": host, "port": port}, "maxLeases": 50,
            "healthCheck": fleet._health(None)}
    body = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": namespace, **({"ownerReferences": [owner]} if owner else {})},
            "spec": spec}
    obj = fleet.custom.create_namespaced_custom_object("crawl.example.com", "v1alpha1", namespace, "proxies", body)
    create(ctx, Ref(namespace, name, obj["metadata"]["uid"]))
    return fleet.read(namespace, name)


def _pool(fleet, namespace: str, name: str) -> dict:
    """A ProxyPool object (no controller runs here) and the ownerReference its members carry."""
    body = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 0, "template": {"metadata": {"labels": {"team": namespace}},
                                                 "spec": {"provider": "k8s-local", "healthCheck": {}}}}}
    obj = fleet.custom.create_namespaced_custom_object("crawl.example.com", "v1alpha1", namespace, "proxypools", body)
    return {"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool", "name": name,
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _tokens(shared: list[str], team_a: dict, team_b: dict) -> str:
    return yaml.safe_dump({"sharedNamespaces": shared, "clients": [
        {"name": "team-a", "token": TEAM_A, **team_a},
        {"name": "team-b", "token": TEAM_B, **team_b},
        {"name": "legacy", "token": LEGACY},
    ]})


def _write(path, text: str) -> None:
    tmp = f"{path}.new"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _call(port: int, method: str, path: str, token: str, body: dict | None = None):
    status, headers, raw = request(port, method, path, json.dumps(body).encode() if body is not None else None,
                                   token=token)
    return status, (json.loads(raw) if raw else None)


def _send_through(lease: dict, url: str) -> int:
    """A crawler's request with its cookies and credentials through the leased proxy."""
    import requests

    proxies = {"http": lease["proxyUrl"], "https": lease["proxyUrl"]}
    return requests.get(url, headers=SECRET_HEADERS, proxies=proxies, timeout=10).status_code


def test_an_editors_external_proxy_never_reaches_another_teams_crawler(
        tmp_path, fleet, api_squids, health_settings, recorder, redis_url, api_origin):
    """An editor of team-evil applies an External Proxy pointing at a listener of theirs that
    answers the health check.  With the operator's defaults it is Failed and never served; with
    team-evil allowed to add External Proxies, it is Ready but no client outside team-evil's
    scope is ever handed it: the listener sees only health probes, never a crawler's cookies."""
    host, port = recorder.server_address
    defaults = _context(fleet, None)
    evil = _external(fleet, defaults, "evil", "team-evil", host, port)
    assert evil.phase == "Failed"
    cond = next(c for c in evil.status["conditions"] if c["type"] == "Provisioned")
    assert cond["reason"] == "SpecNotAllowed"
    assert "spec.endpoint" in cond["message"] and "externalProxyNamespaces" in cond["message"]
    assert not fleet.r.exists(redis_keys.proxy(evil.uid))

    # the operator lets team-a and team-evil add External Proxies for their own crawlers
    allowed = _context(fleet, {"externalProxyNamespaces": ["team-a", "team-evil"]})
    good = _external(fleet, allowed, "squid-a", "team-a", api_squids[0].address, api_squids[0].port)
    evil = _external(fleet, allowed, "evil-2", "team-evil", host, port)
    assert fleet.probe([good, evil], health_settings).succeeded == 2
    assert fleet.read("team-evil", "evil-2").phase == "Ready"  # it answers probes like a proxy

    proc, api = start_api(tmp_path, redis_url, tokens=_tokens(["crawl-shared"], {"namespaces": ["team-a"]},
                                                              {"namespaces": ["team-b"]}))
    try:
        for _ in range(10):  # team-a: only its own proxy, however often it asks
            status, lease = _call(api, "POST", "/v1/leases", TEAM_A, {})
            assert status == 201 and lease["proxy"]["namespace"] == "team-a", lease
            assert _send_through(lease, api_origin.url("/generate_204")) == 204
            assert _call(api, "DELETE", f"/v1/leases/{lease['leaseId']}", TEAM_A)[0] == 200
        for token in (TEAM_B, LEGACY):  # team-b's scope and the shared namespaces hold nothing
            status, body = _call(api, "POST", "/v1/leases", token, {})
            assert status == 503 and body["error"] == "no_proxy_available", body
            status, body = _call(api, "POST", "/v1/leases", token, {"namespace": "team-evil"})
            assert status == 503, body
            assert _call(api, "GET", "/v1/proxies", token)[1]["items"] == []
    finally:
        proc.stop()
    crawler_requests = [r for r in recorder.seen if not r["target"].endswith(("/generate_204", "/ip"))]
    assert crawler_requests == []
    assert not any("team-b-secret" in json.dumps(r["headers"]) for r in recorder.seen)


def test_a_scoped_client_never_sees_or_keeps_a_proxy_outside_its_scope(
        tmp_path, fleet, api_squids, health_settings, redis_url):
    """Scopes by namespace and by pool (``<namespace>/<name>``), through discovery, leases,
    pool filters, sticky sessions and renewals; a narrowed scope ends a lease at its renewal."""
    allowed = _context(fleet, {"externalProxyNamespaces": ["*"]})
    eu_a = _pool(fleet, "team-a", "eu")
    eu_b = _pool(fleet, "team-b", "eu")  # the same pool name in another namespace
    proxies = [
        _external(fleet, allowed, "a0", "team-a", api_squids[0].address, api_squids[0].port, eu_a),
        _external(fleet, allowed, "a1", "team-a", api_squids[1].address, api_squids[1].port),
        _external(fleet, allowed, "b0", "team-b", api_squids[2].address, api_squids[2].port, eu_b),
        _external(fleet, allowed, "s0", "crawl-shared", api_squids[3].address, api_squids[3].port),
    ]
    assert fleet.probe(proxies, health_settings).succeeded == 4
    text = _tokens(["crawl-shared"], {"namespaces": ["team-a"]}, {"pools": ["team-a/eu"]})
    proc, api = start_api(tmp_path, redis_url, tokens=text, env={"API_TOKENS_RELOAD_SECONDS": "0"})
    tokens_path = tmp_path / "tokens.yaml"
    try:
        seen = lambda token, q="": sorted(  # noqa: E731
            f"{p['namespace']}/{p['name']}" for p in _call(api, "GET", f"/v1/proxies{q}", token)[1]["items"])
        assert seen(TEAM_A) == ["team-a/a0", "team-a/a1"]
        assert seen(TEAM_B) == ["team-a/a0"]  # member of team-a/eu, not team-b/eu
        assert seen(LEGACY) == ["crawl-shared/s0"]
        assert seen(TEAM_A, "?namespace=team-b") == [] and seen(TEAM_A, "?pool=eu") == ["team-a/a0"]

        # leases: the pool filter narrows the scope, never escapes it
        # (team-b/eu, outside the scope, answers as a pool that does not exist)
        status, body = _call(api, "POST", "/v1/leases", TEAM_B, {"pool": "eu", "namespace": "team-b"})
        assert status == 404 and body["error"] == "pool_not_found", body
        assert _call(api, "POST", "/v1/leases", TEAM_B, {"pool": "ghost", "namespace": "team-b"})[1]["message"] \
            == body["message"].replace("'eu'", "'ghost'")
        held = []
        for _ in range(6):
            status, lease = _call(api, "POST", "/v1/leases", TEAM_B, {"pool": "eu"})
            assert status == 201 and lease["proxy"]["name"] == "a0", lease
            held.append(lease["leaseId"])
        status, lease = _call(api, "POST", "/v1/leases", LEGACY, {})
        assert status == 201 and lease["proxy"]["name"] == "s0"

        # a sticky session bound inside the scope: on a1, the least loaded (team-b holds a0)
        status, sticky = _call(api, "POST", "/v1/leases", TEAM_A, {"sessionKey": "s1"})
        assert status == 201 and sticky["proxy"]["name"] == "a1", sticky

        # the operator narrows the scopes: team-a to its pool team-a/eu, team-b to its namespace
        _write(tokens_path, _tokens(["crawl-shared"], {"pools": ["team-a/eu"]}, {"namespaces": ["team-b"]}))
        assert seen(TEAM_A) == ["team-a/a0"] and seen(TEAM_B) == ["team-b/b0"]
        # renewals of leases on proxies now outside the scope end them
        for lease_id in held:
            status, body = _call(api, "POST", f"/v1/leases/{lease_id}/renew", TEAM_B, {})
            assert status == 409 and body["error"] == "proxy_unavailable", body
        status, body = _call(api, "POST", f"/v1/leases/{sticky['leaseId']}/renew", TEAM_A, {})
        assert status == 409 and body["error"] == "proxy_unavailable", body
        # the session's proxy left the scope: the session moves, it does not follow it out
        status, again = _call(api, "POST", "/v1/leases", TEAM_A, {"sessionKey": "s1"})
        assert status == 201 and again["proxy"]["name"] == "a0" and not again["sticky"], again
        status, again = _call(api, "POST", "/v1/leases", TEAM_A, {"sessionKey": "s1"})
        assert status == 201 and again["proxy"]["name"] == "a0" and again["sticky"], again
    finally:
        proc.stop()


def test_an_out_of_scope_pool_filter_counts_no_demand(fleet, redis_client):
    """A request naming another team's pool counts no demand for it (which would scale it up)."""
    from app.serving import leases
    from app.serving.leases import Filters, LeaseSettings, Scope

    redis_client.hset(redis_keys.POOLS, mapping={"team-b/eu": "1", "eu": "team-b"})
    scope = Scope(frozenset({"team-a"}))
    for filters in (Filters(pool="eu"), Filters(pool="eu", namespace="team-b")):
        with pytest.raises(leases.LeaseError):
            leases.acquire(redis_client, "team-a", filters, ttl=60, settings=LeaseSettings(), scope=scope)
    assert redis_client.get(redis_keys.pool_demand("team-b", "eu")) is None
    with pytest.raises(leases.LeaseError):
        leases.acquire(redis_client, "team-b", Filters(pool="eu"), ttl=60, settings=LeaseSettings(),
                       scope=Scope(frozenset({"team-b"})))
    assert redis_client.get(redis_keys.pool_demand("team-b", "eu")) == "1"  # the control: in scope
