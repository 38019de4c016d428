"""A pass creates a bounded batch of members, however large ``spec.replicas`` is (plan-level, pure)."""

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
