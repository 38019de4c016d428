"""The SDK's answers to errors that mean "wrong request", not "wait": a lease for a pool that
does not exist fails at once with ``pool_not_found`` instead of retrying 503s until its wait
runs out.  The real ``proxy-operator api`` (granian) on the session Redis."""

from __future__ import annotations

import time

import pytest

from app.pools import demand
from proxy_operator_client import ApiError, Client

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
