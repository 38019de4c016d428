"""Pipeline benchmark: N Proxies applied to the API fake, through the real watcher and workers.

Starts a private Redis, the Kubernetes API fake (no kubelet stand-in: Pods stay Pending, so
the figure is apply -> Provisioning), ``proxy-operator watch`` and ``celery -A workers
worker`` through their real commands, applies N Proxies as fast as a few client threads can,
and prints:

* Proxies/s from the first apply to the last Proxy reaching ``Provisioning``;
* watch-event -> task-start latency p50/p99: the event time is when an independent watch on
  the fake delivers the ADDED event; the task start is the ``task-started`` Celery event of
  the ``proxy.create`` task carrying that Proxy's UID.

Usage: ``python bench/pipeline.py [--proxies 500] [--workers 2] [--pool threads] [--concurrency 8] [--rate 0]``
(``--rate R`` paces the applies at R per second, to see the latency at a steady rate rather
than the queueing of one burst).
"""

from __future__ import annotations

import argparse
import os
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
from tests.kubefake.server import FakeKube  # noqa: E402
from tests.support.processes import Process, celery_worker, watcher  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (q in 0..100)."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


class CeleryEvents(threading.Thread):
    """Collects ``task-received``/``task-started`` events: uid -> start time of its create task."""

    def __init__(self, broker_url: str) -> None:
        super().__init__(daemon=True)
        from celery import Celery

        self.app = Celery(broker=broker_url)
        self.uuid_to_uid: dict[str, str] = {}
        self.started: dict[str, float] = {}
        self.pending_start: dict[str, float] = {}
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
            recv = self.app.events.Receiver(conn, handlers={"task-received": self.on_received,
                                                             "task-started": self.on_started})
            self.ready.set()
            while not self.stop_flag:
                try:
                    recv.capture(limit=None, timeout=1, wakeup=False)
                except Exception as exc:  # noqa: BLE001 - socket timeout: loop and check stop_flag
                    if not self.stop_flag and not isinstance(exc, (TimeoutError, OSError)):
                        print(f"event receiver: {type(exc).__name__}: {exc}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxies", type=int, default=500)
    parser.add_argument("--pool", default="threads", choices=("threads", "prefork"))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--clients", type=int, default=4, help="threads applying Proxies")
    parser.add_argument("--rate", type=float, default=0, help="applies per second (0 = as fast as possible)")
    args = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="bench-pipeline-")
    redis = RedisServer()
    fake = FakeKube(history_limit=100000).start()
    procs: list[Process] = []
    try:
        kubeconfig = fake.write_kubeconfig(os.path.join(workdir, "kubeconfig"))
        providers = os.path.join(workdir, "providers.yaml")
        Path(providers).write_text("providers:\n  - name: k8s-local\n    type: kubernetes\n    checkInterval: 0\n")
        env = {"KUBECONFIG": kubeconfig, "REDIS_URL": redis.url, "PROVIDERS_CONFIG": providers,
               "POLL_INITIAL": "30", "LOG_LEVEL": "WARNING"}
        events = CeleryEvents(redis.url)
        events.start()
        events.ready.wait(10)
        for i in range(args.workers):
            procs.append(celery_worker(env, pool=args.pool, concurrency=args.concurrency, name=f"worker{i}").start())
        deadline = time.monotonic() + 60
        while len(events.app.control.ping(timeout=1) or []) < args.workers:  # workers log only warnings here
            if time.monotonic() > deadline:
                raise SystemExit("workers did not answer ping:\n" + "\n".join(p.log()[-2000:] for p in procs))
        w = watcher({**env, "LOG_LEVEL": "INFO"}).start()
        procs.append(w)
        w.wait_for_log("leading: streaming Proxy events", timeout=60)
        time.sleep(1)  # initial list done, watch open

        api = fake.api_client()
        custom = k8s.CustomObjectsApi(api)
        added: dict[str, float] = {}
        provisioning: dict[str, float] = {}
        done = threading.Event()

        def observe() -> None:
            w = k8s_watch.Watch()
            for ev in w.stream(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, timeout_seconds=600):
                now = time.time()
                obj = ev["object"]
                uid = obj["metadata"]["uid"]
                if ev["type"] == "ADDED":
                    added.setdefault(uid, now)
                if (obj.get("status") or {}).get("phase") == "Provisioning":
                    provisioning.setdefault(uid, now)
                    if len(provisioning) >= args.proxies:
                        done.set()
                        w.stop()

        observer = threading.Thread(target=observe, daemon=True)
        observer.start()
        time.sleep(0.5)

        def apply(i: int) -> None:
            if args.rate:
                time.sleep(max(0.0, start + i / args.rate - time.time()))
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
                    "metadata": {"name": f"bench-{i:04d}", "namespace": "default"},
                    "spec": {"provider": "k8s-local"}}
            custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)

        start = time.time()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(apply, range(args.proxies)))
        applied = time.time()
        finished = done.wait(600)
        end = max(provisioning.values()) if provisioning else time.time()
        events.stop_flag = True

        lat = [events.started[uid] - t for uid, t in added.items() if uid in events.started]
        print(f"proxies: {args.proxies} (worker pool {args.pool} x{args.concurrency}, {args.workers} worker "
              f"process(es), applied {'at %.0f/s' % args.rate if args.rate else 'as fast as possible'})")
        print(f"apply phase: {applied - start:.2f}s ({args.proxies / (applied - start):.1f} applies/s)")
        print(f"reached Provisioning: {len(provisioning)}/{args.proxies}{'' if finished else ' (TIMED OUT)'}")
        print(f"apply -> Provisioning: {end - start:.2f}s = {len(provisioning) / (end - start):.1f} Proxies/s")
        if lat:
            print(f"watch-event -> task-start: p50 {percentile(lat, 50) * 1000:.0f} ms, "
                  f"p99 {percentile(lat, 99) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms (n={len(lat)})")
        print(f"API requests served: {fake.request_count()}")
        return 0 if finished else 1
    finally:
        for p in procs:
            p.stop()
        fake.close()
        redis.stop()


if __name__ == "__main__":
    sys.exit(main())
