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
   not leasable in a zone whose provider target is not Ready, or **burned** (``spec.recycle``,
   :mod:`app.pools.recycle`: sites banned its egress IP) when the pool's provider gives a
   replacement a new egress IP.  The others are *updated*.
4. **Leaving, bounded** (a Deployment's rolling update, with members for Pods): outdated
   members start draining — those not leasable first (they serve nothing and leave freely),
   then the fewest live leases, then the oldest — and, when more updated members exist than
   ``N``, the surplus of updated ones (not leasable first, then the fewest live leases, then
   those in the most crowded zone, then the newest).  A leasable member leaves only while
   the leasable count stays at ``N - maxUnavailable`` or above, so with ``maxUnavailable: 0``
   an outdated member starts draining only once a new one is leasable.  A ``Ready`` member with
   no serving record (a flushed Redis: :attr:`~app.pools.model.Member.unknown`) leaves only
   while that count is already reached, so a lost serving view does not drain the pool.
   **Burned, drained in place**: when the provider gives a replacement the *same* egress IP
   (``keeps_ip``: Pods behind their node's address), replacing a burned member would change
   nothing, so it stays a member (updated: nothing is created in its place) and is marked
   draining with reason :data:`~app.pools.model.BURNED_IN_PLACE`: no new leases, live ones run
   to the drain deadline.  Leasable ones are drained in place under the same bound
   (``N - maxUnavailable`` leasable at least; the fewest live leases first); the rest keep
   serving until the bound allows.  A member drained in place that is no longer burned (its
   bans aged out of the window) takes leases again (:attr:`Plan.unparks`).
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
   since when it is skipped (:func:`app.pools.zones.skipped_zones`).  Rendered by
   :func:`app.pools.status.render`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from app.backoff import capped_exponential
from app.pools import autoscale as scaler
from app.pools.model import BURNED_IN_PLACE, Member, Pool, age_limit, format_time, parse_time
from app.pools.status import StatusInputs, render
from app.pools.zones import ZoneHealth, skipped_zones, zone_is_ready
from app.resources import FAILED

#: First delay of the failure backoff (seconds), doubled by each further pass with failures.
FAILURE_BACKOFF_BASE = 10.0
#: Longest delay of the failure backoff (seconds).
FAILURE_BACKOFF_MAX = 300.0
#: Members one pass creates at most (like the ReplicaSet controller's burstReplicas): ``spec.replicas``
#: has no maximum, so a typo (``1000000``) must not make one pass build and send that many creates.
#: A pass that hits the bound asks for the next one after :data:`CREATE_BATCH_REQUEUE` seconds.
MAX_CREATES_PER_PASS = 100
CREATE_BATCH_REQUEUE = 1.0


@dataclass(frozen=True)
class Create:
    """Create one member from the current template in ``zone`` (``None``: the template's placement)."""

    zone: str | None


@dataclass(frozen=True)
class MemberAction:
    """An action on one member: its ``uid`` and ``name``."""

    uid: str
    name: str


@dataclass(frozen=True)
class Drain(MemberAction):
    """Mark the member draining until ``until`` (epoch seconds) for ``reason``: no new leases.
    ``targets`` and ``why``: for reasons ``Burned`` and ``BurnedInPlace``, the targets that banned
    its egress IP and the recycle rule that holds."""

    until: float
    reason: str
    targets: tuple[str, ...] = ()
    why: str = ""

    @property
    def leaves(self) -> bool:
        """Whether the member leaves its pool (every reason but :data:`BURNED_IN_PLACE`: drained in
        place, it stays a member)."""
        return self.reason != BURNED_IN_PLACE


@dataclass(frozen=True)
class Reclaim(MemberAction):
    """Take the draining mark off the member (drained for ``ScaleDown``, still updated) so it
    takes leases again, instead of creating a member in its place."""


@dataclass(frozen=True)
class Delete(MemberAction):
    """Delete the member; ``reason``: ``Drained``, ``DrainTimeout`` or ``Failed``."""

    reason: str


@dataclass(frozen=True)
class Plan:
    """What :func:`plan` decided.

    Attributes:
        desired: ``N``, the members wanted.
        creates / drains / deletes / reclaims / unparks: the actions, in the order they should
            be applied (deletes, reclaims, unparks, drains, creates).  ``unparks``: members
            drained in place for their bans that are no longer burned (their mark comes off).
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
    unparks: tuple[Reclaim, ...] = ()

    @property
    def actions(self) -> int:
        """How many writes the plan asks for besides the status."""
        return len(self.creates) + len(self.drains) + len(self.deletes) + len(self.reclaims) + len(self.unparks)


def failure_backoff(count: int) -> float:
    """Return the seconds no member is created after the ``count``-th pass in a row that found
    failed members: :data:`FAILURE_BACKOFF_BASE` doubled ``count - 1`` times, at most
    :data:`FAILURE_BACKOFF_MAX` (0 for ``count`` <= 0)."""
    if count <= 0:
        return 0.0
    return capped_exponential(count - 1, FAILURE_BACKOFF_BASE, FAILURE_BACKOFF_MAX)


def _failures(pool: Pool, failed: list[Member], active: list[Member], now: float) -> dict | None:
    """The pool's ``status.memberFailures`` after this pass: ``{"count", "lastFailureTime",
    "retryAfter", "templateHash"}``, or ``None`` when no backoff is in effect."""
    spec = pool.valid_spec
    old = pool.status.get("memberFailures")
    count, last = 0, None
    if isinstance(old, Mapping) and old.get("templateHash") == spec.hash and isinstance(old.get("count"), int):
        count, last = old["count"], parse_time(old.get("lastFailureTime"))
    if failed:
        count += 1
        until = now + failure_backoff(count)
        return {"count": count, "lastFailureTime": format_time(now), "retryAfter": format_time(until),
                "templateHash": spec.hash}
    if count <= 0 or last is None or not isinstance(old, Mapping):
        return None
    if any(m.leasable and m.template_hash == spec.hash and m.created >= last for m in active):
        return None  # a member made since the last failure works: the failures are over
    return dict(old)


def _current(pool: Pool, m: Member, now: float, *, burn: bool = True) -> bool:
    """Whether ``m`` is of the current template, within its age limit, in a zone of ``spread.zones``,
    and (``burn``: when a replacement would get a new egress IP) not burned (``spec.recycle``)."""
    spec = pool.valid_spec
    if m.template_hash != spec.hash or (burn and m.burned):
        return False
    if spec.max_age and now - m.created >= age_limit(m.uid, spec.max_age):
        return False
    return not (spec.zones and (m.zone or "") not in spec.zones)


def _outdated(pool: Pool, m: Member, zone_ready: Mapping[str, bool], now: float, *, keeps_ip: bool = False) -> bool:
    """Whether active member ``m`` is outdated (rule 3).  A member drained in place
    (:attr:`~app.pools.model.Member.parked`) takes no lease because of its bans, not because its
    zone is broken: a zone that is not Ready does not make it outdated (its replacement would
    leave from the same burned IP with none of its bans)."""
    if not _current(pool, m, now, burn=not keeps_ip):
        return True
    return not m.leasable and not m.parked and not zone_is_ready(zone_ready, m.zone)


def _reclaimable(pool: Pool, m: Member, zone_ready: Mapping[str, bool], now: float) -> bool:
    """Whether draining member ``m`` may take leases again on a scale-up (rule 5)."""
    if m.drain_reason != "ScaleDown" or m.deleting or not m.serves or now >= (m.draining_until or 0):
        return False
    return _current(pool, m, now) and zone_is_ready(zone_ready, m.zone)


def _zone_counts(pool: Pool, members: list[Member]) -> dict[str, int]:
    """Members per zone (every zone of ``spread.zones`` present, 0 when empty)."""
    counts = {z: 0 for z in pool.valid_spec.zones}
    for m in members:
        counts[m.zone or ""] = counts.get(m.zone or "", 0) + 1
    return counts


# -- the steps of a pass, in the order of the rules -------------------------------------------
@dataclass
class _Exits:
    """Rule 1: the members leaving the pool this pass, and the failure backoff.

    Attributes:
        deletes: drained, timed-out and failed members.
        timers: seconds until a draining member's deadline.
        active: the members not draining, failed ones removed.
        failures: ``status.memberFailures`` after the pass.
        backing_off: the backoff holds creates now.
    """

    deletes: list[Delete]
    timers: list[float]
    active: list[Member]
    failures: dict | None
    backing_off: bool


def _exits(pool: Pool, draining: list[Member], active: list[Member], now: float) -> _Exits:
    """Rule 1: delete drained, timed-out and failed members; start or keep the failure backoff."""
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
    deletes.extend(Delete(m.uid, m.name, "Failed") for m in sorted(failed, key=lambda m: m.name))
    active = [m for m in active if m.phase != FAILED]
    failures = _failures(pool, failed, active, now)
    backoff_until = parse_time(failures["retryAfter"]) if failures else None
    backing_off = backoff_until is not None and now < backoff_until
    if backoff_until is not None and backing_off:
        timers.append(backoff_until - now)
    return _Exits(deletes, timers, active, failures, backing_off)


def _desired(pool: Pool, active: list[Member], demand: scaler.Demand | None,
             history: "list[Mapping[str, Any]] | None", now: float) -> tuple[int, scaler.Decision | None]:
    """Rule 2: ``N``, and the autoscaler's decision (``None`` when it is off)."""
    spec = pool.valid_spec
    if spec.autoscale is None:
        return spec.replicas, None
    signal = scaler.Demand(live=sum(m.leases for m in active if m.leasable),
                           refused=demand.refused if demand else 0, window=demand.window if demand else 0.0,
                           ready=sum(1 for m in active if m.leasable))
    current = scaler.current_count(spec.replicas, spec.autoscale)
    decision = scaler.decide(spec.autoscale, current, signal, max_leases=spec.max_leases, history=history, now=now)
    return decision.desired, decision


@dataclass
class _Availability:
    """Rule 4's bound: a leasable member leaves only while ``available`` stays at ``least`` or above.

    Attributes:
        available: leasable members not leaving yet.
        least: ``N - maxUnavailable`` (at least 0).
        leaving: the members chosen to leave, in order.
    """

    available: int
    least: int
    leaving: list[Member] = field(default_factory=list)

    def spare(self, m: Member) -> bool:
        """Whether ``m`` may stop taking leases within the bound (counted as gone when it may)."""
        if m.leasable:
            if self.available - 1 < self.least:
                return False
            self.available -= 1
        elif m.unknown and self.available < self.least:
            return False  # Ready but unpublished (a flushed Redis): may serve; not spent as unleasable
        return True

    def leave(self, m: Member) -> bool:
        """Let ``m`` leave if the bound allows; return whether it does."""
        if not self.spare(m):
            return False
        self.leaving.append(m)
        return True


def _leaving(pool: Pool, active: list[Member], outdated: list[Member], updated: list[Member], n: int) -> _Availability:
    """Rule 4: the outdated members, then the surplus of updated ones, that start draining now
    (``leaving`` of the bound returned, whose count the parking step goes on spending)."""
    bound = _Availability(available=sum(1 for m in active if m.leasable),
                          least=max(0, n - pool.valid_spec.max_unavailable))
    for m in sorted(outdated, key=lambda m: (m.leasable, m.unknown, m.leases, m.created, m.name)):
        if not bound.leave(m):
            break
    extra = len(updated) - n
    if extra > 0:
        zones = _zone_counts(pool, updated)
        order = sorted(updated, key=lambda m: (m.leasable, m.unknown, m.leases, -zones.get(m.zone or "", 0), -m.created,
                                               m.name))
        for m in order[:extra]:
            if not bound.leave(m):
                break
    return bound


def _parked(bound: _Availability, updated: list[Member], leaving: list[Member], *,
            keeps_ip: bool) -> tuple[list[Member], list[Member], list[Member]]:
    """Rule 4, burned members: those drained in place now (a provider that keeps the egress IP,
    ``keeps_ip``; within ``bound``, the fewest live leases first), those the bound keeps serving,
    and the members drained in place earlier that are no longer burned (they take leases again,
    whatever the provider now says: a member drained in place while its provider kept the IP is
    not left drained forever once the providers config says ``new``)."""
    gone = {m.uid for m in leaving}
    unparks = [m for m in updated if m.parked and not m.burned and m.uid not in gone]
    if not keeps_ip:
        return [], [], unparks
    candidates = sorted((m for m in updated if m.burned and not m.parked and m.uid not in gone),
                        key=lambda m: (m.leasable, m.leases, m.created, m.name))
    parks: list[Member] = []
    held: list[Member] = []
    for m in candidates:
        (parks if not held and bound.spare(m) else held).append(m)
    return parks, held, unparks


def _reclaimed(pool: Pool, draining: list[Member], short: int, zone_ready: Mapping[str, bool],
               now: float) -> list[Member]:
    """Rule 5: up to ``short`` members drained for ``ScaleDown`` that take leases again (the most
    leased first, then the newest)."""
    if short <= 0:
        return []
    candidates = [m for m in draining if _reclaimable(pool, m, zone_ready, now)]
    return sorted(candidates, key=lambda m: (-m.leases, -m.created, m.name))[:short]


def _placed(pool: Pool, want: int, zone_ready: Mapping[str, bool], members: list[Member]) -> tuple[list[Create], bool]:
    """Rule 5's placement: ``want`` creates, each in the Ready zone with the fewest ``members``.

    Returns:
        the creates, and whether members were wanted but no zone is Ready.
    """
    spec = pool.valid_spec
    if not want:
        return [], False
    if not spec.zones:
        if not zone_is_ready(zone_ready, spec.template_zone):
            return [], True
        return [Create(spec.template_zone) for _ in range(want)], False
    ready_zones = [z for z in spec.zones if zone_is_ready(zone_ready, z)]
    if not ready_zones:
        return [], True
    counts = _zone_counts(pool, members)
    creates = []
    for _ in range(want):
        zone = min(ready_zones, key=lambda z: (counts.get(z, 0), spec.zones.index(z)))
        counts[zone] = counts.get(zone, 0) + 1
        creates.append(Create(zone))
    return creates, False


def plan(pool: Pool, members: list[Member], zone_ready: Mapping[str, bool], *, now: float,
         demand: scaler.Demand | None = None, history: "list[Mapping[str, Any]] | None" = None,
         zone_health: "Mapping[str, ZoneHealth] | None" = None, keeps_ip: bool = False) -> Plan:
    """Decide what ``pool`` needs now (the rules of the module docstring).

    Args:
        pool: the pool as read (its ``spec`` must be valid: see :func:`app.pools.status.invalid`).
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
        zone_health: zone -> :class:`app.pools.zones.ZoneHealth` of the zones that are not Ready,
            for ``status.skippedZones`` and the ``ZonesReady`` condition; ``None``: not known
            (the status says only "not Ready").
        keeps_ip: the pool's provider gives a replacement the same egress IP
            (:attr:`app.config.providers.ProviderConfig.replacement_keeps_ip`): burned members
            are drained in place, not replaced (rule 4).
    Returns:
        the :class:`Plan`.
    Raises:
        ValueError: ``pool.spec`` is ``None`` (an invalid spec).
    """
    spec = pool.valid_spec
    live = [m for m in members if not m.deleting]
    draining = [m for m in live if m.draining]
    exits = _exits(pool, draining, [m for m in live if not m.draining], now)
    active, timers = exits.active, exits.timers
    n, decision = _desired(pool, active, demand, history, now)

    outdated = [m for m in active if _outdated(pool, m, zone_ready, now, keeps_ip=keeps_ip)]
    updated = [m for m in active if m not in outdated]
    if spec.max_age:
        timers.extend(m.created + age_limit(m.uid, spec.max_age) - now for m in updated)

    bound = _leaving(pool, active, outdated, updated, n)
    leaving = bound.leaving
    parks, kept_burned, unparks = _parked(bound, updated, leaving, keeps_ip=keeps_ip)
    until = now + spec.drain_timeout
    drains = tuple(Drain(m.uid, m.name, until,
                         ("Burned" if m.burned and not keeps_ip else "Outdated") if m in outdated else "ScaleDown",
                         m.burned_targets, m.burned) for m in leaving) + \
        tuple(Drain(m.uid, m.name, until, BURNED_IN_PLACE, m.burned_targets, m.burned) for m in parks)
    staying = [m for m in active if m not in leaving]

    # creating, bounded by the surge: draining members that still hold leases keep their
    # instance until the leases end (at the latest their deadline), so they count against it
    short = n - sum(1 for m in staying if m in updated)
    reclaimed = _reclaimed(pool, draining, short, zone_ready, now)
    back = {m.uid for m in reclaimed}
    deletes = [d for d in exits.deletes if d.uid not in back]
    gone = {d.uid for d in deletes}
    holding = sum(1 for m in draining if m.uid not in gone and m.uid not in back) + \
        sum(1 for m in leaving if m.leases > 0)
    room = n + spec.max_surge - len(staying) - len(reclaimed) - holding
    want = max(0, min(short - len(reclaimed), room))
    held_back = max(0, min(short - len(reclaimed), room + holding) - want) if holding else 0
    if exits.backing_off:
        want = 0
    if want > MAX_CREATES_PER_PASS:  # a bounded batch per pass; the next pass makes the next one
        want = MAX_CREATES_PER_PASS
        timers.append(CREATE_BATCH_REQUEUE)
    creates, no_zone = _placed(pool, want, zone_ready, staying + reclaimed)

    skipped = skipped_zones(pool, zone_ready, zone_health, now=now)
    unparked = {m.uid for m in unparks}
    status = render(StatusInputs(
        pool=pool, live=live, active=active + reclaimed, updated=updated + reclaimed, desired=n, decision=decision,
        creates=len(creates), drains=len(drains) - len(parks), deletes=len(deletes), outdated=len(outdated),
        burned=sum(1 for m in outdated if m.burned), no_zone=no_zone,
        draining=len(draining) - len(reclaimed), now=now, failures=exits.failures if exits.backing_off else None,
        skipped=skipped, held_back=held_back, holding=holding, kept_burned=len(kept_burned),
        parking={m.uid for m in parks} | {m.uid for m in staying if m.parked and m.uid not in unparked},
        unparking=unparked))
    status["memberFailures"] = exits.failures
    status["skippedZones"] = skipped or None
    future = [t for t in timers if t > 0]
    return Plan(desired=n, creates=tuple(creates), drains=drains, deletes=tuple(deletes), status=status,
                reclaims=tuple(Reclaim(m.uid, m.name) for m in sorted(reclaimed, key=lambda m: m.name)),
                unparks=tuple(Reclaim(m.uid, m.name) for m in sorted(unparks, key=lambda m: m.name)),
                outdated=tuple(sorted(m.name for m in outdated if m not in leaving)),
                requeue_after=min(future) if future else None,
                scale_to=n if decision is not None and n != spec.replicas else None,
                history=tuple(decision.history) if decision is not None else (),
                utilization=decision.utilization if decision is not None else None)


__all__ = ["CREATE_BATCH_REQUEUE", "Create", "Delete", "Drain", "FAILURE_BACKOFF_BASE", "FAILURE_BACKOFF_MAX",
           "MAX_CREATES_PER_PASS", "MemberAction", "Plan", "Reclaim", "failure_backoff", "plan"]
