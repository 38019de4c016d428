"""Process settings from the environment (flags override them in :mod:`cli.main`).

Every value has a default that works on a laptop; durations are seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping
from urllib.parse import quote, unquote, urlsplit, urlunsplit


def env_number(name: str, default: float, *, minimum: float = 0.0, integer: bool = False,
               env: Mapping[str, str] | None = None) -> float:
    """Return the number in environment variable ``name`` (``default`` when unset or blank).

    The one parser of numbers from the environment: every process reads its numeric settings
    through it.

    Args:
        name: the variable.
        default: returned as is when the variable is unset or blank.
        minimum: the smallest value accepted.
        integer: accept integers only (``int`` returned).
        env: the environment to read (default :data:`os.environ`).
    Raises:
        ValueError: not a number (an integer when ``integer``), or below ``minimum``; the
            message names the variable and quotes the value.
    """
    raw = (os.environ if env is None else env).get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"environment variable {name}: not {kind}: {raw!r}") from None
    if value < minimum:
        raise ValueError(f"environment variable {name}: must be at least {minimum:g}, got {raw!r}")
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_flag(name: str, default: bool) -> bool:
    """Return the boolean in environment variable ``name`` (``default`` when unset or blank).

    Accepted, in any case: ``1 true yes on`` and ``0 false no off``.

    Raises:
        ValueError: any other value; the message names the variable.
    """
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"environment variable {name}: not a boolean (true/false): {raw!r}")


def _float(name: str, default: float) -> float:
    return env_number(name, default)


#: Where every process finds Redis when ``REDIS_URL`` is unset.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def compose_redis_url(url: str, password: str | None = None, username: str | None = None) -> str:
    """Put ``password`` (and ``username``, for a Redis ACL user) into a ``redis://`` / ``rediss://`` /
    ``redis+sentinel://`` URL (:mod:`app.store.client`; with Sentinels, the credentials are the data Redis's).

    The password is percent-encoded, so any character works; redis-py, kombu (Celery's broker),
    redbeat and Flower all decode it.  Redis ``requirepass`` / ``AUTH``:
    https://redis.io/docs/latest/operate/oss_and_stack/management/security/#authentication

    Args:
        url: ``REDIS_URL`` without credentials, e.g. ``redis://redis:6379/0`` or
            ``redis+sentinel://sentinel-0:26379,sentinel-1:26379/proxy-operator/0``.
        password: ``REDIS_PASSWORD``; empty or ``None`` returns ``url`` unchanged.  One trailing
            newline (a Secret made from a file) is dropped.
        username: ``REDIS_USERNAME`` (default: the URL's, else Redis's ``default`` user).
    Returns:
        the URL with credentials.  Never log it: log :func:`redact_redis_url` of it.
    Raises:
        ValueError: ``url`` already carries a password (set one or the other), or is not a
            ``redis://``/``rediss://``/``redis+sentinel://`` URL while a password is given.
    """
    password = (password or "").removesuffix("\n").removesuffix("\r")
    if not password:
        return url
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "redis+sentinel", "sentinel"):
        raise ValueError("REDIS_PASSWORD needs a redis://, rediss:// or redis+sentinel:// REDIS_URL")
    if parts.password:
        raise ValueError("REDIS_URL carries a password and REDIS_PASSWORD is set: use REDIS_PASSWORD only")
    host = parts.netloc.rpartition("@")[2]
    user = username or (unquote(parts.username) if parts.username else "")
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redis_url_from_env() -> str:
    """Return ``REDIS_URL`` (default :data:`DEFAULT_REDIS_URL`) with ``REDIS_PASSWORD`` and
    ``REDIS_USERNAME`` from the environment put in (:func:`compose_redis_url`).

    deploy/ sets ``REDIS_USERNAME`` (the component's ACL user, :mod:`app.store.acl`) and
    ``REDIS_PASSWORD`` from the Secret ``proxy-operator-redis-<user>`` and keeps the password out
    of ``REDIS_URL``.

    Raises:
        ValueError: see :func:`compose_redis_url` and :func:`app.store.client.parse_sentinel_url`.
    """
    from app.store.client import parse_sentinel_url

    url = compose_redis_url(os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL,
                            os.environ.get("REDIS_PASSWORD"), os.environ.get("REDIS_USERNAME"))
    parse_sentinel_url(url)  # a malformed Sentinel URL stops the process here, naming what is wrong
    return url


def redact_redis_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (the form to log): ``redis://:***@redis:6379/0``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.netloc.rpartition("@")[0].partition(":")[0]
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


@dataclass(frozen=True)
class Settings:
    """Settings shared by every process.

    Attributes:
        redis_url: broker, locks, leases and serving view (``REDIS_URL`` with ``REDIS_PASSWORD``
            and ``REDIS_USERNAME`` put in: :func:`redis_url_from_env`).  Never log it: log
            :func:`redact_redis_url` of it.
        providers_config: path of the providers config file or ``None`` (``PROVIDERS_CONFIG``).
        tokens_file: API tokens file (``API_TOKENS_FILE``).
        task_soft_time_limit / task_time_limit: Celery limits per task, seconds
            (``TASK_SOFT_TIME_LIMIT``, ``TASK_TIME_LIMIT``).
        visibility_timeout: Redis broker visibility timeout, seconds; must exceed the longest
            task and the longest countdown (``BROKER_VISIBILITY_TIMEOUT``).
        resync_interval: beat period of the full resync (``RESYNC_INTERVAL``).
        gc_interval: beat period of GC sweeps (``GC_INTERVAL``).
        pool_wake_interval: beat period of ``pool.wake`` (``POOL_WAKE_INTERVAL``, at least 0.5):
            a pool whose draining member lost its last lease (a release) gets its pass within
            this (:mod:`app.pools.wake`).
        pool_resync_interval: beat period of the ProxyPool resync: a pass over every pool, for
            age limits and the autoscaler (``POOL_RESYNC_INTERVAL``, seconds).
        pool_namespace_max_replicas: most Proxies the ProxyPools of one namespace may ask for
            together (``POOL_NAMESPACE_MAX_REPLICAS``, an integer >= 1): a pool whose size
            (``spec.replicas``, or ``spec.autoscale.maxReplicas``) with the other pools' members
            of its namespace exceeds it is refused (condition ``NamespaceCapExceeded``).
        gc_grace: minimum age of an orphan before GC deletes it (``GC_GRACE``).
        poll_initial / poll_max: poll backoff bounds (``POLL_INITIAL``, ``POLL_MAX``); ``poll_initial``
            also spaces ``instance.retire``'s tries while its Proxy's lock is busy.
        retry_initial / retry_max: Transient retry backoff bounds (``RETRY_INITIAL``, ``RETRY_MAX``).
        quota_backoff: delay after QuotaExceeded (``QUOTA_BACKOFF``).
        worker_remote_control: whether a Celery worker obeys remote-control broadcasts
            (``celery control shutdown``/``cancel_consumer``, ``inspect``, Flower's worker
            pages and buttons) sent through the broker (``WORKER_REMOTE_CONTROL``; Celery's
            ``worker_enable_remote_control``).  Off: whoever can write to Redis cannot stop
            a worker's consumers.
        instance_visibility_delay: seconds a provider's reads may still miss an instance after
            the create that made it returned (``INSTANCE_VISIBILITY_DELAY``; GCE and EC2 reads are
            eventually consistent): a poll that reads NotFound within
            :func:`app.proxy.reconcile.visibility_window` of ``status.createStartedAt`` keeps the Proxy
            Provisioning instead of recreating.
        beat_lock_timeout: seconds beat's scheduler lock (redbeat's) lives without being
            extended, so how long a killed beat keeps another from scheduling
            (``BEAT_LOCK_TIMEOUT``, at least 10: twice the longest pause between ticks, 5 s).
    """

    redis_url: str = DEFAULT_REDIS_URL
    providers_config: str | None = None
    tokens_file: str | None = None
    task_soft_time_limit: float = 120.0
    task_time_limit: float = 150.0
    visibility_timeout: float = 3600.0
    resync_interval: float = 300.0
    gc_interval: float = 600.0
    pool_resync_interval: float = 30.0
    pool_wake_interval: float = 2.0
    pool_namespace_max_replicas: int = 100
    gc_grace: float = 600.0
    poll_initial: float = 5.0
    poll_max: float = 60.0
    retry_initial: float = 5.0
    retry_max: float = 300.0
    quota_backoff: float = 900.0
    worker_remote_control: bool = False
    instance_visibility_delay: float = 120.0
    beat_lock_timeout: float = 20.0
    extra: dict = field(default_factory=dict)

    def __repr__(self) -> str:  # the URL may carry the Redis password
        return f"Settings(redis_url={redact_redis_url(self.redis_url)!r}, providers_config={self.providers_config!r})"

    @classmethod
    def from_env(cls) -> "Settings":
        """Read every setting from the environment (see the attribute list for names).

        Raises:
            ValueError: a malformed value, naming the variable.
        """
        return cls(
            redis_url=redis_url_from_env(),
            providers_config=os.environ.get("PROVIDERS_CONFIG") or None,
            tokens_file=os.environ.get("API_TOKENS_FILE") or None,
            task_soft_time_limit=_float("TASK_SOFT_TIME_LIMIT", cls.task_soft_time_limit),
            task_time_limit=_float("TASK_TIME_LIMIT", cls.task_time_limit),
            visibility_timeout=_float("BROKER_VISIBILITY_TIMEOUT", cls.visibility_timeout),
            resync_interval=_float("RESYNC_INTERVAL", cls.resync_interval),
            gc_interval=_float("GC_INTERVAL", cls.gc_interval),
            pool_resync_interval=_float("POOL_RESYNC_INTERVAL", cls.pool_resync_interval),
            pool_wake_interval=env_number("POOL_WAKE_INTERVAL", cls.pool_wake_interval, minimum=0.5),
            pool_namespace_max_replicas=int(env_number("POOL_NAMESPACE_MAX_REPLICAS", cls.pool_namespace_max_replicas,
                                                       minimum=1, integer=True)),
            gc_grace=_float("GC_GRACE", cls.gc_grace),
            poll_initial=_float("POLL_INITIAL", cls.poll_initial),
            poll_max=_float("POLL_MAX", cls.poll_max),
            retry_initial=_float("RETRY_INITIAL", cls.retry_initial),
            retry_max=_float("RETRY_MAX", cls.retry_max),
            quota_backoff=_float("QUOTA_BACKOFF", cls.quota_backoff),
            worker_remote_control=env_flag("WORKER_REMOTE_CONTROL", cls.worker_remote_control),
            instance_visibility_delay=_float("INSTANCE_VISIBILITY_DELAY", cls.instance_visibility_delay),
            beat_lock_timeout=env_number("BEAT_LOCK_TIMEOUT", cls.beat_lock_timeout, minimum=10.0),
        )
