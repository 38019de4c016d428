"""The one error boundary of the reconcile steps: a step's exception becomes a status write and a
followup.

Errors follow the provider taxonomy (:mod:`app.errors`):

* Transient (and anything unclassified) -> retry the same step with exponential backoff and
  jitter;
* QuotaExceeded -> a ``Provisioned=False/QuotaExceeded`` condition and a long backoff;
* Permanent (incl. ``UnknownProvider``) -> phase ``Failed``, no retry until the generation
  changes (:func:`app.proxy.decide.decide` returns ``None`` for a Failed Proxy whose generation
  was observed); for a delete, a condition naming the way out and a slow retry;
* a Kubernetes API error -> 404: done (the Proxy is gone); 409: the step again soon from a
  fresh read (decision 15); others: retried with backoff.
"""

from __future__ import annotations

import logging
import random
from typing import Callable

from kubernetes.client import ApiException

from app.errors import Permanent, ProviderError, QuotaExceeded, Transient, classify, describe
from app.kube import status_writer
from app.proxy.decide import backoff
from app.proxy.provisioned import provisioned
from app.proxy.step import CREATE, DELETE, LOGGER, Context, Followup, Step
from app.resources import FAILED, PENDING, Proxy
from app.serving import view as serving

log = logging.getLogger(LOGGER)


def guard(step: Step, body: Callable[[Step], Followup | None]) -> Followup | None:
    """Run ``body(step)`` and turn what it raises into a status write and a followup.

    Args:
        step: the step; its failure is recorded on ``step.latest``.
        body: the step's work.

    Returns:
        ``body``'s followup, or the one :func:`handle` chose for its error; when recording the
        error itself fails (a 409, the API failing), the same step again in 0.5-1.5 s.
    """
    try:
        return body(step)
    except (ProviderError, ApiException) as exc:
        error: BaseException = exc
    except Exception as exc:  # unclassified means Transient
        log.exception("proxy %s: %s: unexpected error", step.latest.key, step.action)
        error = Transient(f"{type(exc).__name__}: {exc}")
    try:
        return handle(step.ctx, step.latest, error, step.action, step.attempt)
    except ApiException as exc:
        # Recording the error raced another writer (409) or the API failed: retry the step soon.
        log.info("proxy %s: %s: recording %s failed (%s); retrying", step.latest.key, step.action,
                 type(error).__name__, exc.status)
        return Followup(step.action, 0.5 + random.uniform(0, 1), step.attempt)


def handle(ctx: Context, proxy: Proxy, exc: BaseException, action: str, attempt: int) -> Followup | None:
    """Turn an exception raised by one step into a status write and a followup.

    Args:
        ctx: the collaborators.
        proxy: the newest version of the Proxy the step has written (or read).
        exc: what the step raised: an :class:`kubernetes.client.ApiException` or a provider error.
        action: the step's action.
        attempt: the step's retry counter.

    Returns:
        the step to queue next, or ``None`` (the Proxy is gone, or Failed for good).

    Raises:
        kubernetes.client.ApiException: recording the error failed.
    """
    if isinstance(exc, ApiException):
        if exc.status == 404:
            return None  # the Proxy vanished under us; nothing left to do
        if exc.status == 409:
            return Followup(action, 0.5 + random.uniform(0, 1), attempt + 1)
        log.warning("proxy %s: %s: Kubernetes API error %s %s", proxy.key, action, exc.status, exc.reason)
        if action == CREATE and pending(proxy):
            try:  # best effort: the API is failing; the retry below is what matters
                status_writer.write(ctx.kube, proxy, pending(proxy))
            except ApiException:
                pass
        return Followup(action, backoff(ctx.settings, attempt), attempt + 1)
    cls = classify(exc)
    if cls is Permanent and action != DELETE:
        fail(ctx, proxy, exc)  # type: ignore[arg-type]
        return None
    if cls is QuotaExceeded:
        log.warning("proxy %s: %s: quota exceeded: %s", proxy.key, action, describe(exc))
        if action != DELETE:
            status_writer.write(ctx.kube, proxy, {**pending(proxy), "conditions": provisioned(
                proxy, "False", "QuotaExceeded", str(exc))}, event=("Warning", "QuotaExceeded", str(exc)))
        return Followup(action, ctx.settings.quota_backoff, attempt + 1)
    if cls is Permanent:  # delete: keep trying slowly, tell the user the way out
        message = (f"cannot delete the instance: {exc}; set annotation "
                   "crawl.example.com/skip-cleanup=\"true\" to release the Proxy without deleting it")
        log.warning("proxy %s: delete: %s", proxy.key, describe(exc))
        status_writer.write(ctx.kube, proxy, {"conditions": provisioned(
            proxy, "False", getattr(exc, "reason", "Permanent"), message)})
        return Followup(action, ctx.settings.quota_backoff, attempt + 1)
    log.warning("proxy %s: %s: transient error (attempt %d): %s", proxy.key, action, attempt + 1, describe(exc))
    if action != DELETE:
        status_writer.write(ctx.kube, proxy, {**pending(proxy), "conditions": provisioned(
            proxy, "False", "Transient", str(exc) or type(exc).__name__)})
    return Followup(action, backoff(ctx.settings, attempt), attempt + 1)


def fail(ctx: Context, proxy: Proxy, exc: ProviderError) -> None:
    """Write phase Failed for a Permanent ``exc``: withdrawn from serving, one Warning Event.

    Args:
        ctx: the collaborators.
        proxy: the newest version of the Proxy (its resourceVersion is the write's precondition,
            so a ``createStartedAt`` stamped by a later create is never cleared).
        exc: the error; its ``reason`` (default ``Permanent``) names the condition and Event.

    Raises:
        kubernetes.client.ApiException: the status write failed (409 stale, 404 gone, others).
    """
    reason = getattr(exc, "reason", "Permanent") or "Permanent"
    message = str(exc)
    log.warning("proxy %s failed (%s): %s", proxy.key, reason, describe(exc))
    serving.withdraw(ctx.redis, proxy.uid)
    changes = {
        "phase": FAILED, "observedGeneration": proxy.generation,
        "conditions": provisioned(proxy, "False", reason, message, withdrawn=True),
    }
    if proxy.status.get("createStartedAt"):
        # A Permanent answer ends the provider call for good (nothing is still being made, unlike
        # a Transient timeout): a delete that finds no instance need not wait (decision 16).
        changes["createStartedAt"] = None
    status_writer.write(ctx.kube, proxy, changes, event=("Warning", reason, message))


def pending(proxy: Proxy) -> dict:
    """``phase: Pending`` and its condition, for a managed Proxy that has no phase yet.

    The one place Pending is written: a create does not write it on its way (a Proxy without a
    phase reads Pending, and the write-ahead takes it straight to Provisioning); only a create
    that stops before its write-ahead (an API error, a Transient or QuotaExceeded failure)
    writes it, so ``kubectl get px`` shows that the Proxy was accepted and waits for a retry.

    Args:
        proxy: the Proxy as the failed step left it.

    Returns:
        the status changes, or ``{}`` (the Proxy has a phase, or is External).
    """
    if proxy.status.get("phase") or not proxy.spec.managed:
        return {}
    return {"phase": PENDING,
            "conditions": provisioned(proxy, "False", "Pending", "accepted; waiting for the provider")}
