"""Celery tasks of the health engine: thin shells around :mod:`app.health`.

* ``health.sweep`` (beat, every ``HEALTH_SWEEP_INTERVAL`` seconds): claims the proxies whose
  probe is due and enqueues ``health.probe_batch`` tasks on the ``health`` queue, each with a
  list of uids (references only: never an address, URL or credential).
* ``health.probe_batch(uids)``: probes those proxies concurrently, records every result in the
  Redis serving view and writes Proxy status changes (:func:`app.health.engine.probe_batch`).

Both are idempotent: a duplicate batch probes the same proxies once more, nothing else.
"""

from __future__ import annotations

import logging

import redis as redis_lib

from app.health.credentials import SecretCredentials
from app.health import engine, schedule
from app.health.settings import HealthSettings
from app.kube import KubernetesGateway
from app.lazy import per_process
from app.settings import Settings
from workers import routing
from workers.celery_app import celery_app

log = logging.getLogger(__name__)

@per_process
def _runtime() -> tuple[redis_lib.Redis, HealthSettings]:
    """Return this process's Redis client and health settings (rebuilt after fork)."""
    return (redis_lib.Redis.from_url(Settings.from_env().redis_url, decode_responses=True, socket_timeout=10,
                                     socket_connect_timeout=5, socket_keepalive=True),
            HealthSettings.from_env())


_SWEEP_INTERVAL = HealthSettings.from_env().sweep_interval

#: Beat entries of the health engine (merged into the schedule by ``workers.beat``).
BEAT_SCHEDULE = {
    "health-sweep": {
        "task": "health.sweep", "schedule": _SWEEP_INTERVAL,
        # A sweep that waited longer than its period is superseded by the next one.
        "options": {"queue": routing.HEALTH, "expires": _SWEEP_INTERVAL},
    },
}


@celery_app.task(name="health.sweep", ignore_result=True)
def sweep() -> int:
    """Enqueue ``health.probe_batch`` for every due proxy; return how many batches."""
    r, settings = _runtime()
    batches = schedule.sweep(r, settings)
    for uids in batches:
        probe_batch.apply_async(args=[uids], queue=routing.HEALTH)
    if batches:
        log.debug("health: sweep enqueued %d batches (%d proxies)", len(batches), sum(map(len, batches)))
    return len(batches)


@per_process
def _credentials() -> SecretCredentials:
    """This process's basic-auth credentials reader (cached Secret reads) and, as its ``kube``,
    the gateway the status writes go through (on this process's client, rebuilt after fork;
    writes not recorded for the watcher's de-duplication: :mod:`app.status_writer`)."""
    # reads the Proxy first: only the Secret its record's Proxy owns is used (app.health.credentials)
    return SecretCredentials(KubernetesGateway(record_writes=False), ttl=_runtime()[1].credentials_ttl)


@celery_app.task(name="health.probe_batch", ignore_result=True)
def probe_batch(uids: list[str]) -> dict:
    """Probe the proxies ``uids``; return counts only (no addresses, no messages)."""
    r, settings = _runtime()
    creds = _credentials()
    report = engine.probe_batch(r, list(uids), settings, kube=creds.kube, credentials=creds, events=True)
    return {"probed": report.probed, "succeeded": report.succeeded, "failed": report.failed,
            "statusWritten": report.status_written, "statusErrors": report.status_errors,
            "wentFailed": report.went_failed, "outage": report.outage, "originDown": report.origin_down}
