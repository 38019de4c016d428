"""Instances that stop being a Proxy's: deleting a replaced one where it lives, and noticing that
the basic-auth credentials baked into an instance were rotated (which replaces it).

A replaced instance somewhere else (another zone, KVM host or provider) is handed over
(:func:`hand_over`) to :func:`retire_instance` on that place's own queue, never waited for;
GC collects it as superseded if that place stays unreachable (decision 17).
"""

from __future__ import annotations

import hashlib
import logging

from app.errors import NotFound, Permanent, describe
from app.kube import credentials
from app.providers import naming
from app.providers.base import Provider, ShardedProvider
from app.proxy.step import LOGGER, Context, Ref, load, squid_policy
from app.resources import Proxy

log = logging.getLogger(LOGGER)

#: ``status.specHash`` written by poll when a kvm/gcp instance's basic-auth Secret was rotated:
#: matches no spec's hash (those are hex digests), so :func:`app.proxy.decide.decide` hands the
#: Proxy to create, which replaces the instance; create's write-ahead overwrites it.
ROTATED_SPEC_HASH = "credentials-rotated"


def retire_instance(ctx: Context, provider_name: str, provider_id: str, *, ref: Ref) -> bool:
    """Delete a replaced instance unless its Proxy names it again.

    Runs on the instance's own queue (the task layer routes it there).  The arguments come from
    a task message, so they are not trusted: the instance is kept unless it carries our
    managed-by tag, ``ref.uid`` as its Proxy UID and no abandoned mark, and unless the Proxy's
    status records ``provider_id`` again (moved back; compared by ID alone, decision 17).

    Args:
        ctx: the collaborators.
        provider_name: the provider the instance belongs to.
        provider_id: the instance's provider ID.
        ref: the Proxy the instance was replaced for.

    Returns:
        whether the instance was deleted.

    Raises:
        ProviderError: reading or deleting failed (the caller retries; GC collects the
            instance as superseded if it never succeeds).
        kubernetes.client.ApiException: reading the Proxy failed.
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
    proxy = load(ctx, ref)
    if proxy is not None and proxy.status.get("providerID") == provider_id:
        log.info("proxy %s: instance %s is current again; not deleting it", proxy.key, provider_id)
        return False
    provider.delete(provider_id)
    log.info("proxy %s/%s: deleted replaced instance %s", ref.namespace, ref.name, provider_id)
    return True


def hand_over(ctx: Context, provider_name: str, provider_id: str, ref: Ref) -> None:
    """Have :func:`retire_instance` delete ``provider_id`` on its own queue (``ctx.retire``), or inline.

    Best effort: never raises; GC collects the instance as superseded if this fails.

    Args:
        ctx: the collaborators; without ``ctx.retire`` the retire runs here.
        provider_name: the provider the instance belongs to.
        provider_id: the replaced instance.
        ref: the Proxy it was replaced for.
    """
    try:
        if ctx.retire is not None:
            ctx.retire(provider_name, provider_id, ref)  # queued on the instance's own queue
            return
        retire_instance(ctx, provider_name, provider_id, ref=ref)  # inline (no task layer)
    except Exception as exc:  # noqa: BLE001 - best effort: GC collects the instance as superseded
        log.warning("proxy %s/%s: deleting replaced instance %s failed: %s (GC collects it)", ref.namespace,
                    ref.name, provider_id, describe(exc))


def retire_on_other_hosts(ctx: Context, proxy: Proxy, provider: Provider, looked: list[str]) -> None:
    """Hand the Proxy's instance name on every other host of a sharded provider to :func:`hand_over`.

    For a delete that found no recorded provider ID: it looks on the spec's host only (its own
    queue); a domain of this Proxy elsewhere is deleted by its host's worker, or collected by GC
    as an orphan while that host stays unreachable (decision 16).  Non-sharded providers list
    every place in ``instance_ids`` already (gcp: every zone): nothing to do.

    Args:
        ctx: the collaborators.
        proxy: the Proxy being deleted.
        provider: its provider.
        looked: the provider IDs the delete handled itself.
    """
    if not isinstance(provider, ShardedProvider):
        return
    name = naming.instance_name(proxy.uid)
    provider_name: str = proxy.status.get("provider") or proxy.spec.provider or ""  # set: the delete found it
    ref = Ref(proxy.namespace, proxy.name, proxy.uid)
    for host in provider.hosts():
        try:
            provider_id = provider.instance_ids(name, proxy.namespace, host)[0]
        except Permanent:
            continue
        if provider_id not in looked:
            hand_over(ctx, provider_name, provider_id, ref)


def replacement_cause(proxy: Proxy) -> str:
    """Why create is replacing ``proxy``'s instance, for the ``Replacing`` Event and condition.

    Args:
        proxy: the Proxy as create read it.

    Returns:
        ``"the basic-auth credentials changed"`` when poll handed it over for a rotation
        (:data:`ROTATED_SPEC_HASH`, kept until create's writes replace it, so a retried
        replacement still says so), ``"spec changed and the basic-auth credentials changed"``
        when a new generation landed meanwhile, else ``"spec changed"``.
    """
    if proxy.status.get("specHash") == ROTATED_SPEC_HASH:
        if proxy.status.get("observedGeneration") != proxy.generation:
            return "spec changed and the basic-auth credentials changed"
        return "the basic-auth credentials changed"
    return "spec changed"


def credentials_hash(htpasswd: str | None) -> str | None:
    """A digest of the htpasswd line an instance was given, recorded as ``status.credentialsHash``.

    The status keeps nothing secret this way (the line is itself a bcrypt hash).

    Args:
        htpasswd: the line, or ``None``.

    Returns:
        the first 16 hex digits of its SHA-256, or ``None`` when there is no line.
    """
    if not htpasswd:
        return None
    return hashlib.sha256(htpasswd.strip().encode("utf-8")).hexdigest()[:16]


def credentials_rotated(ctx: Context, proxy: Proxy, provider: Provider) -> bool:
    """Whether the Proxy's Secret now holds other credentials than its instance was built with.

    Only for providers that bake the htpasswd into the instance (``credentials_in_instance``:
    kvm vendor-data, gcp metadata); a kubernetes Pod mounts the Secret and follows it.  An
    instance that recorded no hash (an older release) is never replaced for this.

    Args:
        ctx: the collaborators.
        proxy: the Proxy.
        provider: its provider.

    Returns:
        whether the instance carries stale credentials.

    Raises:
        kubernetes.client.ApiException: reading the Secret failed.
    """
    if not provider.credentials_in_instance:
        return False
    policy = squid_policy(ctx, proxy)
    recorded = proxy.status.get("credentialsHash")
    if policy is None or not policy.basic_auth_file or not recorded:
        return False
    creds = credentials.read(ctx.kube, proxy)
    return creds is not None and credentials_hash(creds.htpasswd) != recorded
