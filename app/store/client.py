"""Redis clients of every process, from ``REDIS_URL``: one Redis, or a Sentinel-managed master.

Two forms of ``REDIS_URL`` (with ``REDIS_PASSWORD`` / ``REDIS_USERNAME`` put in by
:func:`app.config.settings.redis_url_from_env`):

* ``redis://host:6379/0`` (or ``rediss://``, ``unix://``): one Redis, as redis-py reads it.
* ``redis+sentinel://host1:26379,host2:26379,host3:26379/<master name>/<db>`` (``sentinel://``
  is the same): Redis Sentinel.  Every client asks the Sentinels where the master named
  ``<master name>`` is (``SENTINEL GET-MASTER-ADDR-BY-NAME``) and asks again after losing it, so
  every process follows a failover.  The URL's user and password are the data Redis's (the ACL
  user of the component); the Sentinels' own password, when they require one, is
  ``REDIS_SENTINEL_PASSWORD``.  Sentinel's client protocol:
  https://redis.io/docs/latest/develop/reference/sentinel-clients/

The same URL configures redis-py (:func:`client_from_url`), Celery's broker (kombu's
``sentinel://`` transport, :func:`celery_broker`) and beat's redbeat (:func:`redbeat_settings`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelManagedConnection

from app.store import retry as redis_retry

#: ``REDIS_URL`` schemes naming Sentinels rather than a Redis.
SENTINEL_SCHEMES = ("redis+sentinel", "sentinel")
#: Sentinel's port when a host of the URL names none (Redis Sentinel's default).
SENTINEL_DEFAULT_PORT = 26379
#: Seconds a call to a Sentinel may take (asking where the master is).
SENTINEL_SOCKET_TIMEOUT = 2.0


@dataclass(frozen=True)
class SentinelTarget:
    """A ``redis+sentinel://`` URL, parsed.

    Attributes:
        sentinels: ``((host, port), ...)`` of the Sentinels, in the URL's order (at least one).
        master: the master's name in the Sentinels' configuration (``sentinel monitor <name> ...``).
        db: the database number (default 0).
        username / password: the data Redis's credentials (``None`` when the URL has none).
    """

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` is a ``redis+sentinel://`` (or ``sentinel://``) URL."""
    return urlsplit(url).scheme in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelTarget | None:
    """Parse a ``redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/<master>[/<db>]`` URL.

    Returns:
        the :class:`SentinelTarget`, or ``None`` when ``url`` is not a Sentinel URL (a
        ``redis://`` one: left to redis-py).
    Raises:
        ValueError: a malformed Sentinel URL; the message names ``REDIS_URL`` and the part that
            is wrong (no host, a bad port, no master name, a bad database number, a query).
            It never contains the password.
    """
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        return None
    where = f"REDIS_URL ({parts.scheme}://)"
    if ";" in url:
        raise ValueError(f"{where}: separate the Sentinel hosts with ',' "
                         "(redis+sentinel://host1:26379,host2:26379/<master>/0), not ';'")
    if parts.query or parts.fragment:
        raise ValueError(f"{where}: takes no query or fragment")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    sentinels = []
    for item in hosts.split(","):
        item = item.strip()
        if item.startswith("["):  # [IPv6]:port
            host, _, port = item[1:].partition("]")
            port = port.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        if not host:
            raise ValueError(f"{where}: a Sentinel host is empty in {hosts!r}")
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"{where}: Sentinel {host!r} has a bad port {port!r} (1-65535)")
        sentinels.append((host, int(port) if port else SENTINEL_DEFAULT_PORT))
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError(f"{where}: the master name is missing: redis+sentinel://<sentinels>/<master name>/<db>")
    if len(path) > 2:
        raise ValueError(f"{where}: the path is /<master name>/<db>, got {parts.path!r}")
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"{where}: the database number {path[1]!r} is not a non-negative integer")
        db = int(path[1])
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    return SentinelTarget(tuple(sentinels), unquote(path[0]), db, username, password)


def sentinel_password() -> str | None:
    """The Sentinels' own password (``REDIS_SENTINEL_PASSWORD``; one trailing newline dropped), or ``None``."""
    value = (os.environ.get("REDIS_SENTINEL_PASSWORD") or "").removesuffix("\n").removesuffix("\r")
    return value or None


def _sentinel_kwargs(socket_connect_timeout: float | None = None) -> dict:
    kwargs: dict = {"socket_timeout": SENTINEL_SOCKET_TIMEOUT,
                    "socket_connect_timeout": socket_connect_timeout or SENTINEL_SOCKET_TIMEOUT}
    password = sentinel_password()
    if password:
        kwargs["password"] = password
    return kwargs


class MasterConnection(SentinelManagedConnection):
    """redis-py's connection to a Sentinel-managed master, asking the Sentinels where the master
    is at every (re)connect.

    redis-py (6.x) re-opens a dropped connection from ``send_packed_command`` through
    ``connect_check_health`` with the host and port it had, bypassing the Sentinel lookup of
    ``connect``: a client holding one connection (``single_connection_client``, the API's
    per-thread clients) kept dialling the dead master after a failover.  Here that path asks
    the Sentinels too.

    Raises:
        redis.sentinel.MasterNotFoundError: no Sentinel names a master (a ``ConnectionError``).
    """

    def _connect_retry(self):
        if self._sock:
            return
        if not self.connection_pool.is_master:
            return super()._connect_retry()
        self.connect_check_health(check_health=self.connection_pool.check_connection, retry_socket_connect=False)

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True):
        if not self._sock and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        return super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)


def client_from_url(url: str, **kwargs) -> redis.Redis:
    """Return a ``redis.Redis`` for ``REDIS_URL`` ``url``: one Redis, or the Sentinels' master.

    Args:
        url: ``redis://...`` / ``rediss://...`` / ``unix://...`` (``redis.Redis.from_url``), or
            ``redis+sentinel://...`` (see the module docstring).
        kwargs: client options (``decode_responses``, ``socket_timeout``, ...), as for
            ``redis.Redis``; the retry of :func:`app.store.retry.client_options` unless given.
    Returns:
        a client; with Sentinels, on a ``SentinelConnectionPool`` that asks them for the master
        at each new connection, so a failover costs the calls in flight a
        ``redis.ConnectionError`` (``MasterNotFoundError`` while no master is known) and the
        next calls go to the new master.
    Raises:
        ValueError: a malformed Sentinel URL (:func:`parse_sentinel_url`).
    """
    kwargs = {**redis_retry.client_options(), **kwargs}  # a restart that is over is never seen
    target = parse_sentinel_url(url)
    if target is None:
        return redis.Redis.from_url(url, **kwargs)
    sentinel = Sentinel(list(target.sentinels),
                        sentinel_kwargs=_sentinel_kwargs(kwargs.get("socket_connect_timeout")))
    credentials = {k: v for k, v in (("username", target.username), ("password", target.password)) if v}
    return sentinel.master_for(target.master, redis_class=redis.Redis, db=target.db, connection_class=MasterConnection,
                               **credentials, **kwargs)


def celery_broker(url: str) -> tuple[str, dict]:
    """Return Celery's ``broker_url`` and the transport options to add for ``REDIS_URL`` ``url``.

    A ``redis://`` URL is returned as is with no options.  A Sentinel URL becomes kombu's form,
    ``sentinel://[cred@]host1:26379/<db>;sentinel://[cred@]host2:26379/<db>`` with the options
    ``master_name`` and ``sentinel_kwargs`` (kombu docs, "Redis Sentinel" transport options).

    Raises:
        ValueError: a malformed Sentinel URL (:func:`parse_sentinel_url`).
    """
    target = parse_sentinel_url(url)
    if target is None:
        return url, {}
    cred = urlsplit(url).netloc.rpartition("@")[0]
    cred = cred + "@" if cred else ""
    broker = ";".join(f"sentinel://{cred}{_host(host)}:{port}/{target.db}" for host, port in target.sentinels)
    return broker, {"master_name": target.master, "sentinel_kwargs": _sentinel_kwargs()}


def redbeat_settings(url: str) -> tuple[str, dict]:
    """Return redbeat's ``redbeat_redis_url`` and the ``redbeat_redis_options`` to add for ``url``.

    A ``redis://`` URL is returned as is with no options.  A Sentinel URL becomes redbeat's
    Sentinel form: the URL ``redis-sentinel://`` and the options ``sentinels``,
    ``service_name`` (the master's name), ``db``, ``username``, ``password`` and
    ``sentinel_kwargs`` (redbeat docs, "Configuration: redbeat_redis_options").

    Raises:
        ValueError: a malformed Sentinel URL (:func:`parse_sentinel_url`).
    """
    target = parse_sentinel_url(url)
    if target is None:
        return url, {}
    options: dict = {"sentinels": list(target.sentinels), "service_name": target.master, "db": target.db,
                     "sentinel_kwargs": _sentinel_kwargs()}
    if target.username:
        options["username"] = target.username
    if target.password:
        options["password"] = target.password
    return "redis-sentinel://", options


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


__all__ = ["MasterConnection", "SENTINEL_DEFAULT_PORT", "SENTINEL_SCHEMES", "SentinelTarget", "celery_broker",
           "client_from_url", "is_sentinel_url", "parse_sentinel_url", "redbeat_settings", "sentinel_password"]
