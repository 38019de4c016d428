"""What the reconcile steps write about the instance: the ``Provisioned`` condition, and Running
with the instance's address (published to the serving view) once it runs."""

from __future__ import annotations

import logging

from app.kube import conditions, credentials, status_writer
from app.providers.base import Instance
from app.proxy.step import LOGGER, Context, squid_policy
from app.resources import COND_HEALTHY, COND_PROVISIONED, COND_READY, READY, RUNNING, UNHEALTHY, Proxy
from app.serving import view as serving

log = logging.getLogger(LOGGER)


def provisioned(proxy: Proxy, status: str, reason: str, message: str, *, withdrawn: bool = False) -> list[dict]:
    """The conditions of ``proxy`` with ``Provisioned`` set for its generation.

    Args:
        proxy: the Proxy the conditions are computed from.
        status: ``"True"``, ``"False"`` or ``"Unknown"``.
        reason: the condition's reason.
        message: the condition's message.
        withdrawn: the reconciler takes the Proxy out of service (failed, instance lost or being
            replaced): ``Healthy`` and ``Ready`` turn ``Unknown`` too, since the probes stop and
            their last verdict must not linger.

    Returns:
        the whole conditions list, to write as ``status.conditions``.
    """
    conds = conditions.set_condition(proxy.status.get("conditions"), COND_PROVISIONED, status, reason=reason,
                                     message=message, generation=proxy.generation)
    if withdrawn:
        for ctype in (COND_HEALTHY, COND_READY):
            if conditions.find(conds, ctype) is not None:
                conds = conditions.set_condition(conds, ctype, "Unknown", reason=reason,
                                                 message="not probed while the instance is " + reason,
                                                 generation=proxy.generation)
    return conds


def mark_running(ctx: Context, proxy: Proxy, inst: Instance, extra: dict | None = None) -> Proxy:
    """Write Running with the instance's address and publish the Proxy to the serving view.

    Ready and Unhealthy (the probes' phases) are kept.  The condition is
    ``Provisioned=True/InstanceRunning``; with an :class:`app.providers.base.InstanceNote` the
    note's reason, its message appended, and for a degraded note one Warning Event of that
    reason when the condition takes it (not on every poll that finds it unchanged).

    Args:
        ctx: the collaborators.
        proxy: the Proxy as last read or written.
        inst: the running instance.
        extra: more status changes for the same write.

    Returns:
        the Proxy as written.

    Raises:
        kubernetes.client.ApiException: the status write failed.
        redis.RedisError: publishing failed.
    """
    phase = proxy.phase if proxy.phase in (READY, UNHEALTHY) else RUNNING
    note = inst.note
    reason, message = "InstanceRunning", f"instance {inst.name} is running"
    if note is not None:
        reason, message = note.reason, f"{message}; {note.message}"
    changes = {
        "phase": phase, "address": inst.address, "port": proxy.spec.port, "observedGeneration": proxy.generation,
        "conditions": provisioned(proxy, "True", reason, message),
        **(extra or {}),
    }
    before = conditions.find(proxy.status.get("conditions"), COND_PROVISIONED) or {}
    updated = status_writer.write(ctx.kube, proxy, changes)
    if note is not None and note.degraded and updated is not proxy and before.get("reason") != note.reason:
        log.warning("proxy %s: %s", proxy.key, message)
        ctx.kube.record_event(updated, "Warning", note.reason, message=message)
    policy = squid_policy(ctx, proxy)
    # With basic auth the probes read the credentials from the Proxy's Secret (named here,
    # never copied into Redis, which the API also reads).
    auth_secret = credentials.secret_name(proxy) if policy is not None and policy.basic_auth_file else None
    serving.publish(ctx.redis, updated, address=inst.address or "", port=proxy.spec.port, phase=phase,
                    auth_secret=auth_secret)
    return updated
