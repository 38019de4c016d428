"""Settings of the discovery and lease API, from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from app.serving.bans import BanSettings
from app.serving.leases import LeaseSettings
from app.config.settings import env_number, redis_url_from_env

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class ApiSettings:
    """What the API needs.

    Attributes:
        redis_url: the Redis holding the serving view and leases (``REDIS_URL`` with
            ``REDIS_PASSWORD`` put in; never log it).
        tokens_file: the clients' bearer tokens (``API_TOKENS_FILE``; required).
        leases: :class:`app.serving.leases.LeaseSettings` (``LEASE_DEFAULT_TTL``, ``LEASE_MAX_TTL``,
            ``LEASE_COOLDOWN_SECONDS``, ``LEASE_STICKY_TTL``, ``LEASE_RECORD_GRACE``).
        tokens_check_every: seconds between checks for a changed tokens file
            (``API_TOKENS_RELOAD_SECONDS``).
        bans: :class:`app.serving.bans.BanSettings`: bans, per-target concurrency and refusing
            targets of leases that name a ``target`` (``BAN_*``, ``TARGET_*``).
    """

    redis_url: str = field(default=DEFAULT_REDIS_URL, repr=False)  # may carry the Redis password
    tokens_file: str | None = None
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    tokens_check_every: float = 5.0
    bans: BanSettings = field(default_factory=BanSettings)

    @classmethod
    def from_env(cls) -> "ApiSettings":
        """Read the settings from the environment.

        Raises:
            ValueError: a malformed value, naming the variable.
        """
        check_every = env_number("API_TOKENS_RELOAD_SECONDS", cls.tokens_check_every)
        return cls(
            redis_url=redis_url_from_env(),  # REDIS_URL + REDIS_PASSWORD (app.config.settings)
            tokens_file=os.environ.get("API_TOKENS_FILE") or None,
            leases=LeaseSettings.from_env(),
            tokens_check_every=check_every,
            bans=BanSettings.from_env(),
        )
