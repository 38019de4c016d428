"""Which Proxies and which lease requests count for a pool: a member relabelled out of the
selector stops serving it, and a request naming ``<ns>/<name>`` as its pool names none.

The in-process controller against the Kubernetes API fake and real Redis.
"""

from __future__ import annotations

import pytest

from tests.pools import test_controller as tc
from tests.pools.test_controller import api, cluster  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(30)


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
