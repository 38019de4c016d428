"""Metrics of the API: lease requests by outcome (counter), live leases and live (egress IP,
target) cooldowns (read from Redis at scrape time, so every worker process reports the same
truth), and targeted leases' bans, refusals and concurrency limits per target.

A scrape costs Redis three commands whatever the fleet's size or its number of bans
(``TIME``, one ``ZCOUNT`` of the expiry index, :func:`app.serving.leases.live_leases`, and one of
the bans, :func:`app.serving.bans.live_cooldowns`), so ``/metrics``, which needs no token, is
no lever on Redis.  Nothing in it names a client, a proxy, an address or a credential.  The
``target`` label is bounded (:meth:`app.serving.bans.BanSettings.metric_label`: an operator
list or the first ``BAN_METRIC_TOP_K`` targets, the rest as ``other``).
"""

from __future__ import annotations

import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily

from app.serving import bans as target_bans
from app.serving import leases
from app.observability.metrics import registry_for_scrape

log = logging.getLogger(__name__)

LEASE_REQUESTS = Counter(
    "proxy_operator_lease_requests_total",
    "Lease API requests by operation (acquire, renew, release) and outcome (ok or the error code).",
    ["operation", "outcome"])
#: The children counted on every successful request, looked up once (``labels()`` costs a
#: dictionary lookup under a lock per call).
OK = {op: LEASE_REQUESTS.labels(op, "ok") for op in ("acquire", "renew", "release")}


TARGET_BANS = Counter(
    "proxy_operator_target_bans_total",
    "(egress IP, target) pairs put in cooldown by a blocked or failed release of a targeted lease.",
    ["target"])
TARGET_REFUSALS = Counter(
    "proxy_operator_target_refusals_total",
    "Targets found refusing every egress IP (refusing_started) and leases refused for it (lease_refused).",
    ["target", "event"])
TARGET_LIMITED = Counter(
    "proxy_operator_target_limited_total",
    "Targeted lease requests refused with no proxy because of bans (banned) or the per-target "
    "concurrency limit per egress IP (concurrency).",
    ["target", "limit"])

# The "other" series exist from the start (zero until a target beyond the named ones counts),
# so every family is in every scrape and a dashboard's rate() has a series to read.
for _event in ("refusing_started", "lease_refused"):
    TARGET_REFUSALS.labels(target_bans.OTHER, _event)
for _limit in ("banned", "concurrency"):
    TARGET_LIMITED.labels(target_bans.OTHER, _limit)
TARGET_BANS.labels(target_bans.OTHER)


def target_released(settings: target_bans.BanSettings, done: leases.Release) -> None:
    """Count a targeted release's ban or the refusal it found, and log a target found refusing
    everyone (naming it)."""
    target = done.target or ""
    if done.banned:
        TARGET_BANS.labels(settings.metric_label(target)).inc()
    if done.refused_now:
        TARGET_REFUSALS.labels(settings.metric_label(target), "refusing_started").inc()
        log.warning("api: target %s refuses every egress IP (%d different IPs reported blocked within %d s): "
                    "its bans are lifted and leases for it refused for %d s", target, settings.refusal_ips,
                    settings.refusal_window, settings.refusal_cooloff)


def target_refused(settings: target_bans.BanSettings, exc: leases.LeaseError) -> None:
    """Count a targeted lease request refused: by a refusing target, or by bans and concurrency
    limits (the larger of the two counts names the limit that held)."""
    target = settings.metric_label(exc.target or "")
    if exc.code == leases.TARGET_REFUSING:
        TARGET_REFUSALS.labels(target, "lease_refused").inc()
    elif exc.limited:
        if exc.limited.get("busy"):
            TARGET_LIMITED.labels(target, "concurrency").inc()
        if exc.limited.get("banned"):
            TARGET_LIMITED.labels(target, "banned").inc()


class LeasesActive:
    """Collector of ``proxy_operator_leases_active`` (live leases over all proxies) and
    ``proxy_operator_target_cooldowns_active`` (live (egress IP, target) bans): three Redis
    commands per scrape; nothing when Redis is unreachable, logged."""

    def __init__(self, r) -> None:
        self.r = r

    def collect(self):
        gauge = GaugeMetricFamily("proxy_operator_leases_active", "Live (unexpired) leases over all proxies.")
        now_ms = None
        try:
            now_s, now_us = self.r.time()
            now_ms = now_s * 1000 + now_us // 1000
            gauge.add_metric([], leases.live_leases(self.r, now_ms))
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail because Redis is down
            log.warning("api: cannot count live leases for /metrics: %s", exc)
            return
        yield gauge
        bans = GaugeMetricFamily("proxy_operator_target_cooldowns_active",
                                 "Live (egress IP, target) cooldowns over the fleet.")
        try:
            bans.add_metric([], target_bans.live_cooldowns(self.r, now_ms))
        except Exception as exc:  # noqa: BLE001 - as above
            log.warning("api: cannot count live target cooldowns for /metrics: %s", exc)
            return
        yield bans


def exposition(r) -> tuple[bytes, str]:
    """Return ``(body, content_type)`` for ``/metrics``: the process (or multiprocess) registry
    plus the live-leases gauge."""
    own = CollectorRegistry(auto_describe=False)
    own.register(LeasesActive(r))
    return generate_latest(registry_for_scrape()) + generate_latest(own), CONTENT_TYPE_LATEST
