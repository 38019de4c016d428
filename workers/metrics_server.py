"""Prometheus endpoint of a Celery worker or beat (SPEC §8).

Set ``METRICS_BIND=host:port`` to serve ``/metrics`` from the worker's main process.  With
prefork children, also set ``PROMETHEUS_MULTIPROC_DIR`` to an empty writable directory
(an emptyDir in Kubernetes): every child writes its samples there and the endpoint
aggregates them (prometheus-client "Multiprocess Mode").
"""

from __future__ import annotations

import logging
import os

from celery.signals import beat_init, worker_init, worker_process_shutdown
from prometheus_client import multiprocess, start_http_server

from app.metrics import registry_for_scrape

log = logging.getLogger(__name__)


def _serve(**_) -> None:
    bind = os.environ.get("METRICS_BIND")
    if not bind:
        return
    host, _, port = bind.rpartition(":")
    start_http_server(int(port), addr=host or "0.0.0.0", registry=registry_for_scrape())
    log.info("serving /metrics on %s", bind)


worker_init.connect(_serve, weak=False)
beat_init.connect(_serve, weak=False)


@worker_process_shutdown.connect
def _child_exit(pid=None, **_) -> None:
    """Tell prometheus-client a prefork child is gone (its live gauges stop counting)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and pid:
        multiprocess.mark_process_dead(pid)
