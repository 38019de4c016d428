"""api/fastpath.py answers the plain lease and release requests exactly as the Flask routes do.

Each request is sent twice, once to the app as served (fast path in front) and once to the
Flask app behind it, and the answers are compared: status, headers, body (the lease id and
expiry aside, which differ between two leases).
"""

from __future__ import annotations

import json

import pytest
from werkzeug.test import Client

from api import create_app
from api.fastpath import FastPath
from api.settings import ApiSettings
from app.serving import leases, view as serving
from app.store import keys as redis_keys
from app.resources import Proxy
from devcluster.redis_server import free_port
from tests.api.helpers import TOKEN_A, TOKEN_B, auth

pytestmark = pytest.mark.timeout(60)

HEADERS = ("Content-Type", "Content-Length", "Location", "WWW-Authenticate", "Retry-After", "Cache-Control")


def _publish(r, n: int = 2, max_leases: int = 50) -> None:
    for i in range(n):
        proxy = Proxy.from_dict({"metadata": {"name": f"fp{i}", "namespace": "fp", "uid": f"uid-fp{i}"},
                                 "spec": {"mode": "External", "endpoint": {"host": f"203.0.113.{i + 1}", "port": 3128},
                                          "maxLeases": max_leases}})
        serving.publish(r, proxy, address=f"203.0.113.{i + 1}", port=3128, phase="Ready")
        r.hset(redis_keys.proxy(proxy.uid), mapping={"health": "healthy", "healthy": "1"})
        leases.reindex(r, proxy.uid)


@pytest.fixture()
def both(app):
    """(the app as served, the Flask app behind the fast path) as test clients."""
    assert isinstance(app.wsgi_app, FastPath)
    return Client(app), Client(app.wsgi_app.flask)


def _same(served, flask, *, ignore=()):
    assert served.status_code == flask.status_code, (served.get_data(), flask.get_data())
    for name in HEADERS:
        if name not in ignore:
            assert served.headers.get(name) == flask.headers.get(name), name
    a, b = json.loads(served.get_data()), json.loads(flask.get_data())
    for key in ignore:
        a.pop(key, None), b.pop(key, None)
    assert a == b
    return a


CASES = [
    ({}, None, None),                                                     # no token
    ({"Authorization": "Bearer nope-nope-nope-nope"}, b"{}", "application/json"),
    ({"Authorization": "Basic abc"}, b"{}", "application/json"),
    (auth(), b"x" * 70_000, "application/json"),                          # 413
    (auth(), b"ttl=5", "text/plain"),                                     # 415
    (auth(), b'{"ttlSeconds": ', "application/json"),                     # bad_json
    (auth(), b" \r\n\t", "application/json"),                             # whitespace only: bad_json
    (auth(), b"[" * 100 + b"]" * 100, "application/json"),                # too deep
    (auth(), b'{"zone": "\\ud800"}', "application/json"),                 # lone surrogate
    (auth(), b'{"colour": "red"}', "application/json"),                   # unknown_field
    (auth(), b'{"ttlSeconds": 99999}', "application/json"),               # invalid_field
    (auth(), b'{"selector": "a in ("}', "application/json"),
    (auth(), b'{"sessionKey": "has space"}', "application/json"),
    (auth(), b'{"zone": "nowhere"}', "application/json"),                 # 503 no_proxy_available
]


@pytest.mark.parametrize("headers, body, ctype", CASES)
def test_lease_errors_are_answered_alike(both, redis_client, headers, body, ctype):
    _publish(redis_client)
    served, flask = both
    kw = {"headers": headers, "data": body, "content_type": ctype} if body is not None else {"headers": headers}
    got = _same(served.post("/v1/leases", **kw), flask.post("/v1/leases", **kw))
    assert "error" in got


def test_leases_and_releases_are_answered_alike(both, redis_client):
    _publish(redis_client, 1)
    served, flask = both
    body = {"ttlSeconds": 60, "sessionKey": "s-1", "namespace": "fp", "selector": "!gone"}
    a, b = served.post("/v1/leases", headers=auth(), json=body), flask.post("/v1/leases", headers=auth(), json=body)
    lease = _same(a, b, ignore=("leaseId", "expiresAt", "Location", "Content-Length", "leases", "sticky"))
    assert a.status_code == 201 and a.headers["Location"] == f"/v1/leases/{a.get_json()['leaseId']}"
    assert a.headers["Cache-Control"] == b.headers["Cache-Control"] == "no-store"  # the credentials
    assert lease["proxy"]["name"] == "fp0" and lease["proxyAuth"] is None
    # release: the fast path one lease, Flask the other, with each outcome form
    for client, resp, query in ((served, a, "?outcome=blocked"), (flask, b, "?outcome=blocked")):
        lid = resp.get_json()["leaseId"]
        done = client.delete(f"/v1/leases/{lid}{query}", headers=auth())
        assert done.status_code == 200 and done.get_json()["outcome"] == "blocked"
    # errors of release: unknown lease, another client's lease
    missing = "0" * 32
    _same(served.delete(f"/v1/leases/{missing}", headers=auth()), flask.delete(f"/v1/leases/{missing}", headers=auth()))
    theirs = served.post("/v1/leases", headers=auth(TOKEN_B), json={}).get_json()["leaseId"]
    _same(served.delete(f"/v1/leases/{theirs}", headers=auth()), flask.delete(f"/v1/leases/{theirs}", headers=auth()))
    _same(served.delete(f"/v1/leases/{theirs}"), flask.delete(f"/v1/leases/{theirs}"))  # no token


def test_other_forms_go_to_flask(client, redis_client):
    """Not the plain form: the Flask routes answer (and still apply their checks)."""
    _publish(redis_client, 1)
    lid = client.post("/v1/leases", headers=auth(), json={}).get_json()["leaseId"]
    bad = client.delete(f"/v1/leases/{lid}?outcome=maybe", headers=auth())
    assert bad.status_code == 400 and bad.get_json()["field"] == "outcome"
    twice = client.delete(f"/v1/leases/{lid}?outcome=ok&outcome=ok", headers=auth())
    assert twice.status_code == 400 and twice.get_json()["field"] == "outcome"
    assert client.delete(f"/v1/leases/{lid}?outcome=failed&x=1", headers=auth()).get_json()["field"] == "x"
    assert client.delete(f"/v1/leases/{lid.upper()}", headers=auth()).get_json()["error"] == "lease_not_found"
    assert client.get("/v1/leases", headers=auth()).status_code == 405
    assert client.post("/v1/leases/", headers=auth(), json={}).status_code in (308, 404)
    assert client.delete(f"/v1/leases/{lid}", headers=auth()).status_code == 200


def test_redis_down_is_answered_alike(tokens_file):
    app = create_app(ApiSettings(redis_url=f"redis://127.0.0.1:{free_port()}/0", tokens_file=tokens_file),
                     rebuild_index=False)
    served, flask = Client(app), Client(app.wsgi_app.flask)
    got = _same(served.post("/v1/leases", headers=auth(), json={}), flask.post("/v1/leases", headers=auth(), json={}))
    assert got["error"] == "redis_unavailable"
    lid = "a" * 32
    got = _same(served.delete(f"/v1/leases/{lid}", headers=auth(TOKEN_A)), flask.delete(f"/v1/leases/{lid}",
                                                                                          headers=auth(TOKEN_A)))
    assert got["error"] == "redis_unavailable"


def test_counters_count_the_fast_path(client, redis_client):
    """The counters are process-wide: compare before and after."""
    _publish(redis_client, 1, max_leases=1)

    def count(outcome: str, op: str = "acquire") -> float:
        needle = f'proxy_operator_lease_requests_total{{operation="{op}",outcome="{outcome}"}} '
        page = client.get("/metrics").get_data(as_text=True)
        return sum(float(line[len(needle):]) for line in page.splitlines() if line.startswith(needle))

    ok, full, released = count("ok"), count("no_proxy_available"), count("ok", "release")
    lid = client.post("/v1/leases", headers=auth(), json={}).get_json()["leaseId"]
    assert client.post("/v1/leases", headers=auth(), json={}).status_code == 503
    assert client.delete(f"/v1/leases/{lid}", headers=auth()).status_code == 200
    assert (count("ok"), count("no_proxy_available"), count("ok", "release")) == (ok + 1, full + 1, released + 1)
