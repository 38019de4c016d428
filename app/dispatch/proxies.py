"""Dispatch: from "something about a Proxy changed" to one message on the right queue.

The one home of that step, for every caller: the watcher (:meth:`Dispatcher.on_event`), beat's
resync (:meth:`Dispatcher.resync`) and the reconcile tasks (:meth:`Dispatcher.run_step`, which
runs one step and queues its followup).  Free of Celery: messages go out through an injected
``send(task_name, args, queue, countdown)`` (the worker and the watcher pass
``workers.celery_app.send``; tests pass a recorder).  Nothing here builds a provider or imports
a provider's SDK: queues are picked from the providers config alone (:class:`Router`), so the watcher
loads this module without libvirt, google-cloud or any task module.

* :class:`Router` — queue names and routing: every task touching KVM host H of provider P runs
  on ``kvm.P.H`` (:func:`kvm_queue`); everything else on ``proxies``.
* :class:`Enqueuer` — references-only payloads, de-duplicated in Redis: a key per
  (action, uid) holds the ETA of the message already queued; a new request is sent only when
  none is queued or it would run earlier, so a burst of watch events or a resync that overlaps
  a pending retry sends one message.  The task clears the key when it starts, so a change seen
  while it runs queues another pass.
* :class:`OwnWrites` — recognising the watch events the operator's own writes cause.
* :class:`Dispatcher` — decide (:func:`app.proxy.reconcile.decide`), route, send.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Protocol

from app.store import holders

from app.observability import metrics

from app.proxy import reconcile
from app.pools import budget as pool_budget

from app.store import keys as redis_keys

from app.serving import view as serving
from app.config.providers import ProviderConfig, ProvidersConfig
from app.store.lua import Lua
from app.config.provider_types import ProviderType
from app.proxy.reconcile import DELETE, POLL, Ref
from app.resources import PHASES, Proxy
from app.store.queues import PROXIES, kvm_queue

log = logging.getLogger(__name__)

#: action -> name of the task that runs it
TASKS = {reconcile.CREATE: "proxy.create", reconcile.POLL: "proxy.poll", reconcile.DELETE: "proxy.delete"}
#: The de-duplicated action of a ProxyPool pass and its task (:mod:`app.dispatch.pools`).
POOL_ACTION = "pool"
TASKS[POOL_ACTION] = "pool.reconcile"
#: Name of the task that deletes a replaced instance on its own queue (``workers.tasks``).
RETIRE_TASK = "instance.retire"


class Send(Protocol):
    """Publishes one task message: ``send(task_name, args, queue, countdown)``.

    ``args`` are references only (never a spec, user-data, token or key: Flower shows them);
    ``countdown`` is seconds before the message may run, or ``None`` for at once.  Raises
    whatever the broker raises while unreachable (``redis.RedisError``,
    ``kombu.exceptions.OperationalError``).
    """

    def __call__(self, task: str, args: list, queue: str, countdown: float | None = None) -> None: ...


class Router:
    """Picks the queue of a task from the providers config alone (no provider is built).

    Args:
        configs: the providers config (or its entries).
        types: provider type name -> :class:`~app.config.provider_types.ProviderType`
            (``app.wiring.PROVIDER_TYPES``); a type with a ``placement`` (kvm) has its hosts'
            work routed to :func:`kvm_queue`.

    Unknown providers and hosts route to ``proxies``: the task then fails there, with a message
    naming the provider or host.
    """

    def __init__(self, configs: ProvidersConfig | Iterable[ProviderConfig], types: Mapping[str, ProviderType]) -> None:
        entries = configs.providers if isinstance(configs, ProvidersConfig) else configs
        self._configs = {pc.name: pc for pc in entries}
        self._types = dict(types)

    def names(self) -> list[str]:
        """Return the configured provider names in config order."""
        return list(self._configs)

    @property
    def configs(self) -> Mapping[str, ProviderConfig]:
        """Provider name -> its config entry."""
        return self._configs

    def _placed(self, provider_name: str | None):
        pc = self._configs.get(provider_name or "")
        kind = self._types.get(pc.type) if pc is not None else None
        return (pc, kind.placement) if kind is not None and kind.placement is not None else (pc, None)

    def queue_for(self, provider_name: str | None, zone: str | None) -> str:
        """Return the queue for work on an instance of ``provider_name`` placed in ``zone``.

        A sharded provider's (kvm) host queue when ``zone`` names a configured host (or is
        empty and the provider has exactly one host); else ``proxies``.
        """
        pc, placement = self._placed(provider_name)
        if placement is None:
            return PROXIES
        host = placement.host_for(pc.settings, zone)
        return kvm_queue(pc.name, host) if host else PROXIES

    def queue_for_instance(self, provider_name: str | None, provider_id: str) -> str:
        """Return the queue for work on the existing instance ``provider_id`` of ``provider_name``.

        The place is read from the ID itself (a KVM provider ID names its host), never from a
        Proxy's spec, which may already point elsewhere.
        """
        pc, placement = self._placed(provider_name)
        host = placement.host_of(provider_id) if placement is not None else None
        return self.queue_for(provider_name, host) if host else PROXIES

    def host_queues(self, provider_name: str) -> dict[str, str]:
        """Return ``{host: queue}`` of a provider whose work is split by host (kvm), else ``{}``.

        Sharded GC listings and per-host checks go to these queues, one task per host.
        """
        pc, placement = self._placed(provider_name)
        if placement is None:
            return {}
        return {host: kvm_queue(pc.name, host) for host in placement.hosts(pc.settings)}

    def queue_for_proxy(self, proxy: Proxy, action: str | None = None) -> str:
        """Return the queue that must run ``action`` for ``proxy`` (its KVM host's queue, else ``proxies``).

        Polls and deletes follow the instance that exists (the host in ``status.providerID``, of
        ``status.provider``, which differs from ``spec.provider`` while a move to another provider
        has not recorded its new instance yet); creates go where the spec places the Proxy
        (``placement.zone``).
        """
        if not proxy.spec.managed:
            return PROXIES
        provider_id = proxy.status.get("providerID")
        if action in (POLL, DELETE) and provider_id:
            return self.queue_for_instance(proxy.status.get("provider") or proxy.spec.provider, provider_id)
        return self.queue_for(proxy.spec.provider, proxy.spec.zone)


# -- de-duplicated sending -----------------------------------------------------------------------
_CLAIM = Lua("dispatch_claim")


def dedup_key(action: str, uid: str) -> str:
    """Return the Redis key marking a queued ``action`` for Proxy ``uid`` (:func:`app.store.keys.queued`)."""
    return redis_keys.queued(action, uid)


class Enqueuer:
    """Sends ``proxy.create/poll/delete`` (and ``pool.reconcile``) messages, de-duplicated in Redis.

    Payloads are ``(namespace, name, uid, attempt)``: never a spec, user-data, token or key.

    Args:
        send: the :class:`Send` callable that publishes a message.
        redis: ``redis.Redis`` for de-duplication.
        stale_after: seconds after which a dedup mark is ignored even if never cleared (a lost
            message must not block work forever).
    """

    def __init__(self, send: Send, redis, stale_after: float = 300.0) -> None:
        self._send, self.redis, self.stale_after = send, redis, stale_after

    def send(self, action: str, ref: Ref, *, queue: str, delay: float = 0.0, attempt: int = 0,
             only_if_idle: bool = False, slack: float = 1.0, lost_after: float | None = None) -> bool:
        """Queue ``action`` for ``ref`` on ``queue`` after ``delay`` seconds.

        Args:
            only_if_idle: send only when no message for this action is queued at all (the
                resync uses this, so it never cuts a scheduled backoff short); by default a
                message is also sent when it would run earlier than the queued one.
            slack: seconds (>= 0); without ``only_if_idle``, a queued message that runs at most
                this long after this one counts as the same and nothing is sent.
            lost_after: seconds; a queued message that was due more than this long before this
                one counts as lost (its mark outlived it: a message a live worker had reserved
                when Redis restarted with its data stays unacknowledged) and this one is sent.
                ``None``: only the mark's expiry (``stale_after``) ends such a wait.
        Returns:
            whether a message was sent.
        Raises:
            redis.RedisError / kombu.exceptions.OperationalError: Redis or the broker is
                unreachable; the de-duplication mark is then released (best effort), so a
                retry or the resync sends the message instead of finding it "already queued".
        """
        eta = time.time() + max(0.0, delay)
        ttl_ms = int((max(0.0, delay) + self.stale_after) * 1000)
        mode = "idle" if only_if_idle else "earlier"
        key = dedup_key(action, ref.uid)
        args = [f"{eta:.3f}", ttl_ms, mode, f"{max(0.0, slack):.3f}"]
        if lost_after is not None:
            args.append(f"{max(0.0, lost_after):.3f}")
        if not _CLAIM(self.redis, [key], args):
            return False
        try:
            self._send(TASKS[action], [ref.namespace, ref.name, ref.uid, attempt], queue, delay if delay > 0 else None)
        except Exception:
            try:
                self.redis.delete(key)
            except Exception:  # noqa: BLE001 - Redis down too: the mark expires after stale_after
                pass
            raise
        log.debug("queued %s %s/%s on %s in %.1fs", action, ref.namespace, ref.name, queue, delay)
        return True

    def started(self, action: str, uid: str) -> None:
        """Clear the dedup mark of ``action`` for ``uid`` (called when the task starts)."""
        self.redis.delete(dedup_key(action, uid))


# -- recognising the events our own writes cause ----------------------------------------------
#
# Every status or finalizer write by a task makes the watcher receive a MODIFIED event.  Those
# events carry nothing new: the task already decided what comes next.  While a task works on a
# Proxy it is marked busy; an event arriving then is parked (its resourceVersion kept).  When
# the task ends it publishes the resourceVersions it wrote; parked events that are not among
# them are real changes and cause one more dispatch.  Events arriving after the task ended are
# skipped when their resourceVersion is one the task wrote.  Both sides are single Lua
# scripts (``dispatch_observe.lua``, ``dispatch_finish.lua``), so no event falls between the checks.

_OBSERVE = Lua("dispatch_observe")
_FINISH = Lua("dispatch_finish")


class OwnWrites:
    """Tells the watcher which Proxy events were caused by the operator's own writes.

    Args:
        redis: ``redis.Redis``.
        ttl: seconds the written resourceVersions and busy marks are kept.
    """

    def __init__(self, redis, ttl: float = 300.0) -> None:
        self.redis, self.ttl_ms = redis, int(ttl * 1000)

    @staticmethod
    def _keys(uid: str) -> list[str]:
        return [redis_keys.own_writes(uid), redis_keys.busy(uid), redis_keys.parked(uid)]

    def park(self, uid: str, what: str) -> None:
        """Record that work for ``uid`` arrived while a task held its lock (re-checked at finish)."""
        pipe = self.redis.pipeline()
        pipe.sadd(redis_keys.parked(uid), what)
        pipe.pexpire(redis_keys.parked(uid), self.ttl_ms)
        pipe.execute()

    def begin(self, uid: str, ttl: float) -> None:
        """Mark a task as working on ``uid`` for at most ``ttl`` seconds."""
        self.redis.set(redis_keys.busy(uid), "1", px=int(ttl * 1000))

    def finish(self, uid: str, written: list[str]) -> bool:
        """Publish the resourceVersions the task wrote; return whether a parked event was a real change."""
        return bool(_FINISH(self.redis, self._keys(uid), [self.ttl_ms, *written]))

    def observe(self, uid: str, resource_version: str) -> str:
        """Classify a watch event: ``"skip"`` (our own write), ``"deferred"`` (a task is busy) or ``"send"``."""
        result = _OBSERVE(self.redis, self._keys(uid), [resource_version, self.ttl_ms])
        return result.decode() if isinstance(result, bytes) else result


# -- the dispatcher ------------------------------------------------------------------------------
def lock_timeout(settings) -> float:
    """Seconds the per-Proxy lock is held at most: the task hard time limit + 10 s (float).

    The same span as :func:`app.proxy.reconcile.create_window`, and taken from it: a step holds the
    lock no longer than its provider call may still make an instance, so a delete that waits
    out the window also outlives any lock a create held."""
    return reconcile.create_window(settings)


@dataclass(frozen=True)
class Dispatched:
    """What :meth:`Dispatcher.dispatch` did.

    Attributes:
        action: what :func:`app.proxy.reconcile.decide` said the Proxy needs (``None``: nothing).
        sent: whether a message went out (de-duplication, or a step of the Proxy running during
            a resync, may hold it back).
    """

    action: str | None
    sent: bool


class Dispatcher:
    """Decides, routes and sends the work Proxies need (see the module docstring).

    Args:
        redis: ``redis.Redis`` (``decode_responses=True``): de-duplication marks, own writes,
            the per-Proxy locks and the serving view.
        router: the :class:`Router` of the providers config.
        send: the :class:`Send` callable that publishes a message.
    """

    def __init__(self, redis, router: Router, send: Send) -> None:
        self.redis, self.router, self._send = redis, router, send
        self.enqueuer = Enqueuer(send, redis)
        self.own = OwnWrites(redis)

    def dispatch(self, proxy: Proxy, *, resync: bool = False) -> Dispatched:
        """Queue what ``proxy`` needs now (de-duplicated), on the queue :class:`Router` picks.

        Args:
            resync: the periodic resync: only sends when nothing is queued for the action, so it
                heals lost messages without cutting scheduled backoffs short, and sends nothing
                while a step of the Proxy runs (its view may predate that step's writes; the
                step re-decides when it ends); a lock whose holder's heartbeat is gone
                (:mod:`app.store.holders`) does not count.
        Raises:
            redis.RedisError / kombu.exceptions.OperationalError: Redis or the broker unreachable.
        """
        action = reconcile.decide(proxy, resync=resync)
        if action is None:
            return Dispatched(None, False)
        if resync and holders.held_by_live(self.redis, redis_keys.proxy_lock(proxy.uid)):
            # A step of this Proxy is running: the resync's view may predate its writes (e.g. a
            # create about to fail with QuotaExceeded and schedule its own retry), and a message sent
            # now would run before that backoff.  The running step re-decides when it ends.  A lock
            # whose holder is dead (app.store.holders) holds nothing back: its step will not re-decide.
            return Dispatched(action, False)
        sent = self.enqueuer.send(action, Ref(proxy.namespace, proxy.name, proxy.uid),
                                  queue=self.router.queue_for_proxy(proxy, action), only_if_idle=resync)
        return Dispatched(action, sent)

    def on_event(self, event_type: str, obj: dict) -> None:
        """The watcher's callback: queue what the Proxy in one watch event needs.

        ``DELETED`` events need nothing (the finalizer guarantees we saw the deletion earlier).
        Events caused by the operator's own writes are skipped (:class:`OwnWrites`); every other
        event queues what :func:`app.proxy.reconcile.decide` says the Proxy needs.  ``SYNC`` items from a
        (re)list are always dispatched.  A live Proxy that needs no step has its labels,
        ``maxLeases`` and ``healthCheck`` refreshed in the serving view.  A Proxy being deleted
        (``deletionTimestamp`` set) is withdrawn from the serving view at once, before its
        delete step is queued: no lease is granted on it meanwhile, and its live leases end.

        Raises:
            redis.RedisError / kombu.exceptions.OperationalError: Redis unreachable; the watcher's
                :class:`watchers.handoff.Handoff` retries the event.
        """
        if event_type == "DELETED":
            return
        try:
            proxy = Proxy.from_dict(obj)
        except ValueError as exc:
            log.warning("ignoring malformed Proxy event: %s", exc)
            return
        if proxy.deleting:
            # Out of leasing the moment its deletion is seen, not when the delete step runs
            # (a queue away); its live leases end as for any withdrawn proxy.
            serving.withdraw(self.redis, proxy.uid)
        if event_type != "SYNC":
            verdict = self.own.observe(proxy.uid, proxy.resource_version)
            if verdict != "send":
                log.debug("%s %s rv=%s: %s", event_type, proxy.key, proxy.resource_version, verdict)
                return
        action = self.dispatch(proxy).action
        if action is None and proxy.phase in reconcile.LIVE_PHASES:
            # Labels, maxLeases and healthCheck change what the API hands out, not the instance.
            serving.refresh(self.redis, proxy)
        log.debug("%s %s -> %s", event_type, proxy.key, action)

    def resync(self, proxies: Iterable[Proxy], *, drifted: Callable[[Proxy], bool] | None = None) -> int:
        """Queue what each listed Proxy needs; return how many messages were actually sent.

        A :func:`~app.proxy.reconcile.steady` Proxy (Running/Ready, status current) that is published
        in the serving view gets nothing: the health probes watch it.  Every other Proxy goes
        through :meth:`dispatch` with ``resync=True``: Pending/Provisioning ones are polled, a
        changed generation or a lost retry is created again, deleting ones are deleted, Unhealthy
        ones are polled, and a steady one is polled when it is missing from the serving view (a
        flushed Redis: the poll publishes it again) or when ``drifted(proxy)`` says so
        (:func:`app.proxy.reconcile.drifted`: its provider or host was removed, its baked-in
        credentials were rotated).  Also sets the Proxies-by-phase gauge.

        Args:
            proxies: every Proxy, as just listed.
            drifted: ``drifted(proxy) -> bool`` for steady Proxies, or ``None`` (never).
        Raises:
            redis.RedisError / kombu.exceptions.OperationalError: Redis or the broker unreachable.
        """
        published = set(self.redis.smembers(redis_keys.PROXIES))
        sent = listed = settled = 0
        counts: dict[tuple[str, str], int] = {}
        costed: list[Proxy] = []
        for proxy in proxies:
            listed += 1
            if pool_budget.has_instance(proxy):
                costed.append(proxy)
            key = (proxy.phase, proxy.spec.provider or "external")
            counts[key] = counts.get(key, 0) + 1
            if reconcile.steady(proxy) and proxy.uid in published and not (drifted is not None and drifted(proxy)):
                settled += 1
                continue
            if proxy.deleting and proxy.uid in published:
                serving.withdraw(self.redis, proxy.uid)  # (the watcher missed it: it was down)
            if self.dispatch(proxy, resync=True).sent:
                sent += 1
        # Every (phase, provider) pair is set, zeros included: clearing labels does not work in
        # multiprocess mode, and a drained phase must read 0, not its last count.
        providers = set(self.router.names()) | {provider for _, provider in counts} | {"external"}
        for provider in providers:
            for phase in PHASES:
                metrics.PROXIES_BY_PHASE.labels(phase, provider).set(counts.get((phase, provider), 0))
        pool_budget.export(costed, self.router.configs)
        log.info("resync queued %d task(s) for %d Proxies (%d steady: nothing to send)", sent, listed, settled)
        return sent

    def retire(self, provider_name: str, provider_id: str, ref: Ref) -> None:
        """Queue the deletion of a replaced instance on the queue of the place it lives in.

        The ``retire`` hook of :class:`app.proxy.reconcile.Context` (task ``instance.retire``).

        Raises:
            redis.RedisError / kombu.exceptions.OperationalError: the broker unreachable.
        """
        self._send(RETIRE_TASK, [provider_name, provider_id, ref.namespace, ref.name, ref.uid],
                   self.router.queue_for_instance(provider_name, provider_id), None)

    def run_step(self, ctx: reconcile.Context, action: str, ref: Ref, *, attempt: int = 0,
                 queue: str = PROXIES) -> str:
        """Run one reconcile step under the per-Proxy lock and queue its followup.

        * The dedup mark of ``action`` is cleared first, so a change seen from now on queues
          another pass.
        * Lock held by another step: the request is *parked* (not re-sent); the holder re-reads
          and re-decides when it finishes, so nothing is lost and a backoff it schedules is not
          cut short (decision 3).  A lock whose holder died (no heartbeat, :mod:`app.store.holders`)
          is taken over (decision 22).
        * A followup of the same step goes back on ``queue`` (the one the task was delivered
          from); a different step is routed from the object as it is now (a create after the
          Proxy moved to another KVM host goes to that host's queue): the Proxy the step last
          wrote (``followup.proxy``, a create's poll) or, when the step gives none, read again
          (decision 9).
        * A real change that arrived while the step ran (an event parked by :class:`OwnWrites`)
          causes one more :meth:`dispatch` of the re-read Proxy (decision 12).

        Args:
            ctx: the reconcile context (its ``redis`` is the one this dispatcher uses).
            action: ``"create"``, ``"poll"`` or ``"delete"``.
            ref: the Proxy.
            attempt: retry counter of the step.
            queue: the queue the task was delivered from.
        Returns:
            ``"locked"`` (parked), ``"followup"`` (a followup was asked for) or ``"done"``.
        Raises:
            redis.RedisError / kombu.exceptions.OperationalError: Redis or the broker unreachable
                outside the step itself (the step's own errors become a retry).
        """
        self.enqueuer.started(action, ref.uid)
        timeout = lock_timeout(ctx.settings)
        lock = holders.lock(ctx.redis, redis_keys.proxy_lock(ref.uid), timeout=timeout, blocking_timeout=0.5)
        if not lock.acquire():
            self.own.park(ref.uid, f"task:{action}")
            metrics.RECONCILES.labels(action, "locked").inc()
            return "locked"
        self.own.begin(ref.uid, timeout)
        ctx.kube.take_written()
        changed_meanwhile = False
        try:
            step = {reconcile.CREATE: reconcile.create, reconcile.POLL: reconcile.poll,
                    reconcile.DELETE: reconcile.delete}[action]
            followup = step(ctx, ref, attempt)
        except Exception as exc:  # noqa: BLE001 - e.g. the API or Redis down while reading: retry the step
            # Only the class and a status code: an API error body may quote the object (user-data).
            log.warning("proxy %s/%s: %s failed before it could record an outcome: %s %s; retrying",
                        ref.namespace, ref.name, action, type(exc).__name__, getattr(exc, "status", "") or "")
            followup = reconcile.Followup(action, reconcile.backoff(ctx.settings, attempt), attempt + 1)
        finally:
            changed_meanwhile = self.own.finish(ref.uid, ctx.kube.take_written())
            try:
                lock.release()
            except Exception:  # noqa: BLE001 - expired lock: another worker may own it now
                pass
        metrics.RECONCILES.labels(action, "followup" if followup else "done").inc()
        if followup:
            if followup.action != action:
                # A different step may belong on another queue (e.g. a create after the zone moved
                # to another KVM host): route it from the object as it is now: as the step last
                # wrote it when it says so (a later change by someone else was parked and causes
                # the dispatch below, or reaches the watcher), else read again.
                proxy = followup.proxy or ctx.kube.get_proxy(ref.namespace, ref.name)
                if proxy is None or proxy.uid != ref.uid:
                    return "followup"
                queue = self.router.queue_for_proxy(proxy, followup.action)
            self.enqueuer.send(followup.action, ref, queue=queue, delay=followup.delay, attempt=followup.attempt)
        if changed_meanwhile:
            # Someone else changed the Proxy while we worked: look again.
            proxy = ctx.kube.get_proxy(ref.namespace, ref.name)
            if proxy is not None and proxy.uid == ref.uid:
                self.dispatch(proxy)
        return "followup" if followup else "done"
