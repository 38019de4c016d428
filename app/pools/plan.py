"""What a ProxyPool needs now: the pool controller's decisions, as one pure function.

:func:`plan` takes the pool, its members (with what the serving view says about each), the
readiness of the zones it may place members in and the load signal, and returns a
:class:`Plan`: members to create (and in which zone), members to mark draining, drained
members to delete, and the status to write.  It calls nothing; :mod:`app.pools.controller`
reads the inputs and applies the plan.  The same inputs always give the same plan.

Rules, in the order they apply:

1. **Leaving members.**  A draining member takes no new leases; its live leases run until
   they are released or expire (renewals are capped at its drain deadline).  It is deleted as
   soon as it holds no live lease, or when its deadline (``drainTimeoutSeconds`` after it began
   draining) has passed.  A ``Failed`` member is deleted at once (it serves nothing).  Members
   already being deleted are ignored.  A pass that finds failed members starts a **failure
   backoff**: no member is created for ``10 s × 2^(k-1)`` (at most 5 min), ``k`` counting the
   passes in a row that found failures (:func:`failure_backoff`), so a template that always fails
   does not churn members at the pace it fails.  The state lives in ``status.memberFailures``
   (it survives restarts of the controller); a member of the current template made after the
   last failure that takes leases, or a new template, ends it.
2. **Wanted count** ``N``: ``spec.replicas``, or the autoscaler's (:mod:`app.pools.autoscale`).
3. **Outdated members**: made from another template (their :data:`~app.pools.model.LABEL_TEMPLATE_HASH`),
   older than their age limit (``maxAge`` shortened by up to 25 % by a hash of the member's UID,
   :func:`~app.pools.model.age_limit`), placed in a zone no longer in ``spec.spread.zones``, or
   not leasable in a zone whose provider target is not Ready.  The others are *updated*.
4. **Leaving, bounded** (a Deployment's rolling update, with members for Pods): outdated
   members start draining — those not leasable first (they serve nothing and leave freely),
   then the fewest live leases, then the oldest — and, when more updated members exist than
   ``N``, the surplus of updated ones (not leasable first, then the fewest live leases, then
   those in the most crowded zone, then the newest).  A leasable member leaves only while
   the leasable count stays at ``N - maxUnavailable`` or above, so with ``maxUnavailable: 0``
   an outdated member starts draining only once a new one is leasable.  A ``Ready`` member with
   no serving record (a flushed Redis: :attr:`~app.pools.model.Member.unknown`) leaves only
   while that count is already reached, so a lost serving view does not drain the pool.
5. **Reclaiming, then creating, bounded**: while fewer than ``N`` are updated, members draining
   for ``ScaleDown`` (:attr:`~app.pools.model.Member.drain_reason`) that are still updated
   (current template, within their age limit, in a Ready zone of ``spec.spread.zones``), serve
   but for the mark and have not reached their deadline are reclaimed first (:class:`Reclaim`:
   the mark comes off, they take leases again), the most leased first, then the newest; members
   draining as ``Outdated`` never are.  Then new members (current template) while fewer than ``N`` are updated,
   at most ``N + maxSurge`` members in all, counting the members not draining *and* the
   draining members that still hold live leases (their instances run until the leases end, at
   the latest at their drain deadline, so a rollout waits for them and never stalls longer
   than ``drainTimeoutSeconds`` per step; a draining member without leases is deleted by this
   pass or the next and is not counted, nor is a member whose deletion has begun), and at most
   :data:`MAX_CREATES_PER_PASS` in one pass (the next pass follows a second later).  Each goes to the zone of
   ``spec.spread.zones`` whose provider target is Ready and that holds the fewest members
   (ties: the order of the list); no zone Ready: nothing is created and ``Progressing`` says so.
6. **Status**: counts, ``observedGeneration``, ``selector`` (:func:`~app.pools.model.status_selector`:
   the pool label every member carries, after an explicit ``spec.selector``), conditions ``Available``,
   ``Progressing``, ``ScalingLimited``, ``ZonesReady``, the autoscaler's state, and
   ``skippedZones``: each zone of the pool (``spec.spread.zones``, or the template's placement)
   whose provider target is not Ready, with that target's ProviderHealth reason and message and
   since when it is skipped (:func:`skipped_zones`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from app.kube import conditions
from app.pools import autoscale as scaler
from app.pools.model import Member, Pool, age_limit, format_time, parse_time, status_selector
from app.resources import FAILED
from app.backoff import capped_exponential

#: First delay of the failure backoff (seconds), doubled by each further pass with failures.
FAILURE_BACKOFF_BASE = 10.0
#: Longest delay of the failure backoff (seconds).
FAILURE_BACKOFF_MAX = 300.0
#: Members one pass creates at most (like the ReplicaSet controller's burstReplicas): ``spec.replicas``
#: has no maximum, so a typo (``1000000``) must not make one pass build and send that many creates
#: (the worker's memory, the task's time limit, the API server).  A pass that hits the bound asks for
#: the next one after :data:`CREATE_BATCH_REQUEUE` seconds.
MAX_CREATES_PER_PASS = 100
CREATE_BATCH_REQUEUE = 1.0

COND_AVAILABLE = "Available"
COND_PROGRESSING = "Progressing"
COND_SCALING_LIMITED = "ScalingLimited"
COND_ZONES_READY = "ZonesReady"
_ORDER = {COND_AVAILABLE: 0, COND_PROGRESSING: 1, COND_SCALING_LIMITED: 2, COND_ZONES_READY: 3}
#: Zones a condition message names at most (the rest are counted): messages stay bounded
#: whatever ``spec.spread.zones`` holds (up to 64 zones).
MAX_ZONES_NAMED = 10
#: Characters of a provider target's message kept in ``status.skippedZones`` and in messages.
MAX_ZONE_MESSAGE = 200


@dataclass(frozen=True)
class ZoneHealth:
    """Why a zone's provider target is not Ready, as its ProviderHealth says.

    Attributes:
        target: the ProviderHealth target the zone follows (a KVM host, a GCP project, ``cluster``).
        reason: the target's reason (CamelCase: ``HostUnreachable``, ``CheckStale``, ...).
        message: the target's message (cut at :data:`MAX_ZONE_MESSAGE` characters where shown).
    """

    target: str
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Create:
    """Create one member from the current template in ``zone`` (``None``: the template's placement)."""

    zone: str | None


@dataclass(frozen=True)
class Drain:
    """Mark member ``uid``/``name`` draining until ``until`` (epoch seconds): no new leases.
    ``targets``: for reason ``Burned``, the targets that banned its egress IP."""

    uid: str
    name: str
    until: float
    reason: str
    targets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reclaim:
    """Take the draining mark off member ``uid``/``name`` (drained for ``ScaleDown``, still
    updated) so it takes leases again, instead of creating a member in its place."""

    uid: str
    name: str


@dataclass(frozen=True)
class Delete:
    """Delete member ``uid``/``name``; ``reason``: ``Drained``, ``DrainTimeout`` or ``Failed``."""

    uid: str
    name: str
    reason: str


@dataclass(frozen=True)
class Plan:
    """What :func:`plan` decided.

    Attributes:
        desired: ``N``, the members wanted.
        creates / drains / deletes / reclaims: the actions, in the order they should be applied
            (deletes, reclaims, drains, creates).
        status: the pool's ``status`` to write (every key the controller owns).
        outdated: names of outdated members not yet draining (for logs).
        requeue_after: seconds until something in this plan changes by itself (a drain deadline,
            a member reaching its age limit), ``None`` for nothing timed.
        scale_to: the ``spec.replicas`` the autoscaler wants written (through the scale
            subresource), ``None`` when it is off or content with the current value.
        history: the autoscaler's recommendations to keep for the next pass (``()`` when off).
        utilization: live leases (and waiting crawlers) / lease capacity of the leasable
            members, ``None`` without capacity or autoscaler (for logs and metrics).
    """

    desired: int
    creates: tuple[Create, ...] = ()
    drains: tuple[Drain, ...] = ()
    deletes: tuple[Delete, ...] = ()
    status: dict[str, Any] = field(default_factory=dict)
    outdated: tuple[str, ...] = ()
    requeue_after: float | None = None
    scale_to: int | None = None
    history: tuple = ()
    utilization: float | None = None
    reclaims: tuple[Reclaim, ...] = ()

    @property
    def actions(self) -> int:
        """How many writes the plan asks for besides the status."""
        return len(self.creates) + len(self.drains) + len(self.deletes) + len(self.reclaims)


def zone_is_ready(zone_ready: Mapping[str, bool], zone: str | None) -> bool:
    """Whether members may be placed in ``zone``: ``True`` unless ``zone_ready`` says ``False``
    for it (a zone nobody checks is not held against the pool)."""
    return zone_ready.get(zone or "", True)


def failure_backoff(count: int) -> float:
    """Seconds no member is created after the ``count``-th pass in a row that found failed members:
    :data:`FAILURE_BACKOFF_BASE` doubled ``count - 1`` times, at most :data:`FAILURE_BACKOFF_MAX`."""
    if count <= 0:
        return 0.0
    return capped_exponential(count - 1, FAILURE_BACKOFF_BASE, FAILURE_BACKOFF_MAX)


def _failures(pool: Pool, failed: list[Member], active: list[Member], now: float) -> dict | None:
    """The pool's ``status.memberFailures`` after this pass: ``{"count", "lastFailureTime",
    "retryAfter", "templateHash"}``, or ``None`` when no backoff is in effect."""
    spec = pool.spec
    old = pool.status.get("memberFailures")
    count, last = 0, None
    if isinstance(old, Mapping) and old.get("templateHash") == spec.hash and isinstance(old.get("count"), int):
        count, last = old["count"], parse_time(old.get("lastFailureTime"))
    if failed:
        count += 1
        until = now + failure_backoff(count)
        return {"count": count, "lastFailureTime": format_time(now), "retryAfter": format_time(until),
                "templateHash": spec.hash}
    if count <= 0 or last is None:
        return None
    if any(m.leasable and m.template_hash == spec.hash and m.created >= last for m in active):
        return None  # a member made since the last failure works: the failures are over
    return dict(old)


def _expired(pool: Pool, m: Member, now: float) -> bool:
    max_age = pool.spec.max_age
    return bool(max_age) and now - m.created >= age_limit(m.uid, max_age)


def _outdated(pool: Pool, m: Member, zone_ready: Mapping[str, bool], now: float) -> bool:
    spec = pool.spec
    if m.template_hash != spec.hash or _expired(pool, m, now) or m.burned:
        return True
    if spec.zones and (m.zone or "") not in spec.zones:
        return True
    return not m.leasable and not zone_is_ready(zone_ready, m.zone)


def _reclaimable(pool: Pool, m: Member, zone_ready: Mapping[str, bool], now: float) -> bool:
    """Whether draining member ``m`` may take leases again on a scale-up: drained for
    ``ScaleDown`` (never ``Outdated``), before its deadline, serving but for the mark, and
    still updated (current template, within its age limit, in a Ready zone of ``spread.zones``)."""
    spec = pool.spec
    if m.drain_reason != "ScaleDown" or m.deleting or not m.serves or now >= (m.draining_until or 0):
        return False
    if m.template_hash != spec.hash or _expired(pool, m, now):
        return False
    if spec.zones and (m.zone or "") not in spec.zones:
        return False
    return zone_is_ready(zone_ready, m.zone)


def _desired(pool: Pool, demand: scaler.Demand, history, now: float):
    spec = pool.spec
    if spec.autoscale is None:
        return spec.replicas, None
    current = scaler.current_count(spec.replicas, spec.autoscale)
    decision = scaler.decide(spec.autoscale, current, demand, max_leases=spec.max_leases, history=history, now=now)
    return decision.desired, decision


def _zone_counts(pool: Pool, staying: list[Member]) -> dict[str, int]:
    counts = {z: 0 for z in pool.spec.zones}
    for m in staying:
        counts[m.zone or ""] = counts.get(m.zone or "", 0) + 1
    return counts


def _cut(text: str, limit: int = MAX_ZONE_MESSAGE) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _zone_label(zone: str) -> str:
    return zone or "the template's placement"


def skipped_zones(pool: Pool, zone_ready: Mapping[str, bool], zone_health: "Mapping[str, ZoneHealth] | None",
                  *, now: float) -> list[dict]:
    """The zones of ``pool`` that get no new member because their provider target is not Ready,
    as ``status.skippedZones`` holds them.

    The pool's zones are ``spec.spread.zones`` (in their order), or the template's
    ``placement.zone`` (``""`` when it has none: the provider as a whole decides).

    Args:
        pool: the pool (valid spec); its current ``status.skippedZones`` keeps each zone's ``since``.
        zone_ready: as :func:`plan` takes it.
        zone_health: zone -> :class:`ZoneHealth` for the zones that are not Ready (a zone
            missing here gets reason ``NotReady``, no target and no message).
        now: epoch seconds (``since`` of a zone skipped from this pass on).
    Returns:
        ``[{"zone", "target", "reason", "message", "since"}]`` (``message`` at most
        :data:`MAX_ZONE_MESSAGE` characters, ``since`` RFC 3339), ``[]`` when every zone is Ready.
    """
    spec = pool.spec
    before = {}
    for entry in pool.status.get("skippedZones") or ():
        if isinstance(entry, Mapping) and isinstance(entry.get("zone"), str) and parse_time(entry.get("since")):
            before[entry["zone"]] = entry["since"]
    out = []
    for zone in (list(spec.zones) or [spec.template_zone or ""]):
        if zone_is_ready(zone_ready, zone):
            continue
        why = (zone_health or {}).get(zone or "")
        out.append({"zone": zone or "", "target": _cut(why.target, 253) if why else "",
                    "reason": _cut(why.reason, 128) if why else "NotReady",
                    "message": _cut(why.message) if why else "",
                    "since": before.get(zone or "") or format_time(now)})
    return out


#: Characters :func:`describe_zones` spends on zones at most (a condition message is cut at 1024).
ZONES_TEXT_BUDGET = 700


def describe_zones(skipped: list[Mapping[str, Any]]) -> str:
    """``skipped`` (:func:`skipped_zones`) as one bounded line: each zone with its target's
    reason and message (cut at 80 characters), at most :data:`MAX_ZONES_NAMED` of them and
    :data:`ZONES_TEXT_BUDGET` characters; the rest are counted (``and N more zone(s)``)."""
    parts: list[str] = []
    used = 0
    for z in skipped[:MAX_ZONES_NAMED]:
        target = f"target {_cut(z['target'], 80)}: " if z.get("target") and z["target"] != z["zone"] else ""
        message = f": {_cut(z['message'], 80)}" if z.get("message") else ""
        part = f"{_cut(_zone_label(z['zone']), 80)} ({target}{z['reason']}{message})"
        if parts and used + len(part) > ZONES_TEXT_BUDGET:
            break
        parts.append(part)
        used += len(part) + 2
    more = len(skipped) - len(parts)
    return "; ".join(parts) + (f"; and {more} more zone(s)" if more > 0 else "")


def plan(pool: Pool, members: list[Member], zone_ready: Mapping[str, bool], *, now: float,
         demand: scaler.Demand | None = None, history: "list[Mapping[str, Any]] | None" = None,
         zone_health: "Mapping[str, ZoneHealth] | None" = None) -> Plan:
    """Decide what ``pool`` needs now (the rules of the module docstring).

    Args:
        pool: the pool as read (its ``spec`` must be valid: see :func:`invalid`).
        members: the Proxies it controls (controller ownerReference to its UID, matching
            ``spec.selector`` when given: :func:`app.pools.controller.members_of`), in any order.
        zone_ready: zone -> whether its provider target is Ready (ProviderHealth); a zone not
            in the map counts as Ready.
        now: epoch seconds.
        demand: the refused lease requests counted for the pool (``refused`` and ``window``
            of :class:`app.pools.autoscale.Demand`; its ``live`` and ``ready`` are taken from
            ``members``), ``None`` for none.
        history: the autoscaler's recommendations kept from the last pass (:attr:`Plan.history`),
            ``None`` when none are known.
        zone_health: zone -> :class:`ZoneHealth` of the zones that are not Ready (their
            ProviderHealth target's reason and message), for ``status.skippedZones`` and the
            ``ZonesReady`` condition; ``None``: not known (the status says only "not Ready").
    Returns:
        the :class:`Plan`.
    Raises:
        ValueError: ``pool.spec`` is ``None`` (an invalid spec).
    """
    spec = pool.spec
    if spec is None:
        raise ValueError(f"pool {pool.key} has an invalid spec: {pool.spec_error}")
    live = [m for m in members if not m.deleting]
    draining = [m for m in live if m.draining]
    active = [m for m in live if not m.draining]

    # 1. members leaving: drained or timed out; failed ones
    deletes: list[Delete] = []
    timers: list[float] = []
    for m in sorted(draining, key=lambda m: m.name):
        if m.leases <= 0:
            deletes.append(Delete(m.uid, m.name, "Drained"))
        elif now >= (m.draining_until or 0):
            deletes.append(Delete(m.uid, m.name, "DrainTimeout"))
        else:
            timers.append((m.draining_until or now) - now)
    failed = [m for m in active if m.phase == FAILED]
    for m in sorted(failed, key=lambda m: m.name):
        deletes.append(Delete(m.uid, m.name, "Failed"))
    active = [m for m in active if m.phase != FAILED]
    member_failures = _failures(pool, failed, active, now)
    backoff_until = parse_time(member_failures["retryAfter"]) if member_failures else None
    backing_off = backoff_until is not None and now < backoff_until
    if backing_off:
        timers.append(backoff_until - now)

    # 2. the count wanted
    signal = scaler.Demand(live=sum(m.leases for m in active if m.leasable),
                           refused=demand.refused if demand else 0, window=demand.window if demand else 0.0,
                           ready=sum(1 for m in active if m.leasable))
    n, decision = _desired(pool, signal, history, now)

    # 3. outdated / updated
    outdated = [m for m in active if _outdated(pool, m, zone_ready, now)]
    updated = [m for m in active if m not in outdated]
    if spec.max_age:
        for m in updated:
            timers.append(m.created + age_limit(m.uid, spec.max_age) - now)

    # 4. leaving, bounded by availability: a member that takes no leases leaves freely; one
    # that does only while the leasable count stays at minAvailable or above
    min_available = max(0, n - spec.max_unavailable)
    available = sum(1 for m in active if m.leasable)
    leaving: list[Member] = []

    def leave(m: Member) -> bool:
        nonlocal available
        if m.leasable:
            if available - 1 < min_available:
                return False
            available -= 1
        elif m.unknown and available < min_available:
            return False  # Ready but unpublished (a flushed Redis): may serve; not spent as unleasable
        leaving.append(m)
        return True

    for m in sorted(outdated, key=lambda m: (m.leasable, m.unknown, m.leases, m.created, m.name)):
        if not leave(m):
            break
    extra = len(updated) - n
    if extra > 0:
        zones = _zone_counts(pool, updated)
        order = sorted(updated, key=lambda m: (m.leasable, m.unknown, m.leases, -zones.get(m.zone or "", 0), -m.created,
                                               m.name))
        for m in order[:extra]:
            if not leave(m):
                break
    until = now + spec.drain_timeout
    drains = tuple(Drain(m.uid, m.name, until, ("Burned" if m.burned else "Outdated") if m in outdated else "ScaleDown",
                         m.burned) for m in leaving)
    staying = [m for m in active if m not in leaving]

    # 5. creating, bounded by the surge: draining members that still hold leases keep their
    # instance until the leases end (at the latest their deadline), so they count against it
    staying_updated = [m for m in staying if m in updated]
    # a scale-up first takes back members drained for ScaleDown that are still updated (their
    # instances run anyway): the most leased first (they would count against the surge), then
    # the newest; only the remainder is created
    short = n - len(staying_updated)
    reclaimed: list[Member] = []
    if short > 0:
        candidates = [m for m in draining if _reclaimable(pool, m, zone_ready, now)]
        reclaimed = sorted(candidates, key=lambda m: (-m.leases, -m.created, m.name))[:short]
    back = {m.uid for m in reclaimed}
    deletes = [d for d in deletes if d.uid not in back]
    gone = {d.uid for d in deletes}
    holding = sum(1 for m in draining if m.uid not in gone and m.uid not in back) + \
        sum(1 for m in leaving if m.leases > 0)
    room = n + spec.max_surge - len(staying) - len(reclaimed) - holding
    want = max(0, min(short - len(reclaimed), room))
    # members not made this pass only because draining members still hold leases (for the status)
    held_back = max(0, min(short - len(reclaimed), room + holding) - want) if holding else 0
    creates: list[Create] = []
    no_zone = False
    if backing_off:
        want = 0
    if want > MAX_CREATES_PER_PASS:  # a bounded batch per pass; the next pass makes the next one
        want = MAX_CREATES_PER_PASS
        timers.append(CREATE_BATCH_REQUEUE)
    if want:
        if spec.zones:
            ready_zones = [z for z in spec.zones if zone_is_ready(zone_ready, z)]
            if not ready_zones:
                no_zone = True
            else:
                counts = _zone_counts(pool, staying + reclaimed)
                for _ in range(want):
                    zone = min(ready_zones, key=lambda z: (counts.get(z, 0), spec.zones.index(z)))
                    counts[zone] = counts.get(zone, 0) + 1
                    creates.append(Create(zone))
        elif not zone_is_ready(zone_ready, spec.template_zone):
            no_zone = True
        else:
            creates = [Create(spec.template_zone) for _ in range(want)]

    skipped = skipped_zones(pool, zone_ready, zone_health, now=now)
    status = _status(pool, live, active + reclaimed, updated + reclaimed, n, decision, creates, drains, deletes,
                     outdated, no_zone, len(draining) - len(reclaimed), now,
                     failures=member_failures if backing_off else None, skipped=skipped,
                     held_back=(held_back, holding))
    status["memberFailures"] = member_failures
    status["skippedZones"] = skipped or None
    future = [t for t in timers if t > 0]
    scale_to = n if decision is not None and n != spec.replicas else None
    return Plan(desired=n, creates=tuple(creates), drains=drains, deletes=tuple(deletes), status=status,
                reclaims=tuple(Reclaim(m.uid, m.name) for m in sorted(reclaimed, key=lambda m: m.name)),
                outdated=tuple(sorted(m.name for m in outdated if m not in leaving)),
                requeue_after=min(future) if future else None, scale_to=scale_to,
                history=tuple(decision.history) if decision is not None else (),
                utilization=decision.utilization if decision is not None else None)


def _set(conds: list[dict], ctype: str, state: str, reason: str, message: str, generation: int, now: str) -> list[dict]:
    out = conditions.set_condition(conds, ctype, state, reason=reason, message=message, generation=generation, now=now)
    out.sort(key=lambda c: (_ORDER.get(c["type"], 9), c["type"]))
    return out


def _status(pool: Pool, live, active, updated, n, decision, creates, drains, deletes, outdated, no_zone,
            draining_count, now, *, failures: dict | None = None, skipped: list[dict] = (),
            held_back: tuple[int, int] = (0, 0)) -> dict:
    spec = pool.spec
    stamp = format_time(now)
    leasable = sum(1 for m in active if m.leasable)
    gen = pool.generation
    conds = list(pool.status.get("conditions") or ())
    min_available = max(0, n - spec.max_unavailable)
    if leasable >= min_available:
        conds = _set(conds, COND_AVAILABLE, "True", "MinimumLeasable",
                     f"{leasable} of {n} members take leases (at least {min_available} wanted)", gen, stamp)
    else:
        conds = _set(conds, COND_AVAILABLE, "False", "TooFewLeasable",
                     f"{leasable} of {n} members take leases, fewer than the {min_available} wanted", gen, stamp)
    pending_out = len(outdated)
    if failures is not None and len(updated) < n:
        conds = _set(conds, COND_PROGRESSING, "False", "FailureBackoff",
                     f"members failed in {failures['count']} pass(es) in a row; no member is created before "
                     f"{failures['retryAfter']}", gen, stamp)
    elif no_zone:
        conds = _set(conds, COND_PROGRESSING, "False", "NoReadyZone",
                     f"no member can be created: the provider target of every zone is not Ready: "
                     f"{describe_zones(list(skipped))}", gen, stamp)
    elif creates or drains or deletes or pending_out or draining_count or len(updated) != n or \
            any(not m.leasable for m in updated):
        parts = []
        if len(updated) < n or creates:
            parts.append(f"{len(updated)} of {n} members updated")
        if pending_out:
            burned = sum(1 for m in outdated if m.burned)
            parts.append(f"{pending_out} outdated" + (f" ({burned} burned: spec.recycle)" if burned else ""))
        if draining_count or drains:
            parts.append(f"{draining_count + len(drains)} draining")
        if held_back[0]:
            parts.append(f"{held_back[0]} member(s) wait for {held_back[1]} draining member(s) still holding "
                         f"leases (maxSurge {spec.max_surge})")
        if len(updated) > n:
            parts.append(f"{len(updated) - n} more than wanted")
        unready = sum(1 for m in updated if not m.leasable)
        if unready:
            parts.append(f"{unready} not leasable yet")
        reason = "RollingOut" if pending_out else ("ScalingUp" if len(updated) < n else
                                                   ("ScalingDown" if len(updated) > n or drains or draining_count
                                                    else "WaitingForMembers"))
        conds = _set(conds, COND_PROGRESSING, "True", reason, "; ".join(parts) or "in progress", gen, stamp)
    else:
        conds = _set(conds, COND_PROGRESSING, "True", "PoolComplete",
                     f"{n} updated members, all leasable", gen, stamp)
    if decision is None:
        conds = _set(conds, COND_SCALING_LIMITED, "False", "AutoscaleDisabled", "spec.autoscale is not set", gen, stamp)
    elif decision.limited:
        auto = spec.autoscale
        bound = (f"minReplicas {auto.min_replicas}" if decision.limited == "TooFewReplicas"
                 else f"maxReplicas {auto.max_replicas}")
        conds = _set(conds, COND_SCALING_LIMITED, "True", decision.limited,
                     f"the load calls for {decision.raw} members, held at {bound}", gen, stamp)
    else:
        conds = _set(conds, COND_SCALING_LIMITED, "False", "DesiredWithinRange",
                     f"{decision.recommended} members recommended, within "
                     f"[{spec.autoscale.min_replicas}, {spec.autoscale.max_replicas}]", gen, stamp)
    zones = list(spec.zones) or [spec.template_zone or ""]
    if skipped:
        conds = _set(conds, COND_ZONES_READY, "False", "ZonesNotReady",
                     f"{len(skipped)} of {len(zones)} zone(s) get no new member until their provider target is "
                     f"Ready: {describe_zones(list(skipped))}", gen, stamp)
    elif spec.zones:
        named = ", ".join(spec.zones[:MAX_ZONES_NAMED]) + (
            f" and {len(spec.zones) - MAX_ZONES_NAMED} more" if len(spec.zones) > MAX_ZONES_NAMED else "")
        conds = _set(conds, COND_ZONES_READY, "True", "AllZonesReady",
                     f"the provider target of every zone is Ready: {named}", gen, stamp)
    else:
        conds = _set(conds, COND_ZONES_READY, "True", "AllZonesReady",
                     f"the provider target of {_zone_label(zones[0])} is Ready", gen, stamp)
    return {
        "replicas": len(live),
        "readyReplicas": sum(1 for m in live if m.ready),
        "leasableReplicas": leasable,
        "updatedReplicas": len(updated),
        "burnedReplicas": sum(1 for m in live if m.burned),
        "observedGeneration": gen,
        "selector": status_selector(pool.name, spec),
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
    """
    conds = _set(list(pool.status.get("conditions") or ()), COND_PROGRESSING, "False", reason, message,
                 pool.generation, format_time(now))
    return {"observedGeneration": pool.generation, "conditions": conds}


def invalid(pool: Pool, now: float) -> dict:
    """:func:`stalled` for a pool whose spec cannot be read: ``InvalidSpec``, the message naming
    the field (:attr:`app.pools.model.Pool.spec_error`)."""
    return stalled(pool, "InvalidSpec", pool.spec_error, now=now)


__all__ = ["COND_AVAILABLE", "COND_PROGRESSING", "COND_SCALING_LIMITED", "COND_ZONES_READY", "Create", "Delete",
           "Drain", "FAILURE_BACKOFF_BASE", "FAILURE_BACKOFF_MAX", "MAX_CREATES_PER_PASS", "MAX_ZONES_NAMED",
           "MAX_ZONE_MESSAGE", "Plan", "Reclaim", "ZoneHealth", "describe_zones", "failure_backoff", "invalid", "plan",
           "skipped_zones", "stalled", "zone_is_ready"]
