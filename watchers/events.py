"""The watcher's event handler: the dispatcher (:mod:`app.dispatch.proxies`) wired for the watcher process.

What it loads is what routing needs and nothing more: the providers config (validated; no
provider is built, so no SDK such as libvirt or google-cloud is imported) and a Redis client.
The fleet's publisher is injected: the composition root (``proxy-operator watch``,
:func:`cli.main.cmd_watch`) passes ``workers.celery_app.send`` (the broker connection, never a
task module, the beat schedule or the worker's hooks), so this package imports nothing from
``workers/`` (an import-linter contract in pyproject.toml).
"""

from __future__ import annotations

from app.dispatch.proxies import Dispatcher, Send
from app.dispatch.pools import PoolDispatcher
from app.config.settings import Settings
from app.wiring import load_config, router
from watchers.stream import OnEvent


def _redis(settings: Settings):
    from app.store.client import client_from_url

    # timeouts: a Redis gone silent fails a call instead of hanging the watcher
    return client_from_url(settings.redis_url, decode_responses=True, socket_timeout=10,
                           socket_connect_timeout=5, socket_keepalive=True)


def make_on_pool_event(send: Send, settings: Settings | None = None) -> OnEvent:
    """Return ``on_pool_event(event_type, obj)`` for the ProxyPool stream of :func:`watchers.main.run`
    (:meth:`app.dispatch.pools.PoolDispatcher.on_pool_event`: a ``pool.reconcile`` pass per change).

    Args:
        send: the publisher (:class:`app.dispatch.proxies.Send`; the watcher's is ``workers.celery_app.send``).
        settings: the process settings (default: :meth:`app.config.settings.Settings.from_env`).
    Raises:
        ValueError: a bad setting in the environment.
    """
    settings = settings or Settings.from_env()
    return PoolDispatcher(_redis(settings), send).on_pool_event


def make_on_event(send: Send, settings: Settings | None = None) -> OnEvent:
    """Return ``on_event(event_type, obj)`` for :func:`watchers.main.run`.

    The callable is :meth:`app.dispatch.proxies.Dispatcher.on_event`.

    A Proxy controlled by a ProxyPool also queues a pass over its pool
    (:meth:`app.dispatch.pools.PoolDispatcher.on_member_event`), whatever the dispatcher decides
    for the Proxy itself (the events of the reconciler's own writes included: a member that went
    Failed is news to its pool).

    Args:
        send: the publisher (:class:`app.dispatch.proxies.Send`; the watcher's is ``workers.celery_app.send``).
        settings: the process settings (default: :meth:`app.config.settings.Settings.from_env`):
            ``redis_url`` and ``providers_config`` are used.
    Raises:
        app.config.validation.ConfigError: the providers config is invalid.
        ValueError: a bad setting in the environment.

    ``on_event`` raises ``redis.RedisError`` or ``kombu.exceptions.OperationalError`` while
    Redis is unreachable; the watcher's :class:`watchers.handoff.Handoff` retries the event.
    """
    settings = settings or Settings.from_env()
    config = load_config(settings.providers_config)
    redis = _redis(settings)
    dispatcher = Dispatcher(redis, router(config), send)
    pools = PoolDispatcher(redis, send)

    def on_event(event_type: str, obj: dict) -> None:
        dispatcher.on_event(event_type, obj)
        pools.on_member_event(event_type, obj)

    return on_event
