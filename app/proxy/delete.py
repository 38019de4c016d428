"""The delete step: delete a Proxy's instance, and release its finalizer only once the instance is
gone (decisions 7 and 16)."""

from __future__ import annotations

import logging
import time
from typing import Any

from app import timefmt
from app.errors import Permanent, ProviderError, Transient, classify, describe
from app.kube import credentials
from app.providers import naming
from app.providers.base import Provider
from app.providers.registry import UnknownProvider
from app.proxy.decide import backoff, create_in_flight, poll_delay
from app.proxy.failures import guard
from app.proxy.retire import retire_on_other_hosts
from app.proxy.provisioned import provisioned
from app.proxy.step import DELETE, LOGGER, Context, Followup, Ref, Step, instance_exists, load
from app.resources import FINALIZER, TERMINATING, Proxy
from app.serving import view as serving
from app.store import keys as redis_keys

log = logging.getLogger(LOGGER)

#: Redis set of Proxy UIDs whose instances were abandoned with skip-cleanup; GC leaves them alone.
ABANDONED_KEY = redis_keys.ABANDONED


def delete(ctx: Context, ref: Ref, attempt: int = 0) -> Followup | None:
    """Finish a deletion: delete the instance, and release the finalizer only once it is gone.

    The skip-cleanup annotation is honoured first: the instance is marked abandoned, never
    deleted, then the finalizer is released (decision 7).  Otherwise provider ``delete`` is
    called even when ``get`` would fail (it is idempotent and can converge where ``get``
    cannot), then ``get`` must answer NotFound; without a recorded provider ID the instance is
    deleted by name wherever it may be.  While a create may still be making the instance and
    this delete has not seen it, the finalizer is kept (``WaitingForCreate``, decision 16).

    Args:
        ctx: the collaborators.
        ref: the Proxy.
        attempt: the retry counter the step was queued with.

    Returns:
        the followup to enqueue (look again, retry), or ``None`` once the finalizer is released.

    Raises:
        Exception: only for errors reading the Proxy itself; :func:`app.dispatch.proxies.run_step`
            retries the step with backoff.
    """
    proxy = load(ctx, ref)
    if proxy is None or not proxy.deleting or FINALIZER not in proxy.finalizers:
        return None
    return guard(Step(ctx, DELETE, attempt, proxy), _delete_instance)


def _delete_instance(step: Step) -> Followup | None:
    """The delete step's work on the Proxy it read (:func:`delete`)."""
    ctx, proxy, attempt = step.ctx, step.proxy, step.attempt
    serving.withdraw(ctx.redis, proxy.uid)
    if proxy.skip_cleanup:
        return _skip_cleanup(step)
    p = step.write(proxy, {"phase": TERMINATING})
    if p.spec.managed:
        found = _instances_to_delete(ctx, p)
        if found is not None:
            provider, ids = found
            # A create may still be making the instance (its write-ahead is recent): whether
            # this delete sees one tells it that create's provider call has made it.
            in_flight = create_in_flight(ctx.settings, p)
            seen = in_flight > 0 and any(instance_exists(provider, i) for i in ids)
            if seen:
                # Recorded before deleting: a retry of this step (a Transient delete, a 409 on
                # the finalizer) finds nothing and must not wait for a create that is done.
                p = step.write(p, {"createStartedAt": None})
            for provider_id in ids:
                provider.delete(provider_id)
            left = [i for i in ids if instance_exists(provider, i)]
            if left:
                changes: dict[str, Any] = {"conditions": provisioned(p, "False", "Deleting",
                                                                     f"waiting for instance {left[0]} to be gone")}
                if p.status.get("createStartedAt"):
                    changes["createStartedAt"] = None  # seen: the create made it; nothing more to wait for
                step.write(p, changes)
                return Followup(DELETE, poll_delay(ctx.settings, attempt), attempt + 1)
            if in_flight and not seen:
                # Nothing found, but the create may still make it (this delete runs beside it: the
                # per-Proxy lock was lost): keep the finalizer and look again (decision 16).
                until = timefmt.rfc3339(time.time() + in_flight)
                message = (f"instance {ids[0]} not found, but the create started at "
                           f"{p.status['createStartedAt']} may still make it; looking again until {until}")
                log.info("proxy %s: delete: %s", p.key, message)
                step.write(p, {"conditions": provisioned(p, "False", "WaitingForCreate", message)})
                return Followup(DELETE, min(poll_delay(ctx.settings, attempt), in_flight + 0.1), attempt + 1)
            if p.status.get("providerID"):
                ctx.kube.record_event(p, "Normal", "InstanceDeleted", message=f"instance {ids[0]} deleted")
            else:
                retire_on_other_hosts(ctx, p, provider, ids)
    credentials.delete(ctx.kube, p)
    ctx.kube.remove_finalizer(p)
    return None


def _instances_to_delete(ctx: Context, proxy: Proxy) -> tuple[Provider, list[str]] | None:
    """The provider and the provider IDs a delete must remove, or ``None`` when there is none.

    The recorded ``status.providerID`` (of ``status.provider``, else ``spec.provider``) when
    there is one; else every ID the instance name may have (``instance_ids``), because a create
    may have run without recording.  With no recorded ID, an unknown provider or a placement the
    provider rejects means nothing can have been created: ``None``.
    """
    recorded = proxy.status.get("providerID")
    provider_name = proxy.status.get("provider") or proxy.spec.provider
    if recorded:
        return ctx.registry.get(provider_name), [recorded]
    try:
        provider = ctx.registry.get(provider_name)
        ids = provider.instance_ids(naming.instance_name(proxy.uid), proxy.namespace, proxy.spec.zone)
    except Permanent as exc:
        log.info("proxy %s: no instance can exist (%s); releasing", proxy.key, exc)
        return None
    return provider, ids


def _skip_cleanup(step: Step) -> Followup | None:
    """Release a Proxy annotated skip-cleanup: mark its instance abandoned, then drop the finalizer.

    The mark (provider ``abandon``) keeps GC off the instance for good; :data:`ABANDONED_KEY`
    is only a hint.  While the mark cannot be written the Proxy is kept, Terminating, with a
    condition saying why: Transient errors are retried with backoff, the others slowly
    (``quota_backoff``).  A provider no longer configured cannot be marked and is not listed by
    GC either: released at once (decision 7).
    """
    ctx, proxy, attempt = step.ctx, step.proxy, step.attempt
    ctx.redis.sadd(ABANDONED_KEY, proxy.uid)
    provider_id = proxy.status.get("providerID")
    marked = False
    if proxy.spec.managed and provider_id:
        provider_name = proxy.status.get("provider") or proxy.spec.provider
        try:
            provider = ctx.registry.get(provider_name)
        except UnknownProvider:
            log.info("proxy %s: skip-cleanup: provider %r is not configured; releasing without marking %s",
                     proxy.key, provider_name, provider_id)
            provider = None
        if provider is not None:
            try:
                provider.abandon(provider_id)
                marked = True
            except ProviderError as exc:
                cls = classify(exc)
                log.warning("proxy %s: skip-cleanup: marking instance %s abandoned failed (attempt %d): %s",
                            proxy.key, provider_id, attempt + 1, describe(exc))
                message = (f"skip-cleanup: cannot mark instance {provider_id} abandoned yet: {exc}; the Proxy is "
                           "kept until the mark is written, so GC cannot collect the instance meanwhile; "
                           "retrying. If the instance's host or provider is gone for good, remove it from "
                           "the providers config and the Proxy is released")
                step.write(step.latest, {"phase": TERMINATING, "conditions": provisioned(
                    step.latest, "False", getattr(exc, "reason", "") or cls.__name__, message)})
                if attempt == 0:
                    ctx.kube.record_event(step.latest, "Warning", "AbandonFailed", message=message)
                delay = backoff(ctx.settings, attempt) if cls is Transient else ctx.settings.quota_backoff
                return Followup(DELETE, delay, attempt + 1)
    log.info("proxy %s: skip-cleanup set; releasing without deleting the instance%s", proxy.key,
             f" ({provider_id} marked abandoned)" if marked else "")
    ctx.kube.record_event(step.latest, "Normal", "SkipCleanup",
                          message=f"instance {provider_id} left in place and marked abandoned (skip-cleanup)" if marked
                          else "instance left in place (skip-cleanup)")
    credentials.delete(ctx.kube, step.latest)
    ctx.kube.remove_finalizer(step.latest)
    return None
