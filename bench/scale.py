"""Scale benchmark: the watcher, the resync and GC over 1,000 to 100,000 kubernetes Proxies.

For each size N it starts the Kubernetes API fake **in a process of its own** (so its CPU is
counted apart from the product's) and seeds it directly, before it serves
(``Store.seed``: no HTTP, no watch events), with N steady Proxies (Ready, finalizer, status
current, ``providerID`` naming their Pod) spread over 10 namespaces, their N Squid Pods
(built by the kubernetes provider's own Pod builder, with a Running status) and N/100 orphan
Pods (managed-by and a Proxy UID that names no Proxy).  A private Redis holds the serving view
(every Proxy published, as the reconciler leaves a Running one) and the broker.

Then each measurement runs in a fresh process (spawned, so RSS and CPU are its own), through
the product's code:

* **watcher**: :func:`watchers.main.run` as ``proxy-operator watch`` runs it (leader election,
  the paged list+watch of :class:`watchers.stream.ProxyStream`, the hand-off, the real
  ``on_event`` of :mod:`watchers.events`); *list* is from leadership to the "listed N
  proxies" log line, *dispatched* until the N-th SYNC went through ``on_event``; RSS at both
  moments and the peak;
* **resync**: the ``proxy.resync`` task body (``workers.tasks.resync``, what beat triggers),
  whatever ``app.proxy.reconcile.decide`` and the dispatcher do with steady Proxies today; messages
  counted in the broker's Redis lists afterwards;
* **gc**: one GC diff as ``gc.collect`` makes it, without the deletes: the provider's
  ``list_by_tag`` (metadata only, paged), the Proxy listing (``kube.list_proxy_refs``, paged,
  consumed by :func:`app.proxy.gc.current_instances`; ``kube.list_proxies`` on a tree without it) and
  :func:`app.proxy.gc.orphans`, the listings with the cyclic
  collector paused as ``collect`` does (:func:`app.proxy.gc.cyclic_gc_paused`); the orphans found are
  checked against the seeded ones.  Time spent in Python's cyclic GC is measured with ``gc.callbacks``;
* **gc (full Pods)**: the same diff with the listing as it was before (one unpaged list of
  full ``V1Pod`` objects, :func:`app.providers.kubernetes.provider.to_instance`), for
  comparison; only up to ``--legacy-max`` Proxies (default 10,000);
* **health**: one beat health sweep's claim (:func:`app.probes.schedule.sweep`) with every
  published Proxy due; the probes themselves are bench/probes.py's subject.

Before the clock starts, each process makes one small list of each kind (the client builds a
validator per API method on its first call, once per process).

Prints, per size, one row per measurement: wall seconds, CPU seconds of the product's process
(user + system), of the fake's and of Redis in the same span, the product's CPU per Proxy,
RSS, and messages sent.  No assertions on time (the machine is shared: see
docs/performance.md).  ``--json PATH`` also writes the figures.

Usage: ``python bench/scale.py [--sizes 1000,10000,100000] [--phases watcher,resync,gc,legacy,health]
[--legacy-max 10000] [--json out.json]``.  100,000 takes several minutes and a few GB.
"""

from __future__ import annotations

import argparse
import contextlib
import gc as pygc
import json
import logging
import multiprocessing
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAMESPACES = 10
PROVIDER = "k8s"
PROVIDERS_YAML = f"providers:\n  - name: {PROVIDER}\n    type: kubernetes\n    checkInterval: 0\n"
SPAWN = multiprocessing.get_context("spawn")


# -- process figures ---------------------------------------------------------------------------
def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all its threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def rss_mb() -> float:
    """Current resident set size of this process, MB (``VmRSS``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process, MB (``ru_maxrss``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pid_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of another process (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the seeded objects ------------------------------------------------------------------------
def proxy_object(i: int, uid: str, now: str) -> dict:
    """A steady managed Proxy: Ready, finalizer set, status current, its Pod recorded."""
    from app.providers import naming
    from app.resources import API_VERSION, FINALIZER, KIND, spec_hash

    ns = f"bench-{i % NAMESPACES}"
    spec = {"mode": "Managed", "provider": PROVIDER, "endpoint": {"port": 3128}, "maxLeases": 5,
            "healthCheck": {"url": "http://connectivitycheck.gstatic.com/generate_204", "expectedStatus": 204,
                            "intervalSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 3,
                            "successThreshold": 1, "rateLimited": "Keep"}}
    name = naming.instance_name(uid)
    conds = [{"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now,
              "observedGeneration": 1} for t, r, m in (
        ("Provisioned", "InstanceRunning", f"instance {name} is running"),
        ("Healthy", "ProbeSucceeded", "GET http://connectivitycheck.gstatic.com/generate_204 answered 204"),
        ("Ready", "Ready", "provisioned and healthy"))]
    address = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": f"px-{i:06d}", "namespace": ns, "uid": uid, "generation": 1,
                         "finalizers": [FINALIZER], "labels": {"pool": f"pool-{i % 7}"}},
            "spec": spec,
            "status": {"phase": "Ready", "provider": PROVIDER, "providerID": f"{ns}/{name}", "instanceName": name,
                       "specHash": spec_hash(spec), "observedGeneration": 1, "address": address, "port": 3128,
                       "egressIP": f"203.0.113.{i % 250}", "conditions": conds}}


def pod_template() -> str:
    """One Squid Pod as the kubernetes provider builds it, with a Running status, as JSON."""
    from kubernetes import client as k8s

    from app.providers import naming
    from app.squid import conf as squid_conf
    from app.config.providers import ProviderConfig
    from app.providers.base import CreateRequest
    from app.providers.kubernetes.config import KubernetesSettings
    from app.providers.kubernetes.provider import KubernetesProvider

    prov = KubernetesProvider(ProviderConfig(PROVIDER, "kubernetes", 60, 15, KubernetesSettings()), client=object())
    uid = "00000000-0000-0000-0000-000000000000"
    req = CreateRequest(name=naming.instance_name(uid), tags=naming.tags_for(uid), namespace="bench-0",
                        port=3128, squid_config=squid_conf.render(3128, None))
    pod = k8s.ApiClient().sanitize_for_serialization(prov._pod(req, "bench-0"))
    pod.update(apiVersion="v1", kind="Pod")
    pod["spec"].update(nodeName="node-1", dnsPolicy="ClusterFirst", schedulerName="default-scheduler",
                       terminationGracePeriodSeconds=30, serviceAccountName="default")
    pod["status"] = {"phase": "Running", "hostIP": "192.0.2.1", "podIP": "10.0.0.1", "qosClass": "BestEffort",
                     "startTime": "2026-01-01T00:00:00Z",
                     "conditions": [{"type": t, "status": "True", "lastProbeTime": None,
                                     "lastTransitionTime": "2026-01-01T00:00:00Z"}
                                    for t in ("PodReadyToStartContainers", "Initialized", "Ready",
                                              "ContainersReady", "PodScheduled")],
                     "containerStatuses": [{"name": "squid", "ready": True, "restartCount": 0, "started": True,
                                            "image": "ubuntu/squid:latest",
                                            "imageID": "docker.io/ubuntu/squid@sha256:" + "0" * 64,
                                            "containerID": "containerd://" + "0" * 64,
                                            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
    return json.dumps(pod)


def seed(fake, n: int) -> dict:
    """Seed ``n`` steady Proxies, their Pods and n/100 orphan Pods; return counts."""
    import uuid

    from app.providers import naming
    from app.providers.kubernetes.provider import LABEL_PROXY_UID
    from devcluster.apiserver import PODS, PROXIES
    from devcluster.apiserver.store import now_rfc3339

    now = now_rfc3339()
    template = pod_template()
    uids = [str(uuid.uuid4()) for _ in range(n)]
    fake.store.seed(PROXIES, (proxy_object(i, uid, now) for i, uid in enumerate(uids)))

    def pod(i: int, uid: str, created: str) -> dict:
        obj = json.loads(template)
        name = naming.instance_name(uid)
        meta = obj["metadata"]
        meta.update(name=name, namespace=f"bench-{i % NAMESPACES}", creationTimestamp=created)
        meta["labels"][LABEL_PROXY_UID] = uid
        obj["status"]["podIP"] = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
        return obj

    fake.store.seed(PODS, (pod(i, uid, now) for i, uid in enumerate(uids)))
    orphans = max(1, n // 100)
    fake.store.seed(PODS, (pod(n + i, str(uuid.uuid4()), "2020-01-01T00:00:00Z") for i in range(orphans)))
    return {"proxies": n, "pods": n + orphans, "orphans": orphans, "pod_json_bytes": len(template)}


def serve_fake(conn, n: int) -> None:
    """Child process: the API fake, seeded with ``n`` Proxies; answers ``usage``/``stop`` on ``conn``."""
    from devcluster.apiserver.server import FakeKube

    fake = FakeKube(bookmark_interval=5.0)
    t0 = time.monotonic()
    counts = seed(fake, n)
    counts["seed_s"] = time.monotonic() - t0
    fake.start()
    conn.send((fake.url, counts))
    while True:
        msg = conn.recv()
        if msg == "usage":
            conn.send((cpu_seconds(), rss_mb()))
        else:
            break
    fake.close()


# -- setup (not measured) ----------------------------------------------------------------------
def list_proxies_paged():
    """Every Proxy, listed in pages (setup only)."""
    from kubernetes import client as k8s

    from app.kube.gateway import api_client
    from app.resources import GROUP, PLURAL, VERSION, Proxy

    api = k8s.CustomObjectsApi(api_client())
    token = None
    while True:
        page = api.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=500, _continue=token)
        yield from (Proxy.from_dict(o) for o in page["items"])
        token = page["metadata"].get("continue")
        if not token:
            return


def setup_publish() -> dict:
    """Publish every Proxy to the serving view, as the reconciler leaves a Running one."""
    from concurrent.futures import ThreadPoolExecutor

    import redis

    from app.serving import view as serving
    from app.config.settings import Settings

    r = redis.Redis.from_url(Settings.from_env().redis_url, decode_responses=True)
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        done = sum(1 for _ in pool.map(lambda p: serving.publish(r, p, address=p.status["address"], port=3128,
                                                                 phase=p.phase), list_proxies_paged()))
    return {"published": done, "wall": time.monotonic() - t0}


# -- measured phases (each in a fresh process) -------------------------------------------------
class _GcTimer:
    """CPU seconds spent in Python's cyclic garbage collector (``gc.callbacks``; the collecting
    thread's CPU time, so time the process waits for a core is not counted)."""

    def __init__(self) -> None:
        self.total, self.collections, self._t = 0.0, 0, 0.0
        pygc.callbacks.append(self._cb)

    def _cb(self, phase, info) -> None:
        if phase == "start":
            self._t = time.thread_time()
        else:
            self.total += time.thread_time() - self._t
            self.collections += 1


def warm_up() -> float:
    """One small list of each kind this process will make, before the clock starts; return its seconds.

    The client validates each method's arguments with a pydantic model built on the method's
    first call (a few hundred ms): a cost a long-lived process pays once, kept out of the figures.
    """
    from kubernetes import client as k8s

    from app.kube.gateway import api_client
    from app.resources import GROUP, PLURAL, VERSION

    t0 = time.monotonic()
    client = api_client()
    k8s.CustomObjectsApi(client).list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)
    k8s.CoreV1Api(client).list_pod_for_all_namespaces(limit=1)
    return time.monotonic() - t0


def phase_watcher(n: int) -> dict:
    """The watcher's list+watch and dispatch of N SYNC events, as ``proxy-operator watch`` runs it."""
    from watchers.main import WatcherSettings, run
    try:
        from watchers.events import make_on_event
    except ImportError:  # before the dispatcher moved out of the worker package
        from workers.watch_dispatch import make_on_event
    import inspect

    from workers.celery_app import send
    # the publisher is injected (as proxy-operator watch does), except in releases where the handler imported it
    on_event = make_on_event(send) if "send" in inspect.signature(make_on_event).parameters else make_on_event()
    cold = warm_up()
    marks: dict[str, tuple[float, float, float]] = {}

    class Marks(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if text.startswith("leading:"):
                marks.setdefault("leading", (time.monotonic(), cpu_seconds(), rss_mb()))
            elif text.startswith("listed "):
                marks.setdefault("listed", (time.monotonic(), cpu_seconds(), rss_mb()))

    for name in ("watchers.main", "watchers.stream"):
        lg = logging.getLogger(name)
        lg.setLevel(logging.INFO)
        lg.addHandler(Marks())
        lg.propagate = False
    delivered = [0]
    done = threading.Event()

    def counted(etype: str, obj: dict) -> None:
        on_event(etype, obj)
        delivered[0] += 1
        if delivered[0] >= n:
            done.set()

    gct = _GcTimer()
    stop = threading.Event()
    rss0, cpu0, t0 = rss_mb(), cpu_seconds(), time.monotonic()
    th = threading.Thread(target=run, kwargs=dict(on_event=counted, lease_namespace="default",
                                                  identity="bench-scale", stop=stop, settings=WatcherSettings()),
                          daemon=True)
    th.start()
    finished = done.wait(1800)
    t_done, cpu_done, rss_done = time.monotonic(), cpu_seconds(), rss_mb()
    stop.set()
    th.join(30)
    lead = marks.get("leading", (t0, cpu0, rss0))
    listed = marks.get("listed", (float("nan"),) * 3)
    return {"list_s": listed[0] - lead[0], "list_cpu": listed[1] - lead[1], "rss_listed": listed[2],
            "wall": t_done - lead[0], "cpu": cpu_done - lead[1], "rss_base": rss0, "rss_after": rss_done,
            "rss_peak": peak_rss_mb(), "delivered": delivered[0], "complete": finished,
            "gc_s": gct.total, "gc_n": gct.collections, "warm_up_s": cold}


def phase_resync(n: int) -> dict:
    """One ``proxy.resync`` over N steady Proxies."""
    from workers import runtime
    from workers.tasks import resync

    runtime.context()
    if hasattr(runtime, "dispatcher"):
        runtime.dispatcher()
    cold = warm_up()
    gct = _GcTimer()
    rss0, cpu0, t0 = rss_mb(), cpu_seconds(), time.monotonic()
    sent = resync()
    return {"wall": time.monotonic() - t0, "cpu": cpu_seconds() - cpu0, "rss_base": rss0, "rss_after": rss_mb(),
            "rss_peak": peak_rss_mb(), "sent_reported": sent, "gc_s": gct.total, "gc_n": gct.collections,
            "warm_up_s": cold}


def phase_gc(n: int, legacy: bool = False) -> dict:
    """One GC diff (list_by_tag, the Proxy listing, the orphan diff), deleting nothing."""
    from datetime import datetime, timezone

    from app.proxy import gc as gc_logic
    from app.providers.naming import MANAGED_BY
    from app.providers.base import ListResult
    from app.providers.kubernetes.provider import LABEL_MANAGED_BY, KubernetesProvider, to_instance
    from workers import runtime

    ctx = runtime.context()
    provider = ctx.registry.get(PROVIDER)
    from app.kube.gateway import api_client
    try:
        raw = KubernetesProvider(_provider_config(), client_factory=api_client)  # the process's client (KUBECONFIG)
    except TypeError:  # before the client was injected: the provider used app.kube.gateway.api_client itself
        raw = KubernetesProvider(_provider_config())
    cold = warm_up()
    # gc.collect lists with the cyclic collector paused (app.proxy.gc.cyclic_gc_paused); before, it did not
    paused = getattr(gc_logic, "cyclic_gc_paused", None)
    scope = contextlib.nullcontext() if legacy or paused is None else paused()
    gct = _GcTimer()
    rss0, cpu0, t0 = rss_mb(), cpu_seconds(), time.monotonic()
    with scope:
        if legacy:  # the listing before: one unpaged list of full V1Pod objects
            pods = raw.core.list_pod_for_all_namespaces(label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}")
            listing = ListResult([to_instance(p) for p in pods.items])
            del pods
        else:
            listing = provider.list_by_tag(MANAGED_BY)
        t1, cpu1, gc1 = time.monotonic(), cpu_seconds(), gct.total
        # what gc.collect is given: the lean paged listing where the gateway has one (an iterator,
        # consumed by current_instances), else the full Proxies of before
        lister = "list_proxy_refs" if hasattr(ctx.kube, "list_proxy_refs") else "list_proxies"
        live, current = gc_logic.current_instances(getattr(ctx.kube, lister)(), PROVIDER)
        t2, cpu2, gc2 = time.monotonic(), cpu_seconds(), gct.total
    found = gc_logic.orphans(listing.instances, live_uids=live, abandoned=set(), now=datetime.now(timezone.utc),
                             grace_seconds=3600, current=current)
    t3, cpu3 = time.monotonic(), cpu_seconds()
    return {"list_s": t1 - t0, "list_cpu": cpu1 - cpu0, "list_gc_s": gc1,
            "proxies_s": t2 - t1, "proxies_cpu": cpu2 - cpu1, "proxies_gc_s": gc2 - gc1,
            "diff_s": t3 - t2, "diff_cpu": cpu3 - cpu2, "paused": not legacy and paused is not None, "wall": t3 - t0, "cpu": cpu3 - cpu0, "gc_s": gct.total, "gc_n": gct.collections,
            "listed": len(listing.instances), "orphans": len(found), "proxies": len(live), "lister": lister,
            "rss_base": rss0, "rss_after": rss_mb(), "rss_peak": peak_rss_mb(), "warm_up_s": cold}


def phase_health(n: int) -> dict:
    """One beat health sweep (:func:`app.probes.schedule.sweep`) with every published Proxy due.

    Only the claim: the probes themselves are per Proxy and go through real Squids
    (bench/probes.py measures them).
    """
    import redis

    from app.probes import schedule
    from app.probes.settings import HealthSettings
    from app.config.settings import Settings

    r = redis.Redis.from_url(Settings.from_env().redis_url, decode_responses=True)
    settings = HealthSettings()
    gct = _GcTimer()
    rss0, cpu0, t0 = rss_mb(), cpu_seconds(), time.monotonic()
    batches = schedule.sweep(r, settings, now=time.time() + 3600)
    return {"wall": time.monotonic() - t0, "cpu": cpu_seconds() - cpu0, "claimed": sum(map(len, batches)),
            "batches": len(batches), "sweep_limit": settings.sweep_limit, "gc_s": gct.total, "gc_n": gct.collections,
            "rss_base": rss0, "rss_after": rss_mb(), "rss_peak": peak_rss_mb()}


def _provider_config():
    from app.config.providers import ProviderConfig
    from app.providers.kubernetes.config import KubernetesSettings

    return ProviderConfig(PROVIDER, "kubernetes", 60, 15, KubernetesSettings())


def _phase_main(conn, name: str, args: tuple) -> None:
    logging.basicConfig(level=logging.WARNING)
    try:
        conn.send(("ok", globals()[name](*args)))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        import traceback

        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


# -- the parent --------------------------------------------------------------------------------
class Fleet:
    """The fake (own process) and Redis for one size."""

    def __init__(self, n: int, workdir: str) -> None:
        from devcluster.redis_server import RedisServer

        self.redis = RedisServer()
        self.conn, child = SPAWN.Pipe()
        self.proc = SPAWN.Process(target=serve_fake, args=(child, n), daemon=True)
        self.proc.start()
        self.url, self.counts = self.conn.recv()
        kubeconfig = os.path.join(workdir, "kubeconfig")
        from devcluster.apiserver.server import write_kubeconfig

        write_kubeconfig(kubeconfig, self.url)
        providers = os.path.join(workdir, "providers.yaml")
        Path(providers).write_text(PROVIDERS_YAML)
        os.environ.update(KUBECONFIG=kubeconfig, REDIS_URL=self.redis.url, PROVIDERS_CONFIG=providers,
                          LOG_LEVEL="WARNING")

    def fake_usage(self) -> tuple[float, float]:
        self.conn.send("usage")
        return self.conn.recv()

    def redis_cpu(self) -> float:
        return pid_cpu_seconds(self.redis.proc.pid)

    def queued(self) -> int:
        """Messages waiting in the broker's lists (every Redis list)."""
        import redis

        r = redis.Redis.from_url(self.redis.url)
        return sum(r.llen(k) for k in r.scan_iter(count=1000, _type="list"))

    def drain(self) -> None:
        """Drop queued messages and de-duplication marks, so each phase starts alike."""
        import redis

        r = redis.Redis.from_url(self.redis.url)
        for k in list(r.scan_iter(count=1000, _type="list")) + list(r.scan_iter(match="po:queued:*", count=1000)):
            r.delete(k)

    def run(self, name: str, *args) -> dict:
        """Run phase function ``name`` in a fresh spawned process; add the fake's and Redis's CPU."""
        parent, child = SPAWN.Pipe()
        queued0 = self.queued()
        fake0, redis0 = self.fake_usage()[0], self.redis_cpu()
        proc = SPAWN.Process(target=_phase_main, args=(child, name, args))
        proc.start()
        status, result = parent.recv()
        proc.join(60)
        if status != "ok":
            raise RuntimeError(f"{name} failed:\n{result}")
        fake1, fake_rss = self.fake_usage()
        result.update(fake_cpu=fake1 - fake0, fake_rss=fake_rss, redis_cpu=self.redis_cpu() - redis0,
                      sent=self.queued() - queued0)
        return result

    def close(self) -> None:
        try:
            self.conn.send("stop")
        except OSError:
            pass
        self.proc.join(30)
        self.redis.stop()


def _fmt_row(label: str, n: int, r: dict) -> str:
    per = r["cpu"] / n * 1e6
    return (f"| {label} | {r['wall']:.2f} | {r['cpu']:.2f} | {r['fake_cpu']:.2f} | {r['redis_cpu']:.2f} | "
            f"{per:.0f} | {r['gc_s']:.2f} | {r['rss_after']:.0f} / {max(r['rss_peak'], r['rss_after']):.0f} | "
            f"{r.get('sent', 0)} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000", help="comma-separated Proxy counts (e.g. 1000,10000,100000)")
    ap.add_argument("--phases", default="watcher,resync,gc,legacy,health",
                    help="any of watcher, resync, gc, legacy (GC with the full-Pod listing of before), "
                         "health (one beat sweep's claim of due Proxies)")
    ap.add_argument("--legacy-max", type=int, default=10000, help="largest size the full-Pod GC runs at")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s]
    phases = set(args.phases.split(","))
    results: dict = {"cpus": os.cpu_count(), "sizes": {}}
    print(f"scale bench: sizes {sizes}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    for n in sizes:
        workdir = tempfile.mkdtemp(prefix="bench-scale-")
        t0 = time.monotonic()
        fleet = Fleet(n, workdir)
        out: dict = {"seed": fleet.counts, "load_start": os.getloadavg()[0]}
        try:
            out["publish"] = fleet.run("setup_publish")
            print(f"\n## {n:,} Proxies  (seeded {fleet.counts['proxies']:,} Proxies + {fleet.counts['pods']:,} Pods "
                  f"in {fleet.counts['seed_s']:.1f} s, published in {out['publish']['wall']:.1f} s; "
                  f"load {os.getloadavg()[0]:.2f})")
            fleet.drain()
            if "watcher" in phases:
                out["watcher"] = fleet.run("phase_watcher", n)
                fleet.drain()
            if "resync" in phases:
                out["resync"] = fleet.run("phase_resync", n)
                fleet.drain()
            if "gc" in phases:
                out["gc"] = fleet.run("phase_gc", n, False)
            if "legacy" in phases and n <= args.legacy_max:
                out["gc_legacy"] = fleet.run("phase_gc", n, True)
            if "health" in phases:
                out["health"] = fleet.run("phase_health", n)
        finally:
            fleet.close()
        out["load_end"] = os.getloadavg()[0]
        out["total_s"] = time.monotonic() - t0
        results["sizes"][n] = out
        print("| measurement | wall s | product CPU s | fake CPU s | Redis CPU s | product CPU µs/Proxy "
              "| in cyclic GC, CPU s | RSS after / peak MB | messages sent |")
        print("|---|---|---|---|---|---|---|---|---|")
        if "watcher" in out:
            w = out["watcher"]
            print(_fmt_row("watcher: list + dispatch", n, w))
            print(f"  watcher list alone: {w['list_s']:.2f} s wall, {w['list_cpu']:.2f} s CPU, RSS {w['rss_listed']:.0f} MB "
                  f"(base {w['rss_base']:.0f} MB); {w['delivered']:,} SYNC events dispatched"
                  f"{'' if w['complete'] else ' (INCOMPLETE)'}")
        if "resync" in out:
            r = out["resync"]
            print(_fmt_row("resync (steady Proxies)", n, r))
            print(f"  resync reported {r['sent_reported']} message(s) sent; {r['sent']} found in the broker")
        for key, label in (("gc", "GC diff (metadata, paged)"), ("gc_legacy", "GC diff (full Pods, before)")):
            if key in out:
                g = out[key]
                print(_fmt_row(label, n, g))
                print(f"  {label}: list_by_tag {g['list_s']:.2f} s ({g['list_cpu']:.2f} CPU, {g['list_gc_s']:.2f} in GC), "
                      f"{g.get('lister', 'list_proxies')} + current_instances {g['proxies_s']:.2f} s ({g['proxies_cpu']:.2f} CPU, {g['proxies_gc_s']:.2f} in GC), "
                      f"diff {g['diff_s']:.3f} s ({g['diff_cpu']:.3f} CPU); cyclic GC paused: {g['paused']}; {g['listed']:,} Pods listed, {g['orphans']} orphans "
                      f"(seeded {fleet.counts['orphans']})")
        if "health" in out:
            h = out["health"]
            print(_fmt_row("health sweep: claim due Proxies", h["claimed"] or 1, h))
            print(f"  health sweep claimed {h['claimed']:,} due Proxies (sweep limit {h['sweep_limit']:,}) "
                  f"in {h['batches']} batches (CPU per Proxy above is per claimed Proxy)")
        print(f"  load average {out['load_start']:.2f} -> {out['load_end']:.2f}; size done in {out['total_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
