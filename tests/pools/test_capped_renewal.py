"""Renewing a lease on a member draining out of its pool shortly before its drain deadline: the
renewal is capped at the deadline but never answers a TTL of 0; within the last second it ends
the lease with ``409 proxy_unavailable``, the answer the documentation promises.

The real app (Flask test client) on the session Redis; the member published and marked draining
the way the reconciler and the pool controller do (:func:`app.serving.view.set_draining`)."""

from __future__ import annotations

import time

import pytest

from app.serving import view as serving
from tests.pools.test_pool_not_found import OPEN, api  # noqa: F401 (the fixture)
from tests.pools.test_serving_drain import _member

pytestmark = pytest.mark.timeout(60)
AUTH = {"Authorization": f"Bearer {OPEN}"}


def _granted(api, redis_client) -> str:
    _member(redis_client, "a", "uid-a")
    got = api.post("/v1/leases", json={"ttlSeconds": 60}, headers=AUTH)
    assert got.status_code == 201, got.json
    return got.json["leaseId"]


def test_a_renewal_in_the_last_second_before_the_drain_deadline_ends_the_lease(api, redis_client):
    lease = _granted(api, redis_client)
    serving.set_draining(redis_client, "uid-a", time.time() + 0.6)
    renewed = api.post(f"/v1/leases/{lease}/renew", json={"ttlSeconds": 60}, headers=AUTH)
    assert renewed.status_code == 409 and renewed.json["error"] == "proxy_unavailable", renewed.json
    again = api.post(f"/v1/leases/{lease}/renew", json={"ttlSeconds": 60}, headers=AUTH)
    assert again.status_code == 404 and again.json["error"] == "lease_not_found"  # ended, not left to run


def test_a_capped_renewal_answers_at_least_one_second(api, redis_client):
    lease = _granted(api, redis_client)
    serving.set_draining(redis_client, "uid-a", time.time() + 1.8)
    renewed = api.post(f"/v1/leases/{lease}/renew", json={"ttlSeconds": 60}, headers=AUTH)
    assert renewed.status_code == 200, renewed.json
    assert renewed.json["ttlSeconds"] == 1
