"""Celery tasks: thin shells around :mod:`app.dispatch.proxies`, :mod:`app.proxy.reconcile` and :mod:`app.proxy.gc`.

Every task takes references only, re-reads the object, holds the per-Proxy Redis lock while
it works (so concurrent or duplicate deliveries of the same Proxy serialise), and is safe to
run twice.  Followups go back on the queue the task came from, so KVM work stays on its
host's queue.  Deciding, routing and sending live in :mod:`app.dispatch.proxies`
(:meth:`~app.dispatch.proxies.Dispatcher.run_step`, :meth:`~app.dispatch.proxies.Dispatcher.resync`).
"""

from __future__ import annotations

import logging
import math
import time
import uuid

from celery.signals import worker_init

from app.proxy import gc as gc_logic
from app.store import holders
from app.observability import metrics
from app.providers import naming
from app.proxy import reconcile
from app.store import keys as redis_keys
from app.dispatch.proxies import lock_timeout
from app.store.queues import GC, PROXIES
from app.providers.base import ShardedProvider
from app.errors import Permanent, classify, describe
from app.proxy.reconcile import Ref
from workers.celery_app import celery_app
from workers.runtime import context, dispatcher, pool_dispatcher, preload

log = logging.getLogger(__name__)


@worker_init.connect
def _preload(**_) -> None:
    """Import what every task needs once, in the worker's main process before the pool forks
    (:func:`workers.runtime.preload`): a prefork child's first task no longer pays for it."""
    preload()


def _lock_timeout(ctx) -> float:
    return lock_timeout(ctx.settings)


def run_step(task, action: str, namespace: str, name: str, uid: str, attempt: int) -> None:
    """Run one reconcile step under the per-Proxy lock and queue its followup
    (:meth:`app.dispatch.proxies.Dispatcher.run_step`).

    The followup of the same step goes back on the queue ``task`` was delivered from.
    """
    queue = (task.request.delivery_info or {}).get("routing_key") or PROXIES
    dispatcher().run_step(context(), action, Ref(namespace, name, uid), attempt=attempt, queue=queue)


@celery_app.task(name="proxy.create", bind=True)
def create(self, namespace: str, name: str, uid: str, attempt: int = 0) -> None:
    """Ensure the finalizer and the instance of one Proxy (see :func:`app.proxy.reconcile.create`)."""
    run_step(self, "create", namespace, name, uid, attempt)


@celery_app.task(name="proxy.poll", bind=True)
def poll(self, namespace: str, name: str, uid: str, attempt: int = 0) -> None:
    """Follow one Proxy's instance (see :func:`app.proxy.reconcile.poll`)."""
    run_step(self, "poll", namespace, name, uid, attempt)


@celery_app.task(name="proxy.delete", bind=True)
def delete(self, namespace: str, name: str, uid: str, attempt: int = 0) -> None:
    """Finish one Proxy's deletion (see :func:`app.proxy.reconcile.delete`)."""
    run_step(self, "delete", namespace, name, uid, attempt)


#: ``max_retries`` handed to Celery by ``instance.retire``'s retries: the task keeps its own
#: limits (lock waits and error attempts apart), so Celery's must never be the one reached.
#: (``max_retries=None`` to ``Task.retry`` means "the task's default", not unlimited.)
_RETIRE_CELERY_MAX_RETRIES = 1_000_000


def retire_lock_waits(settings) -> int:
    """Return how many times ``instance.retire`` waits for a busy per-Proxy lock before leaving
    the instance to GC (int >= 1): enough tries, ``settings.poll_initial`` seconds apart, to
    outlast the lock timeout (:func:`app.dispatch.proxies.lock_timeout`) twice (64 with the defaults)."""
    return max(1, math.ceil(2 * lock_timeout(settings) / max(settings.poll_initial, 0.1)))


@celery_app.task(name="instance.retire", bind=True, max_retries=8)
def retire(self, provider_name: str, provider_id: str, namespace: str, name: str, uid: str,
           lock_waits: int = 0) -> None:
    """Delete an instance its Proxy replaced, on the queue of the place it lives in.

    See :func:`app.proxy.reconcile.retire_instance`.  Retried with backoff on failure, on the same
    queue, up to ``max_retries`` (8) times; when the place stays unreachable, GC collects the
    instance as superseded.  While a step of the Proxy holds its lock the task is tried again
    every ``POLL_INITIAL`` seconds; these waits (``lock_waits``: how many so far, carried in
    the retried message) do not count as failures, and after :func:`retire_lock_waits` of
    them the instance is left to GC (a warning, no error).

    A message naming a provider that is not configured, or delivered on a queue other than
    the one :meth:`~app.dispatch.proxies.Router.queue_for_instance` gives its instance (stale or
    forged: every sender routes by it), is dropped with a warning before any lock or provider
    call, so a worker never dials another host's place; GC collects what it named when its
    provider is configured (GC sweeps configured providers only).  The provider ID of a dropped
    message is logged with ``%r`` (it may be forged: no line breaks reach the log).  Without a
    delivery queue (a direct call) these checks are skipped.
    """
    ctx = context()
    queue = (self.request.delivery_info or {}).get("routing_key")
    if queue:
        router = dispatcher().router
        if provider_name not in router.names():
            log.warning("retire %r: provider %r is not configured; dropped", provider_id, provider_name)
            return
        expected = router.queue_for_instance(provider_name, provider_id)
        if queue != expected:
            log.warning("retire %r: delivered on %s, belongs on %s; dropped (GC collects it)",
                        provider_id, queue, expected)
            return
    lock = holders.lock(ctx.redis, redis_keys.proxy_lock(uid), timeout=_lock_timeout(ctx), blocking_timeout=0.5)
    args = [provider_name, provider_id, namespace, name, uid]
    errors = max(0, self.request.retries - lock_waits)  # failed attempts so far (lock waits apart)
    if not lock.acquire():  # a step of this Proxy is running: try again shortly
        if lock_waits >= retire_lock_waits(ctx.settings):
            log.warning("retire %s: the lock of proxy uid %s stayed busy through %d tries; GC collects the "
                        "instance", provider_id, uid, lock_waits + 1)
            return
        raise self.retry(args=args, kwargs={"lock_waits": lock_waits + 1}, countdown=ctx.settings.poll_initial,
                         queue=queue, max_retries=_RETIRE_CELERY_MAX_RETRIES)
    try:
        reconcile.retire_instance(ctx, provider_name, provider_id, ref=Ref(namespace, name, uid))
    except Exception as exc:  # noqa: BLE001 - classified and logged by the provider
        delay = reconcile.backoff(ctx.settings, errors)
        if classify(exc) is Permanent:
            log.warning("retire %s: %s; not retrying (GC collects it if its provider "
                        "is still configured)", provider_id, describe(exc))
            return
        if errors >= (self.max_retries or 0):
            log.warning("retire %s: giving up after %d attempts (%s); GC collects it",
                        provider_id, errors + 1, type(exc).__name__)
            return
        log.info("retire %s: %s; retrying in %.0fs", provider_id, type(exc).__name__, delay)
        raise self.retry(args=args, kwargs={"lock_waits": lock_waits}, countdown=delay, queue=queue,
                         max_retries=_RETIRE_CELERY_MAX_RETRIES) from None
    finally:
        try:
            lock.release()
        except Exception:  # noqa: BLE001 - expired
            pass


@celery_app.task(name="proxy.resync")
def resync() -> int:
    """List every Proxy and queue what each needs (beat); return how many messages were sent.

    Steady Proxies get nothing unless unpublished or drifted (:meth:`app.dispatch.proxies.Dispatcher.resync`).
    """
    ctx = context()
    return dispatcher().resync(ctx.kube.list_proxies(), drifted=lambda proxy: reconcile.drifted(ctx, proxy))


#: Longest wait before a pool's next pass asked for by its own plan (a drain deadline, an age
#: limit further away is met by a later pass or the resync).
POOL_REQUEUE_MAX = 300.0


@celery_app.task(name="pool.reconcile", bind=True)
def pool_reconcile(self, namespace: str, name: str, uid: str, attempt: int = 0) -> str:
    """One pass of the ProxyPool controller over a pool (see :func:`app.pools.controller.run`).

    The de-duplication mark is cleared first (a change seen from now on queues another pass).
    A pass whose plan has a deadline (a member draining, an age limit) queues the next one for
    then; a pass that fails (the API or Redis unreachable) is retried with backoff; a pool held
    by another pass is tried again shortly.  Returns the pass's state.
    """
    from app.pools.controller import PoolRef, run

    ctx = context()
    pools = pool_dispatcher()
    pools.started(uid)
    ref = PoolRef(namespace, name, uid)
    try:
        outcome = run(ctx.kube, ctx.redis, ctx.registry.configs, ref=ref, lock_timeout=_lock_timeout(ctx),
                      namespace_cap=ctx.settings.pool_namespace_max_replicas)
    except Exception as exc:  # noqa: BLE001 - the API or Redis down while reading: retry the pass
        delay = reconcile.backoff(ctx.settings, attempt)
        log.warning("pool %s/%s: pass failed: %s %s; retrying in %.0fs", namespace, name, type(exc).__name__,
                    getattr(exc, "status", "") or "", delay)
        pools.enqueue(ref, delay=delay, attempt=attempt + 1)
        return "retry"
    if outcome.requeue_after is not None:
        pools.enqueue(ref, delay=min(max(outcome.requeue_after, 0.5), POOL_REQUEUE_MAX))
    return outcome.state


@celery_app.task(name="pool.wake")
def pool_wake() -> int:
    """Queue a pass now over each pool a lease release woke (beat, every ``POOL_WAKE_INTERVAL``):
    a draining member whose last lease ended is deleted within seconds, not at its drain
    deadline (:mod:`app.pools.wake`).  Lists the pools only when one was woken.  Returns how
    many passes were queued."""
    from app.pools import wake
    from app.pools.controller import PoolRef

    ctx = context()
    woken = set(wake.take(ctx.redis))
    if not woken:
        return 0
    dispatcher = pool_dispatcher()
    sent = 0
    try:
        for pool in ctx.kube.list_pools():
            if (pool.namespace, pool.name) in woken:
                sent += dispatcher.enqueue(PoolRef(pool.namespace, pool.name, pool.uid))
                woken.discard((pool.namespace, pool.name))
    except Exception:
        wake.put_back(ctx.redis, woken)  # the next wake tries them again; none is lost
        raise
    return sent


@celery_app.task(name="pool.resync")
def pool_resync() -> int:
    """Queue a pass over every ProxyPool that has none queued to run before the next resync
    (beat): age limits, the autoscaler and leases running out on draining members need passes
    no event asks for, and drop the gauges' counts of pools no longer
    listed (:func:`app.pools.stats.prune`: a deletion whose pass was missed).  Returns how many
    were queued."""
    from app.pools import stats as pool_stats

    ctx = context()
    listed_at = time.time()
    pools = ctx.kube.list_pools()
    pool_stats.prune(ctx.redis, [(p.namespace, p.name) for p in pools], listed_at=listed_at)
    return pool_dispatcher().resync(pools, within=ctx.settings.pool_resync_interval)


@celery_app.task(name="gc.sweep")
def gc_sweep() -> None:
    """Queue GC for every configured provider (beat).

    Providers with hosts (kvm) are listed one host per task on that host's queue
    (``gc.collect_shard``); the others in one ``gc.collect`` on the ``gc`` queue.
    """
    ctx = context()
    route = dispatcher().router
    for name in ctx.registry.names():
        hosts = route.host_queues(name)
        if not hosts:
            gc_collect.apply_async(args=[name], queue=GC, expires=ctx.settings.gc_interval)
            continue
        sweep_id = f"{name}:{uuid.uuid4().hex}"
        for host, queue in hosts.items():
            gc_collect_shard.apply_async(args=[name, host, sweep_id, len(hosts)],
                                         queue=queue, expires=ctx.settings.gc_interval)


@celery_app.task(name="gc.collect_shard")
def gc_collect_shard(provider_name: str, host: str, sweep_id: str, shards: int) -> None:
    """List one host of a provider; the last shard of the sweep decides and queues the deletions."""
    ctx = context()
    provider = ctx.registry.get(provider_name)
    listing, error = None, None
    try:
        listing = provider.list_by_tag(naming.MANAGED_BY, host=host)
    except Exception as exc:  # noqa: BLE001 - a failed shard makes the sweep partial
        error = f"{host}: {exc}"
    merged = gc_logic.record_shard(ctx.redis, sweep_id, host, shards=shards, listing=listing, error=error)
    if merged is None:
        return
    live, current = (set(), {}) if merged.partial else gc_logic.current_instances(ctx.kube.list_proxy_refs(),
                                                                                  provider_name)

    def queue_delete(provider_id: str, uid: str | None = None) -> bool:
        gc_delete.apply_async(args=[provider_name, provider_id], kwargs={"uid": uid} if uid else {},
                              expires=ctx.settings.gc_interval,
                              queue=dispatcher().router.queue_for_instance(provider_name, provider_id))
        return True

    # Superseded instances carry their Proxy's UID to gc.delete, which re-checks under the
    # per-Proxy lock (the Proxy may name the instance again by the time the message runs).
    report = gc_logic.sweep(provider_name, queue_delete, merged, live_uids=live,
                            abandoned=set(ctx.redis.smembers(redis_keys.ABANDONED)),
                            grace_seconds=ctx.settings.gc_grace, current=current,
                            superseded=lambda uid, provider_id: queue_delete(provider_id, uid))
    if report.skipped_partial:
        metrics.GC_PARTIAL.labels(provider_name).inc()


@celery_app.task(name="gc.delete")
def gc_delete(provider_name: str, provider_id: str, uid: str | None = None) -> None:
    """Delete one orphan or superseded instance found by a sharded sweep (on its host's queue).

    The message is not trusted (anyone who can write to Redis can send one): the instance is
    read and judged again by GC's rules under its Proxy's lock before it is deleted
    (:func:`app.proxy.gc.verify_and_delete`).  ``uid`` is accepted for messages of older releases
    and ignored: the instance's own tag names its Proxy.
    """
    ctx = context()
    provider = ctx.registry.get(provider_name)
    if not gc_logic.verify_and_delete(provider, provider_name, provider_id, redis=ctx.redis,
                                      list_proxies=ctx.kube.list_proxy_refs, grace_seconds=ctx.settings.gc_grace,
                                      lock_timeout=_lock_timeout(ctx)):
        return
    metrics.GC_DELETED.labels(provider_name).inc()
    log.info("gc %s: deleted orphan %s", provider_name, provider_id)


@celery_app.task(name="gc.collect")
def gc_collect(provider_name: str) -> dict:
    """List one provider's managed instances and delete the orphans (see :mod:`app.proxy.gc`)."""
    ctx = context()
    provider = ctx.registry.get(provider_name)
    abandoned = set(ctx.redis.smembers(redis_keys.ABANDONED))
    report = gc_logic.collect(provider_name, provider, ctx.kube.list_proxy_refs,
                              abandoned=abandoned, grace_seconds=ctx.settings.gc_grace, redis=ctx.redis,
                              lock_timeout=_lock_timeout(ctx))
    if report.skipped_partial:
        metrics.GC_PARTIAL.labels(provider_name).inc()
    metrics.GC_DELETED.labels(provider_name).inc(len(report.deleted))
    return {"provider": provider_name, "listed": report.listed, "deleted": len(report.deleted),
            "partial": report.skipped_partial}


@celery_app.task(name="providers.check")
def provider_check(provider_name: str) -> dict:
    """Check one provider (unwrapped: not counted as provider requests) and publish its ProviderHealth.

    Providers with hosts (kvm) are checked one host per task on the host's queue
    (``providers.check_host``), so the check uses the connection that worker owns.
    """
    from app.providers.checks import ProviderHealthWriter, expected_targets, publish_snapshot, record_round, run_check

    ctx = context()
    pc = ctx.registry.configs[provider_name]
    provider = ctx.registry.unwrapped[provider_name]
    if isinstance(provider, ShardedProvider):
        hosts = dispatcher().router.host_queues(provider_name)
        for host, queue in hosts.items():
            provider_check_host.apply_async(args=[provider_name, host], queue=queue,
                                            expires=pc.check_interval or None)
        return {"provider": provider_name, "fanned_out": len(hosts)}
    verdicts, elapsed, failed = run_check(provider, pc.check_timeout)
    # One snapshot in Redis (app.providers.checks): the object and the metrics are read from it.
    record_round(ctx.redis, provider_name, verdicts, elapsed=elapsed, failed=failed, targets=expected_targets(pc))
    states = publish_snapshot(ctx.redis, ProviderHealthWriter(ctx.kube), pc)
    return {"provider": provider_name, "ready": sum(s.verdict.ready for s in states), "total": len(states)}


@celery_app.task(name="providers.check_host")
def provider_check_host(provider_name: str, host: str) -> dict:
    """Check one host of a provider and publish the provider's ProviderHealth with every host's latest verdict."""
    from app.providers.checks import ProviderHealthWriter, check_one, publish_snapshot, record_target

    ctx = context()
    pc = ctx.registry.configs[provider_name]
    provider = ctx.registry.unwrapped[provider_name]
    # A timeout is recorded under the host's own name: that host reads 0, not a generic target.
    verdict, elapsed = check_one(lambda: provider.check_host(host), host, pc.check_timeout)
    record_target(ctx.redis, provider_name, verdict, elapsed=elapsed)
    # Every host's latest verdict, silent ones as CheckStale (app.providers.checks.read_snapshot).
    publish_snapshot(ctx.redis, ProviderHealthWriter(ctx.kube), pc)
    return {"provider": provider_name, "host": host, "ready": verdict.ready}
