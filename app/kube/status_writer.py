"""The one writer of Proxy status (the reconciler's steps and the health engine's verdicts), and
of ProxyPool status (:func:`write_pool`, the pool controller's).

Every status write of the operator goes through here (:func:`write` for the reconciler,
:func:`write_latest` for the health engine), over an :class:`app.kube.gateway.KubeGateway`.  Rules:

* **Status subresource, JSON merge patch (RFC 7386), on change only.**  Only the keys of the
  requested changes that differ from the object are sent (``conditions`` compared as the
  list-map it is, :func:`app.kube.conditions.same`); when nothing differs no request is made.  A
  ``None`` value deletes the key (merge-patch semantics).
* **resourceVersion precondition.**  The patch carries the resourceVersion of the object it was
  computed from (Kubernetes API conventions, "Concurrency Control and Consistency").  A merge
  patch replaces the whole ``conditions`` list and both writers write conditions (the
  reconciler ``Provisioned``, the health engine ``Healthy`` and ``Ready``), so a write computed
  from a stale read must fail with 409 rather than drop the other writer's condition.
* **409 Conflict.**  The rule that is safe for each kind of patch:

  - :func:`write` takes a *fixed* patch, computed together with a decision about the object
    (a reconcile step: "the instance will be X", "the spec changed, replace").  Re-applying it
    to a newer object could act on a decision that no longer holds (a write-ahead for a spec
    that changed meanwhile), so the 409 propagates and the caller re-runs its step from a
    fresh read (:func:`app.proxy.failures.handle`).
  - :func:`write_latest` takes a *function* of the object (a health verdict's patch): on 409 it
    re-reads, re-checks that the object is still the one meant and still wants the write, and
    rebuilds the patch from what it read, up to ``attempts`` times; then the 409 propagates.
    The patch is always computed from the object it is applied to.

* **404.**  A patch of an object that is gone propagates :class:`kubernetes.client.ApiException`
  404 from both (the reconciler ends the step; the health engine counts a status error and the
  next probe's read finds nothing).  :func:`write_latest` returns ``None`` when its read finds
  no object, or another object of that name (another UID).
* **observedGeneration.**  Never set here: ``status.observedGeneration`` is the reconciler's
  claim that it acted on that generation's spec (:func:`app.proxy.reconcile.decide` relies on it), so
  callers pass it in their changes when they mean it; a health verdict never claims it.  Each
  condition carries its own ``observedGeneration`` (:func:`app.kube.conditions.set_condition`).
* **Own writes.**  Whether a write is remembered for the watcher's OwnWrites de-duplication is
  the gateway's (:class:`app.kube.gateway.KubernetesGateway` ``record_writes``): reconcile tasks record
  theirs and publish them when they end; the health engine's gateway does not (no task holds
  the Proxy's busy mark for those writes, so the watcher sees them like anyone else's).
* **Events.**  One per happening: an explicit event is recorded whenever the write happens;
  otherwise a phase change records the default Event named after the new phase; nothing when
  nothing was written (a retry that finds the same condition).  Events are best effort.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping

from kubernetes.client import ApiException

from app.kube import conditions
from app.kube.gateway import KubeGateway
from app.pools.model import Pool
from app.resources import FAILED, Proxy

log = logging.getLogger(__name__)

#: ``(type, reason, message)`` of a core/v1 Event.
Event = tuple[str, str, str]
#: ``event_for(before) -> Event | None``: the Event for a write over ``before`` (the object the
#: patch was computed from), decided once the write went through.
EventFor = Callable[[Proxy], "Event | None"]


def changed(status: Mapping, changes: Mapping) -> dict:
    """Return the entries of ``changes`` whose value differs from ``status``.

    ``conditions`` are compared with :func:`app.kube.conditions.same` (order ignored); every other
    key by equality.
    """
    return {k: v for k, v in changes.items()
            if (not conditions.same(status.get(k), v) if k == "conditions" else status.get(k) != v)}


def phase_event(before: Proxy, phase: str) -> Event:
    """The default Event for a phase change: reason = the new phase, Warning for Failed."""
    return ("Warning" if phase == FAILED else "Normal", phase, f"phase {before.phase} -> {phase}")


def _apply(kube: KubeGateway, proxy: Proxy, changes: Mapping, event: "Event | EventFor | None") -> Proxy:
    diff = changed(proxy.status, changes)
    if not diff:
        return proxy
    updated = kube.patch_status(proxy, diff)
    new_phase = diff.get("phase")
    moved = bool(new_phase) and new_phase != proxy.phase
    if moved:
        log.info("proxy %s phase %s -> %s", proxy.key, proxy.phase, new_phase)
    if callable(event):
        chosen = event(proxy)
    elif event is not None:
        chosen = event
    else:
        chosen = phase_event(proxy, new_phase) if moved and new_phase else None
    if chosen is not None:
        try:
            event_type, reason, message = chosen
            kube.record_event(updated, event_type, reason, message=message)
        except Exception as exc:  # noqa: BLE001 - Events are best effort
            log.warning("proxy %s: Event %s not recorded: %s", proxy.key, chosen[1], type(exc).__name__)
    return updated


def write(kube: KubeGateway, proxy: Proxy, changes: Mapping, *, event: "Event | EventFor | None" = None) -> Proxy:
    """Merge-patch the keys of ``changes`` that differ from ``proxy.status`` (fixed patch).

    Args:
        kube: the gateway.
        proxy: the object as read; its resourceVersion is the precondition.
        changes: ``status`` keys to set (``None`` deletes one).
        event: an Event recorded whenever the write happens (a new happening: QuotaExceeded,
            InstanceLost), or a function choosing it from the object written over; ``None``:
            the default Event when the phase changes (:func:`phase_event`).
    Returns:
        the Proxy as written, or ``proxy`` itself when nothing differed.
    Raises:
        kubernetes.client.ApiException: 409 (``proxy`` is stale: re-read and decide again; see
            the module docstring), 404 (gone), others.
    """
    return _apply(kube, proxy, changes, event)


@dataclass(frozen=True)
class Written:
    """What :func:`write_latest` wrote: the object the patch was computed from, and the result."""

    before: Proxy
    after: Proxy


def write_latest(kube: KubeGateway, namespace: str, name: str, *, uid: str,
                 build: Callable[[Proxy], "Mapping | None"], event: "Event | EventFor | None" = None,
                 attempts: int = 3) -> Written | None:
    """Read Proxy ``namespace/name``, build the patch from it, write it; re-read on 409.

    Args:
        kube: the gateway.
        namespace / name / uid: the object meant (another object of the same name is left alone).
        build: ``build(proxy)`` returns the ``status`` changes for the object as just read, or
            ``None`` to leave it alone (e.g. a phase the caller does not own).  Called again
            after each conflict, with the newer object.
        event: as for :func:`write` (a function gets the object the patch was computed from).
        attempts: writes tried before a 409 propagates (at least 1).
    Returns:
        :class:`Written` (``after is before`` when nothing differed), or ``None`` when the object
        is gone, is another object, or ``build`` declined.
    Raises:
        kubernetes.client.ApiException: 409 after ``attempts`` conflicts, 404 when the object
            went away between the read and the patch, others (reads included).
    """
    left = max(1, attempts)
    while True:
        left -= 1
        proxy = kube.get_proxy(namespace, name)
        if proxy is None or proxy.uid != uid:
            return None
        changes = build(proxy)
        if changes is None:
            return None
        try:
            return Written(before=proxy, after=_apply(kube, proxy, changes, event))
        except ApiException as exc:
            if exc.status != 409 or left <= 0:
                raise
            log.info("proxy %s: status write conflicted (409); re-reading", proxy.key)


def write_pool(kube: KubeGateway, pool: Pool, changes: Mapping) -> Pool:
    """Merge-patch the keys of ``changes`` that differ from ``pool.status`` (a ProxyPool's status,
    written by the pool controller, :mod:`app.pools.controller`).

    Same rules as :func:`write`: status subresource, changed keys only (``conditions`` compared
    as a list-map), nothing sent when nothing differs.  No resourceVersion precondition and no
    Events (the controller records its own, one per member created, drained or deleted): the
    controller is the only writer of a pool's status, one pass at a time.

    Returns:
        the pool as written, or ``pool`` itself when nothing differed.
    Raises:
        kubernetes.client.ApiException: 404 (gone), others.
    """
    diff = changed(pool.status, changes)
    if not diff:
        return pool
    return kube.patch_pool_status(pool, diff)


__all__ = ["Event", "EventFor", "Written", "changed", "phase_event", "write", "write_latest", "write_pool"]
