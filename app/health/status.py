"""Writing the health verdict to the Proxy status (status subresource, on change only).

Conditions follow the Kubernetes API conventions ("Typical status properties"): a list-map
keyed by ``type``, ``lastTransitionTime`` changed only when ``status`` flips, and each
condition's ``observedGeneration`` set to the object's ``metadata.generation``.  A JSON merge
patch replaces a whole list, so the current conditions are read first and the Provisioned
condition (the reconciler's) is carried over unchanged.

The writer takes the read and patch functions as arguments (in production
:func:`app.kube.get_proxy` and :func:`app.kube.patch_proxy_status`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Callable

from app import conditions
from app.health.state import Verdict
from app.resources import COND_HEALTHY, COND_READY, FAILED, READY, RUNNING, UNHEALTHY, Proxy

log = logging.getLogger(__name__)

GetProxy = Callable[[str, str], "dict | None"]
PatchStatus = Callable[[str, str, dict, str], object]
#: ``record_event(proxy, event_type, reason, message)``: :meth:`app.kube.Kube.record_event`.
RecordEvent = Callable[[Proxy, str, str, str], None]

#: Event reasons the health engine emits (one Event per phase change it writes).
EVENT_READY = "Ready"
EVENT_UNHEALTHY = "Unhealthy"
EVENT_DEADLINE = "ProvisioningDeadlineExceeded"

#: Phases in which health owns the phase; in any other phase the writer leaves the object alone
#: (the reconciler is creating, replacing or deleting it).
PROBED_PHASES = (RUNNING, READY, UNHEALTHY)


def rfc3339(epoch: float) -> str:
    """Return ``epoch`` (seconds) as RFC 3339 UTC with second precision."""
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
        ``{"conditions": [...], "phase"?: ..., "egressIP"?: ..., "lastProbeTime"?: ...,
        "lastProbeLatencyMs"?: ...}``.
    """
    status_word = "True" if v.healthy else "False"
    conds = proxy.status.get("conditions")
    conds = conditions.set_condition(conds, COND_HEALTHY, status_word, v.reason, v.message,
                                     proxy.generation, now)
    ready_reason = v.reason if not v.healthy else "Healthy"
    ready_message = "probes pass; the proxy is handed out" if v.healthy else v.message
    conds = conditions.set_condition(conds, COND_READY, status_word, ready_reason, ready_message,
                                     proxy.generation, now)
    out: dict = {"conditions": conds}
    if v.phase:
        out["phase"] = v.phase
    if v.egress_ip:
        out["egressIP"] = v.egress_ip
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


def write_status(get_proxy: GetProxy, patch_status: PatchStatus, *, uid: str, namespace: str, name: str,
                 v: Verdict, last_probe: float | None, latency_ms: float | None,
                 record_event: RecordEvent | None = None) -> bool:
    """Write verdict ``v`` to the Proxy ``namespace/name`` if it is still the object ``uid``.

    Skips (returns ``False``) when the object is gone, is another object with the same name,
    is being deleted, or is in a phase health does not own (see :data:`PROBED_PHASES`; a
    Failed verdict may only be written from those phases too).  A write that changes the phase
    emits one Event through ``record_event`` (:func:`event_for`; best effort).

    Returns:
        whether the status was written.
    Raises:
        whatever ``get_proxy``/``patch_status`` raise (``kubernetes.client.ApiException``):
        the caller keeps the verdict unwritten and tries again on the next probe.
    """
    if v.healthy is None:
        return False
    obj = get_proxy(namespace, name)
    if obj is None:
        return False
    proxy = Proxy.from_dict(obj)
    if proxy.uid != uid or proxy.deleting or proxy.phase not in PROBED_PHASES:
        log.info("health: not writing %s/%s status (phase %s%s)", namespace, name, proxy.phase,
                 ", deleting" if proxy.deleting else "")
        return False
    patch = build_status(proxy, v, last_probe=last_probe, latency_ms=latency_ms)
    # The read's resourceVersion is a precondition: a reconciler write in between makes this
    # a 409 (retried on the next probe) instead of silently dropping its condition.
    patch_status(namespace, name, patch, proxy.resource_version)
    if v.phase and v.phase != proxy.phase:
        level = logging.WARNING if v.phase in (UNHEALTHY, FAILED) else logging.INFO
        log.log(level, "health: %s/%s %s -> %s (%s: %s)", namespace, name, proxy.phase, v.phase,
                v.reason, v.message)
    event = event_for(proxy.phase, v)
    if event is not None and record_event is not None:
        try:
            record_event(proxy, *event)
        except Exception as exc:  # noqa: BLE001 - Events are best effort
            log.warning("health: Event %s for %s/%s not recorded: %s", event[1], namespace, name,
                        type(exc).__name__)
    return True
