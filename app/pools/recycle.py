"""A ProxyPool's recycle policy: members whose egress IP sites ban are replaced or drained in place.

Sites ban egress IPs (:mod:`app.serving.bans`); the lease scripts keep, per egress identity, when
each target last banned it (:func:`app.store.keys.ip_ban_times`) and how many targeted leases
and bans it had per minute (:func:`app.store.keys.ip_outcomes`).  A pool with ``spec.recycle``
(:class:`app.pools.model.Recycle`) calls a member **burned** when, within ``windowSeconds`` and
counting only since the member was made (so a replacement that leaves from the same IP is not
judged by its predecessor's bans):

* its egress IP was banned by at least ``bannedTargets`` distinct targets, or
* more than ``maxBanPercent`` of its targeted leases ended in a ban, once it had at least
  ``minLeases`` of them (counted per minute: the minute the member was made counts whole).

The plan (:func:`app.pools.plan.plan`) replaces a burned member through the normal rollout
(surge limits, ``maxUnavailable``, drain of its leases; drain reason ``Burned``), so it comes
back with a new IP where the provider gives one, or drains it in place where the provider's
replacement keeps the IP (:data:`app.pools.model.BURNED_IN_PLACE`).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from app.pools.model import Member, Recycle
from app.store import keys as redis_keys


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Why one member is burned.

    Attributes:
        targets: the targets that banned its egress IP within the window (sorted).
        why: the rule that holds, for Events and the log.
    """

    targets: tuple[str, ...]
    why: str


#: Targets a verdict names at most (the most recent bans first; the count is in ``why``), so a
#: member banned by thousands of sites costs one bounded read per pass and a readable Event.
NAMED_TARGETS = 10


def judge(policy: Recycle, targets: list[str], outcomes: Mapping[str, str], *, since: float,
          banned: int | None = None, parked: bool = False) -> Verdict | None:
    """Whether a member is burned, from what Redis holds of its egress identity.

    Args:
        policy: the pool's :class:`~app.pools.model.Recycle`.
        targets: the targets that banned the identity since ``since`` (at most
            :data:`NAMED_TARGETS` of them are named).
        outcomes: the identity's :func:`app.store.keys.ip_outcomes` hash (``l<bucket>``/``b<bucket>``
            → count, strings as Redis gives them; malformed fields are skipped).
        since: epoch seconds: counts before it are not the member's.
        banned: how many distinct targets banned it since ``since`` (``None``: ``len(targets)``).
        parked: the member is drained in place already: the ban ratio holds it while any of its
            bans is in the window, whatever ``minLeases`` and the ratio now (it takes no lease, so
            its lease count only falls: ``minLeases`` would release it with its bans still there,
            and so would a ratio that dips as its oldest bans leave the window before its leases).
    Returns:
        the :class:`Verdict`, or ``None`` when neither rule holds.
    """
    count = len(targets) if banned is None else banned
    named = tuple(sorted(targets[:NAMED_TARGETS]))
    if policy.banned_targets is not None and count >= policy.banned_targets:
        return Verdict(named, f"its egress IP was banned by {count} target{'' if count == 1 else 's'} within "
                              f"{policy.window:g}s (spec.recycle.bannedTargets {policy.banned_targets})")
    if policy.max_ban_percent is None:
        return None
    first = int(since * 1000) // redis_keys.OUTCOME_BUCKET_MS
    leases = bans = 0
    for name, value in outcomes.items():
        try:
            bucket, n = int(name[1:]), int(value)
        except ValueError:
            continue
        if bucket < first:
            continue
        if name[:1] == "l":
            leases += n
        elif name[:1] == "b":
            bans += n
    if bans <= 0:
        return None
    over = bans * 100 > policy.max_ban_percent * leases
    if over and (parked or leases >= policy.min_leases):
        return Verdict(named, f"{bans} of its {leases} targeted leases within {policy.window:g}s ended in a ban, "
                              f"more than spec.recycle.maxBanPercent {policy.max_ban_percent}%")
    if parked:
        return Verdict(named, f"drained in place: {bans} ban(s) of its {leases} targeted leases are still within "
                              f"{policy.window:g}s (spec.recycle.maxBanPercent {policy.max_ban_percent}%: it stays "
                              "drained while any of its bans is in the window)")
    return None


def mark(r, policy: Recycle, members: list[Member], records: Mapping[str, Mapping[str, str]], *,
         now: float) -> list[Member]:
    """Return ``members`` with :attr:`~app.pools.model.Member.burned` set on those the policy
    calls burned (:func:`judge`).

    Members drained in place (:attr:`~app.pools.model.Member.parked`) are judged again, so they
    take leases again once their bans age out of the window; members leaving the pool are not.
    One whose egress identity is not known for now (no serving record: its instance lost and
    being made again, a flushed Redis; or published again and not probed yet) is not judged and
    stays burned: no verdict is no sign that its bans aged out.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        policy: the pool's :class:`~app.pools.model.Recycle`.
        members: the pool's members (:func:`app.pools.controller.members_of`).
        records: serving records (raw hashes) by uid: their ``egressIP``.
        now: epoch seconds (bans before a member was made are not its own).
    Returns:
        the members, burned ones replaced by copies saying why and naming the targets that
        banned them.
    Raises:
        redis.RedisError: Redis unreachable.
    """
    # (members draining for ScaleDown are judged too: a scale-up must not reclaim a burned one)
    live = [m for m in members if not m.deleting and (not m.draining or m.drain_reason == "ScaleDown")
            and m.uid in records and (not m.parked or _known_ident(records[m.uid]))]
    # drained in place, egress identity unknown for now: not judged, so it stays drained (no
    # verdict is no sign that its bans aged out)
    unknown = {m.uid for m in members if m.parked and not m.deleting and m.uid not in {x.uid for x in live}}
    if not live:
        return [_kept(m) if m.uid in unknown else m for m in members]
    pipe = r.pipeline(transaction=False)
    starts = []
    for m in live:
        ident = records[m.uid].get("egressIP") or f"uid:{m.uid}"
        # (creation timestamps are whole seconds: a ban in the member's first second is not counted)
        since = max(now - policy.window, m.created + 1.0)
        starts.append(since)
        key = redis_keys.ip_ban_times(ident)
        pipe.zcount(key, int(since * 1000), "+inf")
        pipe.zrevrangebyscore(key, "+inf", int(since * 1000), start=0, num=NAMED_TARGETS)
        if policy.max_ban_percent is not None:
            pipe.hgetall(redis_keys.ip_outcomes(ident))
    answers = iter(pipe.execute())
    burned: dict[str, Verdict] = {}
    for m, since in zip(live, starts, strict=True):
        count, targets = next(answers), next(answers)
        outcomes = next(answers) if policy.max_ban_percent is not None else {}
        verdict = judge(policy, targets, outcomes, since=since, banned=int(count), parked=m.parked)
        if verdict is not None:
            burned[m.uid] = verdict
    return [dataclasses.replace(m, burned=burned[m.uid].why, burned_targets=burned[m.uid].targets)
            if m.uid in burned else _kept(m) if m.uid in unknown else m for m in members]


def _known_ident(raw: Mapping[str, str]) -> bool:
    """Whether a serving record tells the egress identity its bans are counted under: its
    ``egressIP``, or, once probed healthy without learning one, ``uid:<uid>`` (a record
    published again after its instance was lost has neither until its first probe)."""
    return bool(raw.get("egressIP")) or raw.get("healthy") == "1"


def _kept(m: Member) -> Member:
    """A member drained in place whose egress identity is not known for now, kept burned."""
    return dataclasses.replace(m, burned="drained in place for its bans; its egress IP is not known for now "
                                         "(no serving record, or not probed since it was published again)")
