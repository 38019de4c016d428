"""The Redis broker transport of the fleet: kombu's, plus self-healing exchange bindings and a
reused client.

kombu's Redis transport keeps the bindings of each exchange in Redis (``_kombu.binding.<exchange>``)
and each process remembers which queues it has declared, declaring them once per connection.
After ``FLUSHALL``, or a Redis restarted without persistence whose reconnect kombu did not see
(redis-py reconnects by itself), the binding sets are gone while every publisher still believes
its queues are declared: a direct exchange with no binding routes nowhere, and kombu drops the
message without an error.  Beat's resync, the watcher's tasks and every followup would vanish.

Every queue of the fleet is bound to the direct exchange of its own name by its own name
(``celery_app.task_queues`` and the ``kvm.<provider>.<host>`` queues created on demand), so a
missing binding of one of *those* exchanges can only mean Redis lost it: :class:`Channel`
re-creates it at the first publish that finds it missing, and the message is delivered.
Exchanges of other shapes (Celery's pidbox and event exchanges) are left alone.

:func:`install` (called by ``workers.celery_app`` at import, before any connection exists)
makes ``redis://`` URLs resolve to :class:`Transport` through kombu's transport aliases, so the
broker URL, Celery's banner and Flower's broker view keep saying ``redis://``.

:class:`Channel` also keeps one ``redis.Redis`` client for its synchronous calls instead of
building one per operation, as kombu does (see :meth:`Channel._create_client`).
"""

from __future__ import annotations

import logging

import redis
from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis

from app.dispatch import GC, HEALTH, HOST_QUEUE_PREFIX, PROXIES

log = logging.getLogger(__name__)

_FIXED_QUEUES = frozenset((PROXIES, HEALTH, GC))


def self_bound(exchange: str) -> bool:
    """Whether ``exchange`` is the exchange of one of the fleet's queues (bound by its own name).

    True for ``proxies``, ``health``, ``gc`` and every ``kvm.<provider>.<host>``.
    """
    return exchange in _FIXED_QUEUES or exchange.startswith(HOST_QUEUE_PREFIX)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, re-creating the lost binding of a fleet queue when publishing.

    Raises what kombu's channel raises (``redis.ConnectionError`` and friends while Redis is
    unreachable).
    """

    def get_table(self, exchange):
        """Return the bindings of ``exchange`` (``[(routing_key, pattern, queue)]``).

        An empty table of a fleet exchange (:func:`self_bound`) is a wiped one: the binding
        ``exchange -> queue exchange`` (routing key = queue = exchange name) is written back to
        Redis and returned, so the message being published is delivered.
        """
        table = super().get_table(exchange)
        if table or not exchange or not self_bound(exchange):
            return table
        log.warning("broker: the binding of queue %s was missing from Redis (flushed or restarted "
                    "empty); re-created", exchange)
        # the member a consumer's declaration writes: routing key, no pattern (direct), queue
        self._queue_bind(exchange, exchange, "", exchange)
        return [(exchange, "", exchange)]

    def _connparams(self, asynchronous=False):
        """Return kombu's connection parameters; raise ``redis.ConnectionError`` once closed.

        A worker that loses Redis closes its connection (celery's
        ``on_connection_error_after_connected``); closing the channel restores the unacked
        messages, which builds a new pool after the transport has already dropped its client
        (``transport.client`` is ``None``), and kombu then fails with ``AttributeError:
        'NoneType' object has no attribute 'hostname'`` (celery/kombu#582, #970).  That error is
        not among the transport's connection errors, so it escaped celery's ``ignore_errors``
        and the worker process exited.  A ``redis.ConnectionError`` is one of them: the close
        goes on, and the worker reconnects as it does for any other loss of Redis.
        """
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection is closed")
        return super()._connparams(asynchronous=asynchronous)

    def _create_client(self, asynchronous=False):
        """Return a Redis client on the channel's pool: one reused client for synchronous calls.

        kombu builds a new ``redis.Redis`` for every synchronous operation (each publish, each
        event, each acknowledgement and unacked-index write); redis-py's constructor fills a
        table of some 200 reply callbacks, which was a quarter of a prefork worker's main
        process CPU at 50 tasks/s (docs/performance.md, "Pipeline").  A ``redis.Redis`` takes
        a connection from the pool per command and is safe to share between threads; the one
        kept here is replaced when the channel's pool is (after a fork or a disconnect).  The
        asynchronous client (the consumer's BRPOP) is built as before.
        """
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        client = self.__dict__.get("_sync_client")
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client()
        return client


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel


#: What ``redis://`` resolves to once :func:`install` ran.
TRANSPORT_PATH = "workers.broker:Transport"


def install() -> None:
    """Make kombu resolve ``redis://`` broker URLs to :class:`Transport` (idempotent).

    Takes effect for every ``Connection`` built afterwards (kombu resolves the transport when a
    ``Connection`` is built, and caches the resolution: a cached one is forgotten here);
    ``rediss://`` and sentinel URLs keep kombu's own transports.
    """
    kombu_transport.TRANSPORT_ALIASES["redis"] = TRANSPORT_PATH
    kombu_transport._transport_cache.pop("redis", None)  # resolved before this ran (a connection made earlier)


__all__ = ["Channel", "Transport", "TRANSPORT_PATH", "install", "self_bound"]
