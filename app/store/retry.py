"""How every process's Redis clients ride out a Redis restart: one retry on a fresh connection.

A pooled connection opened before Redis restarted is dead, and the first command sent on it
fails with ``ConnectionError`` ("Connection closed by server") although Redis is back.
redis-py retries only the errors listed in ``retry_on_error`` (none by default, redis-py 6:
https://redis.readthedocs.io/en/stable/retry.html), so without this the first request of
every pooled connection after a restart failed (the API answered ``503 redis_unavailable``
once per connection).

:func:`client_options` retries a command once, at once, on a new connection, and only for
``ConnectionError``: Redis runs a command only once it has read all of it, and a connection
found dead after a restart failed before that, so the retry runs it exactly once.  A
connection that dies while a command's answer is on its way (the command ran) is retried as
well; the lease scripts answer such a retry as the first run did (an acquire finds the lease
granted under its request's fresh lease id, a release the answer it kept for its request id:
``app/redis_keys.released``), so it makes no second lease and no ``lease_not_found``.  Timeouts
are never retried: the command may still be running.
"""

from __future__ import annotations

from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

#: Retries of one command after a dead connection (each on a new connection, without delay).
RETRIES = 1


def client_options() -> dict:
    """Keyword arguments for ``redis.Redis`` / ``Redis.from_url`` (and thus every connection of
    its pool): ``retry`` (:data:`RETRIES`, no backoff) and ``retry_on_error``
    (``ConnectionError`` only).  A new ``Retry`` each call: redis-py copies it per connection."""
    return {"retry": Retry(NoBackoff(), RETRIES), "retry_on_error": [RedisConnectionError]}
