"""A lease command whose answer is lost with its connection (the command ran) is retried by
app/store/retry.py on a fresh connection.  The lease scripts are not idempotent: the retry must
not turn a granted lease into a refusal (and a ghost lease), nor a done release into a 404."""

from __future__ import annotations

import pytest
import redis

from app.serving import leases, view as serving
from app.store import keys as redis_keys
from app.store.client import client_from_url
from app.resources import Proxy
from tests.support.lossy_relay import LossyRelay

pytestmark = pytest.mark.timeout(60)

SETTINGS = leases.LeaseSettings(default_ttl=60, max_ttl=600, cooldown=30, sticky_ttl=600, record_grace=60)


@pytest.fixture()
def admin(redis_url):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    r.flushdb()
    yield r
    r.flushdb()


@pytest.fixture()
def relay(admin):
    port = admin.connection_pool.connection_kwargs["port"]
    relay = LossyRelay(port)
    yield relay
    relay.close()


def _publish(r, max_leases: int) -> str:
    proxy = Proxy.from_dict({
        "metadata": {"name": "px", "namespace": "default", "uid": "uid-lossy-0"},
        "spec": {"mode": "External", "endpoint": {"host": "203.0.113.7", "port": 3128}, "maxLeases": max_leases}})
    serving.publish(r, proxy, address="203.0.113.7", port=3128, phase="Ready")
    r.hset(redis_keys.proxy(proxy.uid), mapping={"health": "healthy", "healthy": "1"})
    leases.reindex(r, proxy.uid)
    return proxy.uid


def test_an_acquire_whose_answer_is_lost_grants_one_lease_not_a_refusal(admin, relay):
    uid = _publish(admin, max_leases=1)
    r = client_from_url(relay.url, decode_responses=True)
    assert r.ping()
    relay.arm(b"EVALSHA")
    lease = leases.acquire(r, "crawler", leases.Filters(), ttl=60, settings=SETTINGS)
    assert relay.dropped == 1
    assert lease.uid == uid
    # exactly the lease the client was given holds the proxy (no ghost lease counting against maxLeases)
    assert admin.zrange(f"po:leases:{uid}", 0, -1) == [lease.id]


def test_a_client_limit_is_not_spent_by_a_retried_acquire(admin, relay):
    _publish(admin, max_leases=10)
    r = client_from_url(relay.url, decode_responses=True)
    assert r.ping()
    relay.arm(b"EVALSHA")
    leases.acquire(r, "crawler", leases.Filters(), ttl=60, settings=SETTINGS, client_max_leases=1)
    assert relay.dropped == 1
    # the client holds one lease (the one it was told of): its limit of 1 is reached, by that lease only
    assert admin.zcard("po:client-leases:crawler") == 1


def test_a_release_whose_answer_is_lost_is_not_answered_lease_not_found(admin, relay):
    _publish(admin, max_leases=1)
    r = client_from_url(relay.url, decode_responses=True)
    lease = leases.acquire(r, "crawler", leases.Filters(), ttl=60, settings=SETTINGS)
    relay.arm(b"EVALSHA")
    out = leases.release(r, "crawler", lease.id, outcome="ok", settings=SETTINGS)  # was LeaseError lease_not_found
    assert relay.dropped == 1
    assert out.uid == lease.uid and out.live
