"""Reconcile logic for one Proxy (SPEC §5), free of Celery.

Each entry point (:func:`create`, :func:`poll`, :func:`delete`) re-reads the object, does
one idempotent step, and returns a :class:`Followup` telling the caller what to enqueue
next (or ``None``).  The task layer (``workers.tasks``) turns that into a Celery message on
the right queue; tests call these functions directly with real collaborators.

Errors follow the provider taxonomy (:mod:`app.providers.errors`):

* Transient -> retry the same step with exponential backoff and jitter;
* QuotaExceeded -> a ``Provisioned=False/QuotaExceeded`` condition and a long backoff;
* Permanent (incl. ``UnknownProvider``) -> phase ``Failed``, no retry until the generation
  changes (:func:`decide` returns ``None`` for a Failed Proxy whose generation was observed).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from kubernetes.client import ApiException

from app import conditions, naming, serving
from app import squid as squid_conf
from app.providers.base import CreateRequest, Instance, InstanceState
from app.providers.errors import NotFound, Permanent, ProviderError, QuotaExceeded, Transient, classify, describe
from app.providers.registry import Registry
from app.resources import (COND_HEALTHY, COND_PROVISIONED, COND_READY, FAILED, FINALIZER, PENDING, PROVISIONING,
                           READY, RUNNING, TERMINATING, UNHEALTHY, Proxy)
from app.settings import Settings

log = logging.getLogger(__name__)

CREATE, POLL, DELETE = "create", "poll", "delete"
LIVE_PHASES = (RUNNING, READY, UNHEALTHY)
#: Redis set of Proxy UIDs whose instances were abandoned with skip-cleanup; GC leaves them alone.
ABANDONED_KEY = "po:abandoned"


@dataclass(frozen=True)
class Ref:
    """A reference to one Proxy: all a task payload ever carries."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Followup:
    """The next step to enqueue: ``action`` after ``delay`` seconds, with retry counter ``attempt``."""

    action: str
    delay: float
    attempt: int = 0


@dataclass
class Context:
    """Collaborators of the reconcile functions.

    Attributes:
        kube: :class:`app.kube.Kube` (or anything with the same methods).
        registry: built providers.
        redis: ``redis.Redis`` (serving view).
        settings: :class:`app.settings.Settings`.
        squid_policy: fallback squid policy when the provider's config entry has none.
    """

    kube: Any
    registry: Registry
    redis: Any
    settings: Settings
    squid_policy: squid_conf.SquidPolicy | None = None


def decide(proxy: Proxy, *, resync: bool = False) -> str | None:
    """Return the action a Proxy needs now: ``"create"``, ``"poll"``, ``"delete"`` or ``None``.

    Args:
        proxy: the object as last seen.
        resync: true for the periodic resync, which also polls live managed Proxies to detect
            drift (a lost instance, a changed spec).
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


def retry_scheduled(proxy: Proxy) -> bool:
    """Whether a Transient/QuotaExceeded retry of this generation is already scheduled.

    The step that failed wrote ``Provisioned=False`` with that reason and queued its own
    retry; until the generation changes, events about the object must not cut the backoff
    short (only the periodic resync re-checks, and only when no message is queued).
    """
    cond = conditions.find(proxy.status.get("conditions"), COND_PROVISIONED)
    return bool(cond and cond.get("status") == "False" and cond.get("reason") in ("Transient", "QuotaExceeded")
                and cond.get("observedGeneration") == proxy.generation)


def backoff(settings: Settings, attempt: int, *, rng: random.Random | None = None) -> float:
    """Return the Transient retry delay for ``attempt`` (0-based), seconds.

    Exponential from ``retry_initial`` capped at ``retry_max``, with "equal jitter" (half
    fixed, half random) so retries of many Proxies spread out.
    """
    rng = rng or random
    base = min(settings.retry_max, settings.retry_initial * (2 ** min(attempt, 16)))
    return base / 2 + rng.uniform(0, base / 2)


def poll_delay(settings: Settings, attempt: int) -> float:
    """Return the delay before poll number ``attempt``: 5 s doubling to 60 s (settings bounds)."""
    return min(settings.poll_max, settings.poll_initial * (2 ** min(attempt, 16)))


# -- status helpers --------------------------------------------------------------------------
def _write_status(ctx: Context, proxy: Proxy, changes: dict, *, event: tuple[str, str, str] | None = None) -> Proxy:
    """Merge-patch the status keys in ``changes`` that differ; emit an Event on a phase change."""
    current = proxy.status
    diff = {k: v for k, v in changes.items()
            if (not conditions.same(current.get(k), v) if k == "conditions" else current.get(k) != v)}
    if not diff:
        return proxy
    old_phase = proxy.phase
    updated = ctx.kube.patch_status(proxy, diff)
    new_phase = diff.get("phase")
    if new_phase and new_phase != old_phase:
        log.info("proxy %s phase %s -> %s", proxy.key, old_phase, new_phase)
        etype, reason, message = event or (
            "Warning" if new_phase == FAILED else "Normal", new_phase, f"phase {old_phase} -> {new_phase}")
        ctx.kube.record_event(updated, etype, reason, message)
    return updated


def _provisioned(proxy: Proxy, status: str, reason: str, message: str, *, withdrawn: bool = False) -> list[dict]:
    """The conditions with Provisioned set; ``withdrawn`` also turns Healthy and Ready Unknown.

    Used when the reconciler takes the Proxy out of service (failed, instance lost or being
    replaced): the health engine stops probing it, so its last verdict must not linger.
    """
    conds = conditions.set_condition(proxy.status.get("conditions"), COND_PROVISIONED, status, reason,
                                     message, proxy.generation)
    if withdrawn:
        for ctype in (COND_HEALTHY, COND_READY):
            if conditions.find(conds, ctype) is not None:
                conds = conditions.set_condition(conds, ctype, "Unknown", reason,
                                                 "not probed while the instance is " + reason, proxy.generation)
    return conds


def _load(ctx: Context, ref: Ref) -> Proxy | None:
    """Re-read the Proxy; ``None`` when it is gone or was replaced by another object of that name."""
    proxy = ctx.kube.get_proxy(ref.namespace, ref.name)
    if proxy is None or proxy.uid != ref.uid:
        return None
    return proxy


def _fail(ctx: Context, proxy: Proxy, exc: ProviderError) -> None:
    reason = getattr(exc, "reason", "Permanent") or "Permanent"
    message = str(exc)
    log.warning("proxy %s failed (%s): %s", proxy.key, reason, describe(exc))
    serving.withdraw(ctx.redis, proxy.uid)
    _write_status(ctx, proxy, {
        "phase": FAILED, "observedGeneration": proxy.generation,
        "conditions": _provisioned(proxy, "False", reason, message, withdrawn=True),
    }, event=("Warning", reason, message))


def _handle_error(ctx: Context, proxy: Proxy, exc: BaseException, action: str, attempt: int) -> Followup | None:
    """Turn an exception raised by one step into a status write and a followup."""
    if isinstance(exc, ApiException):
        if exc.status == 404:
            return None  # the Proxy vanished under us; nothing left to do
        if exc.status == 409:
            return Followup(action, 0.5 + random.uniform(0, 1), attempt + 1)
        log.warning("proxy %s: %s: Kubernetes API error %s %s", proxy.key, action, exc.status, exc.reason)
        return Followup(action, backoff(ctx.settings, attempt), attempt + 1)
    cls = classify(exc)
    if cls is Permanent and action != DELETE:
        _fail(ctx, proxy, exc)  # type: ignore[arg-type]
        return None
    if cls is QuotaExceeded:
        log.warning("proxy %s: %s: quota exceeded: %s", proxy.key, action, describe(exc))
        if action != DELETE:
            _write_status(ctx, proxy, {"conditions": _provisioned(proxy, "False", "QuotaExceeded", str(exc))},
                          event=("Warning", "QuotaExceeded", str(exc)))
        return Followup(action, ctx.settings.quota_backoff, attempt + 1)
    if cls is Permanent:  # delete: keep trying slowly, tell the user the way out
        message = (f"cannot delete the instance: {exc}; set annotation "
                   "crawl.example.com/skip-cleanup=\"true\" to release the Proxy without deleting it")
        log.warning("proxy %s: delete: %s", proxy.key, describe(exc))
        _write_status(ctx, proxy, {"conditions": _provisioned(proxy, "False", getattr(exc, "reason", "Permanent"),
                                                               message)})
        return Followup(action, ctx.settings.quota_backoff, attempt + 1)
    log.warning("proxy %s: %s: transient error (attempt %d): %s", proxy.key, action, attempt + 1, describe(exc))
    if action != DELETE:
        _write_status(ctx, proxy, {"conditions": _provisioned(proxy, "False", "Transient", str(exc) or type(exc).__name__)})
    return Followup(action, backoff(ctx.settings, attempt), attempt + 1)


class _Latest:
    """Holds the newest version of the Proxy a step has written, for its error handling."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    def __call__(self, proxy: Proxy) -> Proxy:
        self.proxy = proxy
        return proxy


def _guard(ctx: Context, latest: _Latest, action: str, attempt: int, fn) -> Followup | None:
    try:
        return fn()
    except (ProviderError, ApiException) as exc:
        error = exc
    except Exception as exc:  # noqa: BLE001 - unclassified means Transient (SPEC §4)
        log.exception("proxy %s: %s: unexpected error", latest.proxy.key, action)
        error = Transient(f"{type(exc).__name__}: {exc}")
    try:
        return _handle_error(ctx, latest.proxy, error, action, attempt)
    except ApiException as exc:
        # Recording the error raced another writer (409) or the API failed: retry the step soon.
        log.info("proxy %s: %s: recording %s failed (%s); retrying", latest.proxy.key, action,
                 type(error).__name__, exc.status)
        return Followup(action, 0.5 + random.uniform(0, 1), attempt)


# -- create ----------------------------------------------------------------------------------
def _user_data(ctx: Context, proxy: Proxy) -> bytes | None:
    spec = proxy.spec
    if spec.cloud_init_inline is not None:
        return spec.cloud_init_inline.encode("utf-8")
    if spec.cloud_init_secret:
        name, key = spec.cloud_init_secret
        value = ctx.kube.read_secret_key(proxy.namespace, name, key)
        if value is None:
            raise Transient(f"cloudInit.secretRef: Secret {proxy.namespace}/{name} or its key {key!r} not found")
        return value
    return None


def _policy(ctx: Context, proxy: Proxy) -> squid_conf.SquidPolicy | None:
    pc = ctx.registry.configs.get(proxy.spec.provider or "")
    return pc.squid if pc is not None else ctx.squid_policy


def _request(ctx: Context, proxy: Proxy) -> CreateRequest:
    spec = proxy.spec
    policy = _policy(ctx, proxy)
    auth_secret = auth_htpasswd = None
    if policy is not None and policy.basic_auth_file:
        auth_secret, _, _, auth_htpasswd = ctx.kube.ensure_proxy_credentials(proxy)
    return CreateRequest(
        name=naming.instance_name(proxy.uid), tags=naming.tags_for(proxy.uid), namespace=proxy.namespace,
        zone=spec.zone, image=spec.image, machine_type=spec.machine_type, port=spec.port,
        user_data=_user_data(ctx, proxy),
        vendor_data=spec.vendor_data.encode("utf-8") if spec.vendor_data is not None else None,
        squid_config=squid_conf.render(spec.port, policy), auth_secret=auth_secret, auth_htpasswd=auth_htpasswd,
    )


def _mark_running(ctx: Context, proxy: Proxy, inst: Instance, extra: dict | None = None) -> Proxy:
    """Write Running with the instance's address (keeping Ready/Unhealthy set by probes) and publish."""
    phase = proxy.phase if proxy.phase in (READY, UNHEALTHY) else RUNNING
    changes = {
        "phase": phase, "address": inst.address, "port": proxy.spec.port, "observedGeneration": proxy.generation,
        "conditions": _provisioned(proxy, "True", "InstanceRunning", f"instance {inst.name} is running"),
        **(extra or {}),
    }
    updated = _write_status(ctx, proxy, changes)
    policy = _policy(ctx, proxy)
    # With basic auth the probes read the credentials from the Proxy's Secret (named here,
    # never copied into Redis, which the API also reads).
    auth_secret = ctx.kube.credentials_secret_name(proxy) if policy is not None and policy.basic_auth_file else None
    serving.publish(ctx.redis, updated, address=inst.address or "", port=proxy.spec.port, phase=phase,
                    auth_secret=auth_secret)
    return updated


def create(ctx: Context, ref: Ref, attempt: int = 0) -> Followup | None:
    """Make sure the Proxy has a finalizer and an instance (SPEC §5 "Create").

    Managed: provider ``create`` (idempotent by name) -> status Provisioning with the
    provider ID, then a poll.  A changed spec hash replaces the instance (delete, then
    create).  External: status Running with the endpoint, published to the serving view.

    Returns:
        the followup to enqueue, or ``None``.
    Raises:
        Exception: only for errors reading the Proxy itself; ``workers.tasks.run_step``
            retries the step with backoff.
    """
    proxy = _load(ctx, ref)
    if proxy is None:
        return None
    if proxy.deleting:
        return Followup(DELETE, 0)

    latest = _Latest(proxy)

    def step() -> Followup | None:
        p = latest(ctx.kube.add_finalizer(proxy))
        if not p.spec.managed:
            address = p.spec.host or ""
            inst = Instance(provider_id="", name=p.name, state=InstanceState.RUNNING, address=address)
            _mark_running(ctx, p, inst, {"providerID": None, "specHash": p.spec_hash})
            return None
        if not p.status.get("phase"):
            p = latest(_write_status(ctx, p, {"phase": PENDING, "conditions": _provisioned(
                p, "False", "Pending", "accepted; waiting for the provider")}))
        provider = ctx.registry.get(p.spec.provider)
        old_id = p.status.get("providerID")
        if old_id and p.status.get("specHash") == p.spec_hash:
            # Nothing about the instance changed (e.g. healthCheck or maxLeases did): record the
            # generation and let poll confirm the instance.  A Failed Proxy gets another chance
            # with the new generation: back to Provisioning, and the poll re-publishes it.
            changes: dict = {"observedGeneration": p.generation}
            if p.phase == FAILED:
                changes.update(phase=PROVISIONING, conditions=_provisioned(
                    p, "False", "Provisioning", "new generation: re-checking the instance"))
            latest(_write_status(ctx, p, changes))
            return Followup(POLL, 0)
        if old_id:
            log.info("proxy %s: spec changed, replacing instance %s", p.key, old_id)
            serving.withdraw(ctx.redis, p.uid)
            p = latest(_write_status(ctx, p, {"phase": PROVISIONING, "address": None, "conditions": _provisioned(
                p, "False", "Replacing", f"spec changed: replacing instance {old_id}", withdrawn=True)}))
            provider.delete(old_id)
        inst = provider.create(_request(ctx, p))
        p = latest(_write_status(ctx, p, {
            "phase": PROVISIONING, "providerID": inst.provider_id, "instanceName": inst.name,
            "specHash": p.spec_hash, "observedGeneration": p.generation, "address": None,
            "conditions": _provisioned(p, "False", "Provisioning", f"instance {inst.name} requested"),
        }))
        if inst.state == InstanceState.RUNNING and inst.address:
            _mark_running(ctx, p, inst)
            return None
        return Followup(POLL, poll_delay(ctx.settings, 0), 0)

    return _guard(ctx, latest, CREATE, attempt, step)


# -- poll ------------------------------------------------------------------------------------
def poll(ctx: Context, ref: Ref, attempt: int = 0) -> Followup | None:
    """Follow the instance until it runs with an address; detect drift afterwards.

    * Running with an address -> status Running (probes take over from there), published.
    * Still provisioning -> poll again with backoff (``poll_initial`` doubling to ``poll_max``).
    * NotFound, Stopped or Terminated on a Proxy that should have an instance -> recreate.
    * Spec hash changed -> hand over to :func:`create` (which replaces the instance).
    """
    proxy = _load(ctx, ref)
    if proxy is None:
        return None
    action = decide(proxy, resync=True)
    if action != POLL:
        return Followup(action, 0) if action else None

    def step() -> Followup | None:
        provider = ctx.registry.get(proxy.spec.provider)
        provider_id = proxy.status["providerID"]
        try:
            inst = provider.get(provider_id)
        except NotFound:
            inst = None
        if inst is None or inst.state in (InstanceState.STOPPED, InstanceState.TERMINATED):
            what = "gone" if inst is None else inst.state.value.lower()
            log.warning("proxy %s: instance %s is %s; recreating", proxy.key, provider_id, what)
            serving.withdraw(ctx.redis, proxy.uid)
            if inst is not None:
                provider.delete(provider_id)
            _write_status(ctx, proxy, {
                "phase": PROVISIONING, "providerID": None, "address": None,
                "conditions": _provisioned(proxy, "False", "InstanceLost", f"instance {provider_id} is {what}",
                                           withdrawn=True),
            }, event=("Warning", "InstanceLost", f"instance {provider_id} is {what}; recreating"))
            return Followup(CREATE, 0)
        if inst.state == InstanceState.RUNNING and inst.address:
            _mark_running(ctx, proxy, inst)
            return None
        return Followup(POLL, poll_delay(ctx.settings, attempt + 1), attempt + 1)

    return _guard(ctx, _Latest(proxy), POLL, attempt, step)


# -- delete ----------------------------------------------------------------------------------
def delete(ctx: Context, ref: Ref, attempt: int = 0) -> Followup | None:
    """Finish a deletion (SPEC §5 "Delete"): delete the instance, then release the finalizer.

    The skip-cleanup annotation is honoured first, before the provider is even looked up.
    Provider ``delete`` is called even when ``get`` would fail: it is idempotent and can
    converge where ``get`` cannot.  A Proxy without a provider ID never got an instance we
    know of; GC collects anything a crash left behind.
    """
    proxy = _load(ctx, ref)
    if proxy is None or not proxy.deleting or FINALIZER not in proxy.finalizers:
        return None

    latest = _Latest(proxy)

    def step() -> Followup | None:
        serving.withdraw(ctx.redis, proxy.uid)
        if proxy.skip_cleanup:
            ctx.redis.sadd(ABANDONED_KEY, proxy.uid)
            log.info("proxy %s: skip-cleanup set; releasing without deleting the instance", proxy.key)
            ctx.kube.record_event(proxy, "Normal", "SkipCleanup", "instance left in place (skip-cleanup)")
            ctx.kube.delete_proxy_credentials(proxy)
            ctx.kube.remove_finalizer(proxy)
            return None
        p = latest(_write_status(ctx, proxy, {"phase": TERMINATING}))
        provider_id = p.status.get("providerID")
        if p.spec.managed and provider_id:
            ctx.registry.get(p.spec.provider).delete(provider_id)
            ctx.kube.record_event(p, "Normal", "InstanceDeleted", f"instance {provider_id} deleted")
        ctx.kube.delete_proxy_credentials(p)
        ctx.kube.remove_finalizer(p)
        return None

    return _guard(ctx, latest, DELETE, attempt, step)
