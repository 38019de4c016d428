"""A ProxyPool's recycle policy: members whose egress IP many sites banned are replaced.

Sites ban egress IPs (:mod:`app.serving.bans`); the lease release script keeps, per egress
identity, when each target last banned it (:func:`app.store.keys.ip_ban_times`).  A pool with
``spec.recycle`` (:class:`app.pools.model.Recycle`) treats a member whose egress IP was banned by
at least ``bannedTargets`` distinct targets within ``windowSeconds`` — counting only bans since
the member was made, so a replacement that leaves from the same IP (Pods behind one node's SNAT)
is not replaced again for its predecessor's bans — as outdated: the normal rollout replaces it
(surge limits, ``maxUnavailable``, drain of its leases; drain reason ``Burned``), so it comes back
with a new IP where the provider gives one.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from app.pools.model import Member, Recycle
from app.store import keys as redis_keys


def mark(r, policy: Recycle, members: list[Member], records: Mapping[str, Mapping[str, str]], *,
         now: float) -> list[Member]:
    """Return ``members`` with :attr:`~app.pools.model.Member.burned` set on those the policy
    replaces.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        policy: the pool's :class:`~app.pools.model.Recycle`.
        members: the pool's members (:func:`app.pools.controller.members_of`).
        records: serving records (raw hashes) by uid: their ``egressIP``.
        now: epoch seconds (bans before a member was made are not its own).
    Returns:
        the members, burned ones replaced by copies naming the targets that banned them.
    Raises:
        redis.RedisError: Redis unreachable.
    """
    live = [m for m in members if not m.deleting and not m.draining and m.uid in records]
    if not live:
        return members
    pipe = r.pipeline(transaction=False)
    for m in live:
        ident = records[m.uid].get("egressIP") or f"uid:{m.uid}"
        # (creation timestamps are whole seconds: a ban in the member's first second is not counted)
        since = max(now - policy.window, m.created + 1.0)
        pipe.zrangebyscore(redis_keys.ip_ban_times(ident), int(since * 1000), "+inf")
    burned = {m.uid: tuple(sorted(targets)) for m, targets in zip(live, pipe.execute(), strict=True)
              if len(targets) >= policy.banned_targets}
    if not burned:
        return members
    return [dataclasses.replace(m, burned=burned[m.uid]) if m.uid in burned else m for m in members]
