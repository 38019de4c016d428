"""Reconcile logic for one Proxy, free of Celery.

Each entry point (:func:`create`, :func:`poll`, :func:`delete`) re-reads the object, does
one idempotent step, and returns a :class:`Followup` telling the caller what to enqueue
next (or ``None``).  The dispatcher (:mod:`app.dispatch.proxies`, run by the Celery tasks of
``workers.tasks``) turns that into a message on the right queue; tests call these functions
directly with real collaborators.

Errors follow the provider taxonomy (:mod:`app.errors`):

* Transient -> retry the same step with exponential backoff and jitter;
* QuotaExceeded -> a ``Provisioned=False/QuotaExceeded`` condition and a long backoff;
* Permanent (incl. ``UnknownProvider``) -> phase ``Failed``, no retry until the generation
  changes (:func:`decide` returns ``None`` for a Failed Proxy whose generation was observed).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kubernetes.client import ApiException

from app import timefmt

from app.kube import conditions, status_writer

from app.kube import credentials

from app.squid import egress

from app.providers import naming

from app.store import keys as redis_keys

from app.serving import view as serving

from app.config import tenancy
from app.squid import conf as squid_conf
from app.providers.base import INTERRUPTED, CreateRequest, Instance, InstanceState, ShardedProvider
from app.errors import (NotFound, Permanent, ProviderError, QuotaExceeded, SpecNotAllowed, Transient,
                                  classify, describe)
from app.kube.gateway import KubeGateway
from app.providers.registry import Registry, UnknownProvider
from app.resources import (COND_HEALTHY, COND_PROVISIONED, COND_READY, FAILED, FINALIZER, PENDING, PROVISIONING,
                           READY, RUNNING, TERMINATING, UNHEALTHY, Proxy)
from app.config.settings import Settings
from app.config.tenancy import Tenancy
from app.backoff import capped_exponential, equal_jitter

log = logging.getLogger(__name__)

CREATE, POLL, DELETE = "create", "poll", "delete"
LIVE_PHASES = (RUNNING, READY, UNHEALTHY)
#: Live phases in which a Proxy whose status is current needs nothing from the reconciler: the
#: health engine watches it (see :func:`steady`).  An Unhealthy one is still polled by the resync.
STEADY_PHASES = (RUNNING, READY)
#: Redis set of Proxy UIDs whose instances were abandoned with skip-cleanup; GC leaves them alone.
ABANDONED_KEY = redis_keys.ABANDONED


@dataclass(frozen=True)
class Ref:
    """A reference to one Proxy: all a task payload ever carries."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Followup:
    """The next step to enqueue: ``action`` after ``delay`` seconds, with retry counter ``attempt``.

    ``proxy``, when set, is the Proxy exactly as this step last wrote it (the API's answer to its
    last status write): :meth:`app.dispatch.proxies.Dispatcher.run_step` routes a followup of another
    action from it instead of reading the object again.  In process only: the message carries
    the reference, never the object (decision 1).
    """

    action: str
    delay: float
    attempt: int = 0
    proxy: Proxy | None = field(default=None, compare=False, repr=False)


@dataclass
class Context:
    """Collaborators of the reconcile functions.

    Attributes:
        kube: the :class:`app.kube.gateway.KubeGateway` (every Kubernetes API call of a step).
        registry: built providers.
        redis: ``redis.Redis`` (serving view).
        settings: :class:`app.config.settings.Settings`.
        squid_policy: fallback squid policy when the provider's config entry has none.
        retire: ``retire(provider_name, provider_id, ref)`` has a replaced instance deleted
            *where it lives*: the task layer queues :func:`retire_instance` on that instance's
            own queue (a KVM host's), so a step never touches another place.  ``None`` (tests,
            single-process tools) runs :func:`retire_instance` inline.
        tenancy: which namespaces may add External Proxies or set ``spec.cloudInit``
            (:class:`app.config.tenancy.Tenancy`, the providers config's ``tenancy:`` block; default:
            none).  A create step refuses the rest (``SpecNotAllowed``).
    """

    kube: KubeGateway
    registry: Registry
    redis: Any
    settings: Settings
    squid_policy: squid_conf.SquidPolicy | None = None
    retire: Callable[[str, str, "Ref"], None] | None = None
    tenancy: Tenancy = field(default_factory=Tenancy)


def decide(proxy: Proxy, *, resync: bool = False) -> str | None:
    """Return the action a Proxy needs now: ``"create"``, ``"poll"``, ``"delete"`` or ``None``.

    Args:
        proxy: the object as last seen.
        resync: true for the periodic resync and the poll step, which also poll live managed
            Proxies to detect drift (a lost instance, a changed spec).  The resync asks only
            about Proxies that are not :func:`steady` (or are steady but unpublished or
            :func:`drifted`).
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
    generation is scheduled) and, for a managed Proxy, an instance is recorded.  The resync sends
    nothing for such a Proxy (unless it is unpublished or :func:`drifted`); its health is watched
    by the probes, and one that fails them goes Unhealthy, which the resync polls.
    """
    status = proxy.status
    cond = conditions.find(status.get("conditions"), COND_PROVISIONED)
    return bool(not proxy.deleting and FINALIZER in proxy.finalizers and proxy.phase in STEADY_PHASES
                and status.get("observedGeneration") == proxy.generation
                and status.get("specHash") == proxy.spec_hash
                and cond is not None and cond.get("status") == "True"
                and (not proxy.spec.managed or status.get("providerID")))


def drifted(ctx: Context, proxy: Proxy) -> bool:
    """Whether a :func:`steady` managed Proxy still needs a poll, for what only a poll can act on.

    * its provider is no longer configured, or (kvm) the host its instance is on is not: the
      poll fails the Proxy (Permanent);
    * its provider bakes the basic-auth credentials into the instance
      (``credentials_in_instance``) and the Proxy's Secret now holds others: the poll replaces
      the instance (one Secret read per such Proxy, no provider call).

    * its namespace may no longer use what its spec uses (``tenancy:`` narrowed since it was
      created, :func:`app.config.tenancy.refusal`): the create step (External) or the poll (Managed)
      fails and withdraws it.

    Never raises: a check that fails (the API unreachable) answers ``True``, so the poll decides.
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
        return _credentials_rotated(ctx, proxy, provider)
    except Exception as exc:  # noqa: BLE001 - UnknownProvider, an API error: let the poll decide
        log.debug("proxy %s: drift check: %s; polling", proxy.key, type(exc).__name__)
        return True


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
    return equal_jitter(capped_exponential(attempt, settings.retry_initial, settings.retry_max), rng.random)


def poll_delay(settings: Settings, attempt: int) -> float:
    """Return the delay before poll number ``attempt``: 5 s doubling to 60 s (settings bounds)."""
    return capped_exponential(attempt, settings.poll_initial, settings.poll_max)


# -- status helpers --------------------------------------------------------------------------
def _write_status(ctx: Context, proxy: Proxy, changes: dict, *, event: tuple[str, str, str] | None = None) -> Proxy:
    """Merge-patch the status keys in ``changes`` that differ; emit one Event per happening.

    The reconciler's status writes, all through the one status writer
    (:func:`app.kube.status_writer.write`: status subresource, merge patch, resourceVersion
    precondition; a 409 propagates and the step is retried from a fresh read).  ``event``
    (``(type, reason, message)``) is emitted whenever the write happens (the happening is new:
    a QuotaExceeded condition, an instance lost while still Provisioning), never when nothing
    differs (a retry that finds the same condition); without it a phase change emits the
    default Event named after the new phase.

    Raises:
        kubernetes.client.ApiException: 409 (``proxy`` is stale), 404 (gone), others.
    """
    return status_writer.write(ctx.kube, proxy, changes, event=event)


def _provisioned(proxy: Proxy, status: str, reason: str, message: str, *, withdrawn: bool = False) -> list[dict]:
    """The conditions with Provisioned set; ``withdrawn`` also turns Healthy and Ready Unknown.

    Used when the reconciler takes the Proxy out of service (failed, instance lost or being
    replaced): the health engine stops probing it, so its last verdict must not linger.
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


#: ``status.specHash`` written by poll when a kvm/gcp instance's basic-auth Secret was rotated:
#: matches no spec's hash (those are hex digests), so :func:`decide` hands the Proxy to create,
#: which replaces the instance; create's write-ahead overwrites it.
ROTATED_SPEC_HASH = "credentials-rotated"


def _replacement_cause(proxy: Proxy) -> str:
    """Why create is replacing ``proxy``'s instance, for the ``Replacing`` Event and condition.

    ``"the basic-auth credentials changed"`` when poll handed the Proxy over for a rotation (it
    writes :data:`ROTATED_SPEC_HASH` as ``specHash``, kept until create's status writes
    replace it, so a retried replacement still says so; ``"spec changed and the basic-auth
    credentials changed"`` when a new generation landed meanwhile), else ``"spec changed"``.
    """
    if proxy.status.get("specHash") == ROTATED_SPEC_HASH:
        if proxy.status.get("observedGeneration") != proxy.generation:
            return "spec changed and the basic-auth credentials changed"
        return "the basic-auth credentials changed"
    return "spec changed"


def _load(ctx: Context, ref: Ref) -> Proxy | None:
    """Re-read the Proxy; ``None`` when it is gone or was replaced by another object of that name."""
    proxy = ctx.kube.get_proxy(ref.namespace, ref.name)
    if proxy is None or proxy.uid != ref.uid:
        return None
    return proxy


def _fail(ctx: Context, proxy: Proxy, exc: ProviderError) -> None:
    """Write phase Failed for a Permanent ``exc`` (withdrawn from serving, one Warning Event).

    ``status.createStartedAt`` is cleared in the same write: a Permanent answer ends the
    provider call for good (nothing is still being made server side, unlike a Transient
    timeout), so a delete of the Failed Proxy that finds no instance releases it at once
    instead of waiting out :func:`create_window`.  The write carries ``proxy``'s
    resourceVersion, so a stamp from a later create is never cleared.

    Raises:
        kubernetes.client.ApiException: the status write failed (409 stale, 404 gone, others).
    """
    reason = getattr(exc, "reason", "Permanent") or "Permanent"
    message = str(exc)
    log.warning("proxy %s failed (%s): %s", proxy.key, reason, describe(exc))
    serving.withdraw(ctx.redis, proxy.uid)
    changes = {
        "phase": FAILED, "observedGeneration": proxy.generation,
        "conditions": _provisioned(proxy, "False", reason, message, withdrawn=True),
    }
    if proxy.status.get("createStartedAt"):
        changes["createStartedAt"] = None
    _write_status(ctx, proxy, changes, event=("Warning", reason, message))


def _pending(proxy: Proxy) -> dict:
    """``phase: Pending`` (and its condition) for a Proxy that has no phase yet, else ``{}``.

    A create step does not write Pending on its way: a Proxy without a phase reads Pending, and
    the write-ahead takes it straight to Provisioning.  Pending is written only when a create
    stops before its write-ahead (an API error, a Transient or QuotaExceeded failure), so
    ``kubectl get px`` shows that the Proxy was accepted and waits for a retry.
    """
    if proxy.status.get("phase") or not proxy.spec.managed:
        return {}
    return {"phase": PENDING,
            "conditions": _provisioned(proxy, "False", "Pending", "accepted; waiting for the provider")}


def _handle_error(ctx: Context, proxy: Proxy, exc: BaseException, action: str, attempt: int) -> Followup | None:
    """Turn an exception raised by one step into a status write and a followup."""
    if isinstance(exc, ApiException):
        if exc.status == 404:
            return None  # the Proxy vanished under us; nothing left to do
        if exc.status == 409:
            return Followup(action, 0.5 + random.uniform(0, 1), attempt + 1)
        log.warning("proxy %s: %s: Kubernetes API error %s %s", proxy.key, action, exc.status, exc.reason)
        if action == CREATE and _pending(proxy):
            try:  # best effort: the API is failing; the retry below is what matters
                _write_status(ctx, proxy, _pending(proxy))
            except ApiException:
                pass
        return Followup(action, backoff(ctx.settings, attempt), attempt + 1)
    cls = classify(exc)
    if cls is Permanent and action != DELETE:
        _fail(ctx, proxy, exc)  # type: ignore[arg-type]
        return None
    if cls is QuotaExceeded:
        log.warning("proxy %s: %s: quota exceeded: %s", proxy.key, action, describe(exc))
        if action != DELETE:
            _write_status(ctx, proxy, {**_pending(proxy), "conditions": _provisioned(proxy, "False", "QuotaExceeded",
                                                                                      str(exc))},
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
        _write_status(ctx, proxy, {**_pending(proxy), "conditions": _provisioned(proxy, "False", "Transient",
                                                                                  str(exc) or type(exc).__name__)})
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
    except Exception as exc:  # unclassified means Transient
        log.exception("proxy %s: %s: unexpected error", latest.proxy.key, action)
        error = Transient(f"{type(exc).__name__}: {exc}")
    try:
        return _handle_error(ctx, latest.proxy, error, action, attempt)
    except ApiException as exc:
        # Recording the error raced another writer (409) or the API failed: retry the step soon.
        log.info("proxy %s: %s: recording %s failed (%s); retrying", latest.proxy.key, action,
                 type(error).__name__, exc.status)
        return Followup(action, 0.5 + random.uniform(0, 1), attempt)


# -- instances elsewhere ---------------------------------------------------------------------
def _retire(ctx: Context, provider_name: str, provider_id: str, ref: Ref) -> None:
    try:  # best effort either way: GC collects the instance as superseded if this fails
        if ctx.retire is not None:
            ctx.retire(provider_name, provider_id, ref)  # queued on the instance's own queue
            return
        retire_instance(ctx, provider_name, provider_id, ref=ref)  # inline (no task layer)
    except Exception as exc:  # noqa: BLE001
        log.warning("proxy %s/%s: deleting replaced instance %s failed: %s (GC collects it)", ref.namespace,
                    ref.name, provider_id, describe(exc))


def retire_instance(ctx: Context, provider_name: str, provider_id: str, *, ref: Ref) -> bool:
    """Delete a replaced instance unless its Proxy names it again; return whether it was deleted.

    Runs on the instance's own queue (the task layer routes it there).  The arguments come
    from a task message (Redis), so they are not trusted: the instance itself is read first
    and kept unless it carries our managed-by tag and ``ref.uid`` as its Proxy UID and no
    abandoned mark.  Then the Proxy ``ref`` is re-read: when its status records
    ``provider_id`` again (moved back), the instance is current and kept.  Compared by ID
    alone, as GC does: two providers may reach one instance (one GCE project, one cluster), so
    a message naming the other provider must not delete the instance the status names.  A
    legitimate message always names the status's provider: ``spec.provider`` is immutable
    (the Proxy CRD's rule "spec.provider is immutable"), so one Proxy's instances, old and new,
    all belong to one provider, and two kvm providers that both call a host ``h1`` never
    share a Proxy.

    Raises:
        ProviderError: reading or deleting failed (the caller retries; GC collects the
            instance as superseded if it never succeeds).
    """
    provider = ctx.registry.get(provider_name)
    try:
        inst = provider.get(provider_id)
    except NotFound:
        return False
    if inst.tags.get(naming.TAG_MANAGED_BY) != naming.MANAGED_BY or inst.tags.get(naming.TAG_PROXY_UID) != ref.uid \
            or naming.is_abandoned(inst.tags):
        log.warning("retire %s: the instance is not a replaced instance of proxy uid %s (tags say otherwise); "
                    "not deleting it", provider_id, ref.uid)
        return False
    proxy = _load(ctx, ref)
    if proxy is not None and proxy.status.get("providerID") == provider_id:
        log.info("proxy %s: instance %s is current again; not deleting it", proxy.key, provider_id)
        return False
    provider.delete(provider_id)
    log.info("proxy %s/%s: deleted replaced instance %s", ref.namespace, ref.name, provider_id)
    return True


def _delete_if_abandoned(ctx: Context, proxy: Proxy, provider, provider_id: str) -> None:
    """After a failed create: if the Proxy is gone, delete whatever the create left (best effort)."""
    try:
        if _load(ctx, Ref(proxy.namespace, proxy.name, proxy.uid)) is not None:
            return  # the delete step (or a retry) finds it by the recorded provider ID
        provider.delete(provider_id)
        log.warning("proxy %s: gone while its create failed; deleted %s", proxy.key, provider_id)
    except Exception as exc:  # noqa: BLE001 - the create's own error is what the caller reports
        log.warning("proxy %s: cleaning up after a failed create: %s (GC collects it)", proxy.key, describe(exc))


def _exists(provider, provider_id: str) -> bool:
    """Whether ``provider_id`` still exists (a Pod still terminating does)."""
    try:
        provider.get(provider_id)
    except NotFound:
        return False
    except Permanent as exc:  # e.g. a host removed from the config: nothing left we could reach
        log.info("instance %s: cannot be checked (%s); counting it as gone", provider_id, exc)
        return False
    return True


# -- create ----------------------------------------------------------------------------------
def _user_data(ctx: Context, proxy: Proxy) -> bytes | None:
    spec = proxy.spec
    if spec.cloud_init_inline is not None:
        return spec.cloud_init_inline.encode("utf-8")
    if spec.cloud_init_secret:
        name, key = spec.cloud_init_secret
        secret = ctx.kube.read_secret(proxy.namespace, name)
        value = secret.data.get(key) if secret is not None else None
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
        auth_secret, auth_htpasswd = credentials.secret_name(proxy), credentials.ensure(ctx.kube, proxy).htpasswd
    return CreateRequest(
        name=naming.instance_name(proxy.uid), tags=naming.tags_for(proxy.uid), namespace=proxy.namespace,
        zone=spec.zone, image=spec.image, machine_type=spec.machine_type, capacity=spec.capacity, port=spec.port,
        user_data=_user_data(ctx, proxy),
        vendor_data=spec.vendor_data.encode("utf-8") if spec.vendor_data is not None else None,
        squid_config=squid_conf.render(spec.port, policy), auth_secret=auth_secret, auth_htpasswd=auth_htpasswd,
        egress_rules=egress.nftables_rules(policy),
    )


def _mark_running(ctx: Context, proxy: Proxy, inst: Instance, extra: dict | None = None) -> Proxy:
    """Write Running with the instance's address (keeping Ready/Unhealthy set by probes) and publish.

    ``Provisioned=True/InstanceRunning``; with an :class:`app.providers.base.InstanceNote` the
    note's reason, its message appended, and for a degraded note one Warning Event of that
    reason when the condition takes it (not on every poll that finds it unchanged).
    """
    phase = proxy.phase if proxy.phase in (READY, UNHEALTHY) else RUNNING
    note = inst.note
    reason, message = "InstanceRunning", f"instance {inst.name} is running"
    if note is not None:
        reason, message = note.reason, f"{message}; {note.message}"
    changes = {
        "phase": phase, "address": inst.address, "port": proxy.spec.port, "observedGeneration": proxy.generation,
        "conditions": _provisioned(proxy, "True", reason, message),
        **(extra or {}),
    }
    before = conditions.find(proxy.status.get("conditions"), COND_PROVISIONED) or {}
    updated = _write_status(ctx, proxy, changes)
    if note is not None and note.degraded and updated is not proxy and before.get("reason") != note.reason:
        log.warning("proxy %s: %s", proxy.key, message)
        ctx.kube.record_event(updated, "Warning", note.reason, message=message)
    policy = _policy(ctx, proxy)
    # With basic auth the probes read the credentials from the Proxy's Secret (named here,
    # never copied into Redis, which the API also reads).
    auth_secret = credentials.secret_name(proxy) if policy is not None and policy.basic_auth_file else None
    serving.publish(ctx.redis, updated, address=inst.address or "", port=proxy.spec.port, phase=phase,
                    auth_secret=auth_secret)
    return updated


def create(ctx: Context, ref: Ref, attempt: int = 0) -> Followup | None:
    """Make sure the Proxy has a finalizer and an instance.

    Managed: the provider ID the instance will have is written to the status first
    (write-ahead, which also takes a new Proxy from no phase to Provisioning: ``Pending`` is
    written only when the step stops before it, :func:`_pending`), then provider ``create``
    (idempotent by name), then status Provisioning and a poll.  That last write carries the
    write-ahead's resourceVersion, so it goes through only if nothing changed the Proxy during
    the create; on 409/404 the Proxy is read again: a create that finishes after the Proxy is
    gone deletes what it made; one that finds the Proxy terminating hands over to
    :func:`delete`; a spec change that landed meanwhile stays unobserved (replaced next).  A new
    Proxy's step makes 6 API requests (tests/test_create_requests.py).  A changed spec replaces the
    instance: in the same place (same provider ID) the old one is deleted first; elsewhere
    (another zone or KVM host, another provider) it is retired on its own queue
    (``ctx.retire``) and the new one is created without waiting.  External: status Running
    with the endpoint, published to the serving view.

    Returns:
        the followup to enqueue, or ``None``.
    Raises:
        Exception: only for errors reading the Proxy itself; :func:`app.dispatch.proxies.run_step`
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
        refused = tenancy.refusal(ctx.tenancy, p)
        if refused is not None:
            raise SpecNotAllowed(*refused)  # Failed, withdrawn from serving (:func:`_fail`)
        if not p.spec.managed:
            address = p.spec.host or ""
            inst = Instance(provider_id="", name=p.name, state=InstanceState.RUNNING, address=address)
            _mark_running(ctx, p, inst, {"providerID": None, "specHash": p.spec_hash})
            return None
        # No Pending write here: a Proxy without a phase reads Pending, and the write-ahead below
        # takes it to Provisioning at once.  Pending is written only when the step stops before
        # the write-ahead with nothing else to show (:func:`_handle_error`, :func:`_pending`).
        provider = ctx.registry.get(p.spec.provider)
        old_id = p.status.get("providerID")
        old_provider = p.status.get("provider") or p.spec.provider
        same_spec = bool(old_id) and p.status.get("specHash") == p.spec_hash
        if same_spec and p.phase in LIVE_PHASES:
            # Nothing about the instance changed (e.g. healthCheck or maxLeases did): record the
            # generation and let poll confirm the instance.
            latest(_write_status(ctx, p, {"observedGeneration": p.generation}))
            return Followup(POLL, 0)
        name = naming.instance_name(p.uid)
        new_id = provider.instance_ids(name, p.namespace, p.spec.zone)[0]
        # Built before anything is written or torn down: a request that cannot be built yet (a
        # missing cloud-init Secret: Transient) leaves no createStartedAt stamp for a delete to
        # wait out, and a running instance is not replaced by nothing.
        request = _request(ctx, p)
        retire_old = False
        if old_id and (old_id != new_id or old_provider != p.spec.provider or not same_spec):
            message = f"{_replacement_cause(p)}: replacing instance {old_id}"
            log.info("proxy %s: %s", p.key, message)
            serving.withdraw(ctx.redis, p.uid)
            p = latest(_write_status(ctx, p, {"phase": PROVISIONING, "address": None, "conditions": _provisioned(
                p, "False", "Replacing", message, withdrawn=True)}, event=("Normal", "Replacing", message)))
            if old_id == new_id and old_provider == p.spec.provider:
                provider.delete(old_id)  # same place and name: the old one must go first (same queue)
            else:
                # Elsewhere: deleted on its own queue, never waited for; GC collects it as
                # superseded if that place stays unreachable.  Handed over only once the
                # write-ahead below names the new instance: retire_instance keeps an instance
                # the status still names (it would keep this one if run before the write).
                retire_old = True
                if _exists(provider, new_id):
                    # A leftover of an earlier stay here (moved away and back before its retire
                    # ran), built from an older spec: create is idempotent by name and would
                    # adopt it as is.  It is in the new place, so on this queue: delete it first.
                    log.info("proxy %s: deleting leftover instance %s before creating there", p.key, new_id)
                    provider.delete(new_id)
        # Write-ahead: record where the instance will be *before* creating it, so a delete that
        # arrives at any point finds it (a status write after a slow create may fail on a stale
        # resourceVersion; this one fails before anything exists).
        p = latest(_write_status(ctx, p, {
            "phase": PROVISIONING, "providerID": new_id, "provider": p.spec.provider, "instanceName": name,
            "specHash": p.spec_hash, "observedGeneration": p.generation, "address": None,
            "createStartedAt": timefmt.rfc3339(millis=True),  # a delete waits out create_window() from here
            "conditions": _provisioned(p, "False", "Creating", f"creating instance {name}"),
        }))
        if retire_old:
            _retire(ctx, old_provider, old_id, Ref(p.namespace, p.name, p.uid))
        try:
            inst = provider.create(request)
        except BaseException:
            _delete_if_abandoned(ctx, p, provider, new_id)
            raise
        made = p  # the object as the write-ahead left it: the spec the instance was made from

        def provisioning(base: Proxy) -> dict:
            # Record the spec the instance was made from (made's), not a re-read one: a spec change
            # that landed during the create must still look unobserved, so decide() replaces it.
            return {
                "phase": PROVISIONING, "providerID": inst.provider_id, "provider": made.spec.provider,
                "instanceName": inst.name, "specHash": made.spec_hash, "observedGeneration": made.generation,
                "address": None, "credentialsHash": credentials_hash(request.auth_htpasswd),
                "conditions": _provisioned(base, "False", "Provisioning", f"instance {inst.name} requested"),
            }

        # Optimistic: the write carries the write-ahead's resourceVersion, so it goes through only
        # if nothing touched the Proxy during the create (no delete, no spec change, no other
        # writer); then the Proxy is still this one and wants this instance, and no re-read is
        # needed.  Any change makes it 409 (404 once gone): re-read and decide as below.
        written = None
        changes = provisioning(made)
        if status_writer.changed(made.status, changes):  # always (the condition's reason changes)
            try:
                written = _write_status(ctx, made, changes)
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
                log.info("proxy %s: changed while its instance was created (%s); re-reading", p.key, exc.status)
        if written is None:
            current = _load(ctx, Ref(p.namespace, p.name, p.uid))
            if current is None:
                # The Proxy went away while we created (its finalizer was released meanwhile):
                # nothing would ever delete what we just made.
                log.warning("proxy %s: gone while its instance was created; deleting %s", p.key, inst.provider_id)
                provider.delete(inst.provider_id)
                return None
            if current.deleting:
                return Followup(DELETE, 0)
            written = _write_status(ctx, current, provisioning(current))
        p = latest(written)
        if inst.state == InstanceState.RUNNING and inst.address:
            _mark_running(ctx, p, inst)
            return None
        return Followup(POLL, poll_delay(ctx.settings, 0), 0, proxy=p)

    return _guard(ctx, latest, CREATE, attempt, step)


# -- credentials baked into instances ---------------------------------------------------------
def credentials_hash(htpasswd: str | None) -> str | None:
    """Return a 16-hex-digit SHA-256 digest of the htpasswd line an instance was given, or ``None``.

    Recorded as ``status.credentialsHash`` so a rotation of the Proxy's Secret is noticed
    without keeping anything secret in the status (the line is itself a bcrypt hash).
    """
    if not htpasswd:
        return None
    import hashlib

    return hashlib.sha256(htpasswd.strip().encode("utf-8")).hexdigest()[:16]


def _credentials_rotated(ctx: Context, proxy: Proxy, provider) -> bool:
    """Whether the Proxy's Secret now holds other credentials than its instance was built with.

    Only for providers that bake the htpasswd into the instance (``credentials_in_instance``:
    kvm vendor-data, gcp metadata); a kubernetes Pod mounts the Secret and follows it.  An
    instance that recorded no hash (an older release) is never replaced for this.
    """
    if not provider.credentials_in_instance:
        return False
    policy = _policy(ctx, proxy)
    recorded = proxy.status.get("credentialsHash")
    if policy is None or not policy.basic_auth_file or not recorded:
        return False
    creds = credentials.read(ctx.kube, proxy)
    return creds is not None and credentials_hash(creds.htpasswd) != recorded


# -- poll ------------------------------------------------------------------------------------
def poll(ctx: Context, ref: Ref, attempt: int = 0) -> Followup | None:
    """Follow the instance until it runs with an address; detect drift afterwards.

    * Running with an address -> status Running (probes take over from there), published.
    * Still provisioning -> poll again with backoff (``poll_initial`` doubling to ``poll_max``).
    * Stopped (a domain shut off by a hypervisor reboot, a GCE instance stopped or suspended)
      -> withdrawn, ``Provisioned=False/InstanceStopped``, provider ``start`` on the *same*
      instance, Event ``InstanceStarted``, poll again.  A failing start goes through the
      usual error handling (Transient: retried with backoff).
    * NotFound (also from ``start``) or Terminated (cannot run again, e.g. a finished Pod) on a
      Proxy that should have an instance -> recreate; but NotFound on a Pending/Provisioning
      Proxy within :func:`visibility_left` of its create (no step has seen the instance yet) ->
      ``Provisioned=False/NotVisibleYet``, poll again, no Event.
    * Found while ``status.createStartedAt`` is set -> the stamp is cleared (the instance was
      seen) in the step's first write, before any action on the instance.
    * Spec hash changed -> hand over to :func:`create` (which replaces the instance).
    """
    proxy = _load(ctx, ref)
    if proxy is None:
        return None
    action = decide(proxy, resync=True)
    if action != POLL:
        return Followup(action, 0) if action else None

    latest = _Latest(proxy)

    def step() -> Followup | None:
        refused = tenancy.refusal(ctx.tenancy, proxy)
        if refused is not None:
            # tenancy: narrowed since the create step: never (re)published (:func:`_fail` withdraws)
            raise SpecNotAllowed(*refused)
        provider = ctx.registry.get(proxy.spec.provider)
        provider_id = proxy.status["providerID"]
        if proxy.phase in LIVE_PHASES and _credentials_rotated(ctx, proxy, provider):
            message = (f"the basic-auth credentials changed; replacing instance {provider_id}, "
                       "which carries the old ones")
            log.info("proxy %s: %s", proxy.key, message)
            latest(_write_status(ctx, proxy, {"specHash": ROTATED_SPEC_HASH, "conditions": _provisioned(
                proxy, "False", "CredentialsRotated", message)}, event=("Normal", "CredentialsRotated", message)))
            return Followup(CREATE, 0)
        try:
            inst = provider.get(provider_id)
        except NotFound:
            inst = None
        # The instance shows: cleared with the first write this step makes (before any action on
        # the instance), so a retry never takes a NotFound for "not shown yet" (below), nor a
        # delete for "the create may still make it".  A poll that only finds it still
        # provisioning writes nothing (one request per poll: tests/test_create_requests.py).
        seen = {"createStartedAt": None} if inst is not None and proxy.status.get("createStartedAt") else {}
        if inst is not None and inst.state == InstanceState.STOPPED:
            # Stopped is not lost: start the same instance (its disk, its name, its ID) again.
            log.warning("proxy %s: instance %s is stopped; starting it again", proxy.key, provider_id)
            serving.withdraw(ctx.redis, proxy.uid)
            message = f"instance {provider_id} was found stopped; it is being started again"
            latest(_write_status(ctx, proxy, {
                "phase": PROVISIONING, "address": None, **seen,
                "conditions": _provisioned(proxy, "False", "InstanceStopped", message, withdrawn=True),
            }, event=("Warning", "InstanceStopped", message)))
            try:
                provider.start(provider_id)
            except NotFound:
                inst = None  # gone meanwhile: recreate below
            else:
                ctx.kube.record_event(latest.proxy, "Normal", "InstanceStarted",
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
                latest(_write_status(ctx, proxy, {"phase": PROVISIONING, "conditions": _provisioned(
                    proxy, "False", "NotVisibleYet", message)}))
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
                    latest(_write_status(ctx, proxy, seen))
                provider.delete(provider_id)
            p = latest.proxy
            counted = {"interruptions": int(p.status.get("interruptions") or 0) + 1} if lost == INTERRUPTED else {}
            latest(_write_status(ctx, p, {
                "phase": PROVISIONING, "providerID": None, "address": None, **counted,
                "conditions": _provisioned(p, "False", lost, f"instance {provider_id} is {what}",
                                           withdrawn=True),
            }, event=("Warning", "InstanceLost", f"instance {provider_id} is {what}; recreating") if lost != INTERRUPTED
                else ("Warning", INTERRUPTED, f"instance {provider_id} is {what}; recreating")))
            return Followup(CREATE, 0)
        if inst.state == InstanceState.RUNNING and inst.address:
            _mark_running(ctx, proxy, inst, seen)
            return None
        if inst.note is not None and proxy.phase in (PENDING, PROVISIONING):
            # Why it is not Running yet (e.g. kvm waiting for the guest agent); written once per
            # change of the note.  A live Proxy keeps serving its last address meanwhile.
            latest(_write_status(ctx, proxy, {**seen, "conditions": _provisioned(
                proxy, "False", inst.note.reason, inst.note.message)}))
        return Followup(POLL, poll_delay(ctx.settings, attempt + 1), attempt + 1)

    return _guard(ctx, latest, POLL, attempt, step)


# -- delete ----------------------------------------------------------------------------------
#: Seconds added to ``task_time_limit`` in :func:`create_window`: a provider call the worker
#: was killed in still completes server side (a Pod POST, a GCE insert, a libvirt define), and
#: the workers' clocks may differ a little.  The same as the per-Proxy lock's
#: (:func:`app.dispatch.proxies.lock_timeout`).
CREATE_WINDOW_MARGIN = 10.0


def create_window(settings: Settings) -> float:
    """Seconds after a create's write-ahead (``status.createStartedAt``) during which its provider
    call may still make the instance: the task hard time limit plus :data:`CREATE_WINDOW_MARGIN`
    (160 s with the defaults).  No create step outlives its hard time limit (Celery kills the
    worker child), and after the Proxy's deletion no new create can start: its write-ahead
    carries a resourceVersion precondition and fails (409)."""
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
    """Seconds left during which a create of ``proxy`` may still make its instance; 0 when none can.

    Counted from ``status.createStartedAt``, stamped by every create's write-ahead just before
    its provider call; :func:`create_window` bounds it.  Once the Proxy is being deleted it is
    also bounded by ``metadata.deletionTimestamp`` + the window: after the deletion no create
    can pass its write-ahead (resourceVersion precondition), so a stamp in the future (a
    worker's clock ahead, or one written by whoever may write the status) never holds a delete
    longer than the window after the deletion (the API server's clock).  No stamp, or one that
    does not parse: 0.
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
    """Seconds after a create's write-ahead (``status.createStartedAt``) during which a poll that
    reads NotFound takes the instance for not shown yet, not lost: :func:`create_window` (the
    provider call may still be running) plus ``settings.instance_visibility_delay`` (reads that
    lag behind a create: GCE's and EC2's are eventually consistent); 280 s with the defaults."""
    return create_window(settings) + settings.instance_visibility_delay


def visibility_left(settings: Settings, proxy: Proxy, *, now: float | None = None) -> float:
    """Seconds left of :func:`visibility_window` for ``proxy``'s last create; 0 when it is over.

    The stamp is cleared by the first write of a poll that finds the instance (Running, a note,
    Stopped, before deleting an ended one), by a delete that finds it and by a Permanent
    failure; a poll that only finds the instance still provisioning writes nothing.  No stamp,
    or one that does not parse: 0.
    """
    started = _create_started(proxy)
    if started is None:
        return 0.0
    window = visibility_window(settings)
    now = time.time() if now is None else now
    return max(0.0, min(window, started + window - now))


def _instances_to_delete(ctx: Context, proxy: Proxy):
    """Return ``(provider, provider IDs)`` a delete must remove, or ``None`` when there is none.

    The recorded ``status.providerID`` (of ``status.provider``, else ``spec.provider``) when
    there is one; else every ID the instance name may have (:meth:`instance_ids`), because a
    create may have run without recording.  With no recorded ID, an unknown provider or a
    placement the provider rejects means nothing can have been created: ``None``.
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


def _retire_on_other_hosts(ctx: Context, proxy: Proxy, provider, looked: list[str]) -> None:
    """With no recorded ID, hand the instance name on every *other* host of a sharded provider
    (kvm) to :func:`retire_instance`, each on that host's own queue; never waits for them.

    A delete runs on the spec host's queue, so it only looks there itself (work for host H
    runs on H's queue: a dead host never stalls another's worker).  A domain of this Proxy
    on another host (its status lost, e.g. a restore without status) is deleted by its own
    host's worker once that host answers; the retire reads it first and deletes only an
    instance tagged with this Proxy's UID (the Proxy is gone by then, so nothing names it).
    If the host stays unreachable, GC collects it as an orphan.  Non-sharded providers list
    every place in :meth:`instance_ids` already (gcp: every zone).
    """
    if not isinstance(provider, ShardedProvider):
        return
    name, provider_name = naming.instance_name(proxy.uid), proxy.status.get("provider") or proxy.spec.provider
    ref = Ref(proxy.namespace, proxy.name, proxy.uid)
    for host in provider.hosts():
        try:
            provider_id = provider.instance_ids(name, proxy.namespace, host)[0]
        except Permanent:
            continue
        if provider_id not in looked:
            _retire(ctx, provider_name, provider_id, ref)


def _skip_cleanup(ctx: Context, latest: _Latest, proxy: Proxy, attempt: int) -> Followup | None:
    """Release a Proxy annotated skip-cleanup: mark its instance abandoned, then drop the finalizer.

    The mark (provider ``abandon``: the :data:`app.providers.naming.TAG_ABANDONED` tag on the Pod, GCE
    instance or libvirt domain) is what keeps GC off the instance for good; the Redis set
    :data:`ABANDONED_KEY` is only an extra hint.  While the mark cannot be written (a dead KVM
    host, an API outage) the Proxy is kept, Terminating, with a condition saying why: as long
    as it exists its UID is live, so GC leaves the instance alone; releasing it unmarked would
    hand the instance to GC as soon as Redis forgets.  Transient errors are retried with
    backoff, QuotaExceeded and Permanent ones slowly (``quota_backoff``).  A provider (or KVM
    host) no longer in the config cannot be marked, and is not listed by GC either: released
    at once.  docs/architecture.md (fault table) and docs/providers.md explain the choice.
    """
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
                latest(_write_status(ctx, latest.proxy, {"phase": TERMINATING, "conditions": _provisioned(
                    latest.proxy, "False", getattr(exc, "reason", "") or cls.__name__, message)}))
                if attempt == 0:
                    ctx.kube.record_event(latest.proxy, "Warning", "AbandonFailed", message=message)
                delay = backoff(ctx.settings, attempt) if cls is Transient else ctx.settings.quota_backoff
                return Followup(DELETE, delay, attempt + 1)
    log.info("proxy %s: skip-cleanup set; releasing without deleting the instance%s", proxy.key,
             f" ({provider_id} marked abandoned)" if marked else "")
    ctx.kube.record_event(latest.proxy, "Normal", "SkipCleanup",
                          message=f"instance {provider_id} left in place and marked abandoned (skip-cleanup)" if marked
                          else "instance left in place (skip-cleanup)")
    credentials.delete(ctx.kube, latest.proxy)
    ctx.kube.remove_finalizer(latest.proxy)
    return None


def delete(ctx: Context, ref: Ref, attempt: int = 0) -> Followup | None:
    """Finish a deletion: delete the instance, and release the finalizer only once it is gone.

    The skip-cleanup annotation is honoured first (:func:`_skip_cleanup`: the instance is
    marked abandoned, never deleted, then the finalizer is released).
    Provider ``delete`` is called even when ``get`` would fail: it is idempotent and can
    converge where ``get`` cannot.  Then ``get`` must answer NotFound (a Pod still
    terminating, an operation still running: poll again with backoff).  Without a recorded
    provider ID the instance is deleted by name wherever it may be
    (:func:`_instances_to_delete`).  When nothing is found while a create may still be making
    the instance (its write-ahead stamped ``status.createStartedAt`` less than
    :func:`create_window` ago, and this delete has not seen the instance), the finalizer is
    kept and the step looks again (``WaitingForCreate``): the per-Proxy lock normally keeps a
    delete from running beside a create, but a lost lock (a Redis flush) does not, and the
    create's own check after its provider call may never run (the worker dies there).  A delete
    that sees the instance clears the stamp before deleting it, so its own retry (a 409 on the
    finalizer, a failed provider delete) never waits.  The fault table in docs/architecture.md
    lists the cases.
    """
    proxy = _load(ctx, ref)
    if proxy is None or not proxy.deleting or FINALIZER not in proxy.finalizers:
        return None

    latest = _Latest(proxy)

    def step() -> Followup | None:
        serving.withdraw(ctx.redis, proxy.uid)
        if proxy.skip_cleanup:
            return _skip_cleanup(ctx, latest, proxy, attempt)
        p = latest(_write_status(ctx, proxy, {"phase": TERMINATING}))
        if p.spec.managed:
            found = _instances_to_delete(ctx, p)
            if found is not None:
                provider, ids = found
                # A create may still be making the instance (its write-ahead is recent): whether
                # this delete sees one tells it that create's provider call has made it.
                in_flight = create_in_flight(ctx.settings, p)
                seen = in_flight > 0 and any(_exists(provider, i) for i in ids)
                if seen:
                    # Recorded before deleting: a retry of this step (a Transient delete, a 409 on
                    # the finalizer) finds nothing and must not wait for a create that is done.
                    p = latest(_write_status(ctx, p, {"createStartedAt": None}))
                for provider_id in ids:
                    provider.delete(provider_id)
                left = [i for i in ids if _exists(provider, i)]
                if left:
                    changes = {"conditions": _provisioned(p, "False", "Deleting",
                                                          f"waiting for instance {left[0]} to be gone")}
                    if p.status.get("createStartedAt"):
                        changes["createStartedAt"] = None  # seen: the create made it; nothing more to wait for
                    latest(_write_status(ctx, p, changes))
                    return Followup(DELETE, poll_delay(ctx.settings, attempt), attempt + 1)
                if in_flight and not seen:
                    # Nothing found, but the create may still make it (the per-Proxy lock was lost,
                    # e.g. Redis flushed, so this delete runs beside it): keep the finalizer and
                    # look again until the instance shows up or no create can still be running.
                    until = timefmt.rfc3339(time.time() + in_flight)
                    message = (f"instance {ids[0]} not found, but the create started at "
                               f"{p.status['createStartedAt']} may still make it; looking again until {until}")
                    log.info("proxy %s: delete: %s", p.key, message)
                    latest(_write_status(ctx, p, {"conditions": _provisioned(p, "False", "WaitingForCreate",
                                                                              message)}))
                    return Followup(DELETE, min(poll_delay(ctx.settings, attempt), in_flight + 0.1), attempt + 1)
                if p.status.get("providerID"):
                    ctx.kube.record_event(p, "Normal", "InstanceDeleted", message=f"instance {ids[0]} deleted")
                else:
                    _retire_on_other_hosts(ctx, p, provider, ids)
        credentials.delete(ctx.kube, p)
        ctx.kube.remove_finalizer(p)
        return None

    return _guard(ctx, latest, DELETE, attempt, step)
