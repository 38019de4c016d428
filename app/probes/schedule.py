"""Which published proxies are due for a probe, in batches (the beat sweep's logic).

Each published proxy has a score in the sorted set :data:`app.store.keys.HEALTH_DUE` (epoch
second of its next probe; :func:`app.serving.view.publish` adds new ones as due at once, and the
engine reschedules each after its probe by the Proxy's ``healthCheck.intervalSeconds``).  :func:`claim_due` reads
only the due part of the set and, in the same Lua script, pushes those members
``claim_seconds`` into the future, so a second sweep (or a second beat) never enqueues them
again while their batch is queued, and a lost batch is retried after ``claim_seconds``.
The sweep therefore costs O(due), not O(fleet).

Lanes (:func:`plan`): a probe batch holds a worker process until its slowest probe ends, so the
due proxies are split by what their last probe cost.  A proxy whose last probe took
``HEALTH_SLOW_SECONDS`` or longer (a timeout, a tarpit) is *slow*; every other one (never probed
included) is *fast*.  Fast proxies are interleaved round-robin across namespaces before they are
cut into batches (each namespace's first proxies share the first batch), and in the fast lane no
probe runs longer than ``HEALTH_SLOW_SECONDS`` (:func:`app.probes.engine.probe_batch`).  Slow
proxies are batched per namespace, one batch per namespace at a time and at most
``HEALTH_SLOW_LANE_BATCHES`` at once fleet-wide, namespaces served longest-waiting first; the
slow proxies of a namespace without a slot are due again at once and wait for its turn.  So one
namespace's slow proxies cost the fast lane at most ``HEALTH_SLOW_SECONDS`` per probe, and the
slow lane a share of its slots.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from app.store import keys as redis_keys
from app.probes.settings import HealthSettings
from app.store.lua import Lua

_CLAIM = Lua("health_claim_due")
_CLAIM_LANES = Lua("health_claim_lanes")
_SLOTS = Lua("health_slow_slots")


@dataclass(frozen=True)
class Batch:
    """One ``health.probe_batch`` task to enqueue.

    Attributes:
        uids: Proxy uids (references only).
        slot: ``None`` for a fast-lane batch; for a slow-lane batch the namespace's slot in
            :data:`app.store.keys.HEALTH_SLOW_SLOTS` (:func:`slot_of`: a digest, not the name),
            released by :func:`release` when the batch ends.
    """

    uids: list[str]
    slot: str | None = None


def slot_of(namespace: str) -> str:
    """The slow-lane slot of ``namespace``: 16 hex digits of its BLAKE2b digest."""
    return hashlib.blake2b(namespace.encode("utf-8"), digest_size=8).hexdigest()


def release(r, slot: str) -> None:
    """Free the slow-lane ``slot`` (its batch ended); a slot already gone is no error."""
    r.zrem(redis_keys.HEALTH_SLOW_SLOTS, slot)


def claim_due(r, *, now: float, limit: int, claim_seconds: float) -> list[str]:
    """Return up to ``limit`` uids due at ``now`` (most overdue first) and mark them claimed.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        now: epoch seconds.
        limit: most uids to claim.
        claim_seconds: how far into the future the claimed members are pushed.
    """
    uids = _CLAIM(r, [redis_keys.HEALTH_DUE], [repr(now), int(limit), repr(now + claim_seconds)])
    return [u.decode() if isinstance(u, bytes) else u for u in uids]


def claim_lanes(r, *, now: float, limit: int, claim_seconds: float) -> list[tuple[str, str, float | None]]:
    """Claim as :func:`claim_due` does; return ``(uid, namespace, last latency in ms or None)``
    for each claimed uid, most overdue first (``namespace`` ``""`` when the record is gone)."""
    flat = _CLAIM_LANES(r, [redis_keys.HEALTH_DUE], [repr(now), int(limit), repr(now + claim_seconds)])
    flat = [v.decode() if isinstance(v, bytes) else v for v in flat]
    out = []
    for i in range(0, len(flat), 3):
        try:
            latency = float(flat[i + 2]) if flat[i + 2] != "" else None
        except ValueError:
            latency = None
        out.append((flat[i], flat[i + 1], latency))
    return out


def round_robin(groups: list[list[str]]) -> list[str]:
    """Interleave ``groups``: the first of each, then the second of each, and so on."""
    out: list[str] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def batches(uids: list[str], size: int) -> list[list[str]]:
    """Split ``uids`` into lists of at most ``size``."""
    size = max(1, int(size))
    return [uids[i:i + size] for i in range(0, len(uids), size)]


def sweep(r, settings: HealthSettings, *, now: float | None = None) -> list[list[str]]:
    """Claim every due proxy and return the uids of :func:`plan`'s batches (a caller that runs
    a slow-lane batch this way never frees its slot: it expires after ``claim_seconds``).

    Returns:
        lists of uids (references only).
    """
    return [b.uids for b in plan(r, settings, now=now)]


def plan(r, settings: HealthSettings, *, now: float | None = None) -> list[Batch]:
    """Claim every due proxy and return the batches to enqueue, by lane (see the module's text).

    Fast-lane batches are at most ``settings.batch_size`` long; a slow-lane batch holds up to
    ``settings.concurrency`` proxies of one namespace (its probes all wait at once) and a slot
    that its task must :func:`release`.  Slow proxies left without a slot are made due at
    ``now`` again.

    Returns:
        the fast batches, then the slow ones.
    """
    now = time.time() if now is None else now
    claimed = claim_lanes(r, now=now, limit=settings.sweep_limit, claim_seconds=settings.claim_seconds)
    slow_ms = settings.slow_seconds * 1000
    fast: dict[str, list[str]] = {}
    slow: dict[str, list[str]] = {}
    for uid, namespace, latency in claimed:
        lane = slow if latency is not None and latency >= slow_ms else fast
        lane.setdefault(namespace, []).append(uid)
    out = [Batch(uids) for uids in batches(round_robin(list(fast.values())), settings.batch_size)]
    if not slow:
        return out
    slots = {slot_of(ns): ns for ns in slow}
    granted = _SLOTS(r, [redis_keys.HEALTH_SLOW_SLOTS, redis_keys.HEALTH_SLOW_TURNS],
                     [repr(now), repr(now + settings.claim_seconds), int(settings.slow_lane_batches), *slots])
    granted = {g.decode() if isinstance(g, bytes) else g for g in granted}
    size = max(1, settings.concurrency)
    back: list[str] = []
    for slot, ns in slots.items():
        uids = slow[ns]
        if slot in granted:
            out.append(Batch(uids[:size], slot))
            back += uids[size:]
        else:
            back += uids
    if back:
        r.zadd(redis_keys.HEALTH_DUE, {uid: now for uid in back}, xx=True)
    return out
