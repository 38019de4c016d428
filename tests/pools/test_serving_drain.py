"""Pool members in the serving view: the draining mark (no new leases, live ones stay valid,
renewals capped at the deadline), the ``pool`` filter of the API, and the per-pool demand count
of refused requests (one INCR each, read and reset by the autoscaler)."""

from __future__ import annotations

import time

import pytest

from api import create_app
from api.settings import ApiSettings
from app.serving import leases, view as serving
from app.store import keys as redis_keys
from app.pools import demand
from app.pools.model import format_time
from app.resources import DRAINING_ANNOTATION, Proxy

pytestmark = pytest.mark.timeout(60)
TOKEN = "token-of-pool-tests-0123456789"
SETTINGS = leases.LeaseSettings(default_ttl=60, max_ttl=600, cooldown=30, sticky_ttl=600, record_grace=60)


def _member(r, name: str, uid: str, *, pool: str | None = "web", namespace: str = "crawl", max_leases: int = 2,
            annotations: dict | None = None, host: str = "203.0.113.7") -> Proxy:
    """Publish one healthy Managed proxy (a member of ``pool`` when given) as the reconciler and
    the health engine would."""
    meta = {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations or {}}
    if pool:
        meta["ownerReferences"] = [{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool", "name": pool,
                                    "uid": f"pool-{pool}", "controller": True, "blockOwnerDeletion": True}]
    proxy = Proxy.from_dict({"metadata": meta, "spec": {"provider": "k8s", "maxLeases": max_leases}})
    serving.publish(r, proxy, address=host, port=3128, phase="Ready")
    r.hset(redis_keys.proxy(uid), mapping={"health": "healthy", "healthy": "1"})
    leases.reindex(r, uid)
    return proxy


@pytest.fixture()
def api(redis_url, tmp_path):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"sharedNamespaces: [\"*\"]\nclients:\n  - name: crawler\n    token: {TOKEN}\n")
    app = create_app(ApiSettings(redis_url=redis_url, tokens_file=str(tokens), leases=SETTINGS))
    return app.test_client()


def _auth() -> dict:
    return {"Authorization": f"Bearer {TOKEN}"}


# -- draining --------------------------------------------------------------------------------------
def test_a_draining_member_takes_no_new_lease_and_keeps_the_live_one(redis_client):
    _member(redis_client, "a", "uid-a")
    held = leases.acquire(redis_client, "c", leases.Filters(), ttl=300, settings=SETTINGS)
    deadline = time.time() + 120
    assert serving.set_draining(redis_client, "uid-a", deadline)
    # in po:draining, out of the index
    assert redis_client.sismember(redis_keys.DRAINING, "uid-a")
    assert redis_client.zscore(redis_keys.LOAD, "uid-a") is None
    with pytest.raises(leases.LeaseError) as err:
        leases.acquire(redis_client, "c2", leases.Filters(), ttl=60, settings=SETTINGS)
    assert err.value.code == leases.NO_PROXY_AVAILABLE
    assert "1 draining (maxLeases 0 or leaving a pool)" in err.value.message
    # the live lease is still counted and still renewable, up to the deadline only
    assert leases.live_counts(redis_client, ["uid-a", "nope"]) == {"uid-a": 1, "nope": 0}
    renewed = leases.renew(redis_client, "c", held.id, ttl=600, settings=SETTINGS)
    assert renewed.expires_at <= deadline + 0.01
    assert renewed.expires_at >= deadline - 2
    assert renewed.ttl <= 121
    # release works as ever
    assert leases.release(redis_client, "c", held.id, outcome="ok", settings=SETTINGS).live
    assert leases.live_counts(redis_client, ["uid-a"]) == {"uid-a": 0}


def test_a_short_renewal_is_not_lengthened_and_the_mark_comes_off(redis_client):
    _member(redis_client, "a", "uid-a")
    held = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=SETTINGS)
    serving.set_draining(redis_client, "uid-a", time.time() + 3600)
    renewed = leases.renew(redis_client, "c", held.id, ttl=30, settings=SETTINGS)
    assert renewed.ttl == 30
    assert serving.set_draining(redis_client, "uid-a", None)
    assert not redis_client.sismember(redis_keys.DRAINING, "uid-a")
    assert leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=SETTINGS).uid == "uid-a"


def test_renewing_past_the_drain_deadline_ends_the_lease(redis_client):
    _member(redis_client, "a", "uid-a")
    held = leases.acquire(redis_client, "c", leases.Filters(), ttl=60, settings=SETTINGS)
    serving.set_draining(redis_client, "uid-a", time.time() - 1)
    with pytest.raises(leases.LeaseError) as err:
        leases.renew(redis_client, "c", held.id, ttl=60, settings=SETTINGS)
    assert err.value.code == leases.PROXY_UNAVAILABLE


def test_the_mark_on_the_proxy_survives_a_republication(redis_client):
    until = time.time() + 600
    proxy = _member(redis_client, "a", "uid-a", annotations={DRAINING_ANNOTATION: format_time(until)})
    assert redis_client.sismember(redis_keys.DRAINING, "uid-a")
    record = serving.get(redis_client, "uid-a")
    assert abs(int(record["drainUntil"]) - until * 1000) <= 1000
    assert record["pool"] == "web"
    # refresh (the watcher's path for metadata changes) takes the mark off when the annotation goes
    cleared = Proxy.from_dict({**proxy.raw, "metadata": {**proxy.raw["metadata"], "annotations": {}}})
    assert serving.refresh(redis_client, cleared)
    assert serving.get(redis_client, "uid-a")["drainUntil"] == ""
    assert not redis_client.sismember(redis_keys.DRAINING, "uid-a")
    assert redis_client.zscore(redis_keys.LOAD, "uid-a") is not None
    assert not serving.set_draining(redis_client, "unpublished", until)


def test_an_unhealthy_draining_member_counts_as_unhealthy(redis_client):
    _member(redis_client, "a", "uid-a")
    serving.set_draining(redis_client, "uid-a", time.time() + 60)
    redis_client.hset(redis_keys.proxy("uid-a"), "healthy", "0")
    leases.reindex(redis_client, "uid-a")
    assert redis_client.sismember(redis_keys.UNHEALTHY, "uid-a")
    assert not redis_client.sismember(redis_keys.DRAINING, "uid-a")


# -- the pool filter and the demand count ------------------------------------------------------------
def test_the_pool_filter_picks_members_of_that_pool_only(redis_client, api):
    _member(redis_client, "w", "uid-w", pool="web", host="203.0.113.1")
    _member(redis_client, "x", "uid-x", pool="other", host="203.0.113.2")
    _member(redis_client, "y", "uid-y", pool=None, host="203.0.113.3")
    got = api.post("/v1/leases", json={"pool": "web"}, headers=_auth())
    assert got.status_code == 201, got.json
    assert got.json["proxy"]["name"] == "w"
    listed = api.get("/v1/proxies?pool=other", headers=_auth()).json["items"]
    assert [(i["name"], i["pool"], i["draining"]) for i in listed] == [("x", "other", False)]
    everything = api.get("/v1/proxies", headers=_auth()).json["items"]
    assert {i["name"]: i["pool"] for i in everything} == {"w": "web", "x": "other", "y": None}
    bad = api.post("/v1/leases", json={"pool": "a\x01b"}, headers=_auth())
    assert bad.status_code == 400 and bad.json["field"] == "pool"
    assert api.get("/v1/proxies?pool=", headers=_auth()).status_code == 400


def test_a_refused_request_for_a_registered_pool_is_one_incr(redis_client, api):
    _member(redis_client, "w", "uid-w", pool="web", max_leases=1)
    demand.register(redis_client, "crawl", "web")
    assert api.post("/v1/leases", json={"pool": "web"}, headers=_auth()).status_code == 201
    key = redis_keys.pool_demand("crawl", "web")
    for _ in range(3):
        refused = api.post("/v1/leases", json={"pool": "web", "namespace": "crawl"}, headers=_auth())
        assert refused.status_code == 503 and refused.json["error"] == "no_proxy_available"
    assert api.post("/v1/leases", json={"pool": "web"}, headers=_auth()).status_code == 503  # no namespace
    assert redis_client.get(key) == "4"
    # unregistered pools (404 pool_not_found) and requests without a pool count nothing
    assert api.post("/v1/leases", json={"pool": "ghost"}, headers=_auth()).status_code == 404
    assert api.post("/v1/leases", json={"pool": "web", "namespace": "elsewhere"}, headers=_auth()).status_code == 404
    assert api.post("/v1/leases", json={}, headers=_auth()).status_code == 503
    assert redis_client.get(key) == "4"
    assert not [k for k in redis_client.keys(redis_keys.POOL_DEMAND_PREFIX + "*") if "ghost" in k or "elsewhere" in k]
    taken = demand.take(redis_client, "crawl", "web")
    assert taken.refused == 4 and taken.window is not None and 0 <= taken.window < 30
    assert redis_client.get(key) is None
    assert demand.take(redis_client, "crawl", "web").refused == 0


def test_forgetting_a_pool_stops_the_count(redis_client):
    demand.register(redis_client, "crawl", "web")
    demand.register(redis_client, "other-ns", "web")  # same name elsewhere: the first one stays the default
    assert redis_client.hget(redis_keys.POOLS, "web") == "crawl"
    demand.forget(redis_client, "crawl", "web")
    assert not redis_client.hexists(redis_keys.POOLS, "crawl/web")
    assert not redis_client.hexists(redis_keys.POOLS, "web")
    assert redis_client.hexists(redis_keys.POOLS, "other-ns/web")
    demand.register(redis_client, "other-ns", "web")
    assert redis_client.hget(redis_keys.POOLS, "web") == "other-ns"
    assert demand.take(redis_client, "nobody", "x").window is None
