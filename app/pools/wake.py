"""Pools woken by what changes only in Redis: a draining member's last live lease released.

A release only touches Redis (``lease_release.lua`` adds the pool to
:data:`app.store.keys.POOL_WAKE`); no watch event follows, and the pass already queued for the
drain deadline may be minutes away.  The ``pool.wake`` task (beat, every ``POOL_WAKE_INTERVAL``
seconds) takes the woken pools and queues a pass over each now, so the drained member is
deleted within seconds of its last release (docs/pools.md).  A lease that *expires* needs no
wake: a pass over a pool with draining members that hold leases is queued for the earliest of
their expiries (:func:`next_expiry`).
"""

from __future__ import annotations

from app.store import keys as redis_keys

#: Woken pools one take reads at most (the rest: the next take).
TAKE_LIMIT = 1000


def take(r) -> list[tuple[str, str]]:
    """Take (and remove) the woken pools.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
    Returns:
        ``(namespace, name)`` of each woken pool, :data:`TAKE_LIMIT` at most.
    Raises:
        redis.RedisError: Redis unreachable (the pools stay woken for the next take).
    """
    out = []
    for key in r.spop(redis_keys.POOL_WAKE, TAKE_LIMIT) or ():
        namespace, slash, name = key.partition("/")
        if slash and namespace and name:
            out.append((namespace, name))
    return out


def put_back(r, pools) -> None:
    """Wake ``pools`` (``(namespace, name)`` pairs) again: a take whose passes were not all
    queued (the API or the broker failed) loses none of them.

    Raises:
        redis.RedisError: Redis unreachable.
    """
    keys = [f"{namespace}/{name}" for namespace, name in pools]
    if keys:
        r.sadd(redis_keys.POOL_WAKE, *keys)


def next_expiry(r, uids: list[str]) -> float | None:
    """The earliest expiry (epoch seconds, Redis clock) of a live lease on any of ``uids``,
    ``None`` when they hold none.  Two round trips (``TIME``, then the reads).

    Raises:
        redis.RedisError: Redis unreachable.
    """
    if not uids:
        return None
    # a draining member's expired leases stay in its set (reindex drops them only for a
    # leasable proxy): read the first *live* one, or a pass runs every EXPIRY_SLACK seconds
    now_s, now_us = r.time()
    now_ms = now_s * 1000 + now_us // 1000
    pipe = r.pipeline(transaction=False)
    for uid in uids:
        pipe.zrangebyscore(redis_keys.proxy_leases(uid), f"({now_ms}", "+inf", start=0, num=1, withscores=True)
    firsts = [rows[0][1] for rows in pipe.execute() if rows]
    return min(firsts) / 1000.0 if firsts else None
