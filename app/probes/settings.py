"""Settings of the health engine, from the environment (durations in seconds)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from app.resources import DEFAULT_HEALTH_URL
from app.config.settings import env_number

#: Default IP-echo service: answers the caller's address as plain text.
DEFAULT_ECHO_URL = "https://api.ipify.org"


@dataclass(frozen=True)
class HealthSettings:
    """How the health engine probes.

    Attributes:
        echo_url: IP-echo URL fetched through each proxy to learn its egress IP; the answer is
            the address as text or JSON ``{"ip": ...}``/``{"origin": ...}``.  Empty disables
            (``EGRESS_ECHO_URL``).
        egress_refresh: seconds after which a healthy proxy's egress IP is learnt again
            (``EGRESS_REFRESH_SECONDS``; 0 = on every probe).
        provision_deadline: seconds a published proxy may stay never-healthy before it goes
            Failed (``HEALTH_PROVISION_DEADLINE``).
        batch_size: uids per ``health.probe_batch`` task (``HEALTH_BATCH_SIZE``).
        concurrency: probes in flight at once inside one batch (``HEALTH_CONCURRENCY``).
        claim_seconds: how long a claimed (enqueued) proxy is not due again; a lost task is
            retried after this (``HEALTH_CLAIM_SECONDS``).
        sweep_limit: most uids claimed by one sweep (``HEALTH_SWEEP_LIMIT``).
        sweep_interval: beat period of ``health.sweep`` (``HEALTH_SWEEP_INTERVAL``).
        outage_min_proxies: fewest failing once-healthy proxies that count as a probe-side
            outage when none succeeds (``HEALTH_OUTAGE_MIN_PROXIES``).
        ca_bundle: CA file for HTTPS health/echo URLs, ``None`` = system store
            (``PROBE_CA_BUNDLE``).
        status_concurrency: status writes in flight at once (``HEALTH_STATUS_CONCURRENCY``).
        denied_ranges: CIDR ranges no probe may reach, on top of loopback, link-local and
            ``0.0.0.0/8`` (``PROBE_DENIED_RANGES``, comma or space separated; e.g. the cluster's
            Pod and Service ranges, the VPC).  See :mod:`app.probes.destinations`.
        external_denied_ranges: CIDR ranges denied only to what a Proxy author chooses: the
            endpoints of External Proxies and every health URL, never a Managed proxy's endpoint
            (``PROBE_EXTERNAL_DENIED_RANGES``; e.g. the cluster's Pod range, which
            ``PROBE_DENIED_RANGES`` cannot hold while the kubernetes provider runs Squid Pods there).
        external_allowed_ranges: CIDR ranges External endpoints and health URLs may reach although
            they lie in the private ranges denied to them by default (RFC 1918, CGNAT
            ``100.64.0.0/10``, ULA ``fc00::/7``: :data:`app.probes.destinations.DEFAULT_EXTERNAL_DENIED_RANGES`;
            ``PROBE_EXTERNAL_ALLOWED_RANGES``).  Exempts from nothing else.
        allowed_ranges: CIDR ranges exempted from every denied range, defaults included
            (``PROBE_ALLOWED_RANGES``; ``127.0.0.0/8`` for a local stack or the test suite, whose
            Squids and origins run on loopback).
        credentials_ttl: seconds a Proxy's basic-auth credentials read from its Secret are
            reused before the Secret is read again (``HEALTH_CREDENTIALS_TTL``); a 407 reads it
            again at once.
        default_url: the health URL probed for Proxies whose ``spec.healthCheck.url`` is the
            CRD's default (:data:`app.resources.DEFAULT_HEALTH_URL`, on the internet) or unset
            (``HEALTH_DEFAULT_URL``): an installation without internet access, or the local
            stack (``make demo``), points them at an origin of its own.  A URL a Proxy names
            itself is never replaced.
        slow_seconds: the fast lane's time per probe (``HEALTH_SLOW_SECONDS``): a probe with a
            longer timeout gets this much in the fast lane, and one that has no answer by then is
            not judged but probed again at once in the slow lane with its own timeout; a proxy
            whose last probe took this long or longer is probed in the slow lane.
        slow_lane_batches: slow-lane batches queued or running at once, fleet-wide, at most one
            per namespace (``HEALTH_SLOW_LANE_BATCHES``); keep it below the health workers'
            total ``--concurrency`` so the fast lane always has a worker.
        ban_history: seconds of ban history counted in a Proxy's ``status.bannedTargets``: the
            distinct targets that banned its egress IP within this window, live bans included
            (``BAN_HISTORY_SECONDS``, the window the lease API keeps: :mod:`app.serving.bans`).
    """

    echo_url: str = DEFAULT_ECHO_URL
    egress_refresh: float = 300.0
    provision_deadline: float = 900.0
    batch_size: int = 50
    concurrency: int = 64
    claim_seconds: float = 120.0
    sweep_limit: int = 5000
    sweep_interval: float = 5.0
    outage_min_proxies: int = 3
    ca_bundle: str | None = None
    status_concurrency: int = 8
    denied_ranges: tuple[str, ...] = ()
    allowed_ranges: tuple[str, ...] = ()
    external_denied_ranges: tuple[str, ...] = ()
    external_allowed_ranges: tuple[str, ...] = ()
    credentials_ttl: float = 60.0
    default_url: str = DEFAULT_HEALTH_URL
    slow_seconds: float = 5.0
    slow_lane_batches: int = 1
    ban_history: float = 3600.0

    @classmethod
    def from_env(cls) -> "HealthSettings":
        """Read the settings from the environment (names in the attribute list).

        Raises:
            ValueError: a value that is not a number or is out of range, naming the variable.
        """
        echo = os.environ.get("EGRESS_ECHO_URL")
        return cls(
            echo_url=cls.echo_url if echo is None else echo.strip(),
            egress_refresh=env_number("EGRESS_REFRESH_SECONDS", cls.egress_refresh),
            provision_deadline=env_number("HEALTH_PROVISION_DEADLINE", cls.provision_deadline, minimum=1),
            batch_size=int(env_number("HEALTH_BATCH_SIZE", cls.batch_size, minimum=1, integer=True)),
            concurrency=int(env_number("HEALTH_CONCURRENCY", cls.concurrency, minimum=1, integer=True)),
            claim_seconds=env_number("HEALTH_CLAIM_SECONDS", cls.claim_seconds, minimum=1),
            sweep_limit=int(env_number("HEALTH_SWEEP_LIMIT", cls.sweep_limit, minimum=1, integer=True)),
            sweep_interval=env_number("HEALTH_SWEEP_INTERVAL", cls.sweep_interval, minimum=1),
            outage_min_proxies=int(env_number("HEALTH_OUTAGE_MIN_PROXIES", cls.outage_min_proxies,
                                           minimum=1, integer=True)),
            ca_bundle=os.environ.get("PROBE_CA_BUNDLE") or None,
            status_concurrency=int(env_number("HEALTH_STATUS_CONCURRENCY", cls.status_concurrency,
                                           minimum=1, integer=True)),
            denied_ranges=_ranges("PROBE_DENIED_RANGES"),
            allowed_ranges=_ranges("PROBE_ALLOWED_RANGES"),
            external_denied_ranges=_ranges("PROBE_EXTERNAL_DENIED_RANGES"),
            external_allowed_ranges=_ranges("PROBE_EXTERNAL_ALLOWED_RANGES"),
            credentials_ttl=env_number("HEALTH_CREDENTIALS_TTL", cls.credentials_ttl, minimum=1),
            default_url=_default_url(),
            slow_seconds=env_number("HEALTH_SLOW_SECONDS", cls.slow_seconds, minimum=1),
            slow_lane_batches=int(env_number("HEALTH_SLOW_LANE_BATCHES", cls.slow_lane_batches,
                                             minimum=1, integer=True)),
            ban_history=env_number("BAN_HISTORY_SECONDS", cls.ban_history, minimum=1),
        )

    def destination_policy(self):
        """Return the process's shared :class:`app.probes.destinations.DestinationPolicy` for
        :attr:`denied_ranges` / :attr:`allowed_ranges` / :attr:`external_denied_ranges` /
        :attr:`external_allowed_ranges`.

        Raises:
            ValueError: a range that does not parse, naming its variable.
        """
        from app.probes import destinations

        return destinations.policy(tuple(self.denied_ranges), tuple(self.allowed_ranges),
                                   tuple(self.external_denied_ranges), tuple(self.external_allowed_ranges))


def _default_url() -> str:
    """``HEALTH_DEFAULT_URL`` (an http or https URL), else the CRD's default.

    Raises:
        ValueError: not an http(s) URL with a host, naming the variable.
    """
    from urllib.parse import urlsplit

    raw = (os.environ.get("HEALTH_DEFAULT_URL") or "").strip()
    if not raw:
        return DEFAULT_HEALTH_URL
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"environment variable HEALTH_DEFAULT_URL: not an http(s) URL: {raw!r}")
    return raw


def _ranges(name: str) -> tuple[str, ...]:
    """The CIDR ranges in environment variable ``name`` (validated; ``()`` when unset).

    Raises:
        ValueError: an entry that is not an address or a CIDR range, naming the variable.
    """
    from app.probes.destinations import parse_ranges

    raw = os.environ.get(name) or ""
    return tuple(str(net) for net in parse_ranges(raw, name=f"environment variable {name}"))
