"""A draining member's pass is queued for its earliest *live* lease's expiry, not for a lease
that already expired (app/pools/wake.py next_expiry): otherwise the pool runs a pass every
EXPIRY_SLACK seconds until the live lease ends."""

from __future__ import annotations

import time

from app.serving import leases
from tests.pools.test_controller import NS, POOL_PLURAL, GROUP, VERSION, SETTINGS, custom, make_pool, proxies, ready, run


def test_an_expired_lease_of_a_draining_member_does_not_requeue_its_pool_every_second(api, redis_client):
    ref = make_pool(api, replicas=1, drain={"drainTimeoutSeconds": 600}, template={
        "metadata": {"labels": {"app": "web"}}, "spec": {"provider": "k8s-local", "maxLeases": 3}})
    run(api, redis_client, ref)
    [member] = proxies(api)
    ready(api, redis_client, member)
    leases.acquire(redis_client, "crawler", leases.Filters(pool="web"), ttl=1, settings=SETTINGS)
    leases.acquire(redis_client, "crawler", leases.Filters(pool="web"), ttl=300, settings=SETTINGS)
    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"replicas": 0}})
    run(api, redis_client, ref)  # drains it
    time.sleep(1.5)  # the short lease has expired; the other lives ~298 s more
    out = run(api, redis_client, ref)
    assert out.plan.deletes == ()
    assert out.requeue_after is not None and out.requeue_after > 250, out.requeue_after
