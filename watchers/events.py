"""The watcher's event handler: the dispatcher (:mod:`app.dispatch`) wired for the watcher process.

What it loads is what routing needs and nothing more: the providers config (validated; no
provider is built, so no SDK such as libvirt or google-cloud is imported), a Redis client, and
the fleet's publisher (``workers.celery_app.send``: the broker connection, never a task module,
the beat schedule or the worker's hooks).  ``tests/test_watcher_imports.py`` pins that.
"""

from __future__ import annotations

from app.dispatch import Dispatcher
from app.settings import Settings
from app.wiring import load_config, router
from watchers.stream import OnEvent


def make_on_event(settings: Settings | None = None) -> OnEvent:
    """Return ``on_event(event_type, obj)`` for :func:`watchers.main.run` (:meth:`app.dispatch.Dispatcher.on_event`).

    Args:
        settings: the process settings (default: :meth:`app.settings.Settings.from_env`):
            ``redis_url`` and ``providers_config`` are used.
    Raises:
        app.validation.ConfigError: the providers config is invalid.
        ValueError: a bad setting in the environment.

    ``on_event`` raises ``redis.RedisError`` or ``kombu.exceptions.OperationalError`` while
    Redis is unreachable; the watcher's :class:`watchers.handoff.Handoff` retries the event.
    """
    import redis as redis_lib

    from workers.celery_app import send

    settings = settings or Settings.from_env()
    config = load_config(settings.providers_config)
    # timeouts: a Redis gone silent fails a call instead of hanging the watcher
    redis = redis_lib.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=10,
                                     socket_connect_timeout=5, socket_keepalive=True)
    return Dispatcher(redis, router(config), send).on_event
