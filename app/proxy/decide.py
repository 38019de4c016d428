"""What a Proxy needs, and when: the decision predicates and the step timings.

:func:`decide` maps a Proxy to create, poll, delete or nothing (decision 5); :func:`steady` and
:func:`drifted` tell the resync which Proxies need nothing (decision 20);
:func:`retry_scheduled` keeps events from cutting a retry short (decision 13).  The timings:
the retry and poll delays, and the windows during which a create may still make its instance
(:func:`create_window`, decision 16) or a read may not show it yet (:func:`visibility_window`).
"""

from __future__ import annotations

import logging
import random
import time

from app import timefmt
from app.backoff import capped_exponential, equal_jitter
from app.config import tenancy
from app.config.settings import Settings
from app.kube import conditions
from app.providers.base import ShardedProvider
from app.proxy.retire import credentials_rotated
from app.proxy.step import CREATE, DELETE, LOGGER, POLL, Context
from app.resources import COND_PROVISIONED, FAILED, FINALIZER, PENDING, PROVISIONING, READY, RUNNING, UNHEALTHY, Proxy

log = logging.getLogger(LOGGER)

LIVE_PHASES = (RUNNING, READY, UNHEALTHY)
#: Live phases in which a Proxy whose status is current needs nothing from the reconciler: the
#: health engine watches it (see :func:`steady`).  An Unhealthy one is still polled by the resync.
STEADY_PHASES = (RUNNING, READY)

#: Seconds added to ``task_time_limit`` in :func:`create_window`: a provider call the worker
#: was killed in still completes server side (a Pod POST, a GCE insert, a libvirt define), and
#: the workers' clocks may differ a little.  The same as the per-Proxy lock's
#: (:func:`app.dispatch.proxies.lock_timeout`).
CREATE_WINDOW_MARGIN = 10.0


def decide(proxy: Proxy, *, resync: bool = False) -> str | None:
    """The action a Proxy needs now.

    Args:
        proxy: the object as last seen.
        resync: true for the periodic resync and the poll step, which also poll live managed
            Proxies to detect drift (a lost instance, a changed spec).  The resync asks only
            about Proxies that are not :func:`steady` (or are steady but unpublished or
            :func:`drifted`).

    Returns:
        ``"create"``, ``"poll"``, ``"delete"`` or ``None`` (nothing to do: a Failed Proxy whose
        generation was observed, a scheduled retry, a live Proxy outside the resync).
    """
    status = proxy.status
    if proxy.deleting:
        return DELETE if FINALIZER in proxy.finalizers else None
    observed = status.get("observedGeneration")
    if proxy.phase == FAILED and observed == proxy.generation:
        return None
    if not resync and retry_scheduled(proxy):
        return None
    if FINALIZER not in proxy.finalizers or observed != proxy.generation:
        return CREATE
    if not proxy.spec.managed:
        # resync re-publishes live External Proxies so a flushed Redis heals in one period
        return CREATE if (resync or proxy.phase not in LIVE_PHASES) else None
    if not status.get("providerID") or status.get("specHash") != proxy.spec_hash:
        return CREATE
    if proxy.phase in (PENDING, PROVISIONING):
        return POLL
    if proxy.phase in LIVE_PHASES:
        return POLL if resync else None
    return None


def steady(proxy: Proxy) -> bool:
    """Whether ``proxy`` is settled: nothing is left for the reconciler until something changes.

    True when it is not being deleted, carries the finalizer, is Running or Ready
    (:data:`STEADY_PHASES`) and its status is current: ``observedGeneration`` equals
    ``generation``, ``specHash`` matches the spec, ``Provisioned`` is ``True`` (no retry of this
    generation is scheduled) and, for a managed Proxy, an instance is recorded (decision 20).

    Args:
        proxy: the object as last seen.

    Returns:
        whether the resync can leave it to the probes.
    """
    status = proxy.status
    cond = conditions.find(status.get("conditions"), COND_PROVISIONED)
    return bool(not proxy.deleting and FINALIZER in proxy.finalizers and proxy.phase in STEADY_PHASES
                and status.get("observedGeneration") == proxy.generation
                and status.get("specHash") == proxy.spec_hash
                and cond is not None and cond.get("status") == "True"
                and (not proxy.spec.managed or status.get("providerID")))


def drifted(ctx: Context, proxy: Proxy) -> bool:
    """Whether a :func:`steady` Proxy still needs a step, for what only a step can act on.

    * its namespace may no longer use what its spec uses (``tenancy:`` narrowed since it was
      created, :func:`app.config.tenancy.refusal`): the create step (External) or the poll
      (Managed) fails and withdraws it;
    * its provider is no longer configured, or (kvm) the host its instance is on is not: the
      poll fails the Proxy (Permanent);
    * its provider bakes the basic-auth credentials into the instance and the Proxy's Secret
      now holds others (:func:`app.proxy.retire.credentials_rotated`: one Secret read, no
      provider call): the poll replaces the instance.

    Args:
        ctx: the collaborators.
        proxy: a steady Proxy.

    Returns:
        whether to send it a step.  Never raises: a check that fails (the API unreachable)
        answers ``True``, so the step decides.
    """
    if tenancy.refusal(ctx.tenancy, proxy) is not None:
        return True
    if not proxy.spec.managed:
        return False
    try:
        provider = ctx.registry.get(proxy.spec.provider)
        provider_id = proxy.status.get("providerID") or ""
        if isinstance(provider, ShardedProvider) and provider.host_of(provider_id) not in provider.hosts():
            return True
        return credentials_rotated(ctx, proxy, provider)
    except Exception as exc:  # noqa: BLE001 - UnknownProvider, an API error: let the poll decide
        log.debug("proxy %s: drift check: %s; polling", proxy.key, type(exc).__name__)
        return True


def retry_scheduled(proxy: Proxy) -> bool:
    """Whether a Transient/QuotaExceeded retry of this generation is already scheduled.

    The step that failed wrote ``Provisioned=False`` with that reason and queued its own retry
    (decision 13).

    Args:
        proxy: the object as last seen.

    Returns:
        whether events about it must leave the retry alone until the generation changes.
    """
    cond = conditions.find(proxy.status.get("conditions"), COND_PROVISIONED)
    return bool(cond and cond.get("status") == "False" and cond.get("reason") in ("Transient", "QuotaExceeded")
                and cond.get("observedGeneration") == proxy.generation)


def backoff(settings: Settings, attempt: int, *, rng: random.Random | None = None) -> float:
    """The Transient retry delay: exponential from ``retry_initial`` capped at ``retry_max``.

    "Equal jitter" (half fixed, half random) spreads the retries of many Proxies.

    Args:
        settings: the bounds.
        attempt: the retry number, 0-based.
        rng: the random source (default: the ``random`` module).

    Returns:
        seconds.
    """
    draw = rng.random if rng is not None else random.random
    return equal_jitter(capped_exponential(attempt, settings.retry_initial, settings.retry_max), draw)


def poll_delay(settings: Settings, attempt: int) -> float:
    """The delay before poll number ``attempt``: ``poll_initial`` doubling to ``poll_max``.

    Args:
        settings: the bounds (5 s and 60 s by default).
        attempt: the poll number, 0-based.

    Returns:
        seconds.
    """
    return capped_exponential(attempt, settings.poll_initial, settings.poll_max)


def create_window(settings: Settings) -> float:
    """How long after a create's write-ahead (``status.createStartedAt``) its provider call may
    still make the instance (decision 16).

    Args:
        settings: ``task_time_limit``, the create's hard time limit.

    Returns:
        seconds: the hard time limit plus :data:`CREATE_WINDOW_MARGIN` (160 s by default).
    """
    return settings.task_time_limit + CREATE_WINDOW_MARGIN


def _create_started(proxy: Proxy) -> float | None:
    """Epoch seconds of ``status.createStartedAt``; ``None`` when absent or malformed."""
    stamp = proxy.status.get("createStartedAt")
    if not stamp:
        return None
    try:
        return timefmt.parse_rfc3339(stamp).timestamp()
    except ValueError:
        return None


def create_in_flight(settings: Settings, proxy: Proxy, *, now: float | None = None) -> float:
    """How long a create of ``proxy`` may still make its instance.

    Counted from ``status.createStartedAt`` and bounded by :func:`create_window`; once the
    Proxy is being deleted, also by ``metadata.deletionTimestamp`` + the window (decision 16).

    Args:
        settings: the step settings.
        proxy: the Proxy.
        now: epoch seconds (default: the clock).

    Returns:
        seconds left; 0 when no create can still make it (no stamp, or one that does not parse).
    """
    started = _create_started(proxy)
    if started is None:
        return 0.0
    window = create_window(settings)
    now = time.time() if now is None else now
    left = min(window, started + window - now)
    if proxy.deletion_timestamp:
        try:
            left = min(left, timefmt.parse_rfc3339(proxy.deletion_timestamp).timestamp() + window - now)
        except ValueError:
            pass  # the API server writes it: never malformed in practice; the stamp alone bounds
    return max(0.0, left)


def visibility_window(settings: Settings) -> float:
    """How long after a create's write-ahead a poll that reads NotFound takes the instance for not
    shown yet, not lost (decision 16).

    Args:
        settings: the step settings.

    Returns:
        seconds: :func:`create_window` (the provider call may still be running) plus
        ``settings.instance_visibility_delay`` (reads that lag behind a create: GCE's and EC2's
        are eventually consistent); 280 by default.
    """
    return create_window(settings) + settings.instance_visibility_delay


def visibility_left(settings: Settings, proxy: Proxy, *, now: float | None = None) -> float:
    """What is left of :func:`visibility_window` for ``proxy``'s last create.

    Args:
        settings: the step settings.
        proxy: the Proxy.
        now: epoch seconds (default: the clock).

    Returns:
        seconds; 0 when it is over, or there is no stamp (a step saw the instance), or the stamp
        does not parse.
    """
    started = _create_started(proxy)
    if started is None:
        return 0.0
    window = visibility_window(settings)
    now = time.time() if now is None else now
    return max(0.0, min(window, started + window - now))
