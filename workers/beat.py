"""The beat schedule (``celery -A workers beat``; HA through celery-redbeat's Redis lock).

* ``proxy.resync`` every ``RESYNC_INTERVAL`` seconds: heals lost tasks and a flushed Redis.
* ``gc.sweep`` every ``GC_INTERVAL`` seconds: orphan collection per provider.
* ``pool.resync`` every ``POOL_RESYNC_INTERVAL`` seconds: a pass over every ProxyPool (age
  limits, the autoscaler).
* ``pool.wake`` every ``POOL_WAKE_INTERVAL`` seconds: a pass now over each pool a lease release
  woke (a draining member's last lease ended: :mod:`app.pools.wake`).
* ``providers.check`` per provider every ``checkInterval`` (skipped when 0).
* entries contributed by ``workers.probe_tasks.BEAT_SCHEDULE`` (probe sweeps).

The providers config is validated here, at import, so a worker or beat started on a bad
file exits with the config error instead of half-starting.
"""

from __future__ import annotations

import sys

from app.config.validation import ConfigError
from app.wiring import load_config
from workers import routing
from workers.celery_app import celery_app, settings

try:
    providers_config = load_config(settings.providers_config)
except ConfigError as exc:
    print(f"proxy-operator: invalid providers config: {exc}", file=sys.stderr)
    raise SystemExit(2) from None

SCHEDULE = {
    "proxy-resync": {"task": "proxy.resync", "schedule": settings.resync_interval},
    "gc-sweep": {"task": "gc.sweep", "schedule": settings.gc_interval},
    "pool-resync": {"task": "pool.resync", "schedule": settings.pool_resync_interval,
                    "options": {"expires": settings.pool_resync_interval}},
    "pool-wake": {"task": "pool.wake", "schedule": settings.pool_wake_interval,
                  "options": {"expires": settings.pool_wake_interval}},
}
for _pc in providers_config.providers:
    if _pc.check_interval:
        SCHEDULE[f"provider-check-{_pc.name}"] = {
            "task": "providers.check", "schedule": _pc.check_interval, "args": [_pc.name],
            "options": {"queue": routing.HEALTH, "expires": _pc.check_interval},
        }

try:
    from workers.probe_tasks import BEAT_SCHEDULE as _HEALTH
except ImportError:  # health tasks not installed in this build
    _HEALTH = {}

celery_app.conf.beat_schedule = {**SCHEDULE, **_HEALTH}
