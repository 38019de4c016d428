"""Prometheus metrics shared by every process (SPEC §8).

Multiprocess-safe: when ``PROMETHEUS_MULTIPROC_DIR`` is set (Celery prefork, gunicorn),
prometheus-client writes per-process files and :func:`registry_for_scrape` aggregates them.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from prometheus_client import REGISTRY

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
PROXIES_BY_PHASE = Gauge("proxy_operator_proxies", "Proxies by phase and provider (set by resync).",
                         ["phase", "provider"], multiprocess_mode="mostrecent")


def registry_for_scrape() -> CollectorRegistry:
    """Return the registry to expose: aggregated across processes when multiprocess mode is on."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg)
        return reg
    return REGISTRY
