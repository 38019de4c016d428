"""The pool autoscaler's arithmetic: how many members the live leases and the refused requests
call for, with hysteresis.  Pure functions; :func:`app.pools.plan.plan` calls :func:`decide`.

* **Load.**  ``live`` leases on the pool's members that take new leases, plus the crawlers
  waiting: lease requests refused for lack of capacity in this pool are counted in Redis (one
  ``INCR`` per refused request, :func:`app.pools.demand.take`); refused crawlers retry about once
  a second (``Retry-After: 1``), so ``refused / seconds`` since the last read estimates how many
  wait.
* **Recommendation.**  ``ceil(load / (target * maxLeases))`` members, where ``maxLeases`` is
  a member's lease capacity (the template's): the count at which the Ready members would be
  ``target`` full.  Within 10 % of the current count's utilization
  (:data:`TOLERANCE`) the current count stands, so small swings never move it.  Clamped to
  ``[minReplicas, maxReplicas]``; when clamping changed it, ``ScalingLimited`` is ``True``.
* **Scale up** at once; **scale down** only to the highest recommendation of the last
  ``scaleDownDelaySeconds`` (the Kubernetes HPA's stabilization window), so a pool under
  steady or bursty load never oscillates.  The recommendations of that window are kept by the
  controller in Redis (one entry per change, not per pass: :func:`app.store.keys.pool_scale`);
  losing them (a flushed Redis) only restarts the window, which delays a scale-down, never a
  scale-up.
* **Where the count goes.**  Like the HPA, the autoscaler writes the pool's ``spec.replicas``
  through its scale subresource, so ``kubectl get pxp`` shows it; a ``kubectl scale`` of an
  autoscaled pool is overridden by the next pass.
* **No signal, no move.**  A pool with members but none Ready yet and nobody refused keeps its
  count (a rollout or a provider outage is not a load change).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from app.pools.model import Autoscale

#: Relative change of utilization below which the current count stands.
TOLERANCE = 0.1
#: Most recommendations kept (the oldest go first; the window is usually short).
MAX_HISTORY = 32


@dataclass(frozen=True)
class Demand:
    """The load signal for one pass.

    Attributes:
        live: live leases on the pool's members that take new leases (not draining).
        refused: lease requests for this pool refused for lack of capacity since the last read.
        window: seconds those refusals were counted over (at least 1 is used).
        ready: members that take new leases now.
    """

    live: int = 0
    refused: int = 0
    window: float = 0.0
    ready: int = 0

    @property
    def waiting(self) -> int:
        """Crawlers estimated to be waiting: ``ceil(refused / window)`` (they retry about once a second)."""
        if self.refused <= 0:
            return 0
        return int(math.ceil(self.refused / max(1.0, self.window)))


@dataclass(frozen=True)
class Decision:
    """What the autoscaler decided.

    Attributes:
        desired: the member count to keep.
        recommended: this pass's recommendation, clamped to the bounds.
        raw: the recommendation before clamping (``None`` when there was no signal).
        limited: ``"TooFewReplicas"`` / ``"TooManyReplicas"`` when clamping changed it, else ``""``.
        utilization: load / lease capacity of the ``ready`` members (``None`` without capacity).
        history: ``[{"time": epoch s, "replicas": n}]`` to keep for the next pass.
    """

    desired: int
    recommended: int
    raw: int | None
    limited: str
    utilization: float | None
    history: list[dict[str, int]]


def current_count(spec_replicas: int, auto: Autoscale) -> int:
    """The count now wanted: ``spec.replicas`` (the autoscaler's last write, or a user's) clamped
    to the bounds."""
    return min(max(spec_replicas, auto.min_replicas), auto.max_replicas)


def recommend(auto: Autoscale, current: int, demand: Demand, *, max_leases: int) -> int | None:
    """This pass's unclamped recommendation, or ``None`` when there is no signal to act on.

    Args:
        auto: the pool's :class:`Autoscale`.
        current: the member count now wanted.
        demand: :class:`Demand`.
        max_leases: one member's lease capacity (``maxLeases`` of the template; 0 = none).
    """
    load = demand.live + demand.waiting
    if max_leases <= 0:
        return None
    if demand.ready == 0 and demand.waiting == 0 and current > 0:
        return None  # members exist but none takes leases yet: nothing measured
    wanted = int(math.ceil(load / (auto.target * max_leases))) if load > 0 else 0
    if current > 0 and demand.waiting == 0:
        ratio = load / (auto.target * max_leases * current)
        if abs(ratio - 1.0) <= TOLERANCE + 1e-9:
            return current
    return wanted


def stabilize(history: "Sequence[Mapping[str, Any]] | None", recommended: int, now: float, *,
              delay: float) -> tuple[int, list[dict[str, int]]]:
    """Apply the scale-down window.

    Args:
        history: earlier recommendations, oldest first (``{"time", "replicas"}``; malformed
            entries are dropped).
        recommended: this pass's (clamped) recommendation.
        now: epoch seconds.
        delay: ``scaleDownDelaySeconds``.
    Returns:
        ``(desired, history)``: the highest recommendation in effect during the last ``delay``
        seconds (this one included), and the history to keep: this recommendation appended when
        it differs from the last, entries that ended before the window dropped (the one in
        effect when the window began stays).
    """
    entries = [dict(time=int(e["time"]), replicas=int(e["replicas"])) for e in history or ()
               if isinstance(e, Mapping) and isinstance(e.get("time"), int) and isinstance(e.get("replicas"), int)]
    entries.sort(key=lambda e: e["time"])
    if not entries or entries[-1]["replicas"] != recommended:
        entries.append({"time": int(now), "replicas": recommended})
    start = now - delay
    # the last entry that began at or before the window's start is in effect during the window
    first = 0
    for i, e in enumerate(entries):
        if e["time"] <= start:
            first = i
    kept = entries[first:][-MAX_HISTORY:]
    return max(e["replicas"] for e in kept), kept


def decide(auto: Autoscale, current: int, demand: Demand, *, max_leases: int,
           history: "list[Mapping[str, Any]] | None", now: float) -> Decision:
    """The member count to keep now (see the module docstring).

    Args:
        auto: the pool's :class:`Autoscale`.
        current: :func:`current_count`.
        demand: :class:`Demand`.
        max_leases: one member's lease capacity.
        history: the recommendations kept from earlier passes (``Decision.history`` of the
            last pass; ``None`` or ``[]`` when none is known).
        now: epoch seconds.
    """
    history = list(history or ())
    capacity = demand.ready * max_leases
    utilization = (demand.live + demand.waiting) / capacity if capacity > 0 else None
    raw = recommend(auto, current, demand, max_leases=max_leases)
    base = current if raw is None else raw
    clamped = min(max(base, auto.min_replicas), auto.max_replicas)
    limited = ""
    if raw is not None and raw < auto.min_replicas:
        limited = "TooFewReplicas"
    elif raw is not None and raw > auto.max_replicas:
        limited = "TooManyReplicas"
    if clamped >= current:
        # scale up (or stay) at once; the window restarts from this recommendation
        _, kept = stabilize(history, clamped, now, delay=auto.scale_down_delay)
        desired = clamped
    else:
        desired, kept = stabilize(history, clamped, now, delay=auto.scale_down_delay)
        desired = min(desired, current)
    return Decision(desired=desired, recommended=clamped, raw=raw, limited=limited, utilization=utilization,
                    history=kept)


__all__ = ["Decision", "Demand", "MAX_HISTORY", "TOLERANCE", "current_count", "decide", "recommend", "stabilize"]
