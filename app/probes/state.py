"""Thresholds: from probe results to health, phase and what the Proxy status should say.

Pure functions over plain values, so the rules are testable without Redis or Kubernetes:

* ``successThreshold`` consecutive successes make a proxy healthy (phase Ready);
* ``failureThreshold`` consecutive failures make a healthy proxy unhealthy (phase Unhealthy);
  a proxy that was never healthy stays in its phase (Running) with Healthy=False and the
  reason, and goes Failed once the provisioning deadline has passed;
* during a probe-side outage (every probe of every proxy failing) nothing turns unhealthy or
  Failed: the counters keep counting, the verdicts stay as they were.

:class:`Verdict` is what the Proxy status should say; its :meth:`Verdict.key` is stored in the
serving view after a successful status write, so the status is written on change only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from app.probes import probe as p
from app.resources import FAILED, READY, UNHEALTHY

HEALTHY = "healthy"
UNHEALTHY_STATE = "unhealthy"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Thresholds:
    """``healthCheck`` thresholds: consecutive results needed to flip (both at least 1)."""

    success: int = 1
    failure: int = 3


@dataclass(frozen=True)
class HealthState:
    """A proxy's health bookkeeping (mirrors fields of the serving-view hash).

    Attributes:
        health: ``"healthy"``, ``"unhealthy"`` or ``"unknown"`` (never decided yet).
        successes / failures: consecutive results so far.
        ever_healthy: whether it was healthy at least once since it was published.
        reason / message: the reason and message of the current verdict.
        egress_ip: last learnt egress IP (``""`` unknown).
        running_since: epoch seconds it was published with this endpoint.
        failed: whether it went Failed (deadline passed).
    """

    health: str = UNKNOWN
    successes: int = 0
    failures: int = 0
    ever_healthy: bool = False
    reason: str = ""
    message: str = ""
    egress_ip: str = ""
    running_since: float = 0.0
    failed: bool = False

    @property
    def healthy(self) -> bool:
        """Whether leases may be handed out for this proxy."""
        return self.health == HEALTHY


@dataclass(frozen=True)
class Verdict:
    """What the Proxy status should say.

    Attributes:
        healthy: Healthy/Ready condition status (``None`` = nothing decided: write nothing).
        reason / message: condition reason and message.
        phase: ``Ready``, ``Unhealthy``, ``Failed`` or ``None`` (leave the phase alone).
        egress_ip: ``status.egressIP`` (``""`` = unknown).
        banned_targets: ``status.bannedTargets``: distinct targets that banned the egress IP
            within the ban history (``None`` = not counted: leave it alone).
    """

    healthy: bool | None
    reason: str
    message: str
    phase: str | None
    egress_ip: str
    banned_targets: int | None = None

    def key(self) -> str:
        """A string that changes exactly when the status must be written again."""
        if self.healthy is None:
            return ""
        parts = [str(self.healthy), self.reason, self.phase or "", self.egress_ip]
        if self.banned_targets is not None:
            parts.append(str(self.banned_targets))
        return "|".join(parts)


def advance(state: HealthState, result: p.ProbeResult, thresholds: Thresholds, *, now: float,
            deadline: float, outage: bool) -> HealthState:
    """Return the state after ``result``.

    Args:
        state: the state before this probe.
        result: the probe's result.
        thresholds: the Proxy's thresholds.
        now: epoch seconds.
        deadline: provisioning deadline in seconds (a never-healthy proxy older than this goes
            Failed).
        outage: whether a probe-side outage is in progress (failures then change nothing but
            the counters).
    """
    egress = result.egress_ip or state.egress_ip
    if result.ok:
        s = replace(state, successes=state.successes + 1, failures=0, egress_ip=egress)
        if s.health != HEALTHY and s.successes >= max(1, thresholds.success):
            return replace(s, health=HEALTHY, ever_healthy=True, reason=result.reason, message=result.message)
        if s.health == HEALTHY:
            # Still healthy: keep the verdict current (ProbeSucceeded, or RateLimited when a 429
            # counts as a success).
            return replace(s, reason=result.reason, message=result.message)
        return s
    s = replace(state, successes=0, failures=state.failures + 1)
    if outage:
        return s
    if not s.ever_healthy and state.running_since and now - state.running_since >= deadline:
        return replace(s, health=UNHEALTHY_STATE, failed=True, reason=result.reason,
                       message=f"not healthy within {deadline:.0f}s of starting: {result.message}")
    if s.health != UNHEALTHY_STATE and s.failures >= max(1, thresholds.failure):
        return replace(s, health=UNHEALTHY_STATE, reason=result.reason, message=result.message)
    if s.health == UNHEALTHY_STATE:
        # Still failing: keep the verdict current (the reason may have changed).
        return replace(s, reason=result.reason, message=result.message)
    return s


def verdict(state: HealthState) -> Verdict:
    """Return what the Proxy status should say for ``state``."""
    if state.failed:
        return Verdict(False, state.reason, state.message, FAILED, state.egress_ip)
    if state.health == HEALTHY:
        return Verdict(True, state.reason or p.OK, state.message, READY, state.egress_ip)
    if state.health == UNHEALTHY_STATE:
        return Verdict(False, state.reason, state.message, UNHEALTHY if state.ever_healthy else None,
                       state.egress_ip)
    return Verdict(None, "", "", None, state.egress_ip)
