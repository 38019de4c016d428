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
makes ``redis://`` URLs resolve to :class:`Transport` (``sentinel://`` ones to
:class:`SentinelTransport`, the same on a Sentinel-managed master) through kombu's transport aliases, so the
broker URL, Celery's banner and Flower's broker view keep saying ``redis://``.

:class:`Channel` also keeps one ``redis.Redis`` client for its synchronous calls instead of
building one per operation, as kombu does (see :meth:`Channel._create_client`).

:class:`QoS` records which worker holds each message it takes and puts back the messages of
workers that died without acknowledging them (SIGKILL, OOM kill, a lost node) within seconds,
instead of kombu's visibility timeout (an hour): see :mod:`app.store.holders`.
"""

from __future__ import annotations

import logging
import time
import uuid

import redis
from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

from app.store import holders

from app.store import keys as redis_keys
from app.store.queues import GC, HEALTH, HOST_QUEUE_PREFIX, PROXIES

log = logging.getLogger(__name__)

_FIXED_QUEUES = frozenset((PROXIES, HEALTH, GC))


def self_bound(exchange: str) -> bool:
    """Whether ``exchange`` is the exchange of one of the fleet's queues (bound by its own name).

    True for ``proxies``, ``health``, ``gc`` and every ``kvm.<provider>.<host>``.
    """
    return exchange in _FIXED_QUEUES or exchange.startswith(HOST_QUEUE_PREFIX)


#: Seconds between two reaps of one worker (kombu calls :meth:`QoS.restore_visible` every
#: ``unacked_restore_interval`` seconds, set to this in ``workers/celery_app.py``).
REAP_INTERVAL = 2.0


class QoS(kombu_redis.QoS):
    """kombu's Redis acknowledgement emulation, with each taken message's holder recorded.

    * :meth:`append` (a message delivered to this worker) also adds its delivery tag to this
      process's holder's set (:func:`app.store.keys.holder_messages`), in the same transaction
      as kombu's unacked entry; an acknowledgement removes it.
    * :meth:`restore_visible` (kombu's periodic sweep for messages past the visibility timeout)
      also puts back, at most every :data:`REAP_INTERVAL` seconds, the messages of holders whose
      heartbeat is gone (:func:`app.store.holders.reap`, through :meth:`restore_retagged`: kombu's
      ``restore_by_tag`` under a new delivery tag).

    A process without an installed holder (beat, the watcher: they only publish) behaves as kombu's.
    """

    _reaped_at = 0.0

    def append(self, message, delivery_tag):
        """Record ``message`` as unacknowledged (kombu's entry) and held by this process's holder."""
        holder = holders.installed()
        if holder is None:
            return super().append(message, delivery_tag)
        delivery = message.delivery_info
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()}) \
                .hset(self.unacked_key, delivery_tag,
                      dumps([message._raw, delivery["exchange"], delivery["routing_key"]])) \
                .sadd(redis_keys.holder_messages(holder.id), delivery_tag) \
                .execute()
            virtual.QoS.append(self, message, delivery_tag)

    def _remove_from_indices(self, delivery_tag, pipe=None):
        pipe = super()._remove_from_indices(delivery_tag, pipe)
        holder = holders.installed()
        if holder is not None:
            pipe.srem(redis_keys.holder_messages(holder.id), delivery_tag)
        return pipe

    def restore_visible(self, start=0, num=10, interval=10):
        """kombu's sweep (throttled as kombu does), then the reap of dead holders' messages."""
        super().restore_visible(start=start, num=num, interval=interval)
        holder = holders.installed()
        now = time.monotonic()
        if holder is None or now - self._reaped_at < REAP_INTERVAL:
            return
        self._reaped_at = now
        with self.channel.conn_or_acquire() as client:
            try:
                holders.reap(client, lambda tag: self.restore_retagged(tag, client), holder)
            except redis.RedisError as exc:
                log.debug("broker: reaping dead holders' messages failed: %s", type(exc).__name__)


    def restore_retagged(self, tag, client):
        """kombu's ``restore_by_tag`` (atomic: two reapers restore a message once), the message
        put back under a new delivery tag.

        The holder it is taken from may be alive after all (a pause longer than ``HOLDER_TTL``):
        it acknowledges the tag when its run ends.  kombu keeps a message's tag when it restores
        it, so that late acknowledgement would delete the unacked entry of the worker that took
        the restored copy, and that worker's death would then put nothing back (the step lost).
        """
        def restore_transaction(pipe):
            raw = pipe.hget(self.unacked_key, tag)
            pipe.multi()
            self._remove_from_indices(tag, pipe)
            if raw:
                payload, exchange, routing_key = loads(bytes_to_str(raw))
                if isinstance(payload.get("properties"), dict):
                    payload["properties"]["delivery_tag"] = str(uuid.uuid4())
                self.channel._do_restore_message(payload, exchange, routing_key, pipe)

        client.transaction(restore_transaction, self.unacked_key)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, re-creating the lost binding of a fleet queue when publishing.

    Raises what kombu's channel raises (``redis.ConnectionError`` and friends while Redis is
    unreachable).  Its acknowledgements go through :class:`QoS`.
    """

    QoS = QoS

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
        """Return kombu's connection parameters.

        Args:
            asynchronous: parameters for the consumer's asynchronous client.
        Returns:
            the keyword arguments of kombu's Redis connection pool.
        Raises:
            redis.exceptions.ConnectionError: the transport has dropped its client (the
                connection is being closed).
        """
        # Closing a channel after Redis was lost restores the unacked messages through a new
        # pool, after the transport dropped its client: kombu then raised AttributeError
        # (celery/kombu#582, #970), which is no connection error, so the worker exited.  A
        # ConnectionError lets the close go on and the worker reconnect.
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection is closed")
        return super()._connparams(asynchronous=asynchronous)

    def _create_client(self, asynchronous=False):
        """Return a Redis client on the channel's pool: one reused client for synchronous calls.

        Args:
            asynchronous: build the consumer's asynchronous client (``BRPOP``), as kombu does.
        Returns:
            a ``redis.Redis``; the synchronous one is replaced when the channel's pool is
            (after a fork or a disconnect).
        """
        # kombu builds a new redis.Redis per synchronous operation, and its constructor's
        # reply-callback table cost a quarter of a worker's main process CPU (docs/performance.md,
        # "Pipeline").  A redis.Redis is safe to share between threads.
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


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """:class:`Channel` on the master of kombu's Sentinel channel (``sentinel://`` URLs with the
    transport option ``master_name``): the same bindings, client and holder records, and a pool
    that asks the Sentinels for the master at each new connection."""


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Redis Sentinel transport with :class:`SentinelChannel`."""

    Channel = SentinelChannel


#: What ``redis://`` resolves to once :func:`install` ran.
TRANSPORT_PATH = "workers.broker:Transport"
#: What ``sentinel://`` resolves to once :func:`install` ran.
SENTINEL_TRANSPORT_PATH = "workers.broker:SentinelTransport"


def install() -> None:
    """Make kombu resolve ``redis://`` broker URLs to :class:`Transport` and ``sentinel://`` ones
    to :class:`SentinelTransport` (idempotent).

    Takes effect for every ``Connection`` built afterwards (kombu resolves the transport when a
    ``Connection`` is built, and caches the resolution: a cached one is forgotten here);
    ``rediss://`` URLs keep kombu's own transport.
    """
    for alias, path in (("redis", TRANSPORT_PATH), ("sentinel", SENTINEL_TRANSPORT_PATH)):
        kombu_transport.TRANSPORT_ALIASES[alias] = path
        kombu_transport._transport_cache.pop(alias, None)  # resolved before this ran (a connection made earlier)


__all__ = ["Channel", "QoS", "REAP_INTERVAL", "SENTINEL_TRANSPORT_PATH", "SentinelChannel", "SentinelTransport",
           "Transport", "TRANSPORT_PATH", "install", "self_bound"]
