"""Probe benchmark: health sweeps over N External Proxies pointed at a few local Squids.

Starts a private Redis, real Squids on a loopback block claimed for the run
(:mod:`devcluster.loopback`), and — in a separate process so their CPU is not counted as
the prober's — the Kubernetes API fake and the origin (health URL + IP echo).  Seeds N
External Proxies (phase Running) straight into the fake (``Store.seed``: no HTTP), publishes
them to the serving view as the reconciler does when they reach Running, then runs sweeps the
way the ``health`` workers do: :func:`app.probes.schedule.sweep` claims the due proxies (at most
``sweep_limit`` per claim, so 10,000 take two claims, as two beat ticks would), and each batch
goes through :func:`app.probes.engine.probe_batch` exactly as the ``health.probe_batch`` task
calls it (concurrent probes, Redis writes, status writes through the real kubernetes client),
on ``--processes`` forked worker processes (the prefork children of the health workers).

Prints for each sweep its wall time, the CPU seconds of the probing processes (user +
system, ``/proc/<pid>/stat``), CPU per probe, with how many probes succeeded and how many
status writes it did, and the CPU of Redis, the Squids and the fake + origin over the same span:

* sweep 1 — every Proxy turns Ready (a status write each) and learns its egress IP;
* sweeps 2.. — steady state (probes and Redis writes only).

Targets (docs/performance.md, "Probes"): 1,000 proxies in one sweep < 30 s on < 1 core; 10,000
proxies within one 30 s interval on < 0.5 core in steady state (CPU seconds per steady sweep
< 15).

Usage: ``python bench/probes.py [--proxies 1000] [--squids 4] [--batch 50] [--concurrency 64]
[--processes 1] [--sweeps 3] [--profile FILE]`` (``--profile``: cProfile, CPU time, of the last
sweep in every probing process, written to FILE.<n>).
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from app.serving import view as serving  # noqa: E402
from app.squid import conf as squid_conf  # noqa: E402
from app.probes import engine, schedule  # noqa: E402
from app.probes.settings import HealthSettings  # noqa: E402
from app.resources import API_VERSION, KIND  # noqa: E402
from devcluster import loopback  # noqa: E402
from devcluster.redis_server import RedisServer, free_port  # noqa: E402
from devcluster.squid import SquidProcess, loopback_policy  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
FORK = multiprocessing.get_context("fork")
CLK_TCK = os.sysconf("SC_CLK_TCK")
NAMESPACE = "bench"


def pid_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _servers(conn, origin_address: str) -> None:
    """Child process: the API fake and the origin (on ``origin_address``); seeds Proxies and
    reports its CPU on request, until told to stop."""
    import resource

    from devcluster.apiserver.server import FakeKube
    from tests.health.servers import OriginServer

    fake = FakeKube().start()
    origin = OriginServer(origin_address).start()
    conn.send((fake.url, origin.url("/generate_204"), origin.url("/ip")))
    while True:
        msg = conn.recv()
        if msg[0] == "seed":
            _, n, endpoints, health_url = msg
            objs = []
            for i in range(n):
                host, port = endpoints[i % len(endpoints)]
                objs.append({"apiVersion": API_VERSION, "kind": KIND,
                             "metadata": {"name": f"px-{i:05d}", "namespace": NAMESPACE},
                             "spec": {"mode": "External", "endpoint": {"host": host, "port": port},
                                      "healthCheck": {"url": health_url, "intervalSeconds": 30,
                                                      "timeoutSeconds": 10}},
                             "status": {"phase": "Running"}})
            conn.send(fake.store.seed("proxies", objs))
        elif msg[0] == "cpu":
            ru = resource.getrusage(resource.RUSAGE_SELF)
            conn.send(ru.ru_utime + ru.ru_stime)
        else:
            break
    origin.server.shutdown()
    fake.close()


def _prober(conn, redis_url: str, settings: HealthSettings, profile: str | None) -> None:
    """Forked child: runs ``probe_batch`` for every batch it is sent, as a health worker's
    prefork child runs the ``health.probe_batch`` task; answers ``None`` with totals."""
    import cProfile

    from app.kube.gateway import KubernetesGateway

    r = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=10, socket_connect_timeout=5,
                             socket_keepalive=True)
    kube = KubernetesGateway(record_writes=False)  # what health_tasks._credentials gives the task
    prof = None
    while True:
        msg = conn.recv()
        if msg is None:
            break
        if msg == "profile":
            prof = cProfile.Profile(time.process_time)
            continue
        if msg == "dump":
            if prof is not None and profile:
                prof.dump_stats(f"{profile}.{os.getpid()}")
            prof = None
            conn.send("dumped")
            continue
        if prof is not None:
            prof.enable()
        rep = engine.probe_batch(r, msg, settings, kube=kube, events=True)
        if prof is not None:
            prof.disable()
        conn.send((rep.probed, rep.succeeded, rep.status_written, rep.status_errors))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxies", type=int, default=1000)
    ap.add_argument("--squids", type=int, default=4)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--processes", type=int, default=1, help="probing processes (prefork children)")
    ap.add_argument("--sweeps", type=int, default=3)
    ap.add_argument("--profile", default=None, help="cProfile the last sweep of each probing process into FILE.<pid>")
    args = ap.parse_args()

    redis_server = RedisServer()
    net = loopback.claim_block()
    parent, child = SPAWN.Pipe()
    servers = SPAWN.Process(target=_servers, args=(child, net.host(1)), daemon=True)
    servers.start()
    fake_url, health_url, echo_url = parent.recv()
    squids: list[SquidProcess] = []
    probers: list[tuple] = []
    workdir = tempfile.mkdtemp(prefix="bench-probes-")
    try:
        for i in range(args.squids):
            address = net.host(10 + i)
            port = free_port(address)
            # the health origin is on loopback: exempt it as an operator would (allowedDestinations)
            policy = loopback_policy(squid_conf.SquidPolicy(extra=(f"tcp_outgoing_address {address}",)))
            squids.append(SquidProcess(address, port, squid_conf.render(port, policy)).start())
        from devcluster.apiserver.server import write_kubeconfig

        os.environ["KUBECONFIG"] = write_kubeconfig(os.path.join(workdir, "kubeconfig"), fake_url)
        from app.kube.gateway import KubernetesGateway

        t0 = time.monotonic()
        parent.send(("seed", args.proxies, [(sq.address, sq.port) for sq in squids], health_url))
        parent.recv()
        r = redis.Redis.from_url(redis_server.url, decode_responses=True)
        kube = KubernetesGateway()
        for proxy in kube.list_proxies():
            host, port = _endpoint(proxy)
            serving.publish(r, proxy, address=host, port=port, phase="Running")
        print(f"probe bench: {args.proxies} External Proxies on {args.squids} Squids, batches of {args.batch}, "
              f"{args.concurrency} probes in flight per batch, {args.processes} probing process(es), "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (setup {time.monotonic() - t0:.0f} s)")

        # the Squids and the origin run on loopback, which probes may not reach by default
        settings = HealthSettings(echo_url=echo_url, batch_size=args.batch, concurrency=args.concurrency,
                                  allowed_ranges=("127.0.0.0/8",))
        for _ in range(args.processes):
            a, b = FORK.Pipe()
            proc = FORK.Process(target=_prober, args=(b, redis_server.url, settings, args.profile), daemon=True)
            proc.start()
            probers.append((proc, a))

        steady: list[tuple[float, float, int]] = []  # (wall, CPU, probes) of each steady sweep
        for n in range(args.sweeps):
            label = "sweep 1 (all turn Ready, learn egress IPs)" if n == 0 else f"sweep {n + 1} (steady state)"
            last = n == args.sweeps - 1
            if last and args.profile:
                for _, conn in probers:
                    conn.send("profile")
            cpu0 = sum(pid_cpu(p.pid) for p, _ in probers)
            other0 = _others(parent, redis_server, squids)
            wall0 = time.monotonic()
            claimed, batches = 0, []
            while True:  # as beat's ticks would, until nothing is due (sweep_limit per claim)
                got = schedule.sweep(r, settings, now=time.time() + 1000 * (n + 1))
                if not got:
                    break
                claimed += sum(map(len, got))
                batches += got
            totals = [0, 0, 0, 0]
            pending = list(batches)
            busy = {}
            for _proc, conn in probers:  # one batch per process at a time, like a prefork child
                if pending:
                    conn.send(pending.pop(0))
                    busy[conn] = True
            while busy:
                ready = multiprocessing.connection.wait(list(busy))
                for conn in ready:
                    res = conn.recv()
                    totals = [t + v for t, v in zip(totals, res)]
                    if pending:
                        conn.send(pending.pop(0))
                    else:
                        del busy[conn]
            wall = time.monotonic() - wall0
            cpu = sum(pid_cpu(p.pid) for p, _ in probers) - cpu0
            other = [b - a for a, b in zip(other0, _others(parent, redis_server, squids))]
            probed = max(1, totals[0])
            print(f"  {label}: {totals[0]} probes ({totals[1]} ok) in {len(batches)} batches, "
                  f"{totals[2]} status writes ({totals[3]} failed): wall {wall:.1f} s, CPU {cpu:.2f} s "
                  f"= {cpu / probed * 1000:.2f} ms per probe ({cpu / wall:.2f} cores while sweeping; "
                  f"{cpu / 30:.3f} cores sustained at intervalSeconds 30); "
                  f"Redis {other[0]:.2f} s, Squids {other[1]:.2f} s, fake + origin {other[2]:.2f} s")
            if n:
                steady.append((wall, cpu, totals[0]))
            if last and args.profile:
                for _, conn in probers:
                    conn.send("dump")
                    conn.recv()
        if steady:
            walls = sorted(w for w, _, _ in steady)
            per_probe = sorted(c / max(1, k) * 1000 for _, c, k in steady)
            cpus = sorted(c for _, c, _ in steady)
            print(f"  steady sweeps ({len(steady)}): wall median {walls[len(walls) // 2]:.1f} s "
                  f"({walls[0]:.1f}-{walls[-1]:.1f}), CPU median {cpus[len(cpus) // 2]:.2f} s "
                  f"({cpus[0]:.2f}-{cpus[-1]:.2f}) = {per_probe[len(per_probe) // 2]:.2f} ms per probe "
                  f"({per_probe[0]:.2f}-{per_probe[-1]:.2f}); "
                  f"{cpus[len(cpus) // 2] / 30:.3f} cores sustained at intervalSeconds 30")
        ready = sum(1 for p in kube.list_proxies() if p.phase == "Ready")
        egress = sum(1 for rec in serving.all_records(r).values() if rec.get("egressIP"))
        print(f"  Ready in the API: {ready}; egress IP known: {egress}")
    finally:
        for proc, conn in probers:
            try:
                conn.send(None)
            except OSError:
                pass
            proc.join(5)
        for sq in squids:
            sq.stop()
        parent.send(("stop",))
        servers.join(10)
        redis_server.stop()


def _endpoint(proxy) -> tuple[str, int]:
    """The ``spec.endpoint`` of an External Proxy."""
    ep = proxy.raw["spec"]["endpoint"]
    return ep["host"], int(ep["port"])


def _tree_cpu(pid: int) -> float:
    """CPU seconds so far of process ``pid`` and its children."""
    total = pid_cpu(pid)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        total += pid_cpu(int(entry))
            except OSError:
                continue
    return total


def _others(parent, redis_server: RedisServer, squids: list[SquidProcess]) -> tuple[float, float, float]:
    """CPU seconds so far of Redis, the Squids (with their helpers) and the fake + origin process."""
    squid_cpu = sum(_tree_cpu(sq.proc.pid) for sq in squids if sq.proc is not None)
    parent.send(("cpu",))
    return pid_cpu(redis_server.proc.pid), squid_cpu, parent.recv()


if __name__ == "__main__":
    main()
