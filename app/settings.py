"""Process settings from the environment (flags override them in :mod:`app.cli`).

Every value has a default that works on a laptop; durations are seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def env_number(name: str, default: float, *, minimum: float = 0.0, integer: bool = False) -> float:
    """Return the number in environment variable ``name`` (``default`` when unset or blank).

    Raises:
        ValueError: not a number (an integer when ``integer``), or below ``minimum``; the
            message names the variable.
    """
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}: not a{'n integer' if integer else ' number'}: {raw!r}") from None
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


@dataclass(frozen=True)
class Settings:
    """Settings shared by every process.

    Attributes:
        redis_url: broker, locks, leases and serving view (``REDIS_URL``).
        providers_config: path of the providers config file or ``None`` (``PROVIDERS_CONFIG``).
        tokens_file: API tokens file (``API_TOKENS_FILE``).
        task_soft_time_limit / task_time_limit: Celery limits per task, seconds
            (``TASK_SOFT_TIME_LIMIT``, ``TASK_TIME_LIMIT``).
        visibility_timeout: Redis broker visibility timeout, seconds; must exceed the longest
            task and the longest countdown (``BROKER_VISIBILITY_TIMEOUT``).
        resync_interval: beat period of the full resync (``RESYNC_INTERVAL``).
        gc_interval: beat period of GC sweeps (``GC_INTERVAL``).
        gc_grace: minimum age of an orphan before GC deletes it (``GC_GRACE``).
        poll_initial / poll_max: poll backoff bounds (``POLL_INITIAL``, ``POLL_MAX``).
        retry_initial / retry_max: Transient retry backoff bounds (``RETRY_INITIAL``, ``RETRY_MAX``).
        quota_backoff: delay after QuotaExceeded (``QUOTA_BACKOFF``).
    """

    redis_url: str = "redis://127.0.0.1:6379/0"
    providers_config: str | None = None
    tokens_file: str | None = None
    task_soft_time_limit: float = 120.0
    task_time_limit: float = 150.0
    visibility_timeout: float = 3600.0
    resync_interval: float = 300.0
    gc_interval: float = 600.0
    gc_grace: float = 600.0
    poll_initial: float = 5.0
    poll_max: float = 60.0
    retry_initial: float = 5.0
    retry_max: float = 300.0
    quota_backoff: float = 900.0
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> "Settings":
        """Read every setting from the environment (see the attribute list for names)."""
        return cls(
            redis_url=os.environ.get("REDIS_URL") or cls.redis_url,
            providers_config=os.environ.get("PROVIDERS_CONFIG") or None,
            tokens_file=os.environ.get("API_TOKENS_FILE") or None,
            task_soft_time_limit=_float("TASK_SOFT_TIME_LIMIT", cls.task_soft_time_limit),
            task_time_limit=_float("TASK_TIME_LIMIT", cls.task_time_limit),
            visibility_timeout=_float("BROKER_VISIBILITY_TIMEOUT", cls.visibility_timeout),
            resync_interval=_float("RESYNC_INTERVAL", cls.resync_interval),
            gc_interval=_float("GC_INTERVAL", cls.gc_interval),
            gc_grace=_float("GC_GRACE", cls.gc_grace),
            poll_initial=_float("POLL_INITIAL", cls.poll_initial),
            poll_max=_float("POLL_MAX", cls.poll_max),
            retry_initial=_float("RETRY_INITIAL", cls.retry_initial),
            retry_max=_float("RETRY_MAX", cls.retry_max),
            quota_backoff=_float("QUOTA_BACKOFF", cls.quota_backoff),
        )
