"""Orphan collection ("GC").

An instance is an orphan when it carries our managed-by tag, its Proxy UID tag names no
existing Proxy, it is older than the grace period, and its Proxy was not released with
skip-cleanup.  Foreign instances (no managed-by tag) are never touched.  When a provider's
listing is partial (a host unreachable), nothing of that provider is deleted in that sweep:
the listing cannot be trusted as a whole.
"""

from __future__ import annotations

import contextlib
import gc as pygc
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator

from app.store import holders

from app.providers import naming

from app.store import keys as redis_keys
from app.store.lua import Lua
from app.providers.base import Instance, ListResult
from app.errors import describe
from app.resources import ProxyRef

log = logging.getLogger(__name__)

_pause_lock = threading.Lock()
_pauses = 0
_resume = False  # whether the last pause to end turns the collector back on


@contextlib.contextmanager
def cyclic_gc_paused():
    """Keep Python's cyclic garbage collector off while a large listing is read and diffed.

    Parsing a listing allocates hundreds of thousands of containers, and every allocation burst
    makes the collector walk the whole heap, which the listing itself keeps growing: at 10,000
    Proxies that was 30-50 % of the Proxy listing's CPU (docs/performance.md, "Scale").  Parsed
    JSON and the objects built from it hold no reference cycles, so the collector has nothing
    to find there (the few cycles of the HTTP layer wait for its next run).  Process-wide, safe
    across threads and nesting: the collector resumes when the last pause ends, and only if it
    was on when the first began.
    """
    global _pauses, _resume
    with _pause_lock:
        if _pauses == 0:
            _resume = pygc.isenabled()
            pygc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                pygc.enable()


@dataclass
class SweepReport:
    """What one provider's sweep did.

    Attributes:
        provider: provider name.
        listed: instances listed with our tag.
        deleted: provider IDs deleted.
        skipped_partial: true when nothing was deleted because the listing was partial.
        errors: per-instance delete errors (messages).
    """

    provider: str
    listed: int = 0
    deleted: list[str] = field(default_factory=list)
    skipped_partial: bool = False
    errors: list[str] = field(default_factory=list)


def orphans(instances: list[Instance], *, live_uids: set[str], abandoned: set[str], now: datetime,
            grace_seconds: float, current: dict[str, str] | None = None) -> list[Instance]:
    """Return the instances GC may delete (see module docstring).

    An instance carrying the abandoned tag (:data:`app.providers.naming.TAG_ABANDONED`, written by the
    provider's ``abandon`` when its Proxy was released with skip-cleanup) is never returned:
    that mark lives with the instance, so it holds whatever happened to Redis.

    Args:
        instances: the provider's listing.
        live_uids: UIDs of every existing Proxy.
        abandoned: UIDs released with skip-cleanup according to Redis
            (:data:`app.store.keys.ABANDONED`); an extra hint only, correctness rests on the tag.
        now: current time, timezone-aware.
        grace_seconds: minimum age; instances without a creation time are kept.
        current: for live Proxies that record an instance, Proxy UID -> the provider ID their
            status names, whichever provider it belongs to.  An instance of such a Proxy that
            is not the named one is *superseded* (left behind by a move to another zone, host
            or provider whose old place was unreachable) and is collected like an orphan.
            Proxies recording nothing are left out: their instance may be being created.
            Compared by ID only: two providers may list the same instances (two kubernetes
            providers on one cluster, two gcp providers in one project), and the instance a
            Proxy of the other provider names must not look superseded to this one.
    """
    out = []
    for inst in instances:
        if inst.tags.get(naming.TAG_MANAGED_BY) != naming.MANAGED_BY:
            continue
        if naming.is_abandoned(inst.tags):
            continue
        uid = inst.tags.get(naming.TAG_PROXY_UID)
        if not uid or uid in abandoned:
            continue
        if uid in live_uids and (current is None or uid not in current or current[uid] == inst.provider_id):
            continue
        if inst.created is None:
            continue
        created = inst.created if inst.created.tzinfo else inst.created.replace(tzinfo=timezone.utc)
        if (now - created).total_seconds() < grace_seconds:
            continue
        out.append(inst)
    return out


def current_instances(proxies, provider_name: str) -> tuple[set[str], dict[str, str]]:
    """Return ``(live UIDs, current)`` of ``proxies`` for a sweep of ``provider_name``.

    Args:
        proxies: every existing Proxy, iterated once: :class:`app.resources.ProxyRef` (what
            :meth:`app.kube.gateway.KubeGateway.list_proxy_refs` yields) or :class:`app.resources.Proxy`.
        provider_name: the provider being swept.
    Returns:
        the UIDs of every Proxy, and the ``current`` mapping :func:`orphans` takes: UID ->
        recorded ``status.providerID``, whatever provider (``status.provider``) it belongs
        to: provider IDs of different providers never coincide unless they name the very
        same instance (two providers listing one cluster or project), which must be kept.
        ``provider_name`` is kept for the callers (and logs).
    """
    live: set[str] = set()
    current: dict[str, str] = {}
    for proxy in proxies:
        live.add(proxy.uid)
        recorded = proxy.provider_id if isinstance(proxy, ProxyRef) else proxy.status.get("providerID")
        if recorded:
            current[proxy.uid] = recorded
    return live, current


def sweep(provider_name: str, delete, listing: ListResult, *, live_uids: set[str], abandoned: set[str],
          grace_seconds: float, now: datetime | None = None, current: dict[str, str] | None = None,
          superseded=None) -> SweepReport:
    """Delete the orphans in ``listing`` with ``delete(provider_id)``.

    ``delete`` is the provider's own ``delete``, or (sharded sweeps) a function that queues
    the deletion on the instance's host queue.  ``superseded(uid, provider_id) -> bool``, when
    given, takes over the *superseded* instances (their Proxy is live): the verdict was made
    from a Proxy listing that may be stale by now (moved back: the Proxy names the instance
    again), so it must be re-checked under the per-Proxy lock (:func:`delete_superseded`);
    it returns whether the instance was deleted (or its deletion queued).

    Returns:
        a :class:`SweepReport`; delete failures are collected, never raised.
    """
    report = SweepReport(provider_name, listed=len(listing.instances))
    if listing.partial:
        report.skipped_partial = True
        log.warning("gc %s: listing partial (%s); deleting nothing this sweep", provider_name,
                    "; ".join(listing.errors) or "unknown reason")
        return report
    for inst in orphans(listing.instances, live_uids=live_uids, abandoned=abandoned,
                        now=now or datetime.now(timezone.utc), grace_seconds=grace_seconds, current=current):
        uid = inst.tags.get(naming.TAG_PROXY_UID)
        try:
            if superseded is not None and uid in live_uids:
                if not superseded(uid, inst.provider_id):
                    continue
            else:
                delete(inst.provider_id)
            report.deleted.append(inst.provider_id)
            log.info("gc %s: deleted %s %s (proxy uid %s)", provider_name,
                     "superseded instance" if uid in live_uids else "orphan", inst.provider_id, uid)
        except Exception as exc:  # noqa: BLE001 - one failure must not stop the sweep
            report.errors.append(f"{inst.provider_id}: {describe(exc)}")
            log.warning("gc %s: deleting orphan %s failed: %s", provider_name, inst.provider_id, describe(exc))
    return report


def proxy_lock_key(uid: str) -> str:
    """The Redis key of the per-Proxy lock every step of a Proxy holds (``workers.tasks``)."""
    return redis_keys.proxy_lock(uid)


@contextlib.contextmanager
def _proxy_locked(redis, uid: str, lock_timeout: float) -> Iterator[bool]:
    """Hold the per-Proxy lock of ``uid`` for the block (waiting at most 1 s for it).

    Args:
        redis: ``redis.Redis``.
        uid: the Proxy's UID.
        lock_timeout: the lock's timeout, seconds.
    Yields:
        whether the lock was taken (``False``: the Proxy is busy with a step; nothing is held).
    """
    lock = holders.lock(redis, proxy_lock_key(uid), timeout=lock_timeout, blocking_timeout=1)
    if not lock.acquire():
        yield False
        return
    try:
        yield True
    finally:
        try:
            lock.release()
        except Exception:  # noqa: BLE001 - expired
            pass


def delete_superseded(redis, list_proxies, provider_name: str, *, delete, uid: str, provider_id: str,
                      lock_timeout: float = 60.0) -> bool:
    """Delete ``provider_id`` if its live Proxy ``uid`` still names another instance; return whether it did.

    Taken under the Proxy's lock and re-checked against a fresh listing, so a create that
    moved the Proxy back (and adopted this very instance) since the sweep's listing is not
    undone.  A Proxy busy with a step (lock taken) is left for the next sweep; a Proxy gone
    meanwhile makes the instance an orphan, deleted.
    """
    with _proxy_locked(redis, uid, lock_timeout) as held:
        if not held:
            log.info("gc %s: proxy uid %s is busy; superseded %s left for the next sweep", provider_name, uid,
                     provider_id)
            return False
        live, current = current_instances(list_proxies(), provider_name)
        if uid in live and (uid not in current or current[uid] == provider_id):
            log.info("gc %s: %s is current again (proxy uid %s); kept", provider_name, provider_id, uid)
            return False
        delete(provider_id)
        return True


def verify_and_delete(provider, provider_name: str, provider_id: str, *, redis, list_proxies,
                      grace_seconds: float, lock_timeout: float = 60.0, now: datetime | None = None) -> bool:
    """Delete ``provider_id`` only if GC's own rules, applied afresh, say it is collectable.

    What a ``gc.delete`` task runs.  Its arguments come from a Redis message and are not
    trusted: the instance is read from the provider (NotFound: nothing to do), then, under
    its Proxy's lock, judged by :func:`orphans` against a fresh listing of the Proxies: our
    managed-by tag, no abandoned mark, its Proxy gone (or the instance superseded), older
    than the grace period.  A forged message can therefore delete only what GC would delete
    anyway.

    Args:
        provider: the provider (``get`` and ``delete``).
        provider_name: for logs and :func:`current_instances`.
        provider_id: the instance.
        redis: ``redis.Redis`` for the per-Proxy lock.
        list_proxies: callable returning (an iterable of) every existing Proxy, as
            :func:`current_instances` takes them (the workers pass ``kube.list_proxy_refs``).
        grace_seconds: minimum age.
        lock_timeout: seconds.
        now: current time (timezone-aware), for tests.
    Returns:
        whether the instance was deleted.
    Raises:
        ProviderError: reading or deleting the instance failed.
    """
    from app.errors import NotFound

    try:
        inst = provider.get(provider_id)
    except NotFound:
        return False
    uid = inst.tags.get(naming.TAG_PROXY_UID)
    if inst.tags.get(naming.TAG_MANAGED_BY) != naming.MANAGED_BY or not uid:
        log.warning("gc %s: %s carries no managed-by tag and Proxy UID; not deleting it", provider_name, provider_id)
        return False
    with _proxy_locked(redis, uid, lock_timeout) as held:
        if not held:
            log.info("gc %s: proxy uid %s is busy; %s left for the next sweep", provider_name, uid, provider_id)
            return False
        live, current = current_instances(list_proxies(), provider_name)
        if not orphans([inst], live_uids=live, abandoned=set(), now=now or datetime.now(timezone.utc),
                       grace_seconds=grace_seconds, current=current):
            log.warning("gc %s: %s is not collectable (live, abandoned or too young); not deleting it",
                        provider_name, provider_id)
            return False
        provider.delete(provider_id)
        return True


def collect(provider_name: str, provider, list_proxies, *, abandoned: set[str], grace_seconds: float,
            tag: str = naming.MANAGED_BY, redis=None, lock_timeout: float = 60.0) -> SweepReport:
    """One provider's GC pass: list by tag, then delete the orphans and superseded instances.

    Args:
        provider_name: for logs and the report.
        provider: the (metered) provider.
        list_proxies: callable returning (an iterable of) every existing Proxy, as
            :func:`current_instances` takes them (the workers pass ``kube.list_proxy_refs``: UID
            and provider ID only); called *after* the provider listing, so a Proxy created
            meanwhile is seen as live.
        abandoned: UIDs released with skip-cleanup.
        grace_seconds: minimum orphan age.
        redis: when given, superseded instances are re-checked under the per-Proxy lock
            before they are deleted (:func:`delete_superseded`); ``lock_timeout`` is that
            lock's timeout.
    Raises:
        Exception: when listing the Proxies fails (nothing is deleted then).
    """
    with cyclic_gc_paused():
        listing = provider.list_by_tag(tag)
        live, current = current_instances(list_proxies(), provider_name)
    superseded = None
    if redis is not None:
        def superseded(uid: str, provider_id: str) -> bool:
            return delete_superseded(redis, list_proxies, provider_name, delete=provider.delete, uid=uid,
                                     provider_id=provider_id, lock_timeout=lock_timeout)
    return sweep(provider_name, provider.delete, listing, live_uids=live, abandoned=abandoned,
                 grace_seconds=grace_seconds, current=current, superseded=superseded)


# -- sharded sweeps (per KVM host, each on its host's queue) -------------------------------------
#
# A ShardedProvider (``app.providers.base``: kvm) is listed one host per task, on that host's queue (the
# worker that owns the host's connection).  Each shard stores its listing under the sweep's id;
# the shard that completes the set decides for the whole provider: if any shard was partial or
# failed, nothing of that provider is deleted in this sweep.

_SHARD_DONE = Lua("gc_shard_done")


def _encode(listing: ListResult | None, error: str | None) -> str:
    import json

    if listing is None:
        return json.dumps({"partial": True, "errors": [error or "listing failed"], "instances": []})
    return json.dumps({
        "partial": listing.partial, "errors": listing.errors,
        "instances": [{"provider_id": i.provider_id, "name": i.name, "tags": i.tags,
                       "created": i.created.isoformat() if i.created else None, "zone": i.zone}
                      for i in listing.instances],
    })


def _decode(blob: str) -> ListResult:
    import json

    from app.providers.base import InstanceState

    d = json.loads(blob)
    return ListResult([Instance(i["provider_id"], i["name"], InstanceState.RUNNING,
                                created=datetime.fromisoformat(i["created"]) if i["created"] else None,
                                tags=i["tags"], zone=i["zone"]) for i in d["instances"]],
                      partial=d["partial"], errors=d["errors"])


def record_shard(redis, sweep_id: str, shard: str, *, shards: int, listing: ListResult | None,
                 error: str | None = None, ttl: float = 3600) -> ListResult | None:
    """Store one shard's listing; when it completes the sweep, return the merged listing.

    Args:
        redis: ``redis.Redis`` (decode_responses=True).
        sweep_id: identifies one sweep of one provider.
        shard: the shard (host) name.
        shards: how many shards the sweep has.
        listing: the shard's listing, or ``None`` when listing raised (``error`` says why).
    Returns:
        ``None`` while shards are missing; else the merged :class:`ListResult` (``partial``
        when any shard was).  Exactly one caller gets it.
    """
    done = _SHARD_DONE(redis, [redis_keys.gc_sweep(sweep_id)],
                       [shard, _encode(listing, error), shards, int(ttl * 1000)])
    if not done:
        return None
    merged = ListResult([])
    for blob in done[1::2]:
        part = _decode(blob)
        merged.instances.extend(part.instances)
        merged.errors.extend(part.errors)
        if part.partial:
            merged = ListResult(merged.instances, partial=True, errors=merged.errors)
    return merged
