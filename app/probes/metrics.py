"""Prometheus metrics of the health engine (prometheus-client; multiprocess-safe).

In prefork Celery workers set ``PROMETHEUS_MULTIPROC_DIR`` so every child writes its samples
to files the metrics endpoint aggregates (prometheus-client docs, "Multiprocess Mode").
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PROBE_LATENCY = Histogram(
    "proxy_operator_probe_duration_seconds", "Time of one health probe through a proxy, by outcome.",
    ["outcome"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
PROBE_FAILURES = Counter(
    "proxy_operator_probe_failures_total", "Failed health probes, by reason (ConnectionRefused, Timeout, ...).",
    ["reason"])
PROBE_RESULTS = Counter(
    "proxy_operator_probe_results_total",
    "Health probes by the reason they ended with (ProbeSucceeded, RateLimited, ConnectionRefused, ..., "
    "OriginDown: failed while the health URL's origin was down, not held against the proxy; "
    "Deferred: no answer within the fast lane's HEALTH_SLOW_SECONDS, probed again in the slow lane).", ["reason"])
PROBE_OUTAGE = Gauge(
    "proxy_operator_probe_outage", "1 while every probe of every proxy fails (a probe-side outage), else 0.",
    multiprocess_mode="livemostrecent")
STATUS_WRITES = Counter(
    "proxy_operator_health_status_writes_total", "Proxy status writes by the health engine, by outcome.",
    ["outcome"])
