"""Lease API benchmark: gunicorn with 2 workers, 32 client threads doing lease + release pairs.

Starts a private Redis, publishes N proxies to the serving view and marks them healthy (as
the health engine leaves a healthy proxy), starts ``gunicorn 'api:create_app()'`` with two
workers, and runs 32 client threads, each on its own keep-alive connection, doing
``POST /v1/leases`` then ``DELETE /v1/leases/<id>`` for the measured period.  Prints:

* lease + release pairs per second (all threads together);
* p50 / p99 of one pair (both requests), milliseconds;
* one raw Redis round trip (``PING``) p50, measured in the same run, idle and under load;
* CPU milliseconds per pair spent by gunicorn (all workers), Redis and the client threads;
* the floor of the serving stack: the same gunicorn configuration serving a trivial WSGI app
  (one static response), driven by the same client threads, in requests/s (``--no-floor``
  skips it).

Targets (issue 3): at least 1,500 pairs/s and p99 under 50 ms.

Usage: ``python bench/leases.py [--seconds 10] [--threads 32] [--proxies 20] [--worker-class gthread]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from app import serving  # noqa: E402
from app.resources import Proxy  # noqa: E402
from tests.support.processes import BIN, Process  # noqa: E402
from tests.support.redis_server import RedisServer, free_port  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (q in 0..100)."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def seed(r: redis.Redis, count: int, max_leases: int) -> None:
    """Publish ``count`` healthy proxies."""
    for i in range(count):
        proxy = Proxy.from_dict({
            "metadata": {"name": f"bench-{i}", "namespace": "bench", "uid": f"uid-{i:05d}", "labels": {"pool": "a"}},
            "spec": {"mode": "External", "endpoint": {"host": f"127.0.9.{i % 250 + 1}", "port": 3128},
                     "maxLeases": max_leases},
        })
        serving.publish(r, proxy, address=proxy.spec.host, port=3128, phase="Ready")
        r.hset(serving.proxy_key(proxy.uid), mapping={"health": "healthy", "healthy": "1", "egressIP": "192.0.2.1"})


def ping_p50(r: redis.Redis, n: int = 500) -> float:
    """Median PING round trip in milliseconds."""
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        r.ping()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) of every live process in process group ``pgid`` (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 (pgrp) is the third after the command
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def redis_cpu(r: redis.Redis) -> float:
    """CPU seconds Redis has used (INFO cpu)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def wait_http(host: str, port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection(host, port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("gunicorn did not answer /healthz")


FLOOR_APP = """def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "2")])
    return [b"{}"]
"""


def floor(argv_head: list[str], workdir: str, threads: int, seconds: float) -> tuple[float, float]:
    """Requests/s and gunicorn CPU ms per request of a trivial WSGI app under ``argv_head``."""
    Path(workdir, "floorapp.py").write_text(FLOOR_APP)
    port = free_port()
    proc = Process("gunicorn-floor", argv_head + ["-b", f"127.0.0.1:{port}", "--chdir", workdir, "floorapp:app"],
                   {}, workdir).start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/")
                conn.getresponse().read()
                conn.close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("floor gunicorn did not answer") from None
                time.sleep(0.1)
        counts = [0] * threads
        stop = time.monotonic() + seconds

        def hammer(i: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            while time.monotonic() < stop:
                conn.request("GET", "/")
                conn.getresponse().read()
                counts[i] += 1
            conn.close()

        cpu0 = group_cpu(proc.proc.pid)
        ts = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        cpu = group_cpu(proc.proc.pid) - cpu0
        total = sum(counts)
        return total / seconds, cpu / max(total, 1) * 1000
    finally:
        proc.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--proxies", type=int, default=20)
    ap.add_argument("--max-leases", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--worker-class", default="gthread")
    ap.add_argument("--worker-threads", type=int, default=4)
    ap.add_argument("--no-floor", action="store_true", help="skip the trivial-app floor measurement")
    args = ap.parse_args()

    redis_server = RedisServer()
    workdir = tempfile.mkdtemp(prefix="bench-leases-")
    tokens = Path(workdir) / "tokens.yaml"
    tokens.write_text(f"clients:\n  - name: bench\n    token: {TOKEN}\n")
    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    seed(r, args.proxies, args.max_leases)
    port = free_port()
    head = [str(BIN / "gunicorn"), "-w", str(args.workers), "-k", args.worker_class,
            "--log-level", "warning", "--keep-alive", "30"]
    if args.worker_class == "gthread":
        head += ["--threads", str(args.worker_threads)]
    gunicorn = Process("gunicorn", head + ["-b", f"127.0.0.1:{port}", "api:create_app()"],
                       {"REDIS_URL": redis_server.url, "API_TOKENS_FILE": str(tokens)}, workdir).start()
    try:
        wait_http("127.0.0.1", port)
        idle_ping = ping_p50(r)
        stop_at = [0.0]
        record_from = [0.0]
        lat: list[list[float]] = [[] for _ in range(args.threads)]
        errors: list[str] = []
        body = json.dumps({"ttlSeconds": 60}).encode()
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        start = threading.Barrier(args.threads + 1)

        def client(i: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            start.wait()
            while True:
                t0 = time.perf_counter()
                if t0 >= stop_at[0]:
                    break
                try:
                    conn.request("POST", "/v1/leases", body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    if resp.status != 201:
                        errors.append(f"lease {resp.status} {data[:200]!r}")
                        continue
                    lease_id = json.loads(data)["leaseId"]
                    conn.request("DELETE", f"/v1/leases/{lease_id}", headers=headers)
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 200:
                        errors.append(f"release {resp.status}")
                        continue
                except (OSError, http.client.HTTPException) as exc:
                    errors.append(repr(exc))
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    continue
                if t0 >= record_from[0]:
                    lat[i].append((time.perf_counter() - t0) * 1000)
            conn.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.threads)]
        for t in threads:
            t.start()
        now = time.perf_counter()
        record_from[0] = now + args.warmup
        stop_at[0] = now + args.warmup + args.seconds
        start.wait()
        time.sleep(args.warmup)
        cpu0, srv0, red0 = os.times(), group_cpu(gunicorn.proc.pid), redis_cpu(r)
        time.sleep(args.seconds / 2)
        loaded_ping = ping_p50(r, 200)
        for t in threads:
            t.join()
        cpu1, srv1, red1 = os.times(), group_cpu(gunicorn.proc.pid), redis_cpu(r)
        all_lat = [x for per in lat for x in per]
        pairs = len(all_lat)
        print(f"lease bench: gunicorn {args.workers} workers ({args.worker_class}"
              f"{f', {args.worker_threads} threads' if args.worker_class == 'gthread' else ''}), "
              f"{args.threads} client threads, {args.proxies} proxies x maxLeases {args.max_leases}, "
              f"{args.seconds:.0f} s measured after {args.warmup:.0f} s warm-up, {os.cpu_count()} CPUs")
        print(f"  pairs/s (lease+release): {pairs / args.seconds:,.0f}")
        if all_lat:
            print(f"  pair latency p50: {percentile(all_lat, 50):.1f} ms   p99: {percentile(all_lat, 99):.1f} ms")
        print(f"  raw Redis round trip (PING) p50: idle {idle_ping:.3f} ms, under load {loaded_ping:.3f} ms")
        print(f"  errors: {len(errors)}" + (f" (first: {errors[0]})" if errors else ""))
        client_cpu = cpu1.user - cpu0.user + cpu1.system - cpu0.system
        if pairs:
            per = lambda cpu: cpu / pairs * 1000  # noqa: E731
            print(f"  CPU per pair: gunicorn {per(srv1 - srv0):.2f} ms, Redis {per(red1 - red0):.2f} ms, "
                  f"client {per(client_cpu):.2f} ms (measured window)")
        print(f"  load average at the end: {os.getloadavg()[0]:.1f}")
        if not args.no_floor:
            gunicorn.stop()
            rps, ms = floor(head, workdir, args.threads, min(args.seconds, 6))
            print(f"  serving floor (same gunicorn, trivial WSGI app, {args.threads} threads): {rps:,.0f} requests/s "
                  f"= {rps / 2:,.0f} pairs/s at most; gunicorn CPU {ms:.2f} ms per request")
    finally:
        gunicorn.stop()
        redis_server.stop()


if __name__ == "__main__":
    main()
