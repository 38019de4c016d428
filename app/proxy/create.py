"""The create step: make sure a Proxy has its finalizer and its instance.

Managed: the provider ID the instance will have is written to the status first (the
write-ahead, decision 16), then provider ``create`` (idempotent by name), then status
Provisioning and a poll.  A changed spec replaces the instance: in the same place the old one
is deleted first; elsewhere it is handed to :func:`app.proxy.retire.hand_over` and the new one
is created without waiting (decision 17).  External: status Running with the endpoint,
published to the serving view.
"""

from __future__ import annotations

import logging

from kubernetes.client import ApiException

from app import timefmt
from app.config import tenancy
from app.errors import SpecNotAllowed, Transient, describe
from app.kube import credentials, status_writer
from app.providers import naming
from app.providers.base import CreateRequest, Instance, InstanceState, Provider
from app.proxy.decide import LIVE_PHASES, poll_delay
from app.proxy.failures import guard
from app.proxy.retire import credentials_hash, hand_over, replacement_cause
from app.proxy.provisioned import mark_running, provisioned
from app.proxy.step import (CREATE, DELETE, LOGGER, POLL, Context, Followup, Ref, Step, instance_exists, load,
                            squid_policy)
from app.resources import PROVISIONING, Proxy
from app.serving import view as serving
from app.squid import conf as squid_conf
from app.squid import egress

log = logging.getLogger(LOGGER)


def create(ctx: Context, ref: Ref, attempt: int = 0) -> Followup | None:
    """Make sure the Proxy has a finalizer and an instance.

    Args:
        ctx: the collaborators.
        ref: the Proxy.
        attempt: the retry counter the step was queued with.

    Returns:
        the followup to enqueue (a poll, a delete for a Proxy found terminating, a retry), or
        ``None``.

    Raises:
        Exception: only for errors reading the Proxy itself (a failed create is written to its
            status by :func:`app.proxy.failures.guard`); :func:`app.dispatch.proxies.run_step`
            retries the step with backoff.
    """
    proxy = load(ctx, ref)
    if proxy is None:
        return None
    if proxy.deleting:
        return Followup(DELETE, 0)
    return guard(Step(ctx, CREATE, attempt, proxy), _ensure_instance)


def _ensure_instance(step: Step) -> Followup | None:
    """The create step's work on the Proxy it read (:func:`create`)."""
    ctx = step.ctx
    p = step.keep(ctx.kube.add_finalizer(step.proxy))
    refused = tenancy.refusal(ctx.tenancy, p)
    if refused is not None:
        raise SpecNotAllowed(*refused)  # Failed, withdrawn from serving (app.proxy.failures.fail)
    if not p.spec.managed:
        address = p.spec.host or ""
        inst = Instance(provider_id="", name=p.name, state=InstanceState.RUNNING, address=address)
        mark_running(ctx, p, inst, {"providerID": None, "specHash": p.spec_hash})
        return None
    provider = ctx.registry.get(p.spec.provider)
    old_id = p.status.get("providerID")
    old_provider: str = p.status.get("provider") or p.spec.provider or ""  # set: the registry knows it
    same_spec = bool(old_id) and p.status.get("specHash") == p.spec_hash
    if same_spec and p.phase in LIVE_PHASES:
        # Nothing about the instance changed (e.g. healthCheck or maxLeases did): record the
        # generation and let poll confirm the instance.
        step.write(p, {"observedGeneration": p.generation})
        return Followup(POLL, 0)
    name = naming.instance_name(p.uid)
    new_id = provider.instance_ids(name, p.namespace, p.spec.zone)[0]
    # Built before anything is written or torn down: a request that cannot be built yet (a
    # missing cloud-init Secret: Transient) leaves no createStartedAt stamp for a delete to
    # wait out, and a running instance is not replaced by nothing.
    request = _request(ctx, p)
    retire_old: str | None = None  # the replaced instance, handed over after the write-ahead
    if old_id and (old_id != new_id or old_provider != p.spec.provider or not same_spec):
        message = f"{replacement_cause(p)}: replacing instance {old_id}"
        log.info("proxy %s: %s", p.key, message)
        serving.withdraw(ctx.redis, p.uid)
        p = step.write(p, {"phase": PROVISIONING, "address": None, "conditions": provisioned(
            p, "False", "Replacing", message, withdrawn=True)}, event=("Normal", "Replacing", message))
        if old_id == new_id and old_provider == p.spec.provider:
            provider.delete(old_id)  # same place and name: the old one must go first (same queue)
        else:
            # Elsewhere: handed over only once the write-ahead below names the new instance, since
            # retire_instance keeps an instance the status still names (decision 17).
            retire_old = old_id
            if instance_exists(provider, new_id):
                # A leftover of an earlier stay here, built from an older spec: create would adopt
                # it as is (idempotent by name), so delete it first; it is on this queue.
                log.info("proxy %s: deleting leftover instance %s before creating there", p.key, new_id)
                provider.delete(new_id)
    # Write-ahead: record where the instance will be *before* creating it, so a delete that
    # arrives at any point finds it (decision 16).
    p = step.write(p, {
        "phase": PROVISIONING, "providerID": new_id, "provider": p.spec.provider, "instanceName": name,
        "specHash": p.spec_hash, "observedGeneration": p.generation, "address": None,
        "createStartedAt": timefmt.rfc3339(millis=True),  # a delete waits out create_window() from here
        "conditions": provisioned(p, "False", "Creating", f"creating instance {name}"),
    })
    if retire_old:
        hand_over(ctx, old_provider, retire_old, Ref(p.namespace, p.name, p.uid))
    try:
        inst = provider.create(request)
    except BaseException:
        _delete_if_abandoned(ctx, p, provider, new_id)
        raise
    made = p  # the object as the write-ahead left it: the spec the instance was made from
    # Optimistic: the write carries the write-ahead's resourceVersion, so it goes through only if
    # nothing touched the Proxy during the create; any change makes it 409 (404 once gone): then
    # re-read and decide (decision 16).
    written = None
    changes = _provisioning(made, inst, request, made)
    if status_writer.changed(made.status, changes):  # always (the condition's reason changes)
        try:
            written = status_writer.write(ctx.kube, made, changes)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
            log.info("proxy %s: changed while its instance was created (%s); re-reading", p.key, exc.status)
    if written is None:
        current = load(ctx, Ref(p.namespace, p.name, p.uid))
        if current is None:
            # The Proxy went away while we created (its finalizer was released meanwhile):
            # nothing would ever delete what we just made.
            log.warning("proxy %s: gone while its instance was created; deleting %s", p.key, inst.provider_id)
            provider.delete(inst.provider_id)
            return None
        if current.deleting:
            return Followup(DELETE, 0)
        written = status_writer.write(ctx.kube, current, _provisioning(made, inst, request, current))
    p = step.keep(written)
    if inst.state == InstanceState.RUNNING and inst.address:
        mark_running(ctx, p, inst)
        return None
    return Followup(POLL, poll_delay(ctx.settings, 0), 0, proxy=p)


def _provisioning(made: Proxy, inst: Instance, request: CreateRequest, base: Proxy) -> dict:
    """The status after the provider's create, written over ``base``.

    It records the spec the instance was made from (``made``'s, the write-ahead's), never a
    re-read one: a spec change that landed during the create must still look unobserved, so
    :func:`app.proxy.decide.decide` replaces the instance.
    """
    return {
        "phase": PROVISIONING, "providerID": inst.provider_id, "provider": made.spec.provider,
        "instanceName": inst.name, "specHash": made.spec_hash, "observedGeneration": made.generation,
        "address": None, "credentialsHash": credentials_hash(request.auth_htpasswd),
        "conditions": provisioned(base, "False", "Provisioning", f"instance {inst.name} requested"),
    }


def _delete_if_abandoned(ctx: Context, proxy: Proxy, provider: Provider, provider_id: str) -> None:
    """After a failed create: if the Proxy is gone, delete whatever the create left (best effort)."""
    try:
        if load(ctx, Ref(proxy.namespace, proxy.name, proxy.uid)) is not None:
            return  # the delete step (or a retry) finds it by the recorded provider ID
        provider.delete(provider_id)
        log.warning("proxy %s: gone while its create failed; deleted %s", proxy.key, provider_id)
    except Exception as exc:  # noqa: BLE001 - the create's own error is what the caller reports
        log.warning("proxy %s: cleaning up after a failed create: %s (GC collects it)", proxy.key, describe(exc))


def _user_data(ctx: Context, proxy: Proxy) -> bytes | None:
    """The instance's cloud-init user-data: inline, or read from the Secret the spec names."""
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


def _request(ctx: Context, proxy: Proxy) -> CreateRequest:
    """What the provider is asked to create for ``proxy`` (its basic-auth Secret ensured first)."""
    spec = proxy.spec
    policy = squid_policy(ctx, proxy)
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
