"""Pool gauges from one snapshot: each pass writes its pool's counts to Redis, and a collector
reads them all when Prometheus scrapes.

The counts a pool pass computes (desired, members, Ready, leasable, updated, draining, skipped
zones) are written by :func:`record` to one Redis hash (:data:`app.store.keys.POOL_STATS`, a
field per pool), not kept in the worker that ran the pass: under prefork each pass runs in
whichever child took the task, and a per-process gauge would be the last value *that child*
saw (prometheus-client's multiprocess gauges cannot tell a fresh value from a stale one).  The
:class:`PoolCollector` (exported by beat, like the provider-health gauges) reads the whole
hash at scrape time, so every scrape shows each pool as its last pass left it, with the time of
that pass (``proxy_operator_pool_last_pass_timestamp_seconds``: a pool nobody reconciles any
more shows as old, not as a frozen value that looks current).

A deleted pool, or one whose spec the controller cannot act on (``InvalidSpec``,
``UnknownProvider``: its ``Progressing`` condition says why), has no samples: :func:`forget`
runs in its pass, and :func:`prune` (run by ``pool.resync``, which lists every pool) removes
what a missed deletion left.

Labels are ``namespace`` and ``pool`` (the pool's name): bounded by the pools that exist.
Custom collectors: https://prometheus.github.io/client_python/collector/custom/
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Iterable, Mapping

import redis
from prometheus_client.core import GaugeMetricFamily

from app.store import keys as redis_keys

log = logging.getLogger(__name__)

#: (metric name, snapshot field, help) of each gauge :class:`PoolCollector` exports.
GAUGES = (
    ("proxy_operator_pool_desired_replicas", "desired",
     "Members the pool wants (spec.replicas, or the autoscaler's count), as its last pass decided."),
    ("proxy_operator_pool_replicas", "replicas", "Members of the pool not being deleted (draining ones included)."),
    ("proxy_operator_pool_ready_replicas", "ready", "Members of the pool whose phase is Ready."),
    ("proxy_operator_pool_leasable_replicas", "leasable", "Members of the pool the API would lease now."),
    ("proxy_operator_pool_updated_replicas", "updated",
     "Members made from the pool's current template and younger than their age limit."),
    ("proxy_operator_pool_draining_replicas", "draining", "Members of the pool draining (leaving it)."),
    ("proxy_operator_pool_skipped_zones", "skippedZones",
     "Zones of the pool that get no new member because their provider target is not Ready."),
    ("proxy_operator_pool_last_pass_timestamp_seconds", "at", "Unix time of the pool's last controller pass."),
    ("proxy_operator_pool_leases", "leases",
     "Live leases on the pool's members that take new leases (the autoscaler's load, crawlers waiting aside)."),
    ("proxy_operator_pool_lease_capacity", "leaseCapacity",
     "Leases the pool's leasable members take at once (maxLeases x leasable members)."),
)
#: Fields added after the first release: an entry written before has none (read as 0).
_LATER = {"leases", "leaseCapacity"}


def _field(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def record(r, *, namespace: str, name: str, uid: str, status: Mapping, desired: int, draining: int,
           leases: int = 0, capacity: int = 0, now: float | None = None) -> None:
    """Write the pool's counts as its pass computed them.

    Args:
        r: ``redis.Redis``.
        namespace / name / uid: the pool.
        status: the pool status the pass wrote (:attr:`app.pools.plan.Plan.status`): its
            ``replicas``, ``readyReplicas``, ``leasableReplicas``, ``updatedReplicas`` and
            ``skippedZones``.
        desired: the members wanted (:attr:`app.pools.plan.Plan.desired`).
        draining: members draining after the pass (already draining + marked by it).
        leases: live leases on the members that take new leases, as the pass read them.
        capacity: ``maxLeases`` x the leasable members (``status.leasableReplicas``): with
            ``leases``, the lease utilization an HPA on an External metric can target.
        now: epoch seconds of the pass (default: now).
    Raises:
        redis.RedisError: Redis unreachable.
    """
    doc = {"uid": uid, "desired": int(desired), "replicas": int(status.get("replicas") or 0),
           "ready": int(status.get("readyReplicas") or 0), "leasable": int(status.get("leasableReplicas") or 0),
           "updated": int(status.get("updatedReplicas") or 0), "draining": int(draining),
           "skippedZones": len(status.get("skippedZones") or ()), "leases": int(leases),
           "leaseCapacity": int(capacity), "at": time.time() if now is None else now}
    r.hset(redis_keys.POOL_STATS, _field(namespace, name), json.dumps(doc, separators=(",", ":")))


def forget(r, namespace: str, name: str, *, uid: str | None = None) -> None:
    """Remove the pool's counts (its gauges disappear from the next scrape).  With ``uid``, only
    when the counts are that pool's (a pool re-created under the same name keeps its own).

    Raises:
        redis.RedisError: Redis unreachable.
    """
    key = _field(namespace, name)
    if uid is not None:
        raw = r.hget(redis_keys.POOL_STATS, key)
        try:
            if raw and json.loads(raw).get("uid") not in (None, uid):
                return
        except (ValueError, AttributeError):
            pass
    r.hdel(redis_keys.POOL_STATS, key)


def prune(r, pools: Iterable[tuple[str, str]], *, listed_at: float | None = None) -> int:
    """Remove the counts of every pool not in ``pools`` (``(namespace, name)`` of the pools that
    exist, from a complete list); return how many were removed.

    Args:
        listed_at: epoch seconds at which the list was started; counts a pass recorded at or
            after it are kept, whatever the list says (a pool created after the list was read,
            whose first pass already ran, keeps its gauges).  ``None``: no such guard.
    Raises:
        redis.RedisError: Redis unreachable.
    """
    keep = {_field(ns, name) for ns, name in pools}
    with r.pipeline() as pipe:
        while True:
            try:
                pipe.watch(redis_keys.POOL_STATS)  # a pass recording meanwhile: read again
                entries = pipe.hgetall(redis_keys.POOL_STATS)
                gone = [k for k, raw in entries.items() if k not in keep and not _recorded_since(raw, listed_at)]
                pipe.multi()
                if gone:
                    pipe.hdel(redis_keys.POOL_STATS, *gone)
                pipe.execute()
                return len(gone)
            except redis.WatchError:
                continue


def _recorded_since(raw, since: float | None) -> bool:
    """Whether the snapshot ``raw`` (JSON) was recorded at or after ``since``."""
    if since is None:
        return False
    try:
        return float(json.loads(raw).get("at", 0)) >= since
    except (ValueError, TypeError, AttributeError):
        return False


class PoolCollector:
    """prometheus-client collector of the pool gauges (:data:`GAUGES`, labels ``namespace`` and
    ``pool``), read from the snapshot in Redis at scrape time.  A scrape while Redis is
    unreachable exposes none of them (the scrape itself succeeds); an entry that cannot be read
    is skipped.

    Args:
        redis_factory: ``() -> redis.Redis`` (``decode_responses=True``), called per scrape
            until it returns a client, which is then reused.
    """

    def __init__(self, redis_factory: Callable[[], object]) -> None:
        self.redis_factory = redis_factory
        self._r: Any = None

    def describe(self):
        """Nothing up front (no Redis read when registered)."""
        return []

    def collect(self):
        """Yield the gauge families of :data:`GAUGES`."""
        families = [(GaugeMetricFamily(metric, text, labels=["namespace", "pool"]), key)
                    for metric, key, text in GAUGES]
        try:
            if self._r is None:
                self._r = self.redis_factory()
            entries = self._r.hgetall(redis_keys.POOL_STATS)
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail because Redis is down
            log.warning("cannot read the pool counts for /metrics: %s", type(exc).__name__)
            return
        for field_name, raw in sorted(entries.items()):
            namespace, _, name = field_name.partition("/")
            try:
                doc = json.loads(raw)
                values = [float(doc.get(key, 0) if key in _LATER else doc[key]) for _, key in families]
            except (ValueError, TypeError, KeyError):
                continue
            for (family, _), value in zip(families, values, strict=True):
                family.add_metric([namespace, name], value)
        for family, _ in families:
            yield family


__all__ = ["GAUGES", "PoolCollector", "forget", "prune", "record"]
