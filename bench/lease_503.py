"""What one filtered ``503 no_proxy_available`` costs Redis, by fleet size.

A private Redis holds N published proxies, all unhealthy (so none can be leased), half of them
in the namespace a request filters on.  A lease request with that filter then gets the 503
whose message counts why each proxy was excluded; the lease script runs inside Redis, which
serves nothing else meanwhile, so its time is every other lease's wait.  Prints, per size, the
script's time in Redis per request (``INFO commandstats``, ``evalsha`` usec per call), the
``HMGET`` calls per request and the message's tail; a request without filters for comparison.

Usage: ``python bench/lease_503.py [--sizes 1000,10000,50000] [--requests 20]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from app.serving import leases, view as serving  # noqa: E402
from app.store import keys as redis_keys  # noqa: E402
from app.serving.leases import LeaseSettings  # noqa: E402
from app.resources import Proxy  # noqa: E402

from devcluster.redis_server import RedisServer  # noqa: E402


def publish(r: redis.Redis, n: int) -> None:
    """Publish ``n`` External proxies, unhealthy, every other one in namespace ``crawl``."""
    for i in range(n):
        uid = f"uid-{i:06d}"
        ns = "crawl" if i % 2 else "other"
        proxy = Proxy.from_dict({"metadata": {"name": f"p{i}", "namespace": ns, "uid": uid},
                                 "spec": {"mode": "External", "endpoint": {"host": "203.0.113.9", "port": 3128}}})
        serving.publish(r, proxy, address="203.0.113.9", port=3128, phase="Ready")
        r.hset(redis_keys.proxy(uid), mapping={"health": "unhealthy", "healthy": "0"})
        leases.reindex(r, uid)


def stats(r: redis.Redis) -> tuple[int, int, int]:
    """(evalsha calls, evalsha usec, hmget calls) so far."""
    info = r.info("commandstats")
    ev = info.get("cmdstat_evalsha", {})
    return int(ev.get("calls", 0)), int(ev.get("usec", 0)), int(info.get("cmdstat_hmget", {}).get("calls", 0))


def measure(r: redis.Redis, filters: leases.Filters, requests: int, settings: LeaseSettings) -> tuple[float, float, str]:
    """Return (ms in Redis per request, HMGET calls per request, the last message's tail)."""
    try:
        leases.acquire(r, "warm", filters, ttl=60, settings=settings)  # loads the script
    except leases.LeaseError:
        pass
    c0, u0, h0 = stats(r)
    message = ""
    for _ in range(requests):
        try:
            leases.acquire(r, "bench", filters, ttl=60, settings=settings)
        except leases.LeaseError as exc:
            message = exc.message
    c1, u1, h1 = stats(r)
    calls = max(c1 - c0, 1)
    return (u1 - u0) / calls / 1000, (h1 - h0) / requests, message.split("; excluded: ")[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,50000")
    ap.add_argument("--requests", type=int, default=20)
    args = ap.parse_args()
    settings = LeaseSettings(default_ttl=60, max_ttl=600, cooldown=30, sticky_ttl=600, record_grace=60)
    print(f"{'proxies':>8} {'request':<22} {'ms in Redis':>11} {'HMGET/req':>10}  message (after 'excluded:')")
    for n in (int(x) for x in args.sizes.split(",")):
        server = RedisServer()
        try:
            r = redis.Redis.from_url(server.url, decode_responses=True)
            publish(r, n)
            for label, filters in (("filtered (namespace)", leases.Filters(namespace="crawl")),
                                   ("no filters", leases.Filters())):
                ms, hm, tail = measure(r, filters, args.requests, settings)
                print(f"{n:>8} {label:<22} {ms:>11.2f} {hm:>10.0f}  {tail}")
            r.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
