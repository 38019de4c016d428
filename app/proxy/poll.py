"""The poll step: follow a Proxy's instance until it runs with an address; detect drift afterwards."""

from __future__ import annotations

import logging

from app import timefmt
from app.config import tenancy
from app.errors import NotFound, SpecNotAllowed
from app.kube import conditions
from app.providers.base import INTERRUPTED, InstanceState
from app.proxy.decide import (LIVE_PHASES, backoff, decide, poll_delay, retry_scheduled, visibility_left,
                              visibility_window)
from app.proxy.failures import guard
from app.proxy.retire import ROTATED_SPEC_HASH, credentials_rotated
from app.proxy.provisioned import mark_running, provisioned
from app.proxy.step import CREATE, LOGGER, POLL, Context, Followup, Ref, Step, load
from app.resources import COND_PROVISIONED, PENDING, PROVISIONING
from app.serving import view as serving

log = logging.getLogger(LOGGER)


def poll(ctx: Context, ref: Ref, attempt: int = 0) -> Followup | None:
    """Follow the instance until it runs with an address; detect drift afterwards.

    * Running with an address -> status Running (probes take over from there), published.
    * Still provisioning -> poll again with backoff (``poll_initial`` doubling to ``poll_max``).
    * Stopped (a domain shut off by a hypervisor reboot, a GCE instance stopped or suspended)
      -> withdrawn, ``Provisioned=False/InstanceStopped``, provider ``start`` on the *same*
      instance, Event ``InstanceStarted``, poll again.
    * NotFound (also from ``start``) or Terminated (cannot run again, e.g. a finished Pod) ->
      recreate; but NotFound on a Pending/Provisioning Proxy within
      :func:`app.proxy.decide.visibility_left` of its create -> ``Provisioned=False/NotVisibleYet``,
      poll again, no Event.
    * Spec hash changed, or (kvm, gcp) the basic-auth Secret rotated -> hand over to create,
      which replaces the instance.

    Args:
        ctx: the collaborators.
        ref: the Proxy.
        attempt: the poll number (0-based).

    Returns:
        the followup to enqueue, or ``None``.

    Raises:
        Exception: only for errors reading the Proxy itself (a failed read of the instance is
            written to its status by :func:`app.proxy.failures.guard`);
            :func:`app.dispatch.proxies.run_step` retries the step with backoff.
    """
    proxy = load(ctx, ref)
    if proxy is None:
        return None
    action = decide(proxy, resync=True)
    if action != POLL:
        return Followup(action, 0) if action else None
    return guard(Step(ctx, POLL, attempt, proxy), _follow_instance)


def _follow_instance(step: Step) -> Followup | None:
    """The poll step's work on the Proxy it read (:func:`poll`)."""
    ctx, proxy, attempt = step.ctx, step.proxy, step.attempt
    refused = tenancy.refusal(ctx.tenancy, proxy)
    if refused is not None:
        # tenancy: narrowed since the create step: never (re)published (failures.fail withdraws)
        raise SpecNotAllowed(*refused)
    provider = ctx.registry.get(proxy.spec.provider)
    provider_id = proxy.status["providerID"]
    if proxy.phase in LIVE_PHASES and credentials_rotated(ctx, proxy, provider):
        message = (f"the basic-auth credentials changed; replacing instance {provider_id}, "
                   "which carries the old ones")
        log.info("proxy %s: %s", proxy.key, message)
        step.write(proxy, {"specHash": ROTATED_SPEC_HASH, "conditions": provisioned(
            proxy, "False", "CredentialsRotated", message)}, event=("Normal", "CredentialsRotated", message))
        return Followup(CREATE, 0)
    try:
        inst = provider.get(provider_id)
    except NotFound:
        inst = None
    # The instance shows: the stamp goes with the first write this step makes (before any action
    # on the instance), so a retry never takes a NotFound for "not shown yet", nor a delete for
    # "the create may still make it".  A poll that only finds it provisioning writes nothing.
    seen = {"createStartedAt": None} if inst is not None and proxy.status.get("createStartedAt") else {}
    if inst is not None and inst.state == InstanceState.STOPPED:
        # Stopped is not lost: start the same instance (its disk, its name, its ID) again.
        log.warning("proxy %s: instance %s is stopped; starting it again", proxy.key, provider_id)
        serving.withdraw(ctx.redis, proxy.uid)
        message = f"instance {provider_id} was found stopped; it is being started again"
        step.write(proxy, {
            "phase": PROVISIONING, "address": None, **seen,
            "conditions": provisioned(proxy, "False", "InstanceStopped", message, withdrawn=True),
        }, event=("Warning", "InstanceStopped", message))
        try:
            provider.start(provider_id)
        except NotFound:
            inst = None  # gone meanwhile: recreate below
        else:
            ctx.kube.record_event(step.latest, "Normal", "InstanceStarted",
                                  message=f"instance {provider_id} was stopped and has been started again")
            return Followup(POLL, poll_delay(ctx.settings, attempt), attempt + 1)
    if inst is None and proxy.phase == PROVISIONING and retry_scheduled(proxy):
        # This generation's create failed (QuotaExceeded, Transient) and its retry is queued:
        # nothing was lost, so no InstanceLost.  Ask for the create no earlier than its
        # backoff: de-duplicated against the queued retry, it only replaces a lost message.
        cond = conditions.find(proxy.status.get("conditions"), COND_PROVISIONED) or {}
        delay = ctx.settings.quota_backoff if cond.get("reason") == "QuotaExceeded" else \
            backoff(ctx.settings, attempt)
        return Followup(CREATE, delay, attempt)
    if inst is None and proxy.phase in (PENDING, PROVISIONING):
        left = visibility_left(ctx.settings, proxy)
        if left > 0:
            # Just created and not shown yet (eventually consistent reads): still provisioning.
            until = timefmt.rfc3339(timefmt.parse_rfc3339(proxy.status["createStartedAt"]).timestamp()
                                    + visibility_window(ctx.settings))
            message = (f"instance {provider_id} requested; the provider does not show it yet (its reads may "
                       f"lag behind a create); looking again until {until}")
            log.info("proxy %s: poll: %s", proxy.key, message)
            step.write(proxy, {"phase": PROVISIONING, "conditions": provisioned(
                proxy, "False", "NotVisibleYet", message)})
            return Followup(POLL, min(poll_delay(ctx.settings, attempt + 1), left + 0.1), attempt + 1)
    if inst is None or inst.state == InstanceState.TERMINATED:
        what = "gone" if inst is None else inst.state.value.lower()
        # Reclaimed spot capacity is replaced like a lost instance, under its own reason.
        note = inst.note if inst is not None else None
        lost = INTERRUPTED if note is not None and note.reason == INTERRUPTED else "InstanceLost"
        if note is not None and lost == INTERRUPTED:
            what = f"{what}: {note.message}"
        log.warning("proxy %s: instance %s is %s; recreating", proxy.key, provider_id, what)
        serving.withdraw(ctx.redis, proxy.uid)
        if inst is not None:
            if seen:
                step.write(proxy, seen)
            provider.delete(provider_id)
        p = step.latest
        counted = {"interruptions": int(p.status.get("interruptions") or 0) + 1} if lost == INTERRUPTED else {}
        step.write(p, {
            "phase": PROVISIONING, "providerID": None, "address": None, **counted,
            "conditions": provisioned(p, "False", lost, f"instance {provider_id} is {what}", withdrawn=True),
        }, event=("Warning", "InstanceLost", f"instance {provider_id} is {what}; recreating") if lost != INTERRUPTED
            else ("Warning", INTERRUPTED, f"instance {provider_id} is {what}; recreating"))
        return Followup(CREATE, 0)
    if inst.state == InstanceState.RUNNING and inst.address:
        mark_running(ctx, proxy, inst, seen)
        return None
    if inst.note is not None and proxy.phase in (PENDING, PROVISIONING):
        # Why it is not Running yet (e.g. kvm waiting for the guest agent); written once per
        # change of the note.  A live Proxy keeps serving its last address meanwhile.
        step.write(proxy, {**seen, "conditions": provisioned(
            proxy, "False", inst.note.reason, inst.note.message)})
    return Followup(POLL, poll_delay(ctx.settings, attempt + 1), attempt + 1)
