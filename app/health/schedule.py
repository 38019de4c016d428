"""Which published proxies are due for a probe, in batches (the beat sweep's logic).

Each published proxy has a score in the sorted set :data:`app.redis_keys.HEALTH_DUE` (epoch
second of its next probe; :func:`app.serving.publish` adds new ones as due at once, and the
engine reschedules each after its probe by the Proxy's ``healthCheck.intervalSeconds``).  :func:`claim_due` reads
only the due part of the set and, in the same Lua script, pushes those members
``claim_seconds`` into the future, so a second sweep (or a second beat) never enqueues them
again while their batch is queued, and a lost batch is retried after ``claim_seconds``.
The sweep therefore costs O(due), not O(fleet).
"""

from __future__ import annotations

import time

from app import redis_keys
from app.health.settings import HealthSettings
from app.lua import Lua

_CLAIM = Lua("health_claim_due")


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


def batches(uids: list[str], size: int) -> list[list[str]]:
    """Split ``uids`` into lists of at most ``size``."""
    size = max(1, int(size))
    return [uids[i:i + size] for i in range(0, len(uids), size)]


def sweep(r, settings: HealthSettings, *, now: float | None = None) -> list[list[str]]:
    """Claim every due proxy and return them as batches for ``health.probe_batch``.

    Returns:
        lists of uids (references only), each at most ``settings.batch_size`` long.
    """
    now = time.time() if now is None else now
    uids = claim_due(r, now=now, limit=settings.sweep_limit, claim_seconds=settings.claim_seconds)
    return batches(uids, settings.batch_size)
