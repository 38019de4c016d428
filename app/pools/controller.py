"""The pool controller's pass: read a ProxyPool and its members, decide, apply.  Free of Celery.

:func:`run` is the body of the ``pool.reconcile`` task (``workers.tasks``): under a per-pool
Redis lock it reads, through the :class:`app.kube.gateway.KubeGateway`,

* the pool (gone or being deleted: its demand count is forgotten; Kubernetes' garbage collector
  deletes its members, which carry a controller ownerReference with ``blockOwnerDeletion``);
* its members: the Proxies of its namespace whose controller ownerReference names the pool's UID
  (and whose labels match ``spec.selector`` when one is given).  A Proxy without that reference
  is never adopted, whatever its labels; a Proxy controlled by anything else is never touched.
  A Proxy the pool controls whose labels no longer match an explicit ``spec.selector`` is *released*, as a ReplicaSet
  releases such a Pod (``PodControllerRefManager.ReleasePod``): its ownerReference to the pool
  is removed (:meth:`app.kube.gateway.KubeGateway.release_proxy`, with a resourceVersion precondition),
  along with the pool's draining mark, its serving record leaves the pool at once
  (:func:`app.serving.view.leave_pool`), and it goes on as a standalone Proxy (never deleted by the
  pool); the pool does not count it and replaces it like any missing member (``MemberReleased``
  Event);

and from Redis what the serving view says of each member (leasable, live leases), the provider
health of the zones it may place members in (:mod:`app.providers.checks`), the refused requests
counted for it (:mod:`app.pools.demand`) and the autoscaler's recent recommendations.  Then
:func:`app.pools.plan.plan` decides and the pass applies, in this order: delete drained members,
reclaim members drained for ``ScaleDown`` that a scale-up wants back (their draining mark taken
off the Proxy, then off the serving view at once: ``MemberReclaimed`` Event), mark leaving
members draining (the annotation on the Proxy, with the reason, then the serving view at once),
create new members, write ``spec.replicas`` through the scale subresource when the autoscaler
moved it, write the status (:func:`app.kube.status_writer.write_pool`).  One Event per kind of action
and pass, and one when zones start being skipped for a provider target that is not Ready
(``ZoneNotReady``) or recover (``ZoneReady``), told from ``status.skippedZones`` before and
after the pass (:func:`app.pools.zones.skipped_zones`), so a zone that stays down is not
repeated every pass.  An autoscaled pool whose ``spec.replicas`` is not the count its autoscaler
settled on at the last pass has another writer (``kubectl scale``, a HorizontalPodAutoscaler):
a ``ReplicasOverridden`` Warning Event says so, at most once per
:data:`OVERRIDE_EVENT_INTERVAL`.

An action the API refuses (409: the member changed meanwhile; 404: it is gone; 422: the CRD
refused the member) is logged and left to the next pass, which decides again from what it reads.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar

from kubernetes.client import ApiException

from app.store import holders

from app.serving import leases, selectors, view as serving

from app.observability import metrics

from app.store import keys as redis_keys

from app.kube import status_writer
from app.kube.gateway import KubeGateway, OwnerReference
from app.pools import budget as pool_budget
from app.pools import demand as pool_demand
from app.pools import wake as pool_wake
from app.pools import recycle
from app.pools import stats as pool_stats
from app.pools.autoscale import Demand
from app.pools.model import (BURNED_IN_PLACE, LABEL_POOL, LABEL_TEMPLATE_HASH, POOL_API_VERSION, POOL_KIND, Member,
                             Pool, format_time, parse_time, selector_string)
from app.pools.plan import Drain, MemberAction, Plan, plan
from app.pools.status import stalled
from app.pools.zones import ZoneHealth, describe_zones
from app.providers.checks import CHECK_PENDING, read_snapshot
from app.resources import (CAPACITY_ON_DEMAND, CAPACITY_SPOT, DRAINING_ANNOTATION, DRAINING_REASON_ANNOTATION, READY,
                           ObjectRef, Proxy)
from app.serving.records import ServingRecord

log = logging.getLogger(__name__)

#: Characters of a member's name suffix (Kubernetes' generateName alphabet: no vowels, no 0/1/3).
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"


#: A reference to one ProxyPool: all a ``pool.reconcile`` payload carries.
PoolRef = ObjectRef


@dataclass(frozen=True)
class Outcome:
    """What one pass did.

    Attributes:
        state: ``"done"``, ``"locked"`` (another pass holds the pool), ``"gone"`` (no such pool,
            or being deleted), ``"stalled"`` (invalid spec, unknown provider: status says why).
        plan: the :class:`app.pools.plan.Plan` applied (``None`` unless ``done``).
        requeue_after: seconds after which the pool needs another pass by itself (a drain
            deadline, an age limit; a retry when locked or when a release was refused), ``None``
            for none.
        released: names of the Proxies this pass released from the pool (relabelled out of
            its explicit selector).
    """

    state: str
    plan: Plan | None = None
    requeue_after: float | None = None
    released: tuple[str, ...] = ()


def member_name(pool: Pool, rand: Callable[[], float] = random.random) -> str:
    """A fresh member name: ``<pool>-<5 characters>`` (the pool's name cut to 200 characters)."""
    return f"{pool.name[:200]}-" + "".join(_SUFFIX[int(rand() * len(_SUFFIX)) % len(_SUFFIX)] for _ in range(5))


def member_spec(pool: Pool, zone: str | None, capacity: str | None = None) -> dict:
    """The Proxy spec of a new member: the template's, placed in ``zone`` and on ``capacity``
    (``OnDemand``/``Spot``, :func:`member_capacity`) when given."""
    spec = json.loads(json.dumps(pool.valid_spec.template_spec))
    if zone:
        spec["placement"] = {**(spec.get("placement") or {}), "zone": zone}
    if capacity:
        spec["placement"] = {**(spec.get("placement") or {}), "capacity": capacity}
    return spec


def member_capacity(pool: Pool, on_demand: int) -> str | None:
    """The capacity of the next new member of a pool with ``spec.onDemandReplicas``, else ``None``
    (the template's own).

    Args:
        pool: the pool.
        on_demand: members on demand that stay (not deleting, not draining), the creates of this
            pass included.
    Returns:
        ``OnDemand`` while fewer than ``spec.onDemandReplicas`` are, else ``Spot``.
    """
    keep = pool.valid_spec.on_demand_replicas
    if keep is None:
        return None
    return CAPACITY_ON_DEMAND if on_demand < keep else CAPACITY_SPOT


def member_labels(pool: Pool) -> dict[str, str]:
    """The labels of a new member: the template's, its pool (:data:`LABEL_POOL`) and the template's
    hash (:data:`LABEL_TEMPLATE_HASH`)."""
    return {**pool.valid_spec.template_labels, LABEL_POOL: pool.name, LABEL_TEMPLATE_HASH: pool.valid_spec.hash}


def owner_of(pool: Pool) -> OwnerReference:
    """The ownerReference every member carries: the pool, ``controller`` and ``blockOwnerDeletion``."""
    return OwnerReference(api_version=POOL_API_VERSION, kind=POOL_KIND, name=pool.name, uid=pool.uid,
                          controller=True, block_owner_deletion=True)


def over_namespace_cap(pool: Pool, proxies: list[Proxy], cap: int | None) -> str | None:
    """Why ``pool``'s size is refused by the namespace cap, or ``None`` when it fits.

    The size is ``spec.autoscale.maxReplicas`` for an autoscaled pool (the most the autoscaler
    may ask for), else ``spec.replicas``; it fits when it is at most ``cap`` minus the Proxies
    (not being deleted) that other ProxyPools of the namespace control.

    Args:
        pool: a pool with a valid spec.
        proxies: every Proxy of the pool's namespace.
        cap: ``POOL_NAMESPACE_MAX_REPLICAS``, ``None`` for no cap.
    Returns:
        the condition message, naming the field, the cap and its setting.
    """
    if cap is None:
        return None
    spec = pool.valid_spec
    auto = spec.autoscale
    field, size = ("spec.autoscale.maxReplicas", auto.max_replicas) if auto else ("spec.replicas", spec.replicas)
    others = sum(1 for p in proxies if not p.deleting and (p.controller or {}).get("kind") == POOL_KIND
                 and (p.controller or {}).get("uid") != pool.uid)
    if size <= cap - others:
        return None
    held = f"; other ProxyPools of the namespace hold {others}, leaving {max(cap - others, 0)}" if others else ""
    return (f"{field} {size} refused: the ProxyPools of namespace {pool.namespace} may keep at most {cap} "
            f"Proxies together (the operator's POOL_NAMESPACE_MAX_REPLICAS){held}; no member is created or "
            "removed until the size fits")


def controlled_by(proxy: Proxy, pool: Pool) -> bool:
    """Whether ``proxy``'s controller ownerReference is ``pool`` (by UID)."""
    ref = proxy.controller
    return ref is not None and ref.get("uid") == pool.uid and ref.get("kind") == POOL_KIND


def strays_of(pool: Pool, proxies: list[Proxy]) -> list[Proxy]:
    """The Proxies of ``proxies`` the pool controls whose labels do not match its explicit
    ``spec.selector`` (none when the selector follows the template): to be released."""
    if not pool.valid_spec.explicit_selector:
        return []
    return [p for p in proxies if controlled_by(p, pool) and not selectors.matches(pool.valid_spec.selector, p.labels)]


def members_of(pool: Pool, proxies: list[Proxy], *, records: Mapping[str, Mapping[str, str]],
               counts: Mapping[str, int], now: float) -> tuple[list[Member], dict[str, Proxy]]:
    """The pool's members as :func:`app.pools.plan.plan` takes them, and their Proxies by UID.

    Args:
        pool: the pool (valid spec).
        proxies: every Proxy of the pool's namespace.
        records: serving records (raw hashes) by UID.
        counts: live leases by UID.
        now: epoch seconds (creation time of a Proxy that has none).
    """
    out, by_uid = [], {}
    for p in proxies:
        if not controlled_by(p, pool):
            continue
        if pool.valid_spec.explicit_selector and not selectors.matches(pool.valid_spec.selector, p.labels):
            continue  # no member: released (strays_of)
        raw = records.get(p.uid)
        rec = ServingRecord.from_redis(raw) if raw else None
        draining = p.draining_until
        serves = bool(rec is not None and rec.healthy and rec.max_leases > 0 and not p.deleting)
        leasable = serves and rec is not None and rec.drain_until is None and draining is None
        created = parse_time((p.raw.get("metadata") or {}).get("creationTimestamp")) or now
        out.append(Member(uid=p.uid, name=p.name, phase=p.phase, ready=p.phase == READY, leasable=leasable,
                          leases=int(counts.get(p.uid, 0)), created=created,
                          template_hash=p.labels.get(LABEL_TEMPLATE_HASH, ""), zone=p.spec.zone,
                          draining_until=draining, deleting=p.deleting, serves=serves,
                          drain_reason=(p.annotations.get(DRAINING_REASON_ANNOTATION, "")
                                        if draining is not None else ""),
                          unknown=rec is None and p.phase == READY and draining is None and not p.deleting))
        by_uid[p.uid] = p
    return out, by_uid


def zone_health(r, pc, zones: Sequence[str | None], *, now: float | None = None) -> dict[str, ZoneHealth | None]:
    """Why members may not be placed in each of ``zones`` (``None``: the template's placement):
    the :class:`app.pools.zones.ZoneHealth` of a zone that is not Ready, ``None`` for a Ready one.

    A zone is Ready when the provider's ProviderHealth target of that name is (a KVM host), or,
    for a zone that is no target of its own (a GCE zone, the kubernetes provider's placement),
    when every target of the provider is (the project, ``cluster``; the first target that is
    not, by name, is the one named).  A target with no verdict yet (``CheckPending``) and a
    provider whose checks are off (``checkInterval: 0``) are not held against a zone.

    Args:
        r: ``redis.Redis``.
        pc: the template's provider config (:class:`app.config.providers.ProviderConfig`).
        zones: the zones to judge.
        now: epoch seconds (staleness of the verdicts).
    Returns:
        ``{zone or "": ZoneHealth or None}``.
    Raises:
        redis.RedisError: Redis unreachable.
    """
    if not pc.check_interval:
        return {z or "": None for z in zones}
    verdicts = {s.verdict.name: s.verdict for s in read_snapshot(r, pc, now=now)}
    down = {name: ZoneHealth(name, v.reason, v.message or "") for name, v in sorted(verdicts.items())
            if not (v.ready or v.reason == CHECK_PENDING)}
    whole = next(iter(down.values()), None)
    return {z or "": (down.get(z) if z in verdicts else whole) if z else whole for z in zones}


#: Seconds between two ``ReplicasOverridden`` Events of one pool (another writer of ``spec.replicas``
#: keeps writing: an HPA every 15 s; one Event every 5 minutes says it well enough).
OVERRIDE_EVENT_INTERVAL = 300.0


def _scale_state(r, uid: str) -> tuple[list[Mapping[str, Any]], dict]:
    """Read the autoscaler's state kept in :func:`app.store.keys.pool_scale`.

    Args:
        r: Redis client.
        uid: the pool's UID.
    Returns:
        ``(recommendations, document)``: the recommendations of the scale-down window, and the
        whole document (``replicas``: the count it last settled on, ``warnedAt``: epoch seconds
        of the last ``ReplicasOverridden`` Event); ``([], {})`` when missing or unreadable; a
        plain list (what earlier releases wrote) is the recommendations alone.
    """
    raw = r.get(redis_keys.pool_scale(uid))
    try:
        doc = json.loads(raw) if raw else []
    except ValueError:
        return [], {}
    if isinstance(doc, list):  # what earlier releases wrote: the recommendations alone
        return doc, {}
    if isinstance(doc, dict) and isinstance(doc.get("history"), list):
        return doc["history"], doc
    return [], {}


def _overridden(pool: Pool, state: Mapping[str, Any]) -> int | None:
    """The count the autoscaler settled on last pass when ``spec.replicas`` now says something
    else: another writer changed it meanwhile (``kubectl scale``, a HorizontalPodAutoscaler on the
    scale subresource, an apply of a manifest carrying ``spec.replicas``); ``None`` otherwise."""
    last = state.get("replicas")
    if isinstance(last, int) and not isinstance(last, bool) and last != pool.valid_spec.replicas:
        return last
    return None


def _warn_overridden(kube: KubeGateway, pool: Pool, last: int, result: Plan) -> None:
    message = (f"spec.replicas was changed from {last} to {pool.valid_spec.replicas} by another writer (kubectl scale, "
               f"a HorizontalPodAutoscaler on this pool's scale subresource, an apply that sets spec.replicas) "
               f"while spec.autoscale sizes the pool; the autoscaler keeps {result.desired}. Use one of them: "
               f"remove spec.autoscale, or the other writer")
    log.warning("pool %s: %s", pool.key, message)
    kube.record_pool_event(pool, "Warning", "ReplicasOverridden", message=message)


def _whole_status(value: Any) -> int:
    """A count read back from a pool's status: a whole number >= 0, else 0 (absent or hand-edited)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _names(items) -> str:
    names = [i.name for i in items]
    return ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")


def reconcile(kube: KubeGateway, r, configs: Mapping[str, Any], *, ref: PoolRef, now: float | None = None,
              rand: Callable[[], float] = random.random, namespace_cap: int | None = None) -> Outcome:
    """One pass over the pool ``ref`` (no lock: see :func:`run`).

    Args:
        kube: the gateway.
        r: ``redis.Redis`` (``decode_responses=True``): serving view, leases, provider health,
            demand counts, the autoscaler's history.
        configs: provider name -> :class:`app.config.providers.ProviderConfig` (the registry's configs).
        ref: the pool.
        now: epoch seconds (default: now).
        rand: random source of member names.
        namespace_cap: most Proxies the pools of the namespace may ask for together
            (``POOL_NAMESPACE_MAX_REPLICAS``), ``None``: no cap.  A pool over it is stalled,
            its members left as they are (:func:`over_namespace_cap`).
    Returns:
        the :class:`Outcome`.
    Raises:
        kubernetes.client.ApiException / redis.RedisError: a read failed (the task retries).
    """
    now = time.time() if now is None else now
    pool = kube.get_pool(ref.namespace, ref.name)
    if pool is None or pool.uid != ref.uid or pool.deleting:
        if pool is None or pool.uid == ref.uid:
            pool_demand.forget(r, ref.namespace, ref.name)
        pool_stats.forget(r, ref.namespace, ref.name, uid=ref.uid)
        r.delete(redis_keys.pool_scale(ref.uid), redis_keys.pool_zone_events(ref.uid), redis_keys.pool_budget(ref.uid))
        return Outcome("gone")
    if pool.spec is None:
        pool_stats.forget(r, pool.namespace, pool.name)
        status_writer.write_pool(kube, pool, stalled(pool, "InvalidSpec", pool.spec_error, now=now))
        return Outcome("stalled")
    pc = configs.get(pool.valid_spec.provider)
    if pc is None:
        pool_stats.forget(r, pool.namespace, pool.name)
        status_writer.write_pool(kube, pool, stalled(
            pool, "UnknownProvider", f"spec.template.spec.provider: no provider {pool.valid_spec.provider!r} in the "
                                     "providers config: no member is created", now=now))
        return Outcome("stalled")
    pool_demand.register(r, pool.namespace, pool.name)

    proxies = kube.list_proxies_in(pool.namespace)
    refusal = over_namespace_cap(pool, proxies, namespace_cap)
    if refusal is not None:
        pool_stats.forget(r, pool.namespace, pool.name)
        status_writer.write_pool(kube, pool, stalled(pool, "NamespaceCapExceeded", refusal, now=now))
        return Outcome("stalled")
    candidates = [p for p in proxies if controlled_by(p, pool)]
    hours = pool_budget.account(r, pool.uid, sum(1 for p in candidates if pool_budget.has_instance(p)), now=now,
                                recorded=pool.status)
    exhausted = pool_budget.refusal(pool.spec.max_instance_hours_per_day, hours, now=now)
    if exhausted is not None:
        status_writer.write_pool(kube, pool, {**stalled(pool, "BudgetExhausted", exhausted, now=now),
                                              "instanceHoursToday": round(hours, 1),
                                              "instanceHoursDay": pool_budget.day_of(now)})
        return Outcome("stalled")
    released, refused = _release(kube, r, pool, strays_of(pool, candidates))
    uids = [p.uid for p in candidates]
    records = serving.records(r, uids)
    members, by_uid = members_of(pool, candidates, records=records, counts=leases.live_counts(r, uids), now=now)
    if pool.valid_spec.recycle is not None:
        members = recycle.mark(r, pool.valid_spec.recycle, members, records, now=now)
    zones: list[str | None] = [*pool.valid_spec.zones] or [pool.valid_spec.template_zone]
    health = zone_health(r, pc, zones, now=now)
    ready = {zone: why is None for zone, why in health.items()}
    signal, history, overridden = None, None, None
    state: dict[str, Any] = {}
    if pool.valid_spec.autoscale is not None:
        taken = pool_demand.take(r, pool.namespace, pool.name)
        signal = Demand(refused=taken.refused, window=taken.window or 0.0)
        history, state = _scale_state(r, pool.uid)
        overridden = _overridden(pool, state)
    result = plan(pool, members, ready, now=now, demand=signal, history=history,
                  zone_health={zone: why for zone, why in health.items() if why is not None},
                  keeps_ip=pc.replacement_keeps_ip)
    _heal_marks(r, members, records, {c.uid for c in result.reclaims} | {c.uid for c in result.unparks})
    interrupted = sum(int(p.status.get("interruptions") or 0) for p in candidates)
    if interrupted or pool.status.get("interruptions"):
        result.status["interruptions"] = interrupted
    if pool.spec.max_instance_hours_per_day is not None:  # shown with a budget only: it changes at most passes
        result.status["instanceHoursToday"] = round(hours, 1)
        result.status["instanceHoursDay"] = pool_budget.day_of(now)
    _apply(kube, r, pool, result, by_uid, rand, now=now)
    pool_stats.record(r, namespace=pool.namespace, name=pool.name, uid=pool.uid, status=result.status,
                      desired=result.desired, now=now,
                      draining=len({m.uid for m in members if m.draining and not m.deleting}
                                   - {d.uid for d in result.deletes} - {c.uid for c in result.reclaims})
                      # (drained in place: a member that stays, not one leaving)
                      + sum(1 for d in result.drains if d.leaves),
                      leases=sum(m.leases for m in members if m.leasable),
                      capacity=pool.valid_spec.max_leases * int(result.status.get("leasableReplicas") or 0))
    auto = pool.valid_spec.autoscale
    if auto is not None:
        warned = state.get("warnedAt") if isinstance(state.get("warnedAt"), (int, float)) else None
        if overridden is not None and (warned is None or now - warned >= OVERRIDE_EVENT_INTERVAL):
            _warn_overridden(kube, pool, overridden, result)
            warned = now
        doc = {"history": list(result.history), "replicas": result.desired}
        if warned is not None:
            doc["warnedAt"] = warned
        r.set(redis_keys.pool_scale(pool.uid), json.dumps(doc), ex=int(auto.scale_down_delay) + 3600)
    else:
        r.delete(redis_keys.pool_scale(pool.uid))  # no stale count if spec.autoscale comes back
    requeue = result.requeue_after
    if refused:
        requeue = RELEASE_RETRY if requeue is None else min(requeue, RELEASE_RETRY)
    # A draining member is deleted at the pass after its last lease ends; a lease's expiry
    # changes only Redis, so the pass is queued for the earliest expiry (a release wakes the
    # pool instead: app/pools/wake.py).
    held = [m.uid for m in members if m.draining and not m.deleting and m.leases > 0]
    expiry = pool_wake.next_expiry(r, held)
    if expiry is not None:
        due = max(EXPIRY_SLACK, expiry - now + EXPIRY_SLACK)
        requeue = due if requeue is None else min(requeue, due)
    return Outcome("done", result, requeue, released=tuple(released))


#: Seconds after which a pass whose release of a Proxy the API refused (409: it changed
#: meanwhile) runs again by itself, besides the pass the change's own watch event queues.
RELEASE_RETRY = 1.0
#: Seconds after a draining member's earliest lease expiry that its pool's pass runs (the expiry
#: must have passed for the lease to count as ended).
EXPIRY_SLACK = 1.0


def _release(kube: KubeGateway, r, pool: Pool, strays: list[Proxy]) -> tuple[list[str], int]:
    """Release ``strays`` (Proxies the pool controls that left its explicit selector) as a
    ReplicaSet releases a Pod: remove the pool's ownerReference (other owners kept) and its
    draining mark in one write conditional on the resourceVersion read, then take the serving
    record out of the pool at once.  The Proxy itself is left running, standalone.

    Whether or not a release succeeds, the Proxy is no member of this pass (it does not match
    the selector), so the plan replaces it; a release refused with 409 (changed meanwhile) is
    decided again by the next pass (within :data:`RELEASE_RETRY`), a 404 (gone) is let be.

    Returns:
        the names released, and how many releases were refused with 409.
    """
    released, refused = [], 0
    for p in strays:
        annotations: dict[str, str | None] | None = {
            k: None for k in (DRAINING_ANNOTATION, DRAINING_REASON_ANNOTATION) if k in p.annotations} or None
        try:
            kube.release_proxy(p, pool.uid, annotations=annotations)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
            refused += exc.status == 409  # a 404: gone, nothing left to release
            log.warning("pool %s: releasing %s refused by the API (HTTP %s %s); the next pass decides again",
                        pool.key, p.key, exc.status, exc.reason)
            continue
        serving.leave_pool(r, p.uid)
        released.append(p.name)
    if released:
        log.info("pool %s: released %s: controlled by the pool, its labels no longer match the selector %s",
                 pool.key, ", ".join(released), selector_string(pool.valid_spec.selector))
        kube.record_pool_event(pool, "Normal", "MemberReleased",
                               message=f"released {len(released)} Proxy(ies) whose labels no longer match "
                                       f"spec.selector (they keep running, outside the pool): "
                                       + ", ".join(released[:10]))
    return released, refused


def _heal_marks(r, members: list[Member], records: Mapping[str, Mapping[str, str]],
                skip: "set[str] | frozenset[str]" = frozenset()) -> None:
    """Put the draining mark back into the serving record of a draining member that lost it (a
    re-publication computed from a read older than the mark): the Proxy's annotation is what
    counts."""
    for m in members:
        if m.uid in skip:
            continue  # reclaimed by this pass: its mark comes off
        raw = records.get(m.uid)
        if m.draining_until is not None and raw is not None and not raw.get("drainUntil"):
            log.info("member %s: draining mark missing from the serving view; written again", m.name)
            serving.set_draining(r, m.uid, m.draining_until)


def _refused(pool: Pool, what: str, exc: ApiException) -> None:
    """Log a write on ``pool``'s members that the API refused (the next pass decides again)."""
    log.warning("pool %s: %s refused by the API (HTTP %s %s); the next pass decides again",
                pool.key, what, exc.status, exc.reason)


A = TypeVar("A", bound=MemberAction)


def _annotate(kube: KubeGateway, pool: Pool, actions: Sequence[A], by_uid: Mapping[str, Proxy], what: str,
              annotations: Callable[[A], dict[str, str | None]], then: Callable[[A], object]) -> list[A]:
    """Write each action's annotations on its member, then run ``then`` for it.

    Args:
        kube: the gateway.
        pool: the pool (for logs).
        actions: the plan's actions; a member not in ``by_uid`` is skipped.
        by_uid: the members' Proxies as read.
        what: the write, for the log when it is refused (``{name}``: the member).
        annotations: the annotations of an action (``None`` removes one).
        then: what follows a write that went through (the serving view, metrics).
    Returns:
        the actions written (refused ones, 404 or 409, are logged and left to the next pass).
    Raises:
        kubernetes.client.ApiException: any other status.
    """
    done = []
    for action in actions:
        proxy = by_uid.get(action.uid)
        if proxy is None:
            continue
        try:
            kube.annotate_proxy(proxy, annotations(action))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
            _refused(pool, what.format(name=action.name), exc)
            continue
        then(action)
        done.append(action)
    return done


def _stays(p: Proxy) -> bool:
    """Whether the member ``p`` stays in its pool as far as its draining mark tells: not marked,
    or drained in place for its bans (:data:`BURNED_IN_PLACE`: still a member)."""
    return p.draining_until is None or p.annotations.get(DRAINING_REASON_ANNOTATION) == BURNED_IN_PLACE


def _targets(d: Drain) -> str:
    """The targets of a burned member's drain, for its Event (``""`` when none is known)."""
    if not d.targets:
        return ""
    latest = f" (the {len(d.targets)} latest)" if len(d.targets) >= recycle.NAMED_TARGETS else ""
    return f"; banned by {', '.join(d.targets)}{latest}"


def _apply(kube: KubeGateway, r, pool: Pool, result: Plan, by_uid: Mapping[str, Proxy], rand, *, now: float) -> None:
    deleted = []
    for d in result.deletes:
        try:
            if kube.delete_proxy(pool.namespace, d.name, d.uid):
                deleted.append(d)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
            _refused(pool, f"deleting {d.name}", exc)
    labels = (pool.namespace, pool.name)
    for d in deleted:
        metrics.POOL_MEMBERS_DELETED.labels(*labels, d.reason).inc()
    if deleted:
        log.info("pool %s: deleted %s", pool.key, ", ".join(f"{d.name} ({d.reason})" for d in deleted))
        kube.record_pool_event(pool, "Normal", "MemberDeleted",
                               message=f"deleted {len(deleted)} member(s): " + ", ".join(
                                   f"{d.name} ({d.reason})" for d in deleted[:10]))
    reclaimed = _annotate(kube, pool, result.reclaims, by_uid, "reclaiming {name}",
                          lambda c: {DRAINING_ANNOTATION: None, DRAINING_REASON_ANNOTATION: None},
                          lambda c: serving.set_draining(r, c.uid, None))
    if reclaimed:
        log.info("pool %s: reclaimed %s (draining for ScaleDown, still updated): they take leases again",
                 pool.key, _names(reclaimed))
        kube.record_pool_event(pool, "Normal", "MemberReclaimed",
                               message=f"reclaimed {len(reclaimed)} draining member(s) for the scale-up (drained for "
                                       f"ScaleDown, still updated; they take leases again): {_names(reclaimed)}")
    unparked = _annotate(kube, pool, result.unparks, by_uid, "taking {name} out of its drain in place",
                         lambda c: {DRAINING_ANNOTATION: None, DRAINING_REASON_ANNOTATION: None},
                         lambda c: serving.set_draining(r, c.uid, None))
    if unparked:
        log.info("pool %s: %s no longer burned: they take leases again", pool.key, _names(unparked))
        kube.record_pool_event(pool, "Normal", "MemberUnburned",
                               message=f"{_names(unparked)} no longer burned (spec.recycle: their bans aged out of "
                                       "windowSeconds): they take leases again")

    def mark_draining(d: Drain) -> None:
        serving.set_draining(r, d.uid, d.until)
        metrics.POOL_MEMBERS_DRAINING.labels(*labels, d.reason).inc()

    drained = _annotate(kube, pool, result.drains, by_uid, "marking {name} draining",
                        lambda d: {DRAINING_ANNOTATION: format_time(d.until), DRAINING_REASON_ANNOTATION: d.reason},
                        mark_draining)
    recycled = [d for d in drained if d.reason == "Burned"]
    if recycled:
        # cumulative: only drains whose annotation was written count, and a draining member is
        # never drained again, so none counts twice
        result.status["recycledReplicas"] = _whole_status(pool.status.get("recycledReplicas")) + len(recycled)
    for burned in recycled:
        kube.record_pool_event(pool, "Normal", "MemberBurned",
                               message=f"replacing {burned.name}: {burned.why}{_targets(burned)}")
    parked = [d for d in drained if not d.leaves]
    for burned in parked:
        kube.record_pool_event(pool, "Normal", "MemberBurned",
                               message=f"draining {burned.name} in place, not replacing it: {burned.why}"
                                       f"{_targets(burned)}; provider {pool.valid_spec.provider} gives a replacement "
                                       "the same egress IP (replacementEgressIP: same); it takes leases again once "
                                       "no longer burned")
    if parked:
        log.info("pool %s: burned, drained in place (the provider keeps the egress IP): %s", pool.key,
                 _names(parked))
    drained = [d for d in drained if d.leaves]
    if drained:
        log.info("pool %s: draining %s until %s", pool.key, _names(drained), format_time(drained[0].until))
        kube.record_pool_event(pool, "Normal", "MemberDraining",
                               message=f"draining {len(drained)} member(s) ({drained[0].reason}): {_names(drained)}; "
                                       f"deleted once their leases end, by {format_time(drained[0].until)} "
                                       "at the latest")
    created = []
    # (members drained in place stay: they are no member leaving, whether drained by this pass or before)
    leaving = {d.uid for d in result.deletes} | {d.uid for d in result.drains if d.leaves}
    on_demand = sum(1 for p in by_uid.values() if p.uid not in leaving and not p.deleting and _stays(p)
                    and p.spec.capacity == CAPACITY_ON_DEMAND)
    for c in result.creates:
        capacity = member_capacity(pool, on_demand)
        for _ in range(3):
            name = member_name(pool, rand)
            try:
                kube.create_proxy(pool.namespace, name, spec=member_spec(pool, c.zone, capacity),
                                  labels=member_labels(pool), owners=(owner_of(pool),))
            except ApiException as exc:
                if exc.status == 409:
                    continue  # that name is taken: another suffix
                if exc.status in (403, 404, 422):
                    _refused(pool, f"creating a member{' in ' + c.zone if c.zone else ''}", exc)
                    break
                raise
            created.append((name, c.zone))
            on_demand += capacity == CAPACITY_ON_DEMAND
            metrics.POOL_MEMBERS_CREATED.labels(*labels).inc()
            break
    if created:
        log.info("pool %s: created %s", pool.key, ", ".join(f"{n}{' in ' + z if z else ''}" for n, z in created))
        kube.record_pool_event(pool, "Normal", "MemberCreated",
                               message=f"created {len(created)} member(s): " + ", ".join(
                                   f"{n}{' in ' + z if z else ''}" for n, z in created[:10]))
    if result.scale_to is not None:
        try:
            kube.scale_pool(pool, result.scale_to)
        except ApiException as exc:
            if exc.status != 404:
                raise
            _refused(pool, "writing spec.replicas", exc)
        else:
            before = pool.valid_spec.replicas
            metrics.POOL_RESCALES.labels(*labels, "up" if result.scale_to > before else "down").inc()
            util = "" if result.utilization is None else f" (lease utilization {result.utilization:.0%})"
            log.info("pool %s: autoscaler %d -> %d members%s", pool.key, before, result.scale_to, util)
            kube.record_pool_event(pool, "Normal", "Rescaled",
                                   message=f"autoscaler: {before} -> {result.scale_to} members{util}")
    try:
        status_writer.write_pool(kube, pool, result.status)
    except ApiException as exc:
        if exc.status != 404:
            raise
        _refused(pool, "writing the status", exc)
        return
    _zone_events(kube, r, pool, result.status.get("skippedZones") or [], now=now)


#: Seconds over which :data:`ZONE_EVENTS_PER_WINDOW` bounds the zone Events of one zone of a pool.
ZONE_EVENT_WINDOW = 600.0
#: ``ZoneNotReady`` / ``ZoneReady`` Events one zone of a pool gets at most per :data:`ZONE_EVENT_WINDOW`
#: (a provider target flipping at every check round would otherwise make two per pass).
ZONE_EVENTS_PER_WINDOW = 3


def _zone_events(kube: KubeGateway, r, pool: Pool, skipped: list[Mapping[str, Any]], *, now: float) -> None:
    """Record ``ZoneNotReady`` (Warning) when zones start being skipped and ``ZoneReady`` when
    zones listed in the pool recover; a pass that finds the same zones skipped records none.

    What was last told of each zone, and when, is kept in :func:`app.store.keys.pool_zone_events`
    (when it is lost, the pool's ``status.skippedZones`` stands for it).  A zone gets at most
    :data:`ZONE_EVENTS_PER_WINDOW` Events per :data:`ZONE_EVENT_WINDOW` (the ``ZonesReady``
    condition still tells every pass); a zone dropped from ``spec.spread.zones`` while skipped
    is not said to recover.

    Args:
        kube: the gateway the Events go through.
        r: Redis client.
        pool: the pool as this pass read it.
        skipped: the zones the plan skipped (``{"zone": ..., ...}``, as in ``status.skippedZones``).
        now: epoch seconds of the pass.
    """
    key = redis_keys.pool_zone_events(pool.uid)
    try:
        doc = json.loads(r.get(key) or "{}")
    except ValueError:
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    before = {z.get("zone") for z in pool.status.get("skippedZones") or () if isinstance(z, Mapping)}
    by_zone = {z["zone"]: z for z in skipped}
    listed = set(pool.valid_spec.zones) or {pool.valid_spec.template_zone or ""}
    started, recovered, state = [], [], {}
    for zone in sorted(listed | set(by_zone) | {z for z in before if isinstance(z, str)} | set(doc)):
        found = doc.get(zone)
        entry: dict[str, Any] = found if isinstance(found, dict) else {}
        told_down = entry["down"] if isinstance(entry.get("down"), bool) else zone in before
        times = [t for t in entry.get("times") or ()
                 if isinstance(t, (int, float)) and 0 <= now - t < ZONE_EVENT_WINDOW]
        down = zone in by_zone
        if zone not in listed and not down:
            continue  # no longer the pool's: forgotten, not said to recover
        if down != told_down and len(times) < ZONE_EVENTS_PER_WINDOW:
            if down:
                started.append(by_zone[zone])
            else:
                recovered.append(zone)
            times.append(now)
            told_down = down
        if told_down or times:
            state[zone] = {"down": told_down, "times": times}
    if state:
        r.set(key, json.dumps(state), ex=int(ZONE_EVENT_WINDOW) + 86400)
    elif doc:
        r.delete(key)
    if started:
        log.warning("pool %s: no new member in %s", pool.key, describe_zones(started))
        kube.record_pool_event(pool, "Warning", "ZoneNotReady",
                               message=f"{len(started)} zone(s) get no new member until their provider target is "
                                       f"Ready: {describe_zones(started)}")
    if recovered:
        names = ", ".join(z or "the template's placement" for z in recovered[:10]) + (
            f" and {len(recovered) - 10} more" if len(recovered) > 10 else "")
        log.info("pool %s: provider target Ready again for %s", pool.key, names)
        kube.record_pool_event(pool, "Normal", "ZoneReady",
                               message=f"the provider target of {names} is Ready again: new members may go there")


def run(kube: KubeGateway, r, configs: Mapping[str, Any], *, ref: PoolRef, lock_timeout: float,
        now: float | None = None, namespace_cap: int | None = None) -> Outcome:
    """:func:`reconcile` under the per-pool lock (:func:`app.store.keys.pool_lock`), so two
    deliveries of the same pool never act together; a lock whose holder died (no heartbeat,
    :mod:`app.store.holders`) is taken over.

    Args:
        lock_timeout: seconds the lock is held at most (the task hard time limit + 10 s).
        namespace_cap: as :func:`reconcile`.
    Returns:
        the :class:`Outcome`; ``locked`` (``requeue_after`` 2 s) when another pass holds the pool.
    Raises:
        as :func:`reconcile`.
    """
    lock = holders.lock(r, redis_keys.pool_lock(ref.uid), timeout=lock_timeout, blocking_timeout=0.5)
    if not lock.acquire():
        return Outcome("locked", requeue_after=2.0)
    try:
        return reconcile(kube, r, configs, ref=ref, now=now, namespace_cap=namespace_cap)
    finally:
        try:
            lock.release()
        except Exception:  # noqa: BLE001 - expired: another pass may own it now
            pass


__all__ = ["OVERRIDE_EVENT_INTERVAL", "RELEASE_RETRY", "ZONE_EVENTS_PER_WINDOW", "ZONE_EVENT_WINDOW", "Outcome",
           "PoolRef", "controlled_by", "member_labels", "member_name", "member_spec", "members_of",
           "over_namespace_cap", "owner_of", "reconcile", "run", "strays_of", "zone_health"]
