"""Cost guardrails of pools: instance-hours per day, and the estimated hourly cost of a fleet.

* :func:`account` — the instance-hours a pool's members ran today (UTC), kept in Redis
  (:func:`app.store.keys.pool_budget`) and advanced at each pass of the pool controller by the
  members that have an instance times the time since the last pass (the pool resync passes
  every ``POOL_RESYNC_INTERVAL``, 30 s by default, so the count is that fine).  A day's hours
  are split at midnight UTC.
* :func:`refusal` — why a pool with ``spec.maxInstanceHoursPerDay`` may create no member now,
  or ``None``.
* :func:`estimate` — the estimated cost per hour of the instances that exist, by provider and
  pool, from each provider's ``costs:`` table (:mod:`app.config.costs`); the resync exports it as
  ``proxy_operator_estimated_cost_per_hour`` (:func:`export`).
"""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from app.pools.model import LABEL_POOL
from app.resources import FAILED, PENDING, Proxy
from app.store import keys as redis_keys

#: How long a pool's day count is kept after its last write (seconds).
BUDGET_TTL = 2 * 86400
#: Longest gap between two passes that is counted (seconds): after an operator outage the
#: members' time is not known, and counting the whole gap would exhaust a budget at once.
MAX_GAP = 600.0


def day_of(epoch: float) -> str:
    """The UTC day of ``epoch`` (seconds) as ``YYYY-MM-DD``: the day a budget counts
    (``status.instanceHoursDay``)."""
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d")



def _midnight_after(epoch: float) -> float:
    d = datetime.fromtimestamp(epoch, timezone.utc)
    start = datetime(d.year, d.month, d.day, tzinfo=timezone.utc).timestamp()
    return start + 86400


def has_instance(proxy: Proxy) -> bool:
    """Whether ``proxy`` has (or may be making) an instance that costs: a Managed Proxy with a
    recorded provider ID, not Pending or Failed."""
    return bool(proxy.spec.managed and proxy.status.get("providerID") and proxy.phase not in (PENDING, FAILED))


def account(r, uid: str, live: int, *, now: float, recorded: Mapping[str, Any] | None = None) -> float:
    """Add the time since the last pass to the pool's instance-hours of today and return them.

    The interval since the last pass is counted at the number of members that had an instance
    then (``live`` of the last call), at most :data:`MAX_GAP` seconds of it; an interval that
    crosses midnight UTC counts only its part after midnight for the new day.  When Redis holds no
    count of today (flushed, restarted empty), the count resumes from what the pool's status last
    said for today (``recorded``), so a lost Redis does not hand a pool its day's budget again (it
    may lose the twentieth of an hour the status rounds away, and the passes since the status
    was written).

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        uid: the pool's UID.
        live: members with an instance now (:func:`has_instance`).
        now: epoch seconds.
        recorded: the pool's ``status`` (its ``instanceHoursDay`` and ``instanceHoursToday``), or
            ``None``; values of another day or not numbers are ignored.
    Returns:
        instance-hours used today (UTC).
    Raises:
        redis.RedisError: Redis unreachable.
    """
    key = redis_keys.pool_budget(uid)
    raw = r.get(key)
    state: dict[str, Any] = {}
    if raw:
        try:
            state = json.loads(raw)
        except ValueError:
            state = {}
    today = day_of(now)
    hours = float(state.get("hours") or 0.0) if state.get("day") == today else 0.0
    if state.get("day") != today and recorded is not None and recorded.get("instanceHoursDay") == today:
        floor = recorded.get("instanceHoursToday")
        if isinstance(floor, (int, float)) and not isinstance(floor, bool) and floor > hours:
            hours = float(floor)
    at = state.get("at")
    if isinstance(at, (int, float)) and at < now:
        start = max(float(at), now - MAX_GAP)
        if day_of(start) != today:
            start = max(start, _midnight_after(start))
        if start < now:
            hours += int(state.get("live") or 0) * (now - start) / 3600.0
    r.set(key, json.dumps({"day": today, "hours": hours, "at": now, "live": live}), ex=BUDGET_TTL)
    return hours


def forget(r, uid: str) -> None:
    """Drop the pool's count (the pool is gone)."""
    r.delete(redis_keys.pool_budget(uid))


def refusal(limit: float | None, hours: float, *, now: float) -> str | None:
    """Why no member may be created now, or ``None``.

    Args:
        limit: ``spec.maxInstanceHoursPerDay`` or ``None`` (no budget).
        hours: instance-hours used today (:func:`account`).
        now: epoch seconds.
    """
    if limit is None or hours < limit:
        return None
    until = datetime.fromtimestamp(_midnight_after(now), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"spec.maxInstanceHoursPerDay: {hours:.2f} instance-hours used today of {limit:g}: no member is "
            f"created until {until} (members that run are kept)")


def estimate(proxies: Iterable[Proxy], configs: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    """The estimated cost per hour of the instances that exist, by (provider, pool).

    Args:
        proxies: Proxies as listed.
        configs: provider name -> :class:`app.config.providers.ProviderConfig`; a provider without
            a ``costs:`` table is left out.
    Returns:
        ``{(provider, pool): cost per hour}``; ``pool`` is ``""`` for a Proxy of no pool.
    """
    out: dict[tuple[str, str], float] = {}
    for proxy in proxies:
        if not has_instance(proxy):
            continue
        provider = proxy.status.get("provider") or proxy.spec.provider or ""
        pc = configs.get(provider)
        costs = getattr(pc, "costs", None)
        if costs is None:
            continue
        key = (provider, proxy.labels.get(LABEL_POOL, "") if proxy.labels else "")
        out[key] = out.get(key, 0.0) + costs.price(proxy.spec.machine_type, proxy.spec.capacity)
    return out


_exported: set[tuple[str, str]] = set()
_lock = threading.Lock()


def export(proxies: Iterable[Proxy], configs: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    """Set ``proxy_operator_estimated_cost_per_hour{provider, pool}`` from :func:`estimate`, and
    ``proxy_operator_cost_budget_per_hour{provider}`` of the providers with ``costs.budgetPerHour``.

    Labels this process set before and that have no instance now are set to 0 (a gauge's label
    cannot be removed in multiprocess mode).

    Returns:
        the estimate.
    """
    from app.observability import metrics

    costs = estimate(proxies, configs)
    for name, pc in configs.items():
        table = getattr(pc, "costs", None)
        if table is not None and table.budget_per_hour is not None:
            metrics.COST_BUDGET.labels(name).set(table.budget_per_hour)
    with _lock:
        for key in _exported | set(costs):
            metrics.ESTIMATED_COST.labels(*key).set(round(costs.get(key, 0.0), 6))
        _exported.update(costs)
    return costs
