"""Prometheus endpoint of a Celery worker or beat, and the metrics only they can tell.

Set ``METRICS_BIND=host:port`` to serve ``/metrics`` from the worker's (or beat's) main process.
With prefork children, also set ``PROMETHEUS_MULTIPROC_DIR`` to an empty writable directory
(an emptyDir in Kubernetes): every child writes its samples there and the endpoint
aggregates them (prometheus-client "Multiprocess Mode":
https://prometheus.github.io/client_python/multiprocess/).

What each process adds on top of the shared metrics (docs/observability.md lists them all):

* a **worker**: ``proxy_operator_task_duration_seconds`` / ``proxy_operator_tasks_total`` by
  task (Celery's ``task_prerun``/``task_postrun``/``task_success``/``task_failure``/
  ``task_retry`` signals, in the child that runs the task), and
  ``proxy_operator_queue_depth{queue}`` for each queue it consumes, read from the broker at
  scrape time (:class:`QueueDepthCollector`);
* **beat**: ``proxy_operator_beat_schedules_fired_total`` and ``proxy_operator_beat_lock_held``
  (workers/beat_scheduler.py), ``proxy_operator_beat_last_run_timestamp_seconds{entry}`` read
  from redbeat's schedule in Redis at scrape time (:class:`BeatScheduleCollector`: the standby
  shows the leader's runs too), the provider-health gauges
  (:class:`app.providers.checks.ProviderHealthCollector`), exported here because beat is not
  the process that runs the checks: a dead checker shows as a stale target, not as silence;
  ``proxy_operator_serving_proxies{state}`` (:class:`ServingViewCollector`), the fleet as
  the lease API sees it, and the ProxyPool gauges (``proxy_operator_pool_*_replicas{namespace,
  pool}``, :class:`app.pools.stats.PoolCollector`), each pool as its last controller pass left it.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import redis
from celery.signals import (beat_init, task_failure, task_postrun, task_prerun, task_retry, task_success,
                            worker_init, worker_process_shutdown)
from prometheus_client import Counter, Histogram, multiprocess
from prometheus_client.core import GaugeMetricFamily

from app.observability import metrics
from app.observability.metrics import registry_for_scrape

log = logging.getLogger(__name__)

TASK_DURATION = Histogram(
    "proxy_operator_task_duration_seconds", "Seconds a Celery task ran in a worker, by task name.", ["task"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
TASKS = Counter("proxy_operator_tasks_total", "Celery tasks finished in a worker, by task name and outcome "
                "(success, failure, retry).", ["task", "outcome"])

#: kombu's Redis transport keeps a queue's messages in one list per priority step: the queue's
#: own name for priority 0, ``<queue>\x06\x16<step>`` for the others (kombu.transport.redis).
PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)


def _redis_factory():
    """A decode_responses Redis client on the broker (``REDIS_URL`` with ``REDIS_PASSWORD``)."""
    from app.store.client import client_from_url
    from app.config.settings import Settings

    return lambda: client_from_url(Settings.from_env().redis_url, decode_responses=True, socket_timeout=5,
                                   socket_connect_timeout=3)


class QueueDepthCollector:
    """``proxy_operator_queue_depth{queue}``: messages waiting in each queue, read at scrape time.

    Counts the Redis lists of every priority step of the queue (messages reserved by a worker
    but not yet acknowledged are not counted).  Nothing is exposed while Redis is unreachable.

    Args:
        redis_factory: ``() -> redis.Redis``; called until it returns a client, then reused.
        queues: the queue names.
    """

    def __init__(self, redis_factory, queues) -> None:
        self.redis_factory, self.queues = redis_factory, sorted(set(queues))
        self._r: redis.Redis | None = None

    def describe(self):
        """Nothing up front (no Redis read when registered)."""
        return []

    def collect(self):
        """Yield the gauge family."""
        gauge = GaugeMetricFamily("proxy_operator_queue_depth", "Messages waiting in a Celery queue (broker lists).",
                                  labels=["queue"])
        try:
            if self._r is None:
                self._r = self.redis_factory()
            pipe = self._r.pipeline(transaction=False)
            for q in self.queues:
                for step in PRIORITY_STEPS:
                    pipe.llen(q if step == 0 else f"{q}{PRIORITY_SEP}{step}")
            lengths = pipe.execute()
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail because Redis is down
            log.warning("cannot read queue depths for /metrics: %s", type(exc).__name__)
            return
        n = len(PRIORITY_STEPS)
        for i, q in enumerate(self.queues):
            gauge.add_metric([q], float(sum(lengths[i * n:(i + 1) * n])))
        yield gauge


class BeatScheduleCollector:
    """``proxy_operator_beat_last_run_timestamp_seconds{entry}``: when each schedule entry last ran.

    Read from redbeat's entry metadata in Redis at scrape time, so every beat (leader or
    standby) reports the fleet's schedule; an entry that never ran has no sample.

    Args:
        app: the Celery app (its ``beat_schedule`` and redbeat settings).
        redis_factory: ``() -> redis.Redis``.
    """

    def __init__(self, app, redis_factory) -> None:
        self.app, self.redis_factory = app, redis_factory
        self._r: redis.Redis | None = None

    def describe(self):
        """Nothing up front (no Redis read when registered)."""
        return []

    def collect(self):
        """Yield the gauge family."""
        from redbeat.schedulers import RedBeatSchedulerEntry, ensure_conf

        gauge = GaugeMetricFamily("proxy_operator_beat_last_run_timestamp_seconds",
                                  "Unix time a beat schedule entry was last sent (from the schedule in Redis).",
                                  labels=["entry"])
        try:
            ensure_conf(self.app)
            if self._r is None:
                self._r = self.redis_factory()
            names = sorted(self.app.conf.beat_schedule)
            pipe = self._r.pipeline(transaction=False)
            for name in names:
                pipe.hget(RedBeatSchedulerEntry.generate_key(self.app, name), "meta")
            metas = pipe.execute()
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail because Redis is down
            log.warning("cannot read the beat schedule for /metrics: %s", type(exc).__name__)
            return
        for name, raw in zip(names, metas, strict=True):
            try:
                last = RedBeatSchedulerEntry.decode_meta(raw).get("last_run_at")
            except ValueError:
                continue
            if last is not None:
                gauge.add_metric([name], last.timestamp())
        yield gauge


class ServingViewCollector:
    """``proxy_operator_serving_proxies{state}``: the published proxies by what a lease can do with them.

    Read from the Redis serving view at scrape time (:mod:`app.serving.view`): ``published`` (every
    published proxy), ``leasable`` (healthy, not draining, below ``maxLeases``: the lease
    index), ``full`` (at ``maxLeases``), ``unhealthy`` (unhealthy or not yet probed),
    ``draining`` (``maxLeases`` 0).  The last four add up to ``published``.

    Args:
        redis_factory: ``() -> redis.Redis``.
    """

    def __init__(self, redis_factory) -> None:
        self.redis_factory = redis_factory
        self._r: redis.Redis | None = None

    def describe(self):
        """Nothing up front (no Redis read when registered)."""
        return []

    def collect(self):
        """Yield the gauge family."""
        from app.store import keys as redis_keys

        gauge = GaugeMetricFamily("proxy_operator_serving_proxies",
                                  "Published proxies by state in the serving view (published, leasable, full, "
                                  "unhealthy, draining).", labels=["state"])
        try:
            if self._r is None:
                self._r = self.redis_factory()
            pipe = self._r.pipeline(transaction=False)
            pipe.scard(redis_keys.PROXIES)
            pipe.zcard(redis_keys.LOAD)
            pipe.scard(redis_keys.FULL)
            pipe.scard(redis_keys.UNHEALTHY)
            pipe.scard(redis_keys.DRAINING)
            counts = pipe.execute()
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail because Redis is down
            log.warning("cannot read the serving view for /metrics: %s", type(exc).__name__)
            return
        for state, n in zip(("published", "leasable", "full", "unhealthy", "draining"), counts, strict=True):
            gauge.add_metric([state], float(n))
        yield gauge


def _serve_worker(sender=None, **_) -> None:
    bind = os.environ.get("METRICS_BIND")
    if not bind:
        return
    queues = []
    try:
        queues = list(sender.app.amqp.queues.consume_from)
    except Exception:  # noqa: BLE001 - no queue depths rather than no endpoint
        log.warning("metrics: cannot tell which queues this worker consumes; no queue depths")
    metrics.serve(bind, registry_for_scrape(QueueDepthCollector(_redis_factory(), queues)))
    log.info("serving /metrics on %s", bind)


def _serve_beat(sender=None, **_) -> None:
    bind = os.environ.get("METRICS_BIND")
    if not bind:
        return
    from app.pools.stats import PoolCollector
    from app.providers.checks import ProviderHealthCollector
    from workers.beat import providers_config
    from workers.celery_app import celery_app

    factory = _redis_factory()
    metrics.serve(bind, registry_for_scrape(BeatScheduleCollector(celery_app, factory),
                                            ProviderHealthCollector(factory, providers_config.providers),
                                            ServingViewCollector(factory), PoolCollector(factory)))
    log.info("serving /metrics on %s", bind)


worker_init.connect(_serve_worker, weak=False)
beat_init.connect(_serve_beat, weak=False)


# -- task metrics (in the child that runs the task) -------------------------------------------
_started: dict[str, float] = {}
_started_lock = threading.Lock()


@task_prerun.connect
def _task_started(task_id=None, **_) -> None:
    with _started_lock:
        _started[task_id] = time.monotonic()


@task_postrun.connect
def _task_ended(task_id=None, task=None, **_) -> None:
    with _started_lock:
        start = _started.pop(task_id, None)
    if start is not None and task is not None:
        TASK_DURATION.labels(task.name).observe(time.monotonic() - start)


@task_success.connect
def _task_success(sender=None, **_) -> None:
    TASKS.labels(getattr(sender, "name", "unknown"), "success").inc()


@task_failure.connect
def _task_failure(sender=None, **_) -> None:
    TASKS.labels(getattr(sender, "name", "unknown"), "failure").inc()


@task_retry.connect
def _task_retry(sender=None, **_) -> None:
    TASKS.labels(getattr(sender, "name", "unknown"), "retry").inc()


@worker_process_shutdown.connect
def _child_exit(pid=None, **_) -> None:
    """Tell prometheus-client a prefork child is gone (its live gauges stop counting)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and pid:
        multiprocess.mark_process_dead(pid)
