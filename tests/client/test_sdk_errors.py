"""The SDK's answers to errors: a lease for a pool that does not exist fails at once with
``pool_not_found`` instead of retrying 503s until its wait runs out; a renewal capped at the
drain deadline of a proxy leaving its pool does not lower the TTL later renewals ask for, and
the lease ends with the documented ``proxy_unavailable``.  The real ``proxy-operator api``
(granian) on the session Redis; members published as the reconciler does."""

from __future__ import annotations

import time

import pytest

from app.serving import view as serving
from app.pools import demand
from proxy_operator_client import ApiError, Client
from tests.pools.test_serving_drain import _member

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def test_a_lease_for_a_missing_pool_fails_at_once(api, redis_client):
    demand.register(redis_client, "crawl", "web")  # exists, no member: that one is waited for
    with Client(api.url, api.token, wait=60) as client:
        started = time.monotonic()
        with pytest.raises(ApiError) as info:
            client.lease(pool="crawl/wbe")
        assert time.monotonic() - started < 5  # not the 60 s wait
        err = info.value
        assert (err.status, err.code, err.retry_after) == (404, "pool_not_found", None)
        assert "no ProxyPool 'wbe' in namespace 'crawl'" in str(err)
        started = time.monotonic()
        with pytest.raises(ApiError) as info:
            client.lease(pool="web", wait=1.5)
        assert info.value.code == "no_proxy_available" and time.monotonic() - started >= 1.0


def test_a_capped_renewal_keeps_the_ttl_and_the_lease_ends_with_proxy_unavailable(api, redis_client):
    _member(redis_client, "a", "uid-a")
    with Client(api.url, api.token, wait=0) as client:
        lease = client.lease(ttl=4)
        deadline = time.time() + 3.4
        serving.set_draining(redis_client, "uid-a", deadline)
        # renewed at 2 s: capped to the drain deadline, 1.4 s later
        while lease.renewals == 0 and lease.lost is None:
            time.sleep(0.05)
        assert lease.lost is None and lease.ttl == 4, lease
        assert abs(lease.expires_at.timestamp() - deadline) < 0.01
        ends = time.monotonic() + 5
        while lease.lost is None and time.monotonic() < ends:
            time.sleep(0.05)
        lost = lease.lost
        assert lost is not None and (lost.status, lost.code) == (409, "proxy_unavailable"), lost
        assert lease.ttl == 4
