"""Probe benchmark: one health sweep over 1,000 External Proxies pointed at a few local Squids.

Starts a private Redis, real Squids on a loopback block claimed for the run
(:mod:`tests.support.loopback`), and — in a separate process so their CPU is
not counted as the prober's — the Kubernetes API fake and the origin (health URL + IP echo).
Creates N External Proxies in the fake, publishes them to the serving view (as the
reconciler does when they reach Running), then runs sweeps the way a ``health`` worker does:
:func:`app.health.schedule.sweep` claims every due proxy, and each batch goes through
:func:`app.health.engine.probe_batch` (concurrent probes, Redis writes, status writes through
the real kubernetes client).  Prints for each sweep its wall time and the CPU seconds of this
process (user + system), with how many probes succeeded and how many status writes it did:

* sweep 1 — every Proxy turns Ready (a status write each) and learns its egress IP;
* sweep 2 — steady state (probes and Redis writes only).

Target (issue 3): under 30 s and under one core (CPU seconds < wall seconds).

Usage: ``python bench/probes.py [--proxies 1000] [--squids 4] [--batch 50] [--concurrency 64]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from kubernetes import client as k8s  # noqa: E402

from app import serving  # noqa: E402
from app import squid as squid_conf  # noqa: E402
from app.health import engine, schedule  # noqa: E402
from app.health.settings import HealthSettings  # noqa: E402
from app.kube import Kube  # noqa: E402
from app.resources import API_VERSION, GROUP, KIND, PLURAL, VERSION  # noqa: E402
from tests.support import loopback  # noqa: E402
from tests.support.redis_server import RedisServer, free_port  # noqa: E402
from tests.support.squid import SquidProcess, loopback_policy  # noqa: E402


def _servers(conn, origin_address: str) -> None:
    """Child process: the API fake and the origin (on ``origin_address``); reports their URLs, runs
    until told to stop."""
    from tests.health.servers import OriginServer
    from tests.kubefake.server import FakeKube

    fake = FakeKube().start()
    origin = OriginServer(origin_address).start()
    conn.send((fake.url, origin.url("/generate_204"), origin.url("/ip")))
    conn.recv()
    origin.stop()
    fake.close()


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxies", type=int, default=1000)
    ap.add_argument("--squids", type=int, default=4)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()

    redis_server = RedisServer()
    net = loopback.claim_block()
    parent, child = multiprocessing.Pipe()
    servers = multiprocessing.Process(target=_servers, args=(child, net.host(1)), daemon=True)
    servers.start()
    fake_url, health_url, echo_url = parent.recv()
    squids = []
    try:
        for i in range(args.squids):
            address = net.host(10 + i)
            port = free_port(address)
            # the health origin is on loopback: exempt it as an operator would (allowedDestinations)
            policy = loopback_policy(squid_conf.SquidPolicy(extra=(f"tcp_outgoing_address {address}",)))
            squids.append(SquidProcess(address, port, squid_conf.render(port, policy)).start())
        cfg = k8s.Configuration()
        cfg.host = fake_url
        api_client = k8s.ApiClient(cfg)
        api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = 16
        kube = Kube(api_client)
        r = redis.Redis.from_url(redis_server.url, decode_responses=True)

        def make(i: int) -> None:
            sq = squids[i % len(squids)]
            body = {"apiVersion": API_VERSION, "kind": KIND,
                    "metadata": {"name": f"px-{i:05d}", "namespace": "bench"},
                    "spec": {"mode": "External", "endpoint": {"host": sq.address, "port": sq.port},
                             "healthCheck": {"url": health_url, "intervalSeconds": 30, "timeoutSeconds": 10}}}
            kube.custom.create_namespaced_custom_object(GROUP, VERSION, "bench", PLURAL, body)
            kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, "bench", PLURAL, f"px-{i:05d}",
                                                              {"status": {"phase": "Running"}})
            proxy = kube.get_proxy("bench", f"px-{i:05d}")
            serving.publish(r, proxy, address=sq.address, port=sq.port, phase="Running")

        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(make, range(args.proxies)))
        print(f"probe bench: {args.proxies} External Proxies on {args.squids} Squids, batches of {args.batch}, "
              f"{args.concurrency} probes in flight per batch, {os.cpu_count()} CPUs "
              f"(setup {time.monotonic() - t0:.0f} s)")

        # the Squids and the origin run on loopback, which probes may not reach by default
        settings = HealthSettings(echo_url=echo_url, batch_size=args.batch, concurrency=args.concurrency,
                                  allowed_ranges=("127.0.0.0/8",))

        def get_proxy(namespace, name):
            p = kube.get_proxy(namespace, name)
            return p.raw if p else None

        def patch_status(namespace, name, status, resource_version=None):
            # as app.kube.patch_proxy_status: the resourceVersion is a precondition
            body: dict = {"status": status}
            if resource_version:
                body["metadata"] = {"resourceVersion": resource_version}
            return kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, body)

        for n, label in enumerate(("sweep 1 (all turn Ready, learn egress IPs)", "sweep 2 (steady state)")):
            when = time.time() + n * 31  # sweep 2 as if the 30 s interval were over
            cpu0, wall0 = cpu_seconds(), time.monotonic()
            batches = schedule.sweep(r, settings, now=when)
            totals = engine.BatchReport()
            for uids in batches:
                rep = engine.probe_batch(r, uids, settings, get_proxy=get_proxy, patch_status=patch_status)
                totals.probed += rep.probed
                totals.succeeded += rep.succeeded
                totals.status_written += rep.status_written
            wall, cpu = time.monotonic() - wall0, cpu_seconds() - cpu0
            print(f"  {label}: {totals.probed} probes ({totals.succeeded} ok) in {len(batches)} batches, "
                  f"{totals.status_written} status writes: wall {wall:.1f} s, CPU {cpu:.1f} s "
                  f"({cpu / wall:.2f} cores while sweeping; {cpu / 30:.3f} cores sustained at intervalSeconds 30)")
        ready = sum(1 for p in Kube(api_client).list_proxies() if p.phase == "Ready")
        egress = sum(1 for rec in serving.all_records(r).values() if rec.get("egressIP"))
        print(f"  Ready in the API: {ready}; egress IP known: {egress}")
    finally:
        for sq in squids:
            sq.stop()
        parent.send("stop")
        servers.join(10)
        redis_server.stop()


if __name__ == "__main__":
    main()
