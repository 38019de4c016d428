"""A rollover while Redis loses its state: Ready members are unknown, not unleasable.

The in-process controller against the Kubernetes API fake and real Redis.
"""

from __future__ import annotations

import pytest

from tests.pools import test_controller as tc
from tests.pools.test_controller import api, cluster  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(30)


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
