"""Dispatch for ProxyPools: from "something about a pool changed" to one ``pool.reconcile``
message on the ``proxies`` queue.  Free of Celery, like :mod:`app.dispatch.proxies` (whose
:class:`~app.dispatch.proxies.Enqueuer` it uses: references-only payloads ``(namespace, name, uid,
attempt)``, de-duplicated in Redis by :func:`app.store.keys.queued` ``("pool", uid)``).

What queues a pass:

* a ProxyPool watch event (:meth:`PoolDispatcher.on_pool_event`): ``SYNC`` (a relist),
  ``ADDED``, ``DELETED`` (the pass forgets the pool's demand count), and ``MODIFIED`` when the
  spec changed (``metadata.generation`` differs from ``status.observedGeneration``) or the pool
  is being deleted; the controller's own status writes (which set ``observedGeneration``) and
  metadata-only edits queue nothing;
* a Proxy watch event of a member (:meth:`PoolDispatcher.on_member_event`): the owner comes from
  the Proxy's controller ownerReference of kind ProxyPool; queued a second ahead, so a burst of
  member events (a rollout, a health sweep) makes one pass;
* beat's ``pool.resync`` (:meth:`PoolDispatcher.resync`): every pool with no pass queued to run
  before the next resync (age limits, the autoscaler and the leases of a draining member that
  run out need passes nobody else asks for; a pass queued for a far deadline, a drain timeout
  up to :data:`workers.tasks.POOL_REQUEUE_MAX` ahead, does not hold them back);
* a pass itself, when its plan has a deadline (a drain timeout, an age limit).
"""

from __future__ import annotations

import logging
from typing import Iterable

from app.dispatch.proxies import POOL_ACTION, Enqueuer, Send
from app.store.queues import PROXIES
from app.pools.controller import PoolRef
from app.pools.model import Pool
from app.proxy.reconcile import Ref
from app.resources import GROUP, POOL_KIND

log = logging.getLogger(__name__)

#: Seconds a pass asked for by a member event waits, so a burst of them makes one pass.
MEMBER_DELAY = 1.0


def pool_of(obj: dict) -> PoolRef | None:
    """The pool that controls the Proxy ``obj`` (a dict as the API returns it), from its
    controller ownerReference of kind ProxyPool; ``None`` for a Proxy no pool controls."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or ():
        if not isinstance(ref, dict) or ref.get("controller") is not True:
            continue
        if ref.get("kind") == POOL_KIND and str(ref.get("apiVersion", "")).startswith(GROUP + "/") \
                and ref.get("name") and ref.get("uid") and meta.get("namespace"):
            return PoolRef(meta["namespace"], str(ref["name"]), str(ref["uid"]))
        return None
    return None


class PoolDispatcher:
    """Queues ``pool.reconcile`` passes (see the module docstring).

    Args:
        redis: ``redis.Redis`` (``decode_responses=True``) for de-duplication.
        send: the :class:`app.dispatch.proxies.Send` publisher.
        queue: the queue of the passes (``proxies``).
    """

    def __init__(self, redis, send: Send, queue: str = PROXIES) -> None:
        self.enqueuer = Enqueuer(send, redis)
        self.queue = queue

    def enqueue(self, ref: PoolRef, *, delay: float = 0.0, attempt: int = 0, only_if_idle: bool = False) -> bool:
        """Queue a pass over ``ref`` after ``delay`` seconds (de-duplicated: not sent when one is
        queued that runs as early; with ``only_if_idle``, when any is queued).

        Returns:
            whether a message went out.
        Raises:
            redis.RedisError / kombu.exceptions.OperationalError: Redis or the broker unreachable.
        """
        return self.enqueuer.send(POOL_ACTION, ref, queue=self.queue, delay=delay,
                                  attempt=attempt, only_if_idle=only_if_idle)

    def started(self, uid: str) -> None:
        """Clear the de-duplication mark of pool ``uid`` (the pass starts: a change from now on
        queues another)."""
        self.enqueuer.started(POOL_ACTION, uid)

    def on_pool_event(self, event_type: str, obj: dict) -> None:
        """The watcher's callback for a ProxyPool event (``SYNC``/``ADDED``/``MODIFIED``/``DELETED``).

        Raises:
            redis.RedisError / kombu.exceptions.OperationalError: Redis unreachable (the watcher's
                hand-off retries the event).
        """
        meta = obj.get("metadata") or {}
        if not (meta.get("namespace") and meta.get("name") and meta.get("uid")):
            log.warning("ignoring a ProxyPool event without namespace, name or uid")
            return
        if event_type == "MODIFIED" and not meta.get("deletionTimestamp"):
            observed = (obj.get("status") or {}).get("observedGeneration")
            if observed == meta.get("generation"):
                log.debug("pool %s/%s rv=%s: status or metadata only", meta["namespace"], meta["name"],
                          meta.get("resourceVersion"))
                return
        self.enqueue(PoolRef(meta["namespace"], meta["name"], meta["uid"]))

    def on_member_event(self, event_type: str, obj: dict) -> None:
        """The watcher's hook for a Proxy event: queue a pass over the pool controlling it (if
        any), :data:`MEMBER_DELAY` ahead.

        Raises:
            redis.RedisError / kombu.exceptions.OperationalError: Redis unreachable.
        """
        ref = pool_of(obj)
        if ref is not None:
            self.enqueue(ref, delay=MEMBER_DELAY)

    def resync(self, pools: Iterable[Pool], within: float) -> int:
        """Queue a pass now over every pool that has none queued to run within ``within``
        seconds (the resync period: a pass due before the next resync makes this one
        redundant) and none overdue by more than two periods (taken for lost: a pass a live
        worker had reserved when Redis restarted with its data never runs, and its mark would
        hold every pass back for the mark's 300 s); return how many were sent.

        Raises:
            redis.RedisError / kombu.exceptions.OperationalError: Redis or the broker unreachable.
        """
        sent = 0
        for pool in pools:
            if self.enqueuer.send(POOL_ACTION, Ref(pool.namespace, pool.name, pool.uid), queue=self.queue,
                                  slack=within, lost_after=2 * within):
                sent += 1
        log.info("pool resync queued %d pass(es)", sent)
        return sent


__all__ = ["MEMBER_DELAY", "PoolDispatcher", "pool_of"]
