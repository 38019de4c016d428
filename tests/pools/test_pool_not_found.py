"""A lease request naming a pool that does not exist: ``404 pool_not_found`` at once, not a
``503 no_proxy_available`` that has clients wait; a pool that exists without a proxy to lease
stays a 503; a pool outside the client's scope answers exactly like a missing one.

The real app (Flask test client) on the session Redis; pools registered the way the pool
controller does (:func:`app.pools.demand.register`); a scoped tokens file."""

from __future__ import annotations

import pytest
import yaml

from api import create_app
from api.settings import ApiSettings
from app.serving import leases
from app.pools import demand
from tests.pools.test_serving_drain import SETTINGS, _member

pytestmark = pytest.mark.timeout(60)
OPEN = "token-of-open-client-0123456789"
TEAM_A = "token-of-team-a-client-0123456"


@pytest.fixture()
def api(redis_url, tmp_path):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"sharedNamespaces": ["*"], "clients": [
        {"name": "open", "token": OPEN},
        {"name": "team-a", "token": TEAM_A, "namespaces": ["team-a"], "pools": ["shared/common"]}]}))
    app = create_app(ApiSettings(redis_url=redis_url, tokens_file=str(tokens), leases=SETTINGS))
    return app.test_client()


def _lease(api, token: str, **body):
    return api.post("/v1/leases", json=body, headers={"Authorization": f"Bearer {token}"})


def test_a_missing_pool_is_404_and_an_empty_registered_one_stays_503(redis_client, api):
    demand.register(redis_client, "crawl", "web")  # registered, no member yet
    missing = _lease(api, OPEN, pool="wbe")
    assert missing.status_code == 404, missing.json
    assert missing.json["error"] == "pool_not_found" and "Retry-After" not in missing.headers
    assert "'wbe'" in missing.json["message"]
    elsewhere = _lease(api, OPEN, pool="web", namespace="elsewhere")
    assert elsewhere.status_code == 404 and elsewhere.json["error"] == "pool_not_found"
    assert "'web' in namespace 'elsewhere'" in elsewhere.json["message"]
    for body in ({"pool": "web"}, {"pool": "web", "namespace": "crawl"}):
        empty = _lease(api, OPEN, **body)
        assert empty.status_code == 503 and empty.json["error"] == "no_proxy_available", empty.json
        assert empty.headers["Retry-After"] == "1"
    # with a member, the pool leases as before; an unknown pool never counts demand
    _member(redis_client, "w", "uid-w", pool="web")
    assert _lease(api, OPEN, pool="web").status_code == 201
    assert demand.take(redis_client, "crawl", "web").refused == 2
    assert not demand.take(redis_client, "crawl", "wbe").refused


def test_a_pool_of_that_name_in_another_namespace_is_found_without_a_namespace(redis_client, api):
    demand.register(redis_client, "first", "web")
    demand.register(redis_client, "second", "web")
    demand.forget(redis_client, "first", "web")  # the '<name>' entry pointed at this namespace
    refused = _lease(api, OPEN, pool="web")
    assert refused.status_code == 503 and refused.json["error"] == "no_proxy_available", refused.json


def test_a_pool_outside_the_clients_scope_answers_like_a_missing_one(redis_client, api):
    demand.register(redis_client, "team-b", "eu")  # another team's pool
    demand.register(redis_client, "team-a", "eu")
    demand.register(redis_client, "shared", "common")
    demand.register(redis_client, "team-b", "private")
    _member(redis_client, "b", "uid-b", pool="private", namespace="team-b")
    hidden = _lease(api, TEAM_A, pool="private")
    missing = _lease(api, TEAM_A, pool="absent")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json["message"] == missing.json["message"].replace("'absent'", "'private'")
    hidden_ns = _lease(api, TEAM_A, pool="eu", namespace="team-b")
    missing_ns = _lease(api, TEAM_A, pool="ghost", namespace="team-b")
    assert hidden_ns.status_code == missing_ns.status_code == 404
    assert hidden_ns.json["message"] == missing_ns.json["message"].replace("'ghost'", "'eu'")
    # its own pools (by namespace or by name in the tokens file) are there, empty: 503
    for body in ({"pool": "eu"}, {"pool": "eu", "namespace": "team-a"}, {"pool": "common"}):
        own = _lease(api, TEAM_A, **body)
        assert own.status_code == 503 and own.json["error"] == "no_proxy_available", (body, own.json)
    assert _lease(api, OPEN, pool="private").status_code == 201  # the unscoped control


def test_the_library_raises_pool_not_found(redis_client):
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(redis_client, "c", leases.Filters(pool="nope", namespace="crawl"), ttl=60, settings=SETTINGS)
    assert info.value.code == leases.POOL_NOT_FOUND and info.value.retry_after is None
