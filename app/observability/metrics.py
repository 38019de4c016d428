"""Prometheus metrics shared by every process.

Multiprocess-safe: when ``PROMETHEUS_MULTIPROC_DIR`` is set (Celery prefork, the API's workers),
prometheus-client writes per-process files and :func:`registry_for_scrape` aggregates them
(prometheus-client, "Multiprocess Mode":
https://prometheus.github.io/client_python/multiprocess/).  Values that must be one truth
for the whole fleet (provider health, queue depths, beat's last runs) are not kept per process
at all: custom collectors read them from Redis at scrape time and are added to the registry
of the process that exports them (:func:`registry_for_scrape`'s ``extra``).

Every metric, its labels and meaning: docs/observability.md.  Labels never carry a spec,
user-data, a URL or a credential.
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess, start_http_server

PROVIDER_REQUESTS = Counter(
    "proxy_operator_provider_requests_total", "Provider calls by provider, type, operation and outcome class.",
    ["provider", "type", "operation", "outcome"])
PROVIDER_DURATION = Histogram(
    "proxy_operator_provider_request_duration_seconds", "Duration of provider calls.",
    ["provider", "type", "operation"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
RECONCILES = Counter(
    "proxy_operator_reconcile_total", "Reconcile steps by action and result.", ["action", "result"])
GC_DELETED = Counter("proxy_operator_gc_deleted_total", "Orphans deleted by GC.", ["provider"])
GC_PARTIAL = Counter("proxy_operator_gc_partial_sweeps_total", "GC sweeps skipped for a partial listing.",
                     ["provider"])
POOL_MEMBERS_CREATED = Counter(
    "proxy_operator_pool_members_created_total", "Members a ProxyPool's controller created, by pool.",
    ["namespace", "pool"])
POOL_MEMBERS_DRAINING = Counter(
    "proxy_operator_pool_members_draining_total", "Members a ProxyPool's controller marked draining, by pool and "
    "reason (Outdated: template change, age or zone rollover; ScaleDown; Burned: spec.recycle; BurnedInPlace: "
    "spec.recycle on a provider that keeps the egress IP, the member stays).", ["namespace", "pool", "reason"])
POOL_MEMBERS_DELETED = Counter(
    "proxy_operator_pool_members_deleted_total", "Members a ProxyPool's controller deleted, by pool and reason "
    "(Drained, DrainTimeout, Failed).", ["namespace", "pool", "reason"])
POOL_RESCALES = Counter(
    "proxy_operator_pool_rescales_total", "spec.replicas writes of a ProxyPool's autoscaler, by pool and "
    "direction (up, down).", ["namespace", "pool", "direction"])
ESTIMATED_COST = Gauge(
    "proxy_operator_estimated_cost_per_hour", "Estimated cost per hour of the instances that exist, by provider and "
    "pool (\"\" for none), from the providers config's costs tables (set by resync).", ["provider", "pool"],
    multiprocess_mode="mostrecent")
COST_BUDGET = Gauge(
    "proxy_operator_cost_budget_per_hour", "A provider's costs.budgetPerHour from the providers config (set by "
    "resync).", ["provider"], multiprocess_mode="mostrecent")
PROXIES_BY_PHASE = Gauge("proxy_operator_proxies", "Proxies by phase and provider (set by resync).",
                         ["phase", "provider"], multiprocess_mode="mostrecent")


class _Forward:
    """A collector yielding everything another registry holds (the process-wide one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self):
        yield from self.registry.collect()


def registry_for_scrape(*extra) -> CollectorRegistry:
    """Return the registry to expose: aggregated across processes when multiprocess mode is on.

    Args:
        extra: collectors (objects with ``collect()``) read at scrape time, added on top; with
            none, the process registry itself is returned (single process) or a registry with
            the multiprocess collector.
    """
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg)
    elif not extra:
        return REGISTRY
    else:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Forward(REGISTRY))
    for collector in extra:
        reg.register(collector)
    return reg


def serve(bind: str, registry: CollectorRegistry):
    """Serve ``/metrics`` of ``registry`` on ``bind`` (``host:port``; empty host = every interface).

    Returns:
        the server (prometheus-client's ``start_http_server``: a daemon thread).
    Raises:
        ValueError: ``bind`` has no port.
        OSError: the address cannot be bound.
    """
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics bind address {bind!r}: expected host:port")
    server, _thread = start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0", registry=registry)
    return server
