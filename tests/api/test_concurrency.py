"""64 client threads against 5 proxies with maxLeases 3, through a real HTTP server: no proxy
ever holds more than 3 live leases, and every lease is released by its owner and nobody else."""

from __future__ import annotations

import collections
import random
import threading

import pytest
import requests
from werkzeug.serving import make_server

from app.store import keys as redis_keys
from tests.api.helpers import NET, TOKEN_A, TOKEN_B, auth, healthy

pytestmark = pytest.mark.timeout(180)

THREADS, ROUNDS, MAX_LEASES = 64, 6, 3


@pytest.fixture()
def server(app):
    srv = make_server(NET.host(2), 0, app, threaded=True)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://{NET.host(2)}:{srv.server_port}"
    srv.shutdown()


def test_no_proxy_ever_exceeds_max_leases(server, fleet, api_squids, health_settings, redis_client):
    proxies = healthy(fleet, api_squids, health_settings, count=5, max_leases=MAX_LEASES)
    lock = threading.Lock()
    held: collections.Counter = collections.Counter()
    peak = {"client_side": 0, "redis": 0}
    stats = collections.Counter()
    errors: list[str] = []
    done = threading.Event()

    def sampler():
        # Watch Redis itself: count unexpired leases per proxy, over and over.
        while not done.is_set():
            now_s, now_us = redis_client.time()
            now_ms = now_s * 1000 + now_us // 1000
            pipe = redis_client.pipeline()
            for px in proxies:
                pipe.zcount(redis_keys.proxy_leases(px.uid), f"({now_ms}", "+inf")
            peak["redis"] = max(peak["redis"], *pipe.execute())

    def crawler(i: int):
        mine, other = (TOKEN_A, TOKEN_B) if i % 2 else (TOKEN_B, TOKEN_A)
        s = requests.Session()
        try:
            for _ in range(ROUNDS):
                resp = s.post(f"{server}/v1/leases", headers=auth(mine), json={"ttlSeconds": 60}, timeout=30)
                if resp.status_code == 503:
                    with lock:
                        stats["full"] += 1
                    continue
                if resp.status_code != 201:
                    errors.append(f"lease: {resp.status_code} {resp.text}")
                    continue
                body = resp.json()
                name, lid = body["proxy"]["name"], body["leaseId"]
                with lock:
                    stats["granted"] += 1
                    held[name] += 1
                    peak["client_side"] = max(peak["client_side"], held[name])
                foreign = s.delete(f"{server}/v1/leases/{lid}", headers=auth(other), timeout=30)
                if foreign.status_code != 403:
                    errors.append(f"foreign release: {foreign.status_code}")
                foreign = s.post(f"{server}/v1/leases/{lid}/renew", headers=auth(other), timeout=30)
                if foreign.status_code != 403:
                    errors.append(f"foreign renew: {foreign.status_code}")
                threading.Event().wait(random.uniform(0, 0.005))
                with lock:
                    held[name] -= 1
                own = s.delete(f"{server}/v1/leases/{lid}", headers=auth(mine), timeout=30)
                if own.status_code != 200:
                    errors.append(f"own release: {own.status_code} {own.text}")
                with lock:
                    stats["released"] += 1
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            s.close()

    watcher = threading.Thread(target=sampler)
    watcher.start()
    threads = [threading.Thread(target=crawler, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()

    assert not errors, errors[:10]
    assert peak["client_side"] <= MAX_LEASES and peak["redis"] <= MAX_LEASES, peak
    assert stats["granted"] == stats["released"] > 5 * MAX_LEASES
    assert stats["full"] > 0, "64 threads on 15 slots never contended: the test proves nothing"
    now_s, _ = redis_client.time()
    assert sum(redis_client.zcount(redis_keys.proxy_leases(px.uid), now_s * 1000, "+inf") for px in proxies) == 0
