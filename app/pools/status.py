"""A ProxyPool's status as one pass of the controller leaves it: counts, selector and conditions.

:func:`render` turns what the plan decided (:class:`StatusInputs`) into the ``status`` keys the
controller owns; :func:`stalled` and :func:`invalid` are the status of a pool it cannot act on.
Conditions follow Kubernetes semantics (:func:`app.kube.conditions.set_condition`) and keep a
fixed order: ``Available``, ``Progressing``, ``ScalingLimited``, ``ZonesReady``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from app.kube import conditions
from app.pools import autoscale as scaler
from app.pools.model import Member, Pool, format_time, status_selector
from app.pools.zones import MAX_ZONES_NAMED, describe_zones, pool_zones, zone_label

COND_AVAILABLE = "Available"
COND_PROGRESSING = "Progressing"
COND_SCALING_LIMITED = "ScalingLimited"
COND_ZONES_READY = "ZonesReady"
_ORDER = {COND_AVAILABLE: 0, COND_PROGRESSING: 1, COND_SCALING_LIMITED: 2, COND_ZONES_READY: 3}


@dataclass(frozen=True)
class StatusInputs:
    """What one pass decided, as the status reports it.

    Attributes:
        pool: the pool as read (valid spec).
        live: its members not being deleted.
        active: the members not draining after the pass (reclaimed ones included).
        updated: the active members of the current template, within their age limit and zones.
        desired: ``N``, the members wanted.
        decision: the autoscaler's decision, ``None`` when it is off.
        creates / drains / deletes: how many of each the pass makes.
        outdated: how many active members are outdated.
        burned: how many of the outdated are burned (``spec.recycle``).
        no_zone: members are wanted but no zone is Ready.
        draining: members draining before the pass and not reclaimed.
        now: epoch seconds.
        failures: ``status.memberFailures`` while the failure backoff holds creates, else ``None``.
        skipped: ``status.skippedZones`` (:func:`app.pools.zones.skipped_zones`).
        held_back: members not created only because draining members still hold leases.
        holding: the draining members still holding leases.
        kept_burned: burned members of a provider that keeps the egress IP that the
            ``maxUnavailable`` bound keeps serving.
        parking: the UIDs of the burned members drained in place after the pass (their provider
            gives a replacement the same egress IP: :data:`app.pools.model.BURNED_IN_PLACE`); not
            counted as "not leasable yet".
        unparking: the UIDs of members drained in place that take leases again after the pass.
    """

    pool: Pool
    live: Sequence[Member]
    active: Sequence[Member]
    updated: Sequence[Member]
    desired: int
    decision: scaler.Decision | None
    creates: int
    drains: int
    deletes: int
    outdated: int
    burned: int
    no_zone: bool
    draining: int
    now: float
    failures: dict[str, Any] | None = None
    skipped: Sequence[dict[str, Any]] = ()
    held_back: int = 0
    holding: int = 0
    kept_burned: int = 0
    parking: frozenset[str] | set[str] = frozenset()
    unparking: frozenset[str] | set[str] = frozenset()


def _set(conds: list[dict], ctype: str, state: str, reason: str, message: str, generation: int, now: str) -> list[dict]:
    out = conditions.set_condition(conds, ctype, state, reason=reason, message=message, generation=generation, now=now)
    out.sort(key=lambda c: (_ORDER.get(c["type"], 9), c["type"]))
    return out


def _available(s: StatusInputs) -> tuple[str, str, str]:
    """``Available``: whether at least ``N - maxUnavailable`` members take leases."""
    leasable = sum(1 for m in s.active if m.leasable)
    n = s.desired
    least = max(0, n - s.pool.valid_spec.max_unavailable)
    if leasable >= least:
        return "True", "MinimumLeasable", f"{leasable} of {n} members take leases (at least {least} wanted)"
    return "False", "TooFewLeasable", f"{leasable} of {n} members take leases, fewer than the {least} wanted"


def _progressing(s: StatusInputs) -> tuple[str, str, str]:
    """``Progressing``: held back (failures, no Ready zone), moving (what is left to do), or complete."""
    n, updated = s.desired, len(s.updated)
    if s.failures is not None and updated < n:
        return "False", "FailureBackoff", (f"members failed in {s.failures['count']} pass(es) in a row; no member is "
                                           f"created before {s.failures['retryAfter']}")
    if s.no_zone:
        return "False", "NoReadyZone", ("no member can be created: the provider target of every zone is not Ready: "
                                        f"{describe_zones(list(s.skipped))}")
    unready = sum(1 for m in s.updated if not m.leasable and m.uid not in s.parking and m.uid not in s.unparking)
    if not (s.creates or s.drains or s.deletes or s.outdated or s.draining or updated != n or unready
            or s.parking or s.kept_burned or s.unparking):
        return "True", "PoolComplete", f"{n} updated members, all leasable"
    parts = []
    if updated < n or s.creates:
        parts.append(f"{updated} of {n} members updated")
    if s.outdated:
        parts.append(f"{s.outdated} outdated" + (f" ({s.burned} burned: spec.recycle)" if s.burned else ""))
    if s.draining or s.drains:
        parts.append(f"{s.draining + s.drains} draining")
    if s.held_back:
        parts.append(f"{s.held_back} member(s) wait for {s.holding} draining member(s) still holding "
                     f"leases (maxSurge {s.pool.valid_spec.max_surge})")
    if updated > n:
        parts.append(f"{updated - n} more than wanted")
    if unready:
        parts.append(f"{unready} not leasable yet")
    if s.parking:
        parts.append(f"{len(s.parking)} burned, drained in place (spec.recycle: their provider gives a replacement the "
                     "same egress IP; they take leases again once no longer burned)")
    if s.kept_burned:
        least = max(0, n - s.pool.valid_spec.max_unavailable)
        parts.append(f"{s.kept_burned} burned kept serving: draining them in place would leave fewer than {least} "
                     "leasable (spec.rollout.maxUnavailable)")
    if s.unparking:
        parts.append(f"{len(s.unparking)} drained in place no longer burned: taking leases again")
    if s.outdated:
        reason = "RollingOut"
    elif updated < n:
        reason = "ScalingUp"
    elif updated > n or s.drains or s.draining:
        reason = "ScalingDown"
    elif s.parking or s.kept_burned or s.unparking:
        reason = "BurnedInPlace"
    else:
        reason = "WaitingForMembers"
    return "True", reason, "; ".join(parts) or "in progress"


def _scaling_limited(s: StatusInputs) -> tuple[str, str, str]:
    """``ScalingLimited``: whether the autoscaler's bounds hold the count back."""
    decision = s.decision
    auto = s.pool.valid_spec.autoscale
    if decision is None or auto is None:
        return "False", "AutoscaleDisabled", "spec.autoscale is not set"
    if decision.limited:
        bound = (f"minReplicas {auto.min_replicas}" if decision.limited == "TooFewReplicas"
                 else f"maxReplicas {auto.max_replicas}")
        return "True", decision.limited, f"the load calls for {decision.raw} members, held at {bound}"
    return "False", "DesiredWithinRange", (f"{decision.recommended} members recommended, within "
                                           f"[{auto.min_replicas}, {auto.max_replicas}]")


def _zones_ready(s: StatusInputs) -> tuple[str, str, str]:
    """``ZonesReady``: whether every zone's provider target is Ready."""
    spec = s.pool.valid_spec
    zones = pool_zones(s.pool)
    if s.skipped:
        return "False", "ZonesNotReady", (f"{len(s.skipped)} of {len(zones)} zone(s) get no new member until their "
                                          f"provider target is Ready: {describe_zones(list(s.skipped))}")
    if spec.zones:
        named = ", ".join(spec.zones[:MAX_ZONES_NAMED]) + (
            f" and {len(spec.zones) - MAX_ZONES_NAMED} more" if len(spec.zones) > MAX_ZONES_NAMED else "")
        return "True", "AllZonesReady", f"the provider target of every zone is Ready: {named}"
    return "True", "AllZonesReady", f"the provider target of {zone_label(zones[0])} is Ready"


_CONDITIONS = ((COND_AVAILABLE, _available), (COND_PROGRESSING, _progressing),
               (COND_SCALING_LIMITED, _scaling_limited), (COND_ZONES_READY, _zones_ready))


def render(s: StatusInputs) -> dict[str, Any]:
    """Return the pool's status after a pass: counts, ``observedGeneration``, ``selector``, conditions.

    Args:
        s: what the pass decided.
    Returns:
        ``replicas``, ``readyReplicas``, ``leasableReplicas``, ``updatedReplicas``,
        ``observedGeneration``, ``selector`` and ``conditions`` (each condition's
        ``lastTransitionTime`` kept unless its status flips).
    Raises:
        ValueError: the pool's spec is invalid.
    """
    pool = s.pool
    stamp = format_time(s.now)
    conds = list(pool.status.get("conditions") or ())
    for ctype, judge in _CONDITIONS:
        state, reason, message = judge(s)
        conds = _set(conds, ctype, state, reason, message, pool.generation, stamp)
    return {
        "replicas": len(s.live),
        "readyReplicas": sum(1 for m in s.live if m.ready),
        "leasableReplicas": sum(1 for m in s.active if m.leasable),
        "updatedReplicas": len(s.updated),
        "burnedReplicas": sum(1 for m in s.live if m.burned and not m.draining),
        "observedGeneration": pool.generation,
        "selector": status_selector(pool.name, pool.valid_spec),
        "conditions": conds,
    }


def stalled(pool: Pool, reason: str, message: str, *, now: float) -> dict:
    """The status of a pool the controller cannot act on: ``Progressing=False`` with ``reason``
    and ``message``; nothing else is changed (its members are left as they are).

    Args:
        pool: the pool.
        reason: CamelCase (``InvalidSpec``, ``UnknownProvider``).
        message: what is wrong, naming the field.
        now: epoch seconds.
    Returns:
        ``observedGeneration`` and ``conditions``.
    """
    conds = _set(list(pool.status.get("conditions") or ()), COND_PROGRESSING, "False", reason, message,
                 pool.generation, format_time(now))
    return {"observedGeneration": pool.generation, "conditions": conds}


def invalid(pool: Pool, now: float) -> dict:
    """:func:`stalled` for a pool whose spec cannot be read: ``InvalidSpec``, the message naming
    the field (:attr:`app.pools.model.Pool.spec_error`).

    Args:
        pool: the pool.
        now: epoch seconds.
    Returns:
        as :func:`stalled`.
    """
    return stalled(pool, "InvalidSpec", pool.spec_error, now=now)


__all__ = ["COND_AVAILABLE", "COND_PROGRESSING", "COND_SCALING_LIMITED", "COND_ZONES_READY", "StatusInputs",
           "invalid", "render", "stalled"]
