"""The broker transport (workers/broker.py): a publish after Redis lost its bindings is delivered.

kombu keeps exchange bindings in Redis and declares each queue once per connection, so after
``FLUSHALL`` (or an empty restart kombu did not notice) a publish to a fleet queue would go
nowhere, silently.  Real Redis, real kombu.
"""

from __future__ import annotations

import json

import pytest
from kombu import Connection, Exchange, Queue

from workers import broker

pytestmark = pytest.mark.timeout(30)


def _queue(name: str) -> Queue:
    """A fleet queue as workers.celery_app declares it: bound to the direct exchange of its name."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


@pytest.mark.parametrize("name", ["proxies", "health", "gc", "kvm.kvm-lab.lab1"])
def test_a_publish_after_flushall_reaches_the_fleet_queue(redis_url, redis_client, name, caplog):
    broker.install()
    queue = _queue(name)
    with Connection(redis_url) as conn:
        assert isinstance(conn.transport, broker.Transport)
        assert conn.as_uri().startswith("redis://")  # Flower and the banner still see redis://
        producer = conn.Producer()
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key=name, declare=[queue])
        redis_client.flushall()
        # the producer still believes the queue is declared: nothing re-declares it
        producer.publish({"n": 2}, exchange=queue.exchange, routing_key=name, declare=[queue])
    [message] = redis_client.lrange(name, 0, -1)
    assert json.loads(message)["properties"]["delivery_info"]["routing_key"] == name
    assert redis_client.smembers(f"_kombu.binding.{name}") == {f"{name}\x06\x16\x06\x16{name}"}
    assert f"the binding of queue {name} was missing" in caplog.text


def test_other_exchanges_are_left_alone(redis_url, redis_client):
    broker.install()
    queue = Queue("someone-elses", Exchange("someone-elses-exchange", type="direct"), routing_key="key")
    with Connection(redis_url) as conn:
        producer = conn.Producer()
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key="key", declare=[queue])
        redis_client.flushall()
        producer.publish({"n": 2}, exchange=queue.exchange, routing_key="key", declare=[queue])
    assert redis_client.keys("*") == []  # kombu's behaviour for exchanges of other shapes


def test_self_bound_names_the_fleet_queues_only():
    assert all(broker.self_bound(q) for q in ("proxies", "health", "gc", "kvm.p.h"))
    assert not any(broker.self_bound(q) for q in ("celery", "reply.celery.pidbox", "celeryev", ""))


def test_synchronous_calls_share_one_client_until_the_pool_changes(redis_url):
    broker.install()
    with Connection(redis_url) as conn:
        channel = conn.default_channel
        first = channel._create_client()
        assert channel._create_client() is first
        assert first.connection_pool is channel.pool
        assert channel._create_client(asynchronous=True) is not first  # the consumer's own
        channel._disconnect_pools()  # what kombu does after a fork
        again = channel._create_client()
        assert again is not first and again.connection_pool is channel.pool
        assert again.ping()


def test_closing_a_channel_after_the_transport_dropped_its_client_is_a_connection_error(redis_url, redis_client):
    """A worker that lost Redis closes its connection; the channel's close restores the unacked
    messages after the transport has dropped its client.  kombu's own channel then raised
    ``AttributeError`` (celery/kombu#582), which escaped celery's ``ignore_errors`` and the
    worker process exited (seen in tests/test_redis_loss.py).  It must be a connection error,
    which ``Connection.maybe_close_channel`` (and celery) ignore; the message stays unacked in
    Redis, restored once its visibility timeout passes."""
    broker.install()
    redis_client.flushdb()
    queue = _queue("proxies")
    conn = Connection(redis_url)
    channel = conn.default_channel
    conn.Producer().publish({"n": 1}, exchange=queue.exchange, routing_key="proxies", declare=[queue])
    assert channel.basic_get("proxies", no_ack=False) is not None
    conn.transport.client = None  # what kombu's Connection._do_close_transport does
    conn.maybe_close_channel(channel)  # raised AttributeError before
    assert redis_client.hlen("unacked") == 1  # not lost: kombu restores it after the visibility timeout
    redis_client.flushdb()
