"""Pool rollout benchmark: a ProxyPool of 200 members rotated end to end by a template change.

What is real:

* the pool controller's pass, :func:`app.pools.controller.run` (reads, :func:`app.pools.plan.plan`,
  creates, drain marks, deletes, status writes), driven in process pass after pass as
  tests/pools/test_controller.py drives it (no Celery, no watcher: each pass follows the last);
* the reconciler's steps for every member (:func:`app.proxy.reconcile.create`, ``poll``, ``delete``,
  chosen by :func:`app.proxy.reconcile.decide`) with the real kubernetes provider: Squid Pods are
  created and deleted in the API fake, finalizers added and removed, Proxies published to the
  serving view in Redis when their Pod runs;
* the Kubernetes API fake (devcluster/apiserver/, with its garbage collector) admitting Proxies and
  ProxyPools through the real CRDs (:class:`devcluster.cluster.FakeCluster`), over HTTP;
* a private ``redis-server`` (serving view, locks, drain marks).

What is stood in:

* the kubelet (:class:`devcluster.kubelet.Kubelet` with ``start_squid=False``): Squid Pods
  go ``Running`` with a ``podIP`` nothing listens on, no Squid runs;
* the health engine: a member whose reconciler made it ``Running`` is made ``Ready`` by hand as
  test_controller.py does (status phase patched, serving record published ``Ready`` and marked
  healthy), in the same sweep; no probe is sent;
* crawlers: none, so a draining member holds no lease and is deleted at the next pass.

One *round* = one controller pass, then one reconcile sweep over the namespace's Proxies (each
Proxy that needs a step gets one), then the health stand-in.  Before the clock starts the pool is
filled to 200 Ready members; then its template changes (``maxLeases`` 2 -> 3) and the clock runs
until the pool is complete again (``Progressing`` ``PoolComplete``, 200 updated members, none
left).  The minimum leasable count is the lowest ``status.leasableReplicas`` the controller wrote
during the rollout (each pass counts what it reads, before acting).

A second figure samples what the API could actually lease during the rollout, independently of
the controller: a thread with its own Redis connection reads, every
:data:`SAMPLE_INTERVAL` seconds while the rollout runs, the lease index the lease script reads
and its 503 counts come from (:data:`app.store.keys.LOAD`: leasable with room,
:data:`app.store.keys.FULL`: leasable at ``maxLeases``; a draining, unhealthy or unpublished
proxy is in neither) and counts the uids whose serving record names the pool
(:func:`leasable_in_index`).  It sees the moments between a pass's writes that the status,
computed before the pass acts, does not.

Prints, per rollout setting: wall seconds, controller passes, the minimum leasable from the
status and from the lease index (with the samples taken), and the floor neither must go below
(``replicas - maxUnavailable``).  No assertions on time (the machine is shared: see
docs/performance.md).

Usage: ``python bench/pools.py [--replicas 200] [--surges 1,10]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NS = "crawl"
PROVIDER = "k8s-local"
#: Seconds between two samples of the lease index during a rollout.
SAMPLE_INTERVAL = 0.02


def leasable_in_index(r, pool: str) -> int:
    """Members of ``pool`` a lease request could get now, as the lease script sees them: uids in
    the lease index's :data:`~app.store.keys.LOAD` or :data:`~app.store.keys.FULL` (healthy,
    ``maxLeases`` > 0, not draining; the sets the 503 counts are read from) whose serving record's
    ``pool`` is ``pool``.  Two round trips; a uid withdrawn between them is not counted.

    Raises:
        redis.RedisError: Redis unreachable.
    """
    from app.store import keys as redis_keys

    pipe = r.pipeline(transaction=False)
    pipe.zrange(redis_keys.LOAD, 0, -1)
    pipe.smembers(redis_keys.FULL)
    load, full = pipe.execute()
    uids = sorted(set(load) | set(full))
    pipe = r.pipeline(transaction=False)
    for uid in uids:
        pipe.hget(redis_keys.proxy(uid), "pool")
    return sum(1 for name in pipe.execute() if name == pool)


class IndexSampler:
    """Samples :func:`leasable_in_index` in a thread until stopped; keeps the minimum.

    Args:
        redis_url: the Redis to read (a connection of its own).
        pool: the pool's name.
    """

    def __init__(self, redis_url: str, pool: str) -> None:
        import threading

        import redis as redis_lib

        self.r = redis_lib.Redis.from_url(redis_url, decode_responses=True)
        self.pool, self.low, self.samples = pool, None, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="index-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            n = leasable_in_index(self.r, self.pool)
            self.low = n if self.low is None else min(self.low, n)
            self.samples += 1
            self._stop.wait(SAMPLE_INTERVAL)

    def __enter__(self) -> "IndexSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.r.close()


def _ready(custom, r, proxy) -> None:
    """The health engine stand-in: Ready, published, healthy (as tests/pools/test_controller.py)."""
    from app.resources import GROUP, PLURAL, VERSION
    from app.serving import leases, view as serving
    from app.store import keys as redis_keys

    custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, proxy.name, {"status": {"phase": "Ready"}})
    serving.publish(r, proxy, address=proxy.status.get("address") or "203.0.113.9", port=3128, phase="Ready")
    r.hset(redis_keys.proxy(proxy.uid), mapping={"health": "healthy", "healthy": "1"})
    leases.reindex(r, proxy.uid)


def _sweep(ctx, custom, r) -> int:
    """One reconcile step for every Proxy that needs one, then Running -> Ready.  Returns steps taken."""
    from app.proxy import reconcile
    from app.resources import RUNNING

    steps = 0
    for p in ctx.kube.list_proxies_in(NS):
        action = reconcile.decide(p, resync=p.phase in ("Pending", "Provisioning"))
        ref = reconcile.Ref(NS, p.name, p.uid)
        if action == reconcile.CREATE:
            reconcile.create(ctx, ref)
        elif action == reconcile.POLL:
            reconcile.poll(ctx, ref)
        elif action == reconcile.DELETE:
            reconcile.delete(ctx, ref)
        steps += action is not None
    for p in ctx.kube.list_proxies_in(NS):
        if p.phase == RUNNING and not p.deleting:
            _ready(custom, r, p)
            steps += 1
    return steps


def _round(api, ctx, custom, r, ref, configs):
    """One controller pass and one sweep; returns (outcome, pool status, sweep steps)."""
    from app.pools import controller
    from app.resources import GROUP, POOL_PLURAL, VERSION

    out = controller.run(ctx.kube, r, configs, ref=ref, lock_timeout=30)
    status = custom.get_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, ref.name).get("status") or {}
    return out, status, _sweep(ctx, custom, r)


def _complete(status: dict, replicas: int) -> bool:
    reasons = {c["type"]: c["reason"] for c in status.get("conditions") or []}
    return (reasons.get("Progressing") == "PoolComplete" and status.get("updatedReplicas") == replicas
            and status.get("replicas") == replicas and status.get("leasableReplicas") == replicas)


def rollout(replicas: int, max_surge: int, max_unavailable: int, redis_url: str) -> dict:
    """Fill a pool to ``replicas`` Ready members, change its template, time the rollover."""
    import redis as redis_lib
    from kubernetes import client as k8s

    from app.config.providers import ProvidersConfig
    from app.kube.gateway import KubernetesGateway
    from app.pools.controller import PoolRef
    from app.providers.kubernetes.provider import KubernetesProvider
    from app.providers.registry import build
    from app.proxy.reconcile import Context
    from app.resources import GROUP, POOL_PLURAL, VERSION
    from devcluster.cluster import FakeCluster
    from tests.support.contexts import QUICK, k8s_provider

    r = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    r.flushall()
    with FakeCluster(start_squid=False) as cluster:
        api = cluster.fake.api_client()
        custom = k8s.CustomObjectsApi(api)
        pc = k8s_provider(PROVIDER)
        configs = {PROVIDER: pc}
        registry = build(ProvidersConfig((pc,)), {"kubernetes": lambda p: KubernetesProvider(p, client=api)})
        ctx = Context(kube=KubernetesGateway(api), registry=registry, redis=r, settings=QUICK)
        template = {"metadata": {"labels": {"app": "web"}}, "spec": {"provider": PROVIDER, "maxLeases": 2}}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": "web", "namespace": NS},
                "spec": {"replicas": replicas, "template": template, "drain": {"drainTimeoutSeconds": 600},
                         "rollout": {"maxSurge": max_surge, "maxUnavailable": max_unavailable}}}
        obj = custom.create_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, body)
        ref = PoolRef(NS, "web", obj["metadata"]["uid"])

        t0 = time.monotonic()
        while True:  # fill (not timed as the rollout)
            out, status, steps = _round(api, ctx, custom, r, ref, configs)
            if _complete(status, replicas):
                break
            if not steps and not out.plan.actions:
                time.sleep(0.05)  # the kubelet has Pods to start
        fill = time.monotonic() - t0

        template = {"metadata": {"labels": {"app": "web"}}, "spec": {"provider": PROVIDER, "maxLeases": 3}}
        custom.patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web", {"spec": {"template": template}})
        passes, low, t0 = 0, replicas, time.monotonic()
        with IndexSampler(redis_url, "web") as sampler:
            while True:
                out, status, steps = _round(api, ctx, custom, r, ref, configs)
                passes += 1
                low = min(low, status.get("leasableReplicas", 0))
                if _complete(status, replicas):
                    pool = custom.get_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web")
                    if pool["status"].get("observedGeneration") == pool["metadata"]["generation"]:
                        break
                if not steps and not out.plan.actions:
                    time.sleep(0.05)
            wall = time.monotonic() - t0
        left = len(ctx.kube.list_proxies_in(NS))
        api.close()
    r.close()
    return {"replicas": replicas, "maxSurge": max_surge, "maxUnavailable": max_unavailable, "fill_s": fill,
            "rollout_s": wall, "passes": passes, "min_leasable": low, "min_index": sampler.low,
            "samples": sampler.samples, "floor": replicas - max_unavailable, "proxies_after": left}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=200)
    ap.add_argument("--surges", default="1,10", help="maxSurge values to run, maxUnavailable 0 each")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from devcluster.redis_server import RedisServer

    server = RedisServer()
    try:
        print(f"{'replicas':>8} {'surge':>5} {'unavail':>7} {'fill s':>7} {'rollout s':>9} {'passes':>6} "
              f"{'min leasable (status)':>21} {'min leasable (index)':>20} {'samples':>7} {'floor':>5} {'left':>5}")
        for surge in (int(s) for s in args.surges.split(",")):
            f = rollout(args.replicas, surge, 0, server.url)
            print(f"{f['replicas']:>8} {f['maxSurge']:>5} {f['maxUnavailable']:>7} {f['fill_s']:>7.1f} "
                  f"{f['rollout_s']:>9.1f} {f['passes']:>6} {f['min_leasable']:>21} {f['min_index']!s:>20} "
                  f"{f['samples']:>7} {f['floor']:>5} {f['proxies_after']:>5}", flush=True)
        print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
