"""Per-pool demand: lease requests refused for lack of a proxy in a pool, counted in Redis.

The API's lease script adds one (a single ``INCR`` of :func:`app.store.keys.pool_demand`,
nothing else written) for every ``503 no_proxy_available`` of a request whose ``pool`` filter
names a registered pool; the pool controller registers each pool it reconciles
(:func:`register`), reads and resets the count once per pass (:func:`take`) and forgets a
deleted pool (:func:`forget`).  Only registered pools are counted, so requests naming pools that
do not exist cannot make keys grow.

A request with ``pool`` but no ``namespace`` is counted for the first pool of that name the
controller registered; give ``namespace`` too when pool names repeat across namespaces.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.store import keys as redis_keys
from app.store.lua import Lua

_REGISTER = Lua("now", "pool_register")
_TAKE = Lua("now", "pool_take")
_FORGET = Lua("pool_forget")


@dataclass(frozen=True)
class Taken:
    """What :func:`take` read.

    Attributes:
        refused: refused lease requests counted since the last take.
        window: seconds since the last take (Redis clock); ``None`` when unknown (the pool was
            never registered or Redis was flushed).
    """

    refused: int
    window: float | None


def register(r, namespace: str, name: str) -> None:
    """Register the pool ``namespace/name`` for demand counting (idempotent, atomic).

    Raises:
        redis.RedisError: Redis unreachable.
    """
    _REGISTER(r, [redis_keys.pool_demand_read(namespace, name)], [namespace, name])


def take(r, namespace: str, name: str) -> Taken:
    """Read and reset the pool's refused-request count (atomic).

    Raises:
        redis.RedisError: Redis unreachable.
    """
    n, ms = _TAKE(r, [redis_keys.pool_demand(namespace, name), redis_keys.pool_demand_read(namespace, name)], [])
    return Taken(int(n), None if int(ms) < 0 else int(ms) / 1000.0)


def forget(r, namespace: str, name: str) -> None:
    """Stop counting for the pool ``namespace/name`` and drop its count (a deleted pool).

    Raises:
        redis.RedisError: Redis unreachable.
    """
    _FORGET(r, [redis_keys.pool_demand(namespace, name), redis_keys.pool_demand_read(namespace, name)],
            [namespace, name])


__all__ = ["Taken", "forget", "register", "take"]
