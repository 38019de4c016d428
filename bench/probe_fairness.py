"""Probe fairness benchmark: N tarpit Proxies in one namespace, the probe interval of another
namespace's healthy Proxies.

Starts a private Redis, the Kubernetes API fake, the origin (health URL + IP echo), a real Squid
and a tarpit (a loopback listener that accepts and never answers) on a loopback block claimed
for the run (:mod:`devcluster.loopback`), then the product's own ``health`` worker (``celery
-A workers worker -Q health --concurrency 2``, as the demo's health-worker) and beat.  Applies
``--tarpits`` External Proxies in namespace ``tarpit`` pointed at the tarpit (timeout
``--tarpit-timeout``) and ``--healthy`` in namespace ``healthy`` pointed at the Squid (interval
``--interval``), lets the tarpits reach their lane (``--warmup`` seconds), then watches every
healthy Proxy's ``lastProbe`` for ``--duration`` seconds.

Prints the healthy namespace's measured intervals (mean, median, max, count) against its
setting, and how many tarpit probes ended in each lane.  Target: the mean within 10 % of the
setting (the sweep period, ``HEALTH_SWEEP_INTERVAL`` 5 s, adds up to one period to each).

Usage: ``python bench/probe_fairness.py [--tarpits 60] [--tarpit-timeout 60] [--healthy 5]
[--interval 30] [--concurrency 2] [--warmup 90] [--duration 240]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from app.store import keys as redis_keys  # noqa: E402
from devcluster import loopback  # noqa: E402
from devcluster.apiserver.server import FakeKube  # noqa: E402
from devcluster.redis_server import RedisServer  # noqa: E402
from tests.health.fleet import Fleet, start_squid  # noqa: E402
from tests.health.servers import Blackhole, OriginServer  # noqa: E402
from tests.support.processes import celery_beat, celery_worker  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tarpits", type=int, default=60)
    ap.add_argument("--tarpit-timeout", type=int, default=60)
    ap.add_argument("--healthy", type=int, default=5)
    ap.add_argument("--interval", type=int, default=30)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=90)
    ap.add_argument("--duration", type=float, default=240)
    args = ap.parse_args()

    net = loopback.block("bench-fairness")
    work = tempfile.mkdtemp(prefix="bench-fairness-")
    server = RedisServer()
    fake = FakeKube().start()
    origin = OriginServer(net.host(1)).start()
    squid = start_squid(net.host(10))
    hole = Blackhole(net.host(11))
    r = redis.Redis.from_url(server.url, decode_responses=True)
    env = {"REDIS_URL": server.url, "KUBECONFIG": fake.write_kubeconfig(f"{work}/kubeconfig"),
           "EGRESS_ECHO_URL": origin.url("/ip"), "PROVIDERS_CONFIG": "", "PROBE_ALLOWED_RANGES": "127.0.0.0/8",
           "GC_INTERVAL": "3600", "RESYNC_INTERVAL": "3600"}
    procs = []
    client = fake.api_client()
    try:
        fleet = Fleet(client, r, origin.url("/generate_204"))
        tarpit_hc = {"intervalSeconds": args.tarpit_timeout + 1, "timeoutSeconds": args.tarpit_timeout,
                     "failureThreshold": 3}
        tarpits = [fleet.external(f"tarpit{i}", hole.address, hole.port, namespace="tarpit", health=tarpit_hc)
                   for i in range(args.tarpits)]
        healthy = [fleet.external(f"ok{i}", squid.address, squid.port, namespace="healthy",
                                  health={"intervalSeconds": args.interval, "timeoutSeconds": 10})
                   for i in range(args.healthy)]
        procs = [celery_worker(env, queues="health", concurrency=args.concurrency, name="health-worker").start(),
                 celery_beat(env, work).start()]
        procs[0].wait_for_log("ready.", timeout=60)
        print(f"{args.tarpits} tarpit Proxies (timeout {args.tarpit_timeout} s) in namespace tarpit, "
              f"{args.healthy} healthy Proxies (interval {args.interval} s) in namespace healthy, "
              f"health worker --concurrency {args.concurrency}; warm-up {args.warmup:.0f} s, "
              f"measuring {args.duration:.0f} s", flush=True)
        time.sleep(args.warmup)
        seen: dict[str, list[float]] = {px.uid: [] for px in healthy}
        end = time.monotonic() + args.duration
        while time.monotonic() < end:
            for uid, times in seen.items():
                value = r.hget(redis_keys.proxy(uid), "lastProbe")
                if value and (not times or float(value) != times[-1]):
                    times.append(float(value))
            time.sleep(0.1)
        intervals = [b - a for times in seen.values() for a, b in zip(times, times[1:])]
        judged = sum(1 for px in tarpits
                     if float(r.hget(redis_keys.proxy(px.uid), "latencyMs") or 0) >= 1000 * (args.tarpit_timeout - 1))
        if not intervals:
            print("no interval measured (fewer than two probes per healthy Proxy)")
            return
        mean = statistics.mean(intervals)
        print(f"healthy namespace: setting {args.interval} s; measured mean {mean:.1f} s "
              f"({100 * (mean / args.interval - 1):+.1f} %), median {statistics.median(intervals):.1f} s, "
              f"max {max(intervals):.1f} s over {len(intervals)} intervals; "
              f"target mean within 10 %: {'met' if mean <= 1.1 * args.interval else 'MISSED'}")
        print(f"tarpit namespace: {judged}/{args.tarpits} last probed in the slow lane with their own "
              f"{args.tarpit_timeout} s timeout")
    finally:
        for proc in reversed(procs):
            proc.stop()
        client.close()
        hole.stop()
        squid.stop()
        origin.stop()
        fake.close()
        server.stop()


if __name__ == "__main__":
    main()
