"""Celery tasks of the health engine: thin shells around :mod:`app.probes`.

* ``health.sweep`` (beat, every ``HEALTH_SWEEP_INTERVAL`` seconds): claims the proxies whose
  probe is due and enqueues ``health.probe_batch`` tasks on the ``health`` queue, each with a
  list of uids (references only: never an address, URL or credential).
* ``health.probe_batch(uids, slot=None)``: probes those proxies concurrently, records every
  result in the Redis serving view and writes Proxy status changes
  (:func:`app.probes.engine.probe_batch`).  ``slot`` ``None``: a fast-lane batch (probes cut at
  ``HEALTH_SLOW_SECONDS``); else the slow-lane slot (a digest) the batch frees when it ends
  (lanes: :mod:`app.probes.schedule`).

Both are idempotent: a duplicate batch probes the same proxies once more, nothing else.
"""

from __future__ import annotations

import logging

import redis as redis_lib

from app.probes.credentials import SecretCredentials
from app.probes import engine, schedule
from app.probes.settings import HealthSettings
from app.kube.gateway import KubernetesGateway
from app.lazy import per_process
from app.store.client import client_from_url
from app.config.settings import Settings
from workers import routing
from workers.celery_app import celery_app

log = logging.getLogger(__name__)

@per_process
def _runtime() -> tuple[redis_lib.Redis, HealthSettings]:
    """Return this process's Redis client and health settings (rebuilt after fork)."""
    return (client_from_url(Settings.from_env().redis_url, decode_responses=True, socket_timeout=10,
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
    batches = schedule.plan(r, settings)
    try:
        for batch in batches:
            probe_batch.apply_async(args=[batch.uids], kwargs={"slot": batch.slot} if batch.slot else {},
                                    queue=routing.HEALTH)
    except Exception:
        for batch in batches:  # not enqueued (or maybe): the slot must not wait for its expiry
            if batch.slot:
                schedule.release(r, batch.slot)
        raise
    if batches:
        log.debug("health: sweep enqueued %d batches (%d proxies, %d slow-lane batches)", len(batches),
                  sum(len(b.uids) for b in batches), sum(1 for b in batches if b.slot))
    return len(batches)


@per_process
def _credentials() -> SecretCredentials:
    """This process's basic-auth credentials reader (cached Secret reads) and, as its ``kube``,
    the gateway the status writes go through (on this process's client, rebuilt after fork;
    writes not recorded for the watcher's de-duplication: :mod:`app.kube.status_writer`)."""
    # reads the Proxy first: only the Secret its record's Proxy owns is used (app.probes.credentials)
    return SecretCredentials(KubernetesGateway(record_writes=False), ttl=_runtime()[1].credentials_ttl)


@celery_app.task(name="health.probe_batch", ignore_result=True)
def probe_batch(uids: list[str], slot: str | None = None) -> dict:
    """Probe the proxies ``uids``; return counts only (no addresses, no messages).

    ``slot``: ``None`` for a fast-lane batch; a slow-lane batch's slot, freed when it ends.
    """
    r, settings = _runtime()
    creds = _credentials()
    try:
        report = engine.probe_batch(r, list(uids), settings, kube=creds.kube, credentials=creds, events=True,
                                    fast_lane=slot is None)
    finally:
        if slot:
            try:
                schedule.release(r, slot)
            except Exception as exc:  # noqa: BLE001 - the slot expires after HEALTH_CLAIM_SECONDS
                log.warning("health: freeing a slow-lane slot failed: %s", type(exc).__name__)
    return {"probed": report.probed, "succeeded": report.succeeded, "failed": report.failed,
            "statusWritten": report.status_written, "statusErrors": report.status_errors,
            "wentFailed": report.went_failed, "outage": report.outage, "originDown": report.origin_down,
            "deferred": report.deferred}
