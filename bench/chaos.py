"""Chaos run: the whole stack on loopback under a seeded schedule of faults, then invariant checks.

The stack is ``make demo``'s (:class:`devcluster.demo.Demo`: the Kubernetes API fake
admitting Proxies and ProxyPools through the real CRDs, the kubelet stand-in running every
Squid Pod as a real Squid, a private Redis with a password, a local origin, beat, the API and
Flower) with two watchers (leader-elected) and two Celery workers.  While two workload threads
run, the main thread injects faults from a schedule drawn from ``--seed``:

* the fleet thread applies, deletes and re-applies standalone Proxies and a ProxyPool and scales
  the pool (:data:`MAX_PROXIES` standalone, ``1..``:data:`MAX_REPLICAS` members);
* the client thread leases (from the pool or anywhere), renews and releases through the API.

Fault kinds (:data:`FAULT_KINDS`): SIGKILL of a whole process group and its restart after a
short pause, for every process kind (worker, watcher, beat, API, Flower); SIGSTOP of a worker
for a few seconds (sometimes longer than ``HOLDER_TTL``, so its work is taken for a dead
holder's), then SIGCONT; a Redis restart that keeps its data (``SHUTDOWN SAVE``, the dump
loaded at start), one that comes back empty (SIGKILL, no dump), an outage of several seconds
(SIGKILL, down, back empty); SIGKILL of the Squid behind a Ready Proxy (the kubelet stand-in
restarts it as a kubelet restarts a container).  The schedule is rounds of every kind in a
seeded random order with seeded gaps; the first round always completes (every kind at least
once), later rounds stop at ``--duration``.  Each fault runs in a thread of its own from its
time on, so faults overlap (a worker killed during a Redis outage), except two on one target
(a process, Redis), which take turns.

Then the workload stops, one last change is made (the pool scaled to another size, or applied
again if the workload last deleted it, and one more Proxy created), and the settle phase checks
the invariants every 2 s until they all hold at once or ``--settle`` seconds pass:

* every Proxy converged: ``Ready`` with exactly one running Pod, or ``Failed`` with a reason;
* no Proxy is Terminating;
* no leaked instance (a Pod of the operator whose Proxy UID no live Proxy has) and no
  duplicate (two Pods for one Proxy);
* every ProxyPool has ``spec.replicas`` members, all Ready;
* every lease the API reports points at a live proxy: each lease the clients still hold that
  renews, each fresh lease granted and each item of ``GET /v1/proxies`` names an existing Proxy
  that is not Terminating; a granted lease's Proxy is Ready, its host is the Pod's address and
  the origin answers through it; with a Ready Proxy, at least one lease is granted;
* no process exited except those the run killed (checked every second during the run, and at
  the end).

Prints the faults injected (when, which, on what), the workload's counts, when each invariant
first held and any violation with details; exits 1 on a violation (the work directory with
every process's log is then kept and named), 0 otherwise.

Usage: ``python bench/chaos.py [--seed 1] [--duration 120] [--settle 120]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import requests  # noqa: E402
from kubernetes import client as k8s  # noqa: E402

from app.providers.kubernetes.provider import LABEL_MANAGED_BY, LABEL_PROXY_UID  # noqa: E402
from app.resources import GROUP, PLURAL, POOL_PLURAL, VERSION  # noqa: E402
from devcluster.demo import PROVIDER, Demo  # noqa: E402
from tests.support.processes import BIN, Process, celery_worker  # noqa: E402

NS = "default"
POOL = "chaos-pool"
#: Standalone Proxies the fleet thread keeps at most.
MAX_PROXIES = 4
#: Most members the fleet thread scales the pool to.
MAX_REPLICAS = 3
#: Every kind of fault, each injected at least once per run.
FAULT_KINDS = ("kill-worker", "kill-watcher", "kill-beat", "kill-api", "kill-flower", "stop-worker",
               "redis-restart-kept", "redis-restart-empty", "redis-outage", "kill-squid")
#: The stack's settings over the demo's (its short polls and health sweeps kept): the product's
#: defaults for holders, beat's lock and GC (so a leak is not hidden by a short GC grace); the
#: Proxy resync every 15 s (demo 30 s) and the pool resync every 5 s (default 30 s), so a
#: settle phase of a minute or two sees a few of each.
CHAOS_ENV = {"LOG_LEVEL": "INFO", "POOL_RESYNC_INTERVAL": "5", "RESYNC_INTERVAL": "15"}
HEALTH_CHECK = {"intervalSeconds": 2, "timeoutSeconds": 1}
LEASE_TTL = 60


def fault_schedule(seed: int, duration: float, gap: float) -> list[tuple[float, str]]:
    """The faults of a run: ``[(seconds after the start, kind), ...]`` in time order.

    Rounds of every kind of :data:`FAULT_KINDS` in a random order, ``gap`` × U(0.5, 1.5) seconds
    apart; the first round is whole even past ``duration``, later ones stop at it.  The same
    seed gives the same schedule.
    """
    rng = random.Random(seed)
    out: list[tuple[float, str]] = []
    t = gap * rng.uniform(0.3, 1.0)
    first = True
    while first or t < duration:
        kinds = list(FAULT_KINDS)
        rng.shuffle(kinds)
        for kind in kinds:
            if not first and t >= duration:
                break
            out.append((round(t, 1), kind))
            t += gap * rng.uniform(0.5, 1.5)
        first = False
    return out


class Chaos:
    """One run: :meth:`start` the stack, :meth:`run` faults and workload, :meth:`settle`, :meth:`stop`."""

    def __init__(self, seed: int, duration: float, settle: float, gap: float) -> None:
        self.seed, self.duration, self.settle_s, self.gap = seed, duration, settle, gap
        self.demo = Demo(api_port=0, flower_port=0, workdir=tempfile.mkdtemp(prefix="proxy-operator-chaos-"),
                         extra_env=CHAOS_ENV)
        self.procs: dict[str, Process] = {}
        self.killed: set[str] = set()  # processes the run has down on purpose right now
        self.exits: list[str] = []  # unexpected exits seen
        self.faults: list[tuple[float, str, str, float]] = []  # (start s, kind, what was done, end s)
        self.grants: list[float] = []  # when each lease was granted during the run, s
        self.counts: collections.Counter = collections.Counter()
        self.leases: dict[str, dict] = {}
        self.lock = threading.Lock()
        # one fault at a time on each target (a process, Redis)
        self.targets = {name: threading.Lock() for name in
                        ("worker", "worker2", "watcher", "watcher2", "beat", "api", "flower", "redis")}
        self.stop_workload = threading.Event()
        self.stop_monitor = threading.Event()
        self.t0 = 0.0

    # -- stack ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the demo's stack plus a second worker and a second watcher; wait until ready."""
        d = self.demo.start()
        logs = str(d.workdir / "logs")
        worker2 = celery_worker(d.env, name="worker2")
        watcher2 = Process("watcher2", [f"{BIN}/proxy-operator", "watch", "--lease-namespace", "proxy-operator",
                                        "--identity", "chaos-watcher-2"], d.env, logs)
        for p in (worker2, watcher2):
            p.logdir, p.log_path = logs, Path(logs) / f"{p.name}.log"
            p.start()
            d.processes.append(p)
        worker2.wait_for_log("ready", timeout=90)
        self.procs = {p.name: p for p in d.processes}
        self.kube = d.fake.api_client()
        self.custom = k8s.CustomObjectsApi(self.kube)
        self.core = k8s.CoreV1Api(self.kube)
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {d.token}"

    def stop(self, keep: bool) -> None:
        """Stop everything; keep the work directory (logs) when ``keep``."""
        self.stop_workload.set()
        self.stop_monitor.set()
        self.demo.keep = keep
        self.demo.stop()

    def _monitor(self) -> None:
        while not self.stop_monitor.wait(1.0):
            for name, p in self.procs.items():
                with self.lock:
                    expected = name in self.killed
                if not expected and not p.alive():
                    code = p.proc.returncode if p.proc else None
                    if not any(e.startswith(f"{name} ") for e in self.exits):
                        self.exits.append(f"{name} exited by itself (code {code}) at +{self.now():.1f} s")

    def now(self) -> float:
        """Seconds since the fault phase began."""
        return time.monotonic() - self.t0

    # -- Kubernetes reads ----------------------------------------------------------------------
    def proxies(self) -> list[dict]:
        return self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]

    def pools(self) -> list[dict]:
        return self.custom.list_cluster_custom_object(GROUP, VERSION, POOL_PLURAL)["items"]

    def pods(self) -> list:
        return [p for p in self.core.list_pod_for_all_namespaces(
            label_selector=f"{LABEL_MANAGED_BY}=proxy-operator").items if p.metadata.deletion_timestamp is None]

    # -- faults --------------------------------------------------------------------------------
    def run(self) -> None:
        """The fault phase: workload threads plus the schedule's faults, then stop the workload."""
        schedule = fault_schedule(self.seed, self.duration, self.gap)
        self.t0 = time.monotonic()
        threads = [threading.Thread(target=self._monitor, daemon=True, name="monitor"),
                   threading.Thread(target=self._fleet, daemon=True, name="fleet"),
                   threading.Thread(target=self._clients, daemon=True, name="clients")]
        for t in threads:
            t.start()
        faults = []
        for i, (at, kind) in enumerate(schedule):
            time.sleep(max(0.0, at - self.now()))
            faults.append(threading.Thread(target=self._inject, args=(i, kind), daemon=True, name=kind))
            faults[-1].start()
        for t in faults:
            t.join()
        self.faults.sort()
        time.sleep(max(0.0, self.duration - self.now()))
        self.stop_workload.set()
        for t in threads[1:]:
            t.join(30)
        self.fault_end = self.now()

    def _inject(self, i: int, kind: str) -> None:
        """Inject fault ``i`` of the schedule (its own seeded randomness); record and print it."""
        rng = random.Random(f"{self.seed}:{i}")
        started = self.now()
        try:
            what = getattr(self, "_" + kind.replace("-", "_"))(rng)
        except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported
            what = f"NOT INJECTED: {type(exc).__name__}: {exc}"
        with self.lock:
            self.faults.append((started, kind, what, self.now()))
        print(f"+{started:6.1f} s  {kind:20} {what} (until +{self.now():.1f} s)", flush=True)

    def lease_gaps(self) -> dict[str, str]:
        """Per fault kind, the longest wait from a fault's end to the next lease granted, seconds,
        as text (``">=N"``: none granted in the N s left of the fault phase)."""
        worst: dict[str, tuple[float, bool]] = {}
        for _, kind, _, ended in self.faults:
            gap = next((g - ended for g in self.grants if g >= ended), None)
            value = (gap, False) if gap is not None else (max(0.0, self.fault_end - ended), True)
            worst[kind] = max(worst.get(kind, (0.0, False)), value)
        return {k: (">=" if censored else "") + f"{v:.1f}" for k, (v, censored) in worst.items()}

    def _restart_after_kill(self, name: str, rng: random.Random) -> str:
        p = self.procs[name]
        with self.targets[name]:
            with self.lock:
                self.killed.add(name)
            pid = p.proc.pid
            p.kill()
            pause = rng.uniform(0.5, 3.0)
            time.sleep(pause)
            if name == "beat":
                (self.demo.workdir / "beat.pid").unlink(missing_ok=True)
            p.start()
            with self.lock:
                self.killed.discard(name)
        return f"{name} (pid {pid}) SIGKILLed, restarted after {pause:.1f} s"

    def _kill_worker(self, rng):
        return self._restart_after_kill(rng.choice(["worker", "worker2"]), rng)

    def _kill_watcher(self, rng):
        return self._restart_after_kill(rng.choice(["watcher", "watcher2"]), rng)

    def _kill_beat(self, rng):
        return self._restart_after_kill("beat", rng)

    def _kill_api(self, rng):
        return self._restart_after_kill("api", rng)

    def _kill_flower(self, rng):
        return self._restart_after_kill("flower", rng)

    def _stop_worker(self, rng):
        name = rng.choice(["worker", "worker2"])
        p = self.procs[name]
        pause = rng.uniform(3.0, 16.0)
        with self.targets[name]:
            with self.lock:
                self.killed.add(name)
            pid = p.proc.pid
            os.killpg(pid, signal.SIGSTOP)
            try:
                time.sleep(pause)
            finally:
                os.killpg(pid, signal.SIGCONT)
                with self.lock:
                    self.killed.discard(name)
        return f"{name} (pid {pid}) SIGSTOPped for {pause:.1f} s, then SIGCONT"

    def _redis_down(self) -> None:
        r = self.demo.redis
        r.kill()
        (Path(r.dir) / "dump.rdb").unlink(missing_ok=True)

    def _redis_restart_kept(self, rng):
        with self.targets["redis"]:
            return self._redis_restart_kept_locked()

    def _redis_restart_kept_locked(self):
        r = self.demo.redis
        client = redis.Redis.from_url(r.authed_url, socket_timeout=5)
        keys = client.dbsize()
        try:
            client.shutdown(save=True)
        except redis.ConnectionError:
            pass  # the server closes the connection as it exits
        r.proc.wait(30)
        r.start()
        kept = redis.Redis.from_url(r.authed_url, socket_timeout=5).dbsize()
        return f"SHUTDOWN SAVE with {keys} keys, back with {kept} from its dump"

    def _redis_restart_empty(self, rng):
        with self.targets["redis"]:
            self._redis_down()
            time.sleep(rng.uniform(0.2, 1.0))
            self.demo.redis.start()
        return "SIGKILLed, back empty"

    def _redis_outage(self, rng):
        down = rng.uniform(5.0, 12.0)
        with self.targets["redis"]:
            self._redis_down()
            time.sleep(down)
            self.demo.redis.start()
        return f"SIGKILLed, down {down:.1f} s, back empty"

    def _kill_squid(self, rng):
        ready = sorted((p for p in self.proxies() if (p.get("status") or {}).get("phase") == "Ready"
                        and not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["name"])
        if not ready:
            return "no Ready Proxy: nothing killed"
        victim = rng.choice(ready)
        uid = victim["metadata"]["uid"]
        pods = [p for p in self.pods() if (p.metadata.labels or {}).get(LABEL_PROXY_UID) == uid]
        if not pods:
            return f"Proxy {victim['metadata']['name']} has no Pod: nothing killed"
        squid = self.demo.kubelet.squid_of(pods[0].metadata.namespace, pods[0].metadata.name)
        if squid is None or squid.proc is None:
            return f"Pod {pods[0].metadata.name} has no running Squid: nothing killed"
        os.killpg(squid.proc.pid, signal.SIGKILL)
        return f"Squid of Ready Proxy {victim['metadata']['name']} (Pod {pods[0].metadata.name}) SIGKILLed"

    # -- workload ------------------------------------------------------------------------------
    def _proxy_body(self, name: str) -> dict:
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": name, "namespace": NS},
                "spec": {"provider": PROVIDER, "healthCheck": HEALTH_CHECK, "maxLeases": 3}}

    def apply_pool(self, replicas: int) -> None:
        """Create the ProxyPool with ``replicas`` members."""
        self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": POOL, "namespace": NS},
            "spec": {"replicas": replicas, "template": {
                "metadata": {"labels": {"app": "chaos"}},
                "spec": {"provider": PROVIDER, "healthCheck": HEALTH_CHECK, "maxLeases": 3}}}})

    def _pool_exists(self) -> bool:
        return any(p["metadata"]["name"] == POOL and not p["metadata"].get("deletionTimestamp")
                   for p in self.pools())

    def _fleet(self) -> None:
        rng = random.Random(f"{self.seed}:fleet")
        serial = 0
        while not self.stop_workload.wait(rng.uniform(0.5, 2.5)):
            standalone = sorted(p["metadata"]["name"] for p in self.proxies()
                                if p["metadata"]["name"].startswith("chaos-px-")
                                and not p["metadata"].get("deletionTimestamp"))
            pool = self._pool_exists()
            action = rng.choices(["create", "delete", "scale", "pool-delete"], weights=[4, 2, 3, 1])[0]
            try:
                if action == "create" and len(standalone) < MAX_PROXIES:
                    serial += 1
                    self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL,
                                                                self._proxy_body(f"chaos-px-{serial}"))
                    self.counts["proxy created"] += 1
                elif action == "delete" and standalone:
                    self.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, rng.choice(standalone))
                    self.counts["proxy deleted"] += 1
                elif action in ("scale", "create", "delete") and pool:
                    self.custom.patch_namespaced_custom_object_scale(
                        GROUP, VERSION, NS, POOL_PLURAL, POOL, {"spec": {"replicas": rng.randint(1, MAX_REPLICAS)}})
                    self.counts["pool scaled"] += 1
                elif not pool:
                    self.apply_pool(rng.randint(1, MAX_REPLICAS))
                    self.counts["pool applied"] += 1
                elif action == "pool-delete":
                    self.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, POOL)
                    self.counts["pool deleted"] += 1
            except k8s.ApiException as exc:
                self.counts[f"kubernetes {action} answered {exc.status}"] += 1

    def _clients(self) -> None:
        rng = random.Random(f"{self.seed}:clients")
        api = self.demo.api_url
        while not self.stop_workload.wait(rng.uniform(0.2, 1.0)):
            action = rng.choices(["acquire", "renew", "release"], weights=[3, 2, 2])[0]
            try:
                if action == "acquire" or not self.leases:
                    body = {"ttlSeconds": LEASE_TTL, **({"pool": POOL} if rng.random() < 0.5 else {})}
                    res = self.http.post(f"{api}/v1/leases", json=body, timeout=10)
                    if res.status_code == 201:
                        lease = res.json()
                        self.leases[lease["leaseId"]] = lease
                        self.grants.append(self.now())
                    self.counts[f"lease acquire {res.status_code}"] += 1
                elif action == "renew":
                    lease_id = rng.choice(sorted(self.leases))
                    res = self.http.post(f"{api}/v1/leases/{lease_id}/renew", json={"ttlSeconds": LEASE_TTL},
                                         timeout=10)
                    if res.status_code == 200:
                        self.leases[lease_id] = res.json()
                    elif res.status_code in (404, 409):
                        self.leases.pop(lease_id, None)
                    self.counts[f"lease renew {res.status_code}"] += 1
                else:
                    lease_id = rng.choice(sorted(self.leases))
                    res = self.http.delete(f"{api}/v1/leases/{lease_id}", timeout=10)
                    if res.status_code in (200, 404):
                        self.leases.pop(lease_id, None)
                    self.counts[f"lease release {res.status_code}"] += 1
            except requests.RequestException:
                self.counts[f"lease {action} unanswered"] += 1

    # -- settle and invariants -----------------------------------------------------------------
    def settle(self) -> dict[str, tuple[float | None, list[str]]]:
        """Check :data:`INVARIANTS` every 2 s until all hold at once or ``--settle`` s pass.

        Returns ``{invariant: (seconds after the fault phase when it last began to hold, or None
        if it does not hold at the end; the violations of the last check)}``.
        """
        # The last change, made as the faults end, so the settle phase times a real convergence.
        pool = next((p for p in self.pools() if p["metadata"]["name"] == POOL), None)
        if pool is None or pool["metadata"].get("deletionTimestamp"):
            wait_gone = time.monotonic() + 30
            while pool is not None and time.monotonic() < wait_gone:
                time.sleep(0.5)
                pool = next((p for p in self.pools() if p["metadata"]["name"] == POOL), None)
            self.apply_pool(MAX_REPLICAS)
            self.counts["pool applied (settle)"] += 1
        else:
            replicas = pool["spec"]["replicas"] % MAX_REPLICAS + 1
            self.custom.patch_namespaced_custom_object_scale(GROUP, VERSION, NS, POOL_PLURAL, POOL,
                                                             {"spec": {"replicas": replicas}})
            self.counts["pool scaled (settle)"] += 1
        self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, self._proxy_body("chaos-px-last"))
        self.counts["proxy created (settle)"] += 1
        start = time.monotonic()
        held_since: dict[str, float | None] = {name: None for name, _ in INVARIANTS}
        last: dict[str, list[str]] = {}
        while True:
            elapsed = time.monotonic() - start
            for name, check in INVARIANTS:
                if name == LEASE_INVARIANT and any(last.get(n) for n, _ in INVARIANTS if n != LEASE_INVARIANT):
                    last[name] = ["not checked: the fleet has not converged"]
                else:
                    try:
                        last[name] = check(self)
                    except Exception as exc:  # noqa: BLE001 - an unreadable state is a violation
                        last[name] = [f"the check failed: {type(exc).__name__}: {exc}"]
                if last[name]:
                    held_since[name] = None
                elif held_since[name] is None:
                    held_since[name] = elapsed
            if all(not v for v in last.values()) or elapsed > self.settle_s:
                self.settled_after = elapsed if all(not v for v in last.values()) else None
                return {name: (held_since[name], last[name]) for name, _ in INVARIANTS}
            time.sleep(2.0)

    def check_converged(self) -> list[str]:
        pods = collections.Counter((p.metadata.labels or {}).get(LABEL_PROXY_UID) for p in self.pods()
                                   if p.status and p.status.phase == "Running")
        out = []
        for p in self.proxies():
            status, name = p.get("status") or {}, f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            phase = status.get("phase")
            if phase == "Failed":
                reasons = [c.get("reason") for c in status.get("conditions") or [] if c.get("status") == "False"]
                if not any(reasons):
                    out.append(f"{name}: Failed without a reason")
            elif phase != "Ready":
                conds = {c.get("type"): c.get("reason") for c in status.get("conditions") or []}
                out.append(f"{name}: phase {phase} (conditions {conds})")
            elif pods[p["metadata"]["uid"]] != 1:
                out.append(f"{name}: Ready with {pods[p['metadata']['uid']]} running Pods")
        return out

    def check_not_terminating(self) -> list[str]:
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']}: Terminating since "
                f"{p['metadata']['deletionTimestamp']} (finalizers {p['metadata'].get('finalizers')}, "
                f"phase {(p.get('status') or {}).get('phase')})"
                for p in self.proxies() if p["metadata"].get("deletionTimestamp")]

    def check_instances(self) -> list[str]:
        live = {p["metadata"]["uid"]: p["metadata"]["name"] for p in self.proxies()}
        by_uid = collections.defaultdict(list)
        for pod in self.pods():
            by_uid[(pod.metadata.labels or {}).get(LABEL_PROXY_UID)].append(pod.metadata.name)
        out = []
        for uid, names in sorted(by_uid.items(), key=lambda kv: str(kv[0])):
            if uid not in live:
                out.append(f"leaked: Pod(s) {names} of Proxy UID {uid}, which no live Proxy has")
            elif len(names) > 1:
                out.append(f"duplicated: Proxy {live[uid]} has {len(names)} Pods {names}")
        return out

    def check_pools(self) -> list[str]:
        proxies = self.proxies()
        out = []
        for pool in self.pools():
            uid, want = pool["metadata"]["uid"], pool["spec"]["replicas"]
            members = [p for p in proxies if not p["metadata"].get("deletionTimestamp")
                       and any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences") or [])]
            ready = [p for p in members if (p.get("status") or {}).get("phase") == "Ready"]
            if len(members) != want or len(ready) != want:
                out.append(f"{pool['metadata']['name']}: spec.replicas {want}, {len(members)} members, "
                           f"{len(ready)} Ready")
        return out

    def check_leases(self) -> list[str]:
        api, out = self.demo.api_url, []
        proxies = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in self.proxies()}
        pod_ip = {(pod.metadata.labels or {}).get(LABEL_PROXY_UID): pod.status.pod_ip for pod in self.pods()
                  if pod.status}

        def live(ns: str, name: str, what: str, granted: dict | None = None) -> None:
            p = proxies.get((ns, name))
            if p is None:
                out.append(f"{what} names {ns}/{name}, which does not exist")
                return
            if p["metadata"].get("deletionTimestamp"):
                out.append(f"{what} names {ns}/{name}, which is Terminating")
            if granted is None:
                return
            if (p.get("status") or {}).get("phase") != "Ready":
                out.append(f"{what} names {ns}/{name}, phase {(p.get('status') or {}).get('phase')}")
            if granted["host"] != pod_ip.get(p["metadata"]["uid"]):
                out.append(f"{what} names {ns}/{name} at {granted['host']}, its Pod is at "
                           f"{pod_ip.get(p['metadata']['uid'])}")
            try:
                got = requests.get(self.demo.origin.url("/generate_204"), timeout=5,
                                   proxies={"http": granted["proxyUrl"]})
                if got.status_code != 204:
                    out.append(f"{what}: the origin answered {got.status_code} through {ns}/{name}")
            except requests.RequestException as exc:
                out.append(f"{what}: no answer through {ns}/{name}: {type(exc).__name__}")

        for lease_id in sorted(self.leases):
            res = self.http.post(f"{api}/v1/leases/{lease_id}/renew", json={"ttlSeconds": LEASE_TTL}, timeout=10)
            if res.status_code == 200:
                lease = res.json()
                live(lease["proxy"]["namespace"], lease["proxy"]["name"], f"held lease {lease_id[:8]} (renewed)",
                     lease)
            elif res.status_code in (404, 409):
                self.leases.pop(lease_id)
            else:
                out.append(f"renew of held lease {lease_id[:8]}: {res.status_code} {res.text[:200]}")
        listed = self.http.get(f"{api}/v1/proxies", timeout=10)
        if listed.status_code != 200:
            return out + [f"GET /v1/proxies: {listed.status_code} {listed.text[:200]}"]
        for item in listed.json()["items"]:
            live(item["namespace"], item["name"], f"GET /v1/proxies item {item['name']}")
        ready = sum(1 for p in proxies.values() if (p.get("status") or {}).get("phase") == "Ready")
        fresh = []
        for _ in range(ready):
            res = self.http.post(f"{api}/v1/leases", json={"ttlSeconds": 30}, timeout=10)
            if res.status_code != 201:
                break
            fresh.append(res.json())
        for lease in fresh:
            live(lease["proxy"]["namespace"], lease["proxy"]["name"], f"fresh lease {lease['leaseId'][:8]}", lease)
            self.http.delete(f"{api}/v1/leases/{lease['leaseId']}", timeout=10)
        if ready and not fresh:
            out.append(f"{ready} Ready Proxies, but a lease was refused: {res.status_code} {res.text[:300]}")
        return out

    def check_processes(self) -> list[str]:
        out = list(self.exits)
        out += [f"{name} is not running at the end" for name, p in self.procs.items()
                if not p.alive() and not any(e.startswith(f"{name} ") for e in self.exits)]
        return out


LEASE_INVARIANT = "every lease the API reports points at a live proxy"
INVARIANTS = (
    ("every Proxy converged (Ready, one Pod) or Failed with a reason", Chaos.check_converged),
    ("no Proxy stuck Terminating", Chaos.check_not_terminating),
    ("0 leaked and 0 duplicated instances", Chaos.check_instances),
    ("every ProxyPool at its replicas, all Ready", Chaos.check_pools),
    (LEASE_INVARIANT, Chaos.check_leases),
    ("no process exited except those killed", Chaos.check_processes),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1, help="seed of the fault schedule and the workload (default 1)")
    ap.add_argument("--duration", type=float, default=120.0,
                    help="seconds of faults and workload (default 120; the first round of faults always completes)")
    ap.add_argument("--settle", type=float, default=120.0,
                    help="seconds the invariants have to hold after the faults (default 120)")
    ap.add_argument("--fault-gap", type=float, default=10.0, help="mean seconds between faults (default 10)")
    args = ap.parse_args(argv)
    for flag, value in (("--duration", args.duration), ("--settle", args.settle), ("--fault-gap", args.fault_gap)):
        if value <= 0:
            ap.error(f"{flag} {value:g}: must be a positive number of seconds")
    chaos = Chaos(args.seed, args.duration, args.settle, args.fault_gap)
    violated = True
    try:
        t = time.monotonic()
        chaos.start()
        print(f"chaos: seed {args.seed}, {args.duration:g} s of faults, settle within {args.settle:g} s; stack up "
              f"in {time.monotonic() - t:.1f} s: {', '.join(sorted(chaos.procs))}, redis, kube API fake + kubelet "
              f"(Pods on {chaos.demo.pod_cidr}); logs in {chaos.demo.workdir / 'logs'}", flush=True)
        chaos.run()
        results = chaos.settle()
        violated = any(v for _, v in results.values())
        kinds = collections.Counter(kind for _, kind, what, _ in chaos.faults if "NOT INJECTED" not in what)
        print(f"\nfaults injected: {sum(kinds.values())} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})")
        print("first lease granted after each fault's end (s; max per kind): " + ", ".join(
            f"{k} {v}" for k, v in sorted(chaos.lease_gaps().items())))
        print(f"workload: {', '.join(f'{k} {n}' for k, n in sorted(chaos.counts.items()))}")
        settled = ("settled %.1f s after the last fault" % chaos.settled_after if chaos.settled_after is not None
                   else f"NOT settled within {args.settle:g} s")
        print(f"fault phase {chaos.fault_end:.1f} s; {settled}")
        print("invariants:")
        violations = 0
        for name, (held, found) in results.items():
            if found:
                violations += len(found)
                print(f"  FAIL {name}")
                for line in found:
                    print(f"       {line}")
            else:
                print(f"  ok   {name} (holding since +{held:.1f} s of the settle phase)")
        print(f"violations: {violations}")
        if violated:
            print(f"logs kept in {chaos.demo.workdir / 'logs'}")
        return 1 if violated else 0
    finally:
        chaos.stop(keep=violated)


if __name__ == "__main__":
    sys.exit(main())
