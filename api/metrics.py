"""Metrics of the API: lease requests by outcome (counter) and live leases (read from Redis
at scrape time, so every worker process reports the same truth).

A scrape costs Redis two commands whatever the fleet's size (:func:`app.serving.leases.live_leases`:
``TIME`` and one ``ZCOUNT`` of the expiry index), so ``/metrics``, which needs no token, is
no lever on Redis.  Nothing in it names a client, a proxy, an address or a credential.
"""

from __future__ import annotations

import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily

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


class LeasesActive:
    """Collector of ``proxy_operator_leases_active``: live leases over all proxies (two Redis
    commands per scrape; nothing when Redis is unreachable, logged)."""

    def __init__(self, r) -> None:
        self.r = r

    def collect(self):
        gauge = GaugeMetricFamily("proxy_operator_leases_active", "Live (unexpired) leases over all proxies.")
        try:
            gauge.add_metric([], leases.live_leases(self.r))
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail because Redis is down
            log.warning("api: cannot count live leases for /metrics: %s", exc)
            return
        yield gauge


def exposition(r) -> tuple[bytes, str]:
    """Return ``(body, content_type)`` for ``/metrics``: the process (or multiprocess) registry
    plus the live-leases gauge."""
    own = CollectorRegistry(auto_describe=False)
    own.register(LeasesActive(r))
    return generate_latest(registry_for_scrape()) + generate_latest(own), CONTENT_TYPE_LATEST
