"""The beat schedule (``celery -A workers beat``; HA through celery-redbeat's Redis lock).

* ``proxy.resync`` every ``RESYNC_INTERVAL`` seconds: heals lost tasks and a flushed Redis.
* ``gc.sweep`` every ``GC_INTERVAL`` seconds: orphan collection per provider.
* entries contributed by ``workers.health_tasks.BEAT_SCHEDULE`` (probe sweeps, provider checks).
"""

from __future__ import annotations

from workers.celery_app import celery_app, settings

SCHEDULE = {
    "proxy-resync": {"task": "proxy.resync", "schedule": settings.resync_interval},
    "gc-sweep": {"task": "gc.sweep", "schedule": settings.gc_interval},
}

try:
    from workers.health_tasks import BEAT_SCHEDULE as _HEALTH
except ImportError:  # health tasks not installed in this build
    _HEALTH = {}

celery_app.conf.beat_schedule = {**SCHEDULE, **_HEALTH}
