"""Writing the health verdict to the Proxy status (status subresource, on change only).

Conditions follow the Kubernetes API conventions ("Typical status properties"): a list-map
keyed by ``type``, ``lastTransitionTime`` changed only when ``status`` flips, and each
condition's ``observedGeneration`` set to the object's ``metadata.generation``.  A JSON merge
patch replaces a whole list, so the patch is built from the conditions just read and the
Provisioned condition (the reconciler's) is carried over unchanged.

The write itself (read, resourceVersion precondition, re-read on 409, Events) is the one
status writer's, :func:`app.kube.status_writer.write_latest`; this module decides what a verdict
writes and when health may write at all.
"""

from __future__ import annotations

import logging

from app.kube import conditions, status_writer
from app.probes.state import Verdict
from app.kube.gateway import KubeGateway
from app.resources import COND_HEALTHY, COND_READY, FAILED, READY, RUNNING, UNHEALTHY, Proxy
from app.timefmt import rfc3339

log = logging.getLogger(__name__)

#: Event reasons the health engine emits (one Event per phase change it writes).
EVENT_READY = "Ready"
EVENT_UNHEALTHY = "Unhealthy"
EVENT_DEADLINE = "ProvisioningDeadlineExceeded"

#: Phases in which health owns the phase; in any other phase the writer leaves the object alone
#: (the reconciler is creating, replacing or deleting it).
PROBED_PHASES = (RUNNING, READY, UNHEALTHY)


def build_status(proxy: Proxy, v: Verdict, *, last_probe: float | None, latency_ms: float | None,
                 now: str | None = None) -> dict:
    """Return the status merge patch for verdict ``v`` on ``proxy``.

    Args:
        proxy: the object as just read.
        v: the verdict (``v.healthy`` must not be ``None``).
        last_probe: epoch seconds of the probe that produced it.
        latency_ms: that probe's latency.
        now: transition timestamp (default: now).
    Returns:
        ``{"conditions": [...], "phase"?: ..., "egressIP"?: ..., "bannedTargets"?: ...,
        "lastProbeTime"?: ..., "lastProbeLatencyMs"?: ...}``.
    """
    status_word = "True" if v.healthy else "False"
    conds = proxy.status.get("conditions")
    conds = conditions.set_condition(conds, COND_HEALTHY, status_word, reason=v.reason, message=v.message,
                                     generation=proxy.generation, now=now)
    ready_reason = v.reason if not v.healthy else "Healthy"
    ready_message = "probes pass; the proxy is handed out" if v.healthy else v.message
    conds = conditions.set_condition(conds, COND_READY, status_word, reason=ready_reason, message=ready_message,
                                     generation=proxy.generation, now=now)
    out: dict = {"conditions": conds}
    if v.phase:
        out["phase"] = v.phase
    if v.egress_ip:
        out["egressIP"] = v.egress_ip
    if v.banned_targets is not None:
        out["bannedTargets"] = v.banned_targets
    if last_probe is not None:
        out["lastProbeTime"] = rfc3339(last_probe)
    if latency_ms is not None:
        out["lastProbeLatencyMs"] = int(round(latency_ms))
    return out


def event_for(old_phase: str, v: Verdict) -> tuple[str, str, str] | None:
    """The Kubernetes Event ``(type, reason, message)`` for writing ``v`` over phase ``old_phase``.

    One per phase change: ``Ready`` (Normal), ``Unhealthy`` (Warning; the message starts with
    the probe reason), ``ProvisioningDeadlineExceeded`` (Warning: never healthy within the
    provisioning deadline, phase Failed); ``None`` when the phase does not change.
    """
    if not v.phase or v.phase == old_phase:
        return None
    if v.phase == READY:
        return "Normal", EVENT_READY, f"probes pass; the proxy is handed out ({v.message})"
    if v.phase == UNHEALTHY:
        return "Warning", EVENT_UNHEALTHY, f"{v.reason}: {v.message}; withdrawn until probes pass again"
    if v.phase == FAILED:
        return "Warning", EVENT_DEADLINE, f"{v.reason}: {v.message}"
    return None


def write_verdict(kube: KubeGateway, *, uid: str, namespace: str, name: str, v: Verdict,
                  last_probe: float | None, latency_ms: float | None, events: bool = False) -> bool:
    """Write verdict ``v`` to the Proxy ``namespace/name`` if it is still the object ``uid``.

    Skips (returns ``False``) when the object is gone, is another object with the same name,
    is being deleted, or is in a phase health does not own (see :data:`PROBED_PHASES`; a
    Failed verdict may only be written from those phases too), and when the status already
    says all of it.  The patch (:func:`build_status`) is built from the object as read and
    written by :func:`app.kube.status_writer.write_latest` (merge patch with the read's
    resourceVersion as a precondition: a reconciler write in between is a 409, answered by
    reading again and rebuilding, never by dropping its condition).  With ``events``, a write
    that changes the phase records one Event (:func:`event_for`; best effort).

    Returns:
        whether the status was written.
    Raises:
        kubernetes.client.ApiException: the read or the write failed (a 409 that persisted
            through the re-reads, a 404 when the object went away between the read and the
            write ...): the caller keeps the verdict unwritten and tries again on the next probe.
    """
    if v.healthy is None:
        return False

    def build(proxy: Proxy) -> dict | None:
        if proxy.deleting or proxy.phase not in PROBED_PHASES:
            log.info("health: not writing %s/%s status (phase %s%s)", namespace, name, proxy.phase,
                     ", deleting" if proxy.deleting else "")
            return None
        return build_status(proxy, v, last_probe=last_probe, latency_ms=latency_ms)

    written = status_writer.write_latest(kube, namespace, name, uid=uid, build=build,
                                         event=(lambda before: event_for(before.phase, v)) if events else
                                         (lambda before: None))
    if written is None or written.after is written.before:
        return False
    before = written.before
    if v.phase and v.phase != before.phase:
        level = logging.WARNING if v.phase in (UNHEALTHY, FAILED) else logging.INFO
        log.log(level, "health: %s/%s %s -> %s (%s: %s)", namespace, name, before.phase, v.phase,
                v.reason, v.message)
    return True
