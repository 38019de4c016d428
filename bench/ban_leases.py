"""Targeted versus untargeted leases, side by side in one run (app.serving.bans).

Starts a private Redis and publishes ``--proxies`` (10,000) healthy proxies, each with an egress
IP of its own, then bans ``--banned`` (10 %) of the (egress IP, target) pairs of ``--targets``
(1,000) targets: written straight into the ban sets the release script keeps (``po:ban:<target>``,
``po:ip-bans:<ip>``, ``po:bans``), as that many blocked releases would leave them, so seeding takes
seconds, not a million releases.

Rounds alternate between the two kinds (untargeted, targeted, untargeted, ...), each
``--seconds`` long, with ``--threads`` client threads, each on its own connection, doing
lease + release pairs through :func:`app.serving.leases.acquire` / :func:`~app.serving.leases.release`
(the lease scripts the API runs, without the HTTP server: what targets change is in the
scripts).  A targeted pair asks for a target drawn at random among the ``--targets`` and
releases ``ok``.  Prints per round the pairs per second, p50 / p99 of one pair (ms) and the
Redis CPU per pair (µs, from ``INFO cpu``), then the medians per kind against the goals
of targeted leases: targeted pairs/s >= 80 % of untargeted, targeted p99 < 2 x untargeted.

Usage: ``python bench/ban_leases.py [--proxies 10000] [--targets 1000] [--banned 0.1]
[--seconds 5] [--rounds 3] [--threads 4] [--untargeted-only]``.  ``--untargeted-only`` runs the
untargeted rounds alone, so the same file can be run on a tree from before targets (copy it
there) to compare untargeted leases before and after.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from app.resources import Proxy  # noqa: E402
from app.serving import leases, view as serving  # noqa: E402
from app.store import keys as redis_keys  # noqa: E402
from devcluster.redis_server import RedisServer  # noqa: E402

try:  # a tree from before targets has no app.serving.bans (--untargeted-only)
    from app.serving.bans import BanSettings, Target
except ImportError:  # pragma: no cover - the comparison run only
    BanSettings = Target = None  # type: ignore[assignment,misc]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (q in 0..100)."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def egress(i: int) -> str:
    """The egress IP of proxy ``i`` (one per proxy)."""
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def seed(r: redis.Redis, count: int, max_leases: int) -> None:
    """Publish ``count`` healthy proxies, proxy ``i`` leaving from :func:`egress` ``(i)``."""
    pipe = r.pipeline(transaction=False)
    for i in range(count):
        proxy = Proxy.from_dict({
            "metadata": {"name": f"bench-{i}", "namespace": "bench", "uid": f"uid-{i:05d}"},
            "spec": {"mode": "External", "endpoint": {"host": f"203.0.113.{i % 250 + 1}", "port": 3128},
                     "maxLeases": max_leases},
        })
        serving.publish(r, proxy, address=proxy.spec.host, port=3128, phase="Ready")
        pipe.hset(redis_keys.proxy(proxy.uid), mapping={"health": "healthy", "healthy": "1", "egressIP": egress(i)})
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()
    leases.reindex_all(r)


def ban(r: redis.Redis, proxies: int, targets: list[str], share: float, seconds: int = 3600) -> int:
    """Ban ``share`` of the (egress IP, target) pairs, at random, for ``seconds``; return how many."""
    rng = random.Random(26)
    now_ms = int(time.time() * 1000)
    until = now_ms + seconds * 1000
    per_target = int(proxies * share)
    pipe = r.pipeline(transaction=False)
    total = 0
    for target in targets:
        chosen = rng.sample(range(proxies), per_target)
        pipe.zadd(redis_keys.ban(target), {egress(i): until for i in chosen})
        pipe.zadd(redis_keys.BANS, {f"{egress(i)}|{target}": until for i in chosen})
        for i in chosen:
            pipe.zadd(redis_keys.ip_bans(egress(i)), {target: until})
        total += per_target
        pipe.execute()
    return total


def run_round(url: str, *, seconds: float, threads: int, targets: list[str] | None, settings) -> dict:
    """Lease + release pairs on ``threads`` connections for ``seconds``; the round's figures."""
    stop = threading.Event()
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads
    bans = BanSettings() if BanSettings is not None else None
    prepared = [Target.of(t, bans) for t in targets] if targets and Target is not None else None

    def work(n: int) -> None:
        r = redis.Redis.from_url(url, decode_responses=True)
        rng = random.Random(n)
        out = latencies[n]
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                if prepared is not None:
                    lease = leases.acquire(r, f"c{n}", leases.Filters(), ttl=60, settings=settings,
                                           target=rng.choice(prepared), bans=bans)
                    leases.release(r, f"c{n}", lease.id, outcome="ok", settings=settings, bans=bans)
                else:
                    lease = leases.acquire(r, f"c{n}", leases.Filters(), ttl=60, settings=settings)
                    leases.release(r, f"c{n}", lease.id, outcome="ok", settings=settings)
            except leases.LeaseError:
                errors[n] += 1
                continue
            out.append((time.perf_counter() - t0) * 1000)
        r.close()

    admin = redis.Redis.from_url(url)
    cpu0 = admin.info("cpu")
    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    cpu1 = admin.info("cpu")
    admin.close()
    samples = [x for per in latencies for x in per]
    pairs = len(samples)
    redis_cpu = (cpu1["used_cpu_sys"] + cpu1["used_cpu_user"] - cpu0["used_cpu_sys"] - cpu0["used_cpu_user"])
    return {"pairs_s": pairs / elapsed, "p50": percentile(samples, 50) if samples else 0.0,
            "p99": percentile(samples, 99) if samples else 0.0, "errors": sum(errors),
            "redis_us": redis_cpu / pairs * 1e6 if pairs else 0.0}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures.

    Returns:
        the process exit code (0).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proxies", type=int, default=10_000)
    ap.add_argument("--targets", type=int, default=1_000)
    ap.add_argument("--banned", type=float, default=0.1, help="share of (egress IP, target) pairs banned")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--max-leases", type=int, default=5)
    ap.add_argument("--untargeted-only", action="store_true")
    args = ap.parse_args(argv)

    server = RedisServer()
    try:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        t0 = time.perf_counter()
        seed(r, args.proxies, args.max_leases)
        targets = [f"site-{n:04d}.com" for n in range(args.targets)]
        banned = 0 if args.untargeted_only else ban(r, args.proxies, targets, args.banned)
        print(f"seeded {args.proxies} proxies (one egress IP each), {args.targets} targets, {banned} banned "
              f"(egress IP, target) pairs ({args.banned:.0%}) in {time.perf_counter() - t0:.1f} s; "
              f"Redis memory {r.info('memory')['used_memory_human']}")
        settings = leases.LeaseSettings()
        kinds = [("untargeted", None)] if args.untargeted_only else [("untargeted", None), ("targeted", targets)]
        results: dict[str, list[dict]] = {k: [] for k, _ in kinds}
        run_round(server.url, seconds=1.0, threads=args.threads, targets=None, settings=settings)  # warm-up
        for n in range(args.rounds):
            for kind, tg in kinds:
                res = run_round(server.url, seconds=args.seconds, threads=args.threads, targets=tg, settings=settings)
                results[kind].append(res)
                print(f"round {n + 1} of {args.rounds}, {kind:>10}: {res['pairs_s']:8.0f} pairs/s  "
                      f"p50 {res['p50']:6.2f} ms  p99 {res['p99']:6.2f} ms  Redis CPU {res['redis_us']:6.1f} µs/pair  "
                      f"errors {res['errors']}")
        print()
        print(f"{'kind':>10}  {'pairs/s':>8}  {'p50 ms':>7}  {'p99 ms':>7}  {'Redis µs/pair':>13}   (medians)")
        med = {}
        for kind, _ in kinds:
            rows = results[kind]
            med[kind] = {key: statistics.median(x[key] for x in rows) for key in ("pairs_s", "p50", "p99", "redis_us")}
            m = med[kind]
            print(f"{kind:>10}  {m['pairs_s']:8.0f}  {m['p50']:7.2f}  {m['p99']:7.2f}  {m['redis_us']:13.1f}")
        if not args.untargeted_only:
            u, t = med["untargeted"], med["targeted"]
            ratio = t["pairs_s"] / u["pairs_s"] if u["pairs_s"] else 0.0
            p99 = t["p99"] / u["p99"] if u["p99"] else 0.0
            print()
            print(f"targeted / untargeted pairs/s: {ratio:.0%} (target >= 80 %: {'met' if ratio >= 0.8 else 'NOT met'})")
            print(f"targeted / untargeted p99: {p99:.2f}x (target < 2x: {'met' if p99 < 2 else 'NOT met'})")
        r.close()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
