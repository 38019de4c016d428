"""A small simulator for the pool decisions: apply a plan's actions to an in-memory member list.

No API, no Redis: a created member is Pending, becomes leasable after ``ready_after`` passes;
a drain mark stops nothing here but the decisions (leases on a draining member stay until
the test releases them); a reclaim takes the mark off; a delete removes the member.
"""

from __future__ import annotations

import dataclasses
import itertools

from app.pools.model import Member, Pool
from app.pools.plan import plan

_ids = itertools.count(1)


def pool(spec: dict, *, status: dict | None = None, generation: int = 1, name: str = "web",
         uid: str = "pool-uid") -> Pool:
    """A Pool from a spec dict (the template defaults to a Managed kubernetes Proxy)."""
    spec = dict(spec)
    spec.setdefault("template", {"metadata": {"labels": {"app": "web"}}, "spec": {"provider": "k8s", "maxLeases": 5}})
    return Pool.from_dict({"metadata": {"name": name, "namespace": "crawl", "uid": uid, "generation": generation},
                           "spec": spec, "status": status or {}})


def member(p: Pool, *, leasable: bool = True, leases: int = 0, created: float = 0.0, zone: str | None = None,
           template_hash: str | None = None, draining_until: float | None = None, phase: str | None = None,
           uid: str | None = None, name: str | None = None, drain_reason: str = "") -> Member:
    """A member of ``p`` (current template unless ``template_hash`` is given); ``leasable`` also
    says whether it serves (healthy) apart from a draining mark."""
    n = next(_ids)
    return Member(uid=uid or f"uid-{n}", name=name or f"{p.name}-{n}",
                  phase=phase or ("Ready" if leasable else "Provisioning"), ready=leasable, leasable=leasable,
                  leases=leases, created=created, template_hash=p.spec.hash if template_hash is None else template_hash,
                  zone=zone, draining_until=draining_until, serves=leasable,
                  drain_reason=drain_reason if draining_until is not None else "")


class Sim:
    """Runs passes of :func:`app.pools.plan.plan` over a member list, applying each plan.

    Args:
        p: the pool.
        members: the starting members.
        ready_after: passes a created member takes to become leasable.
        zone_ready: passed to :func:`plan`.
    """

    def __init__(self, p: Pool, members: list[Member], *, ready_after: int = 1, zone_ready: dict | None = None,
                 now: float = 1_000_000.0) -> None:
        self.pool, self.members, self.ready_after = p, list(members), ready_after
        self.zone_ready = zone_ready or {}
        self.now = now
        self.age: dict[str, int] = {}
        self.plans = []
        self.created: list[Member] = []
        self.history: tuple = ()

    def step(self, demand=None, dt: float = 1.0):
        """One pass: plan, apply, let time ``dt`` pass; return the plan."""
        self.now += dt
        result = plan(self.pool, self.members, self.zone_ready, now=self.now, demand=demand, history=list(self.history))
        self.plans.append(result)
        self.history = result.history
        gone = {d.uid for d in result.deletes}
        self.members = [m for m in self.members if m.uid not in gone]
        for d in result.drains:
            self.members = [dataclasses.replace(m, draining_until=d.until, drain_reason=d.reason, leasable=False)
                            if m.uid == d.uid else m for m in self.members]
        back = {c.uid for c in result.reclaims}
        self.members = [dataclasses.replace(m, draining_until=None, drain_reason="", leasable=m.serves)
                        if m.uid in back else m for m in self.members]
        for c in result.creates:
            m = member(self.pool, leasable=False, created=self.now, zone=c.zone)
            self.age[m.uid] = 0
            self.members.append(m)
            self.created.append(m)
        # pending members progress
        out = []
        for m in self.members:
            if m.uid in self.age and not m.leasable and not m.draining:
                self.age[m.uid] += 1
                if self.age[m.uid] >= self.ready_after:
                    m = dataclasses.replace(m, leasable=True, serves=True, ready=True, phase="Ready")
            out.append(m)
        self.members = out
        if result.status:
            self.pool = dataclasses.replace(self.pool, status=result.status)
        if result.scale_to is not None:  # the autoscaler writes spec.replicas (the scale subresource)
            self.set_spec(replicas=result.scale_to)
        return result

    def leasable(self) -> int:
        """Members taking leases now."""
        return sum(1 for m in self.members if m.leasable and not m.draining)

    def active(self) -> list[Member]:
        """Members not draining."""
        return [m for m in self.members if not m.draining]

    def release_all(self) -> None:
        """Every lease ends (crawlers released them)."""
        self.members = [dataclasses.replace(m, leases=0) for m in self.members]

    def set_spec(self, **changes) -> None:
        """Change the pool's spec (a new generation) keeping its status."""
        raw = dict(self.pool.raw)
        spec = dict(raw.get("spec") or {})
        spec.update(changes)
        meta = dict(raw["metadata"])
        meta["generation"] = meta.get("generation", 1) + 1
        self.pool = Pool.from_dict({"metadata": meta, "spec": spec, "status": self.pool.status})
