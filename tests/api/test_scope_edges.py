"""Client scopes in the lease scripts at their edges, on real Redis.

Records are published with :func:`app.serving.view.publish` and marked healthy as the health engine
would (as tests/api/test_lease_index.py does); leases go through :func:`app.serving.leases.acquire`,
:func:`app.serving.leases.renew` and :func:`app.serving.leases.discover` with a :class:`app.serving.leases.Scope`.
"""

from __future__ import annotations

import re

import pytest

from app.serving import leases, view as serving

from app.store import keys as redis_keys
from app.serving.leases import Filters, Scope
from app.pools import demand
from app.resources import Proxy

pytestmark = pytest.mark.timeout(120)


def _proxy(r, name: str, uid: str, namespace: str, *, healthy: bool = True, max_leases: int = 2,
           pool: str | None = None, host: str = "203.0.113.9") -> str:
    meta = {"name": name, "namespace": namespace, "uid": uid}
    if pool:
        meta["ownerReferences"] = [{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool", "name": pool,
                                    "uid": f"pool-{namespace}-{pool}", "controller": True}]
    proxy = Proxy.from_dict({"metadata": meta, "spec": {"mode": "External", "maxLeases": max_leases,
                                                         "endpoint": {"host": host, "port": 3128}}})
    serving.publish(r, proxy, address=host, port=3128, phase="Ready")
    if healthy:
        r.hset(redis_keys.proxy(uid), mapping={"health": "healthy", "healthy": "1"})
    leases.reindex(r, uid)
    return uid


def _published_in_scope(message: str) -> int:
    m = re.search(r"(\d+) published in this client's scope", message)
    assert m, message
    return int(m.group(1))


def test_a_scoped_503_never_counts_another_teams_fleet(redis_client, lease_settings):
    """team-a's scope holds one proxy (full).  team-b runs 1,200 proxies that are not yet healthy.
    team-a's 503 must describe its own scope: 1 published, nothing about team-b.  The script adds
    every proxy it did not examine (past EXPLAIN_LIMIT) to the count "published in this client's
    scope", so team-a learns the size of team-b's fleet (and reads a false count)."""
    r = redis_client
    pipe_uids = [f"b-{i:05d}" for i in range(1200)]
    for i, uid in enumerate(pipe_uids):
        _proxy(r, f"b{i}", uid, "team-b", healthy=False, host=f"203.0.113.{i % 250 + 1}")
    _proxy(r, "a0", "a-0", "team-a", max_leases=1)
    scope = Scope(frozenset({"team-a"}))
    leases.acquire(r, "team-a", Filters(), ttl=60, settings=lease_settings, scope=scope)  # a0 full now
    with pytest.raises(leases.LeaseError) as info:
        leases.acquire(r, "team-a", Filters(), ttl=60, settings=lease_settings, scope=scope)
    message = info.value.message
    assert _published_in_scope(message) == 1, message
    assert "200" not in message and "1200" not in message, message


def test_a_pool_filter_by_name_counts_demand_for_the_pool_in_the_clients_scope(redis_client, lease_settings):
    """Pools named ``eu`` in team-b (registered first) and team-a.  team-a's client, scoped to
    ``team-a/eu``, asks for ``{"pool": "eu"}`` (the name alone, as docs/discovery-api.md shows)
    and is refused: its own pool is the only ``eu`` it can mean, so the refusal is demand for
    ``team-a/eu``.  The script resolves the bare name through K_POOLS' first-come ``eu -> team-b``
    entry, finds team-b out of scope, and counts nothing: team-a's pool never scales up."""
    r = redis_client
    demand.register(r, "team-b", "eu")
    demand.register(r, "team-a", "eu")
    scope = Scope(frozenset(), frozenset({"team-a/eu"}))
    with pytest.raises(leases.LeaseError):
        leases.acquire(r, "team-a", Filters(pool="eu"), ttl=60, settings=lease_settings, scope=scope)
    assert r.get(redis_keys.pool_demand("team-b", "eu")) is None  # never another team's pool
    assert r.get(redis_keys.pool_demand("team-a", "eu")) == "1"


@pytest.mark.parametrize("namespace,pool", [("1", "2"), ("0", "1"), ("123", "eu"), ("a" * 63, "b" * 63)])
def test_odd_but_valid_names_scope_the_same_in_lua_and_python(redis_client, lease_settings, namespace, pool):
    """Namespaces that look like numbers (cjson array indices?) and the longest names: the lease
    script and discovery agree, and nothing outside the scope is ever leased."""
    r = redis_client
    _proxy(r, "in", "in-ns", namespace, max_leases=100)
    _proxy(r, "pooled", "in-pool", "other", max_leases=100, pool=pool)
    _proxy(r, "out", "out-1", "other", max_leases=100)
    _proxy(r, "out2", "out-2", "2", max_leases=100, pool=pool)
    scope = Scope(frozenset({namespace}), frozenset({f"other/{pool}"}))
    seen = {p["name"] for p in leases.discover(r, Filters(), scope=scope)}
    assert seen == {"in", "pooled"}
    got = {leases.acquire(r, "c", Filters(), ttl=60, settings=lease_settings, scope=scope).name for _ in range(20)}
    assert got == {"in", "pooled"}
