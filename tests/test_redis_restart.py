"""A Redis restart that is already over is never seen by a client: a pooled connection found
dead is replaced and the command retried once (app/store/retry.py), in the real API and in the
clients every other process builds."""

from __future__ import annotations

import json

import pytest
import redis

from app.store import retry as redis_retry

from app.serving import leases, view as serving
from app.store import keys as redis_keys
from app.resources import Proxy
from devcluster.redis_server import RedisServer
from tests.api.served import request, start_api

pytestmark = pytest.mark.timeout(120)


@pytest.fixture()
def private_redis():
    server = RedisServer()
    yield server
    server.stop()


def _publish(r) -> str:
    """One healthy External proxy in the serving view (what the resync republishes after a
    Redis that came back empty); its uid."""
    proxy = Proxy.from_dict({
        "metadata": {"name": "px", "namespace": "default", "uid": "uid-restart-0"},
        "spec": {"mode": "External", "endpoint": {"host": "203.0.113.7", "port": 3128}, "maxLeases": 50}})
    serving.publish(r, proxy, address="203.0.113.7", port=3128, phase="Ready")
    r.hset(redis_keys.proxy(proxy.uid), mapping={"health": "healthy", "healthy": "1"})
    leases.reindex(r, proxy.uid)
    return proxy.uid


def _lease(port: int) -> tuple[int, dict]:
    status, _, raw = request(port, "POST", "/v1/leases", b"{}")
    return status, json.loads(raw)


def test_the_first_requests_after_a_redis_restart_succeed(tmp_path, private_redis):
    """One API thread (its connection is the one that goes stale): after Redis restarts, the
    very first lease, release and listing answer as if nothing happened."""
    admin = redis.Redis.from_url(private_redis.url, decode_responses=True)
    _publish(admin)
    proc, port = start_api(tmp_path, private_redis.url, env={"API_WORKERS": "1", "API_THREADS": "1"})
    try:
        status, lease = _lease(port)
        assert status == 201, lease
        private_redis.kill()
        private_redis.start()  # back, empty: the resync republishes the proxy
        admin = redis.Redis.from_url(private_redis.url, decode_responses=True)
        _publish(admin)
        status, lease = _lease(port)
        assert status == 201, lease  # was 503 redis_unavailable: the thread's connection was dead
        private_redis.kill()
        private_redis.start()
        status, _, raw = request(port, "DELETE", f"/v1/leases/{lease['leaseId']}")
        assert status == 404 and json.loads(raw)["error"] == "lease_not_found", raw  # Redis forgot it: not a 503
        private_redis.kill()
        private_redis.start()
        status, _, raw = request(port, "GET", "/v1/proxies")
        assert status == 200 and json.loads(raw)["items"] == [], raw
    finally:
        proc.stop()


def test_a_pooled_client_retries_once_on_a_fresh_connection_and_never_on_a_timeout(private_redis):
    """The clients of the workers, the watcher, beat's metrics and the health engine are built
    with the same options: a command on a connection Redis closed is run once on a new one; a
    Redis that is really down still fails (after one more connect attempt)."""
    r = redis.Redis.from_url(private_redis.url, decode_responses=True, socket_timeout=2,
                             **redis_retry.client_options())
    one = redis.Redis(connection_pool=r.connection_pool, single_connection_client=True)
    assert r.set("k", "v") and one.ping()
    private_redis.kill()
    private_redis.start()
    assert r.get("k") is None and one.ping()  # both reconnected transparently
    private_redis.kill()
    with pytest.raises(redis.ConnectionError):
        r.get("k")
    private_redis.start()
    assert r.ping()
    # a slow command is not retried (it may still be running): the timeout reaches the caller,
    # and the command ran once
    busy = ("redis.call('INCR', KEYS[1]); local t = redis.call('TIME'); local start = t[1] * 1e6 + t[2]; "
            "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - start > 800000; return 1")
    slow = redis.Redis.from_url(private_redis.url, socket_timeout=0.3, **redis_retry.client_options())
    with pytest.raises(redis.TimeoutError):
        slow.eval(busy, 1, "runs")
    assert redis.Redis.from_url(private_redis.url, decode_responses=True).get("runs") == "1"
