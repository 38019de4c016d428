"""Pipeline benchmark: N Proxies applied to the API fake, through the real watcher and workers.

Starts a private Redis, the Kubernetes API fake in a process of its own (no kubelet stand-in:
Pods stay Pending, so the figure is apply -> Provisioning; its CPU is not the bench's),
``proxy-operator watch`` and ``celery -A workers worker`` through their real commands, applies
N Proxies (as fast as a few client threads can, or paced), and prints:

* Proxies/s from the first apply to the last Proxy reaching ``Provisioning``;
* watch-event -> task-start latency p50/p95/p99: the event time is when an independent watch on
  the fake delivers the ADDED event; the task start is the ``task-started`` Celery event of
  the ``proxy.create`` task carrying that Proxy's UID;
* the CPU seconds each process used (``/proc/<pid>/stat`` of every process of its group:
  a prefork worker's children included).

``--deployed`` runs the workers exactly as ``deploy/base/worker.yaml`` and
``deploy/base/health-worker.yaml`` do: each Deployment's ``args`` (prefork, ``-Q``, ``-E``,
``--concurrency`` ...) and ``replicas``, each replica with the ``METRICS_BIND`` and
``PROMETHEUS_MULTIPROC_DIR`` its Deployment sets (only a node name, ``-n workerN@%h`` /
``-n health-workerN@%h``, is added: the replicas share one host here).  The health-workers
(``-Q health``) get no task here (no beat, no Pod becomes Ready), but they run, consume and
use the cores as deployed.  ``--trace`` also follows each
create message through Redis (``MONITOR``: when the watcher's ``LPUSH`` reached Redis) and the
worker (``task-received``: when its consumer took the message), and splits the latency into
watch -> published -> received -> started.

Usage: ``python bench/pipeline.py [--proxies 500] [--workers 2] [--pool threads] [--concurrency 8] [--rate 0]``,
or ``python bench/pipeline.py --deployed --rate 50 --duration 60 --warmup 100 [--trace]``
(``--rate R`` paces the applies at R per second, to see the latency at a steady rate rather
than the queueing of one burst; ``--duration S`` applies ``R x S`` Proxies; ``--warmup N``
first applies N Proxies that are not measured, so every process has run its first tasks, as a
worker that has been running for a while has).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client as k8s  # noqa: E402
from kubernetes import watch as k8s_watch  # noqa: E402

from app.resources import GROUP, PLURAL, VERSION  # noqa: E402
from devcluster.redis_server import RedisServer, free_port  # noqa: E402
from tests.support.processes import BIN, Process, celery_worker, watcher  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
WORKER_YAML = ROOT / "deploy" / "base" / "worker.yaml"
HEALTH_WORKER_YAML = ROOT / "deploy" / "base" / "health-worker.yaml"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (q in 0..100)."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def deployed_worker(path: Path = WORKER_YAML, name: str = "worker") -> tuple[list[str], int, dict[str, str]]:
    """The Deployment ``name`` of ``path`` (deploy/base/worker.yaml's ``worker`` by default,
    deploy/base/health-worker.yaml's ``health-worker``): its ``args``, ``replicas`` and plain
    ``env`` values."""
    import yaml

    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "Deployment" and doc["metadata"]["name"] == name:
            container = doc["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
            return list(container["args"]), int(doc["spec"].get("replicas", 1)), env
    raise SystemExit(f"no {name} Deployment in {path}")


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system, reaped children included) of every live process in group ``pgid``."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 (pgrp), counted after the ")" of the name
            total += sum(int(v) for v in fields[11:15]) / CLK_TCK  # utime stime cutime cstime
    return total


def pid_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _serve_fake(conn) -> None:
    """Child process: the API fake; answers ``count`` and ``cpu`` until told to stop."""
    import resource

    from devcluster.apiserver.server import FakeKube

    fake = FakeKube(history_limit=100000).start()
    conn.send(fake.url)
    while True:
        msg = conn.recv()
        if msg == "count":
            conn.send(fake.request_count())
        elif msg == "cpu":
            ru = resource.getrusage(resource.RUSAGE_SELF)
            conn.send(ru.ru_utime + ru.ru_stime)
        else:
            break
    fake.close()


class CeleryEvents(threading.Thread):
    """Collects ``task-received``/``task-started`` events of ``proxy.create``: uid -> time; and
    the host names of the workers online (``worker-online``/``worker-heartbeat``: the workers
    answer no ping, as they ignore remote control)."""

    def __init__(self, broker_url: str) -> None:
        super().__init__(daemon=True)
        from celery import Celery

        self.app = Celery(broker=broker_url)
        self.uuid_to_uid: dict[str, str] = {}
        self.received: dict[str, float] = {}
        self.started: dict[str, float] = {}
        self.pending_start: dict[str, float] = {}
        self.online: set[str] = set()
        self.ready = threading.Event()
        self.stop_flag = False

    def on_received(self, event) -> None:
        if event.get("name") != "proxy.create":
            return
        args = event.get("args") or ""
        # args is a repr of [namespace, name, uid, attempt]; the uid is the third element.
        parts = [p.strip(" '\"[]") for p in args.split(",")]
        if len(parts) >= 3:
            uid = parts[2]
            self.uuid_to_uid[event["uuid"]] = uid
            self.received.setdefault(uid, event["timestamp"])
            if event["uuid"] in self.pending_start:
                self.started.setdefault(uid, self.pending_start.pop(event["uuid"]))

    def on_started(self, event) -> None:
        uid = self.uuid_to_uid.get(event["uuid"])
        if uid is None:
            self.pending_start[event["uuid"]] = event["timestamp"]
        else:
            self.started.setdefault(uid, event["timestamp"])

    def run(self) -> None:
        with self.app.connection() as conn:
            def online(event) -> None:
                self.online.add(event["hostname"])

            recv = self.app.events.Receiver(conn, handlers={"task-received": self.on_received,
                                                             "task-started": self.on_started,
                                                             "worker-online": online, "worker-heartbeat": online})
            self.ready.set()
            while not self.stop_flag:
                try:
                    recv.capture(limit=None, timeout=1, wakeup=False)
                except Exception as exc:  # noqa: BLE001 - socket timeout: loop and check stop_flag
                    if not self.stop_flag and not isinstance(exc, (TimeoutError, OSError)):
                        print(f"event receiver: {type(exc).__name__}: {exc}", file=sys.stderr)


class Publishes(threading.Thread):
    """``MONITOR`` of the broker: Proxy name -> when the first ``LPUSH`` of its ``proxy.create`` reached Redis."""

    _NAME = re.compile(r"bench-(\d{5})")

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        import redis

        self.r = redis.Redis.from_url(url)
        self.published: dict[str, float] = {}
        self.ready = threading.Event()

    def run(self) -> None:
        import redis

        with self.r.monitor() as m:
            self.ready.set()
            try:
                for cmd in m.listen():
                    text = cmd.get("command") or ""
                    if not text.startswith("LPUSH proxies ") or "proxy.create" not in text:
                        continue
                    found = self._NAME.search(text)
                    if found:
                        self.published.setdefault(f"bench-{found.group(1)}", cmd["time"])
            except redis.ConnectionError:  # the server stopped at the end of the run
                pass


def stats(values: list[float]) -> str:
    """``p50 / p95 / p99 / max`` of seconds, in milliseconds."""
    if not values:
        return "no samples"
    return (f"p50 {percentile(values, 50) * 1000:.0f} ms, p95 {percentile(values, 95) * 1000:.0f} ms, "
            f"p99 {percentile(values, 99) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms (n={len(values)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxies", type=int, default=500)
    parser.add_argument("--pool", default="threads", choices=("threads", "prefork"))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--deployed", action="store_true",
                        help="workers as deploy/base/worker.yaml and health-worker.yaml run them "
                             "(ignores --pool/--concurrency/--workers)")
    parser.add_argument("--clients", type=int, default=4, help="threads applying Proxies")
    parser.add_argument("--rate", type=float, default=0, help="applies per second (0 = as fast as possible)")
    parser.add_argument("--duration", type=float, default=0, help="with --rate: apply for this many seconds")
    parser.add_argument("--warmup", type=int, default=0,
                        help="apply this many Proxies (at --rate) and let them reach Provisioning before measuring")
    parser.add_argument("--trace", action="store_true", help="split the latency by stage (Redis MONITOR)")
    parser.add_argument("--worker-args", default="",
                        help="with --deployed: more options of the `worker` Deployment's processes, after the "
                             "deployed ones (to try a change; the health-workers run as deployed)")
    parser.add_argument("--worker-log-level", default="WARNING", help="LOG_LEVEL of the workers (their logs stay in /tmp)")
    args = parser.parse_args()
    if args.rate and args.duration:
        args.proxies = int(args.rate * args.duration)

    workdir = tempfile.mkdtemp(prefix="bench-pipeline-")
    redis = RedisServer()
    fake_conn, child = SPAWN.Pipe()
    fake_proc = SPAWN.Process(target=_serve_fake, args=(child,), daemon=True)
    fake_proc.start()
    fake_url = fake_conn.recv()
    procs: list[Process] = []
    workers: list[Process] = []
    try:
        from devcluster.apiserver.server import write_kubeconfig

        kubeconfig = write_kubeconfig(os.path.join(workdir, "kubeconfig"), fake_url)
        providers = os.path.join(workdir, "providers.yaml")
        Path(providers).write_text("providers:\n  - name: k8s-local\n    type: kubernetes\n    checkInterval: 0\n")
        env = {"KUBECONFIG": kubeconfig, "REDIS_URL": redis.url, "PROVIDERS_CONFIG": providers,
               "POLL_INITIAL": "30", "LOG_LEVEL": "WARNING"}
        events = CeleryEvents(redis.url)
        events.start()
        events.ready.wait(10)
        publishes = None
        if args.trace:
            publishes = Publishes(redis.url)
            publishes.start()
            publishes.ready.wait(10)
        if args.deployed:
            descs = []
            for path, deployment in ((WORKER_YAML, "worker"), (HEALTH_WORKER_YAML, "health-worker")):
                argv, replicas, deploy_env = deployed_worker(path, deployment)
                if deployment == "worker":
                    argv += args.worker_args.split()
                descs.append(f"{deployment}: {' '.join(argv)} x {replicas} replicas")
                for i in range(replicas):
                    mp_dir = os.path.join(workdir, f"prometheus-{deployment}-{i}")
                    os.makedirs(mp_dir)
                    wenv = {**env, "LOG_LEVEL": args.worker_log_level, "METRICS_BIND": f"127.0.0.1:{free_port()}", "PROMETHEUS_MULTIPROC_DIR": mp_dir}
                    if "PROMETHEUS_MULTIPROC_DIR" not in deploy_env:
                        wenv.pop("PROMETHEUS_MULTIPROC_DIR")
                    workers.append(Process(f"{deployment}{i}", [str(BIN / argv[0]), *argv[1:], "-n", f"{deployment}{i}@%h"],
                                           wenv).start())
            desc = "deployed: " + "; ".join(descs)
        else:
            desc = f"worker pool {args.pool} x{args.concurrency}, {args.workers} worker process(es)"
            for i in range(args.workers):
                workers.append(celery_worker({**env, "LOG_LEVEL": args.worker_log_level}, pool=args.pool, concurrency=args.concurrency,
                                             name=f"worker{i}").start())
        procs += workers
        deadline = time.monotonic() + 90
        while len(events.online) < len(workers):  # workers log only warnings here
            if time.monotonic() > deadline:
                raise SystemExit("workers did not come online:\n" + "\n".join(p.log()[-2000:] for p in workers))
            time.sleep(0.2)
        w = watcher({**env, "LOG_LEVEL": "INFO"}).start()
        procs.append(w)
        w.wait_for_log("leading: streaming Proxy events", timeout=60)
        time.sleep(1)  # initial list done, watch open

        cfg = k8s.Configuration()
        cfg.host = fake_url
        api = k8s.ApiClient(cfg)
        api.rest_client.pool_manager.connection_pool_kw["maxsize"] = args.clients
        custom = k8s.CustomObjectsApi(api)
        added: dict[str, float] = {}
        names: dict[str, str] = {}
        warm: set[str] = set()
        provisioning: dict[str, float] = {}
        done = threading.Event()

        def observe() -> None:
            w = k8s_watch.Watch()
            for ev in w.stream(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, timeout_seconds=900):
                now = time.time()
                obj = ev["object"]
                uid = obj["metadata"]["uid"]
                if obj["metadata"]["name"].startswith("warm-"):
                    if (obj.get("status") or {}).get("phase") == "Provisioning":
                        warm.add(uid)
                    continue
                if ev["type"] == "ADDED":
                    added.setdefault(uid, now)
                    names[uid] = obj["metadata"]["name"]
                if (obj.get("status") or {}).get("phase") == "Provisioning":
                    provisioning.setdefault(uid, now)
                    if len(provisioning) >= args.proxies:
                        done.set()
                        w.stop()

        observer = threading.Thread(target=observe, daemon=True)
        observer.start()
        time.sleep(0.5)

        def apply(i: int, prefix: str = "bench") -> None:
            if args.rate:
                time.sleep(max(0.0, start + i / args.rate - time.time()))
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
                    "metadata": {"name": f"{prefix}-{i:05d}", "namespace": "default"},
                    "spec": {"provider": "k8s-local"}}
            custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)

        if args.warmup:
            # Every process has run its first tasks (a deployed worker has long been running):
            # what is measured is the steady latency, not the first seconds after a start.
            start = time.time()
            with ThreadPoolExecutor(args.clients) as pool:
                list(pool.map(lambda i: apply(i, "warm"), range(args.warmup)))
            deadline = time.monotonic() + 120
            while len(warm) < args.warmup and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1)

        cpu0 = {p.name: group_cpu(p.proc.pid) for p in procs}
        main0 = {p.name: pid_cpu(p.proc.pid) for p in workers}
        fake_conn.send("cpu")
        fake_cpu0 = fake_conn.recv()
        redis_cpu0 = pid_cpu(redis.proc.pid)
        start = time.time()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(apply, range(args.proxies)))
        applied = time.time()
        finished = done.wait(600)
        end = max(provisioning.values()) if provisioning else time.time()
        cpu = {p.name: group_cpu(p.proc.pid) - cpu0[p.name] for p in procs}
        main = {p.name: pid_cpu(p.proc.pid) - main0[p.name] for p in workers}
        fake_conn.send("cpu")
        fake_cpu = fake_conn.recv() - fake_cpu0
        redis_cpu = pid_cpu(redis.proc.pid) - redis_cpu0
        time.sleep(1.5)  # the last task-started events
        events.stop_flag = True

        lat = [events.started[uid] - t for uid, t in added.items() if uid in events.started]
        load = os.getloadavg()
        print(f"proxies: {args.proxies} ({desc}; applied {'at %.0f/s' % args.rate if args.rate else 'as fast as possible'}"
              f"{f' after {args.warmup} warm-up Proxies' if args.warmup else ''}; "
              f"load average {load[0]:.1f} {load[1]:.1f})")
        print(f"apply phase: {applied - start:.2f}s ({args.proxies / (applied - start):.1f} applies/s)")
        print(f"reached Provisioning: {len(provisioning)}/{args.proxies}{'' if finished else ' (TIMED OUT)'}")
        print(f"apply -> Provisioning: {end - start:.2f}s = {len(provisioning) / (end - start):.1f} Proxies/s")
        print(f"watch-event -> task-start: {stats(lat)}")
        window = 10.0
        timeline: dict[int, list[float]] = {}
        for uid, t in added.items():
            if uid in events.started:
                timeline.setdefault(int((t - start) // window), []).append(events.started[uid] - t)
        print(f"  by {window:.0f} s of applies: " + " | ".join(
            f"{k * window:.0f}s p50 {percentile(v, 50) * 1000:.0f} max {max(v) * 1000:.0f}"
            for k, v in sorted(timeline.items())) + " (ms)")
        if publishes is not None:
            stages: dict[str, list[float]] = {"watch -> published": [], "published -> received": [],
                                              "received -> started": []}
            rows = []
            for uid, t in added.items():
                pub = publishes.published.get(names.get(uid, ""))
                rec, sta = events.received.get(uid), events.started.get(uid)
                if pub is None or rec is None or sta is None:
                    continue
                parts = (pub - t, rec - pub, sta - rec)
                for key, value in zip(stages, parts):
                    stages[key].append(value)
                rows.append((sta - t, parts))
            for key, values in stages.items():
                print(f"  {key}: {stats(values)}")
            rows.sort(reverse=True)
            worst = rows[:max(1, len(rows) // 100)]
            if worst:
                mean = [sum(r[1][k] for r in worst) / len(worst) * 1000 for k in range(3)]
                print(f"  slowest 1% ({len(worst)}): mean watch->published {mean[0]:.0f} ms, published->received "
                      f"{mean[1]:.0f} ms, received->started {mean[2]:.0f} ms")
        span = end - start
        print("CPU seconds over the run (" + f"{span:.0f} s): "
              + ", ".join(f"{name} {value:.1f}" + (f" (main process {main[name]:.1f})" if name in main else "")
                          for name, value in cpu.items())
              + f", API fake {fake_cpu:.1f}, redis {redis_cpu:.1f}")
        fake_conn.send("count")
        print(f"API requests served: {fake_conn.recv()}")
        return 0 if finished else 1
    finally:
        for p in procs:
            p.stop()
        fake_conn.send("stop")
        fake_proc.join(10)
        redis.stop()


if __name__ == "__main__":
    sys.exit(main())
