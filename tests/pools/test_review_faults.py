"""Faults and hostile input found by a review of the pool controller (plan-level, pure logic).

Each test names the fault it pins; see the fix noted next to it in app/pools/plan.py.
"""

from __future__ import annotations

import time

import pytest

from app.pools import plan as planner
from app.pools.model import MAX_REPLICAS
from tests.pools.sim import member, pool

pytestmark = pytest.mark.timeout(30)
NOW = 1_000_000.0


def test_a_huge_replicas_creates_a_bounded_batch_per_pass():
    # spec.replicas up to the CRD's maximum must not make one pass build and send all its
    # creates (memory, the task's time limit, the API server); a pass makes a bounded batch and
    # asks for the next pass soon.
    p = pool({"replicas": MAX_REPLICAS})
    t0 = time.monotonic()
    result = planner.plan(p, [], {}, now=NOW)
    assert time.monotonic() - t0 < 2
    assert 0 < len(result.creates) <= planner.MAX_CREATES_PER_PASS
    assert result.requeue_after is not None and result.requeue_after <= 5
    # the same bound holds for spread pools and while the batch is still pending
    z = pool({"replicas": MAX_REPLICAS, "spread": {"zones": ["a", "b", "c"]}})
    spread = planner.plan(z, [member(z, leasable=False, zone="a") for _ in range(3)], {}, now=NOW)
    assert 0 < len(spread.creates) <= planner.MAX_CREATES_PER_PASS
    assert {c.zone for c in spread.creates} == {"a", "b", "c"}


def test_a_small_pool_is_not_throttled_by_the_batch_bound():
    p = pool({"replicas": 5})
    result = planner.plan(p, [], {}, now=NOW)
    assert len(result.creates) == 5 and result.requeue_after is None


# -- in-process controller against the API fake and real Redis --------------------------------

from tests.pools import test_controller as tc  # noqa: E402  (its fixtures and helpers)
from tests.pools.test_controller import api, cluster  # noqa: E402,F401  (fixtures)


def test_a_flushed_redis_mid_rollout_does_not_drain_every_serving_member(api, redis_client):
    # Redis lost its state (flushed, failed over to an empty replica) during a rollover: for a
    # moment no member has a serving record.  Members that are Ready are not "unleasable" then,
    # only unknown: the pass must not spend them as if they served nothing (draining all the
    # outdated ones at once, deleting them at the next pass) before the serving view is rebuilt.
    ref = tc.make_pool(api, replicas=3)
    tc.run(api, redis_client, ref)
    for m in tc.proxies(api):
        tc.ready(api, redis_client, m)
    template = {"metadata": {"labels": {"app": "web"}}, "spec": {**tc.TEMPLATE["spec"], "maxLeases": 3}}
    tc.custom(api).patch_namespaced_custom_object(tc.GROUP, tc.VERSION, tc.NS, tc.POOL_PLURAL, "web",
                                                  {"spec": {"template": template}})
    out = tc.run(api, redis_client, ref)
    assert len(out.plan.creates) == 1 and out.plan.drains == ()  # maxSurge 1, maxUnavailable 0
    redis_client.flushdb()
    out = tc.run(api, redis_client, ref)
    assert out.plan.drains == (), [d.name for d in out.plan.drains]
    assert out.plan.deletes == ()


def test_an_owned_proxy_relabelled_out_of_the_selector_no_longer_serves_the_pool(api, redis_client):
    # an owned Proxy relabelled out of an explicit spec.selector used to be 'left alone, not
    # counted' while keeping the pool's controller ownerReference, so Proxy.pool and its serving
    # record still said the pool: pool-filtered leases kept going to it.  It is released now, as a
    # ReplicaSet releases such a Pod (app.pools.controller._release; details pinned by
    # test_controller's test_a_released_proxy_*).
    from app.serving import leases

    ref = tc.make_pool(api, "sel", replicas=1, selector={"matchLabels": {"app": "web"}})
    tc.run(api, redis_client, ref)
    [mine] = tc.proxies(api)
    tc.custom(api).patch_namespaced_custom_object(tc.GROUP, tc.VERSION, tc.NS, tc.PLURAL, mine.name,
                                                  {"metadata": {"labels": {"app": "elsewhere"}}})
    relabelled = [p for p in tc.proxies(api) if p.uid == mine.uid][0]
    tc.ready(api, redis_client, relabelled)
    tc.run(api, redis_client, ref)
    with pytest.raises(leases.LeaseError):  # the pool does not count it: it must not serve the pool
        leases.acquire(redis_client, "crawler", leases.Filters(pool="sel", namespace=tc.NS), ttl=60,
                       settings=tc.SETTINGS)


def test_a_refused_request_naming_ns_slash_name_as_pool_writes_no_stray_counter(api, redis_client):
    # K_POOLS holds '<ns>/<name>' -> '1' next to '<name>' -> '<ns>': a `pool` of "crawl/web" with no
    # namespace used to hit the first kind and INCR "po:pool-demand:1/crawl/web", a key nobody
    # reads, resets or forgets.  Such a request names no pool (pool names have no '/').
    from app.serving import leases
    from app.store import keys as redis_keys

    ref = tc.make_pool(api, replicas=0)
    tc.run(api, redis_client, ref)
    for _ in range(3):
        with pytest.raises(leases.LeaseError):
            leases.acquire(redis_client, "crawler", leases.Filters(pool="crawl/web"), ttl=60, settings=tc.SETTINGS)
    assert [k for k in redis_client.keys(redis_keys.pool_demand("*", "*")) if not k.endswith(":read")] == []
