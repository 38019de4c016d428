"""What one reconcile step is given, shares and returns.

A step (:func:`app.proxy.create.create`, :func:`app.proxy.poll.poll`,
:func:`app.proxy.delete.delete`) is called with a :class:`Context` and a :class:`Ref`, re-reads
the Proxy (:func:`load`), does its work with a :class:`Step` (which remembers the newest
version of the Proxy it wrote) and returns a :class:`Followup` or ``None``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from app.config.settings import Settings
from app.config.tenancy import Tenancy
from app.errors import NotFound, Permanent
from app.kube import status_writer
from app.kube.gateway import KubeGateway
from app.providers.base import Provider
from app.providers.registry import Registry
from app.resources import ObjectRef, Proxy
from app.squid import conf as squid_conf

#: The logger of every reconcile module: one name for the reconciler's log lines, whichever
#: module of :mod:`app.proxy` writes them (log filters and dashboards select on it).
LOGGER = "app.proxy.reconcile"

log = logging.getLogger(LOGGER)

#: The actions a step can be asked for, and a followup can name.
CREATE, POLL, DELETE = "create", "poll", "delete"


#: A reference to one Proxy: all a task payload ever carries (decision 1).
Ref = ObjectRef


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
    """Collaborators of the reconcile steps.

    Attributes:
        kube: the :class:`app.kube.gateway.KubeGateway` (every Kubernetes API call of a step).
        registry: built providers.
        redis: ``redis.Redis`` (serving view).
        settings: :class:`app.config.settings.Settings`.
        squid_policy: fallback squid policy when the provider's config entry has none.
        retire: ``retire(provider_name, provider_id, ref)`` has a replaced instance deleted
            *where it lives*: the task layer queues :func:`app.proxy.retire.retire_instance` on
            that instance's own queue (a KVM host's), so a step never touches another place.
            ``None`` (tests, single-process tools) runs it inline.
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


@dataclass
class Step:
    """One run of a step on one Proxy.

    Attributes:
        ctx: the collaborators.
        action: :data:`CREATE`, :data:`POLL` or :data:`DELETE`.
        attempt: the retry counter the step was queued with (0-based).
        proxy: the Proxy as the step read it.
        latest: the newest version of the Proxy the step has written (at first ``proxy``); a
            failure is recorded on it (:func:`app.proxy.failures.guard`).
    """

    ctx: Context
    action: str
    attempt: int
    proxy: Proxy
    latest: Proxy = field(init=False)

    def __post_init__(self) -> None:
        self.latest = self.proxy

    def keep(self, proxy: Proxy) -> Proxy:
        """Remember ``proxy`` as the newest version written.

        Args:
            proxy: the API's answer to a write of this step.

        Returns:
            ``proxy``.
        """
        self.latest = proxy
        return proxy

    def write(self, proxy: Proxy, changes: Mapping, *, event: status_writer.Event | None = None) -> Proxy:
        """Write the status ``changes`` of ``proxy`` (:func:`app.kube.status_writer.write`) and keep the answer.

        Args:
            proxy: the version the changes were computed from (its resourceVersion is the
                write's precondition, decision 15).
            changes: status keys to merge; ``None`` deletes a key.
            event: ``(type, reason, message)`` recorded when the write happens; without it a
                phase change records the default Event of the new phase.

        Returns:
            the Proxy as written (``proxy`` itself when nothing differed).

        Raises:
            kubernetes.client.ApiException: 409 (``proxy`` is stale), 404 (gone), others.
        """
        return self.keep(status_writer.write(self.ctx.kube, proxy, changes, event=event))


def load(ctx: Context, ref: Ref) -> Proxy | None:
    """Read the Proxy ``ref`` names.

    Args:
        ctx: the collaborators.
        ref: the Proxy's namespace, name and UID.

    Returns:
        the Proxy, or ``None`` when it is gone or was replaced by another object of that name.

    Raises:
        kubernetes.client.ApiException: the read failed.
    """
    proxy = ctx.kube.get_proxy(ref.namespace, ref.name)
    if proxy is None or proxy.uid != ref.uid:
        return None
    return proxy


def squid_policy(ctx: Context, proxy: Proxy) -> squid_conf.SquidPolicy | None:
    """The squid policy ``proxy``'s instance gets: its provider entry's, else ``ctx.squid_policy``.

    Args:
        ctx: the collaborators.
        proxy: the Proxy.

    Returns:
        the policy, or ``None`` (squid's defaults).
    """
    pc = ctx.registry.configs.get(proxy.spec.provider or "")
    return pc.squid if pc is not None else ctx.squid_policy


def instance_exists(provider: Provider, provider_id: str) -> bool:
    """Whether ``provider_id`` still exists (a Pod still terminating does).

    Args:
        provider: the provider the instance belongs to.
        provider_id: the instance's provider ID.

    Returns:
        ``False`` on NotFound, and on a Permanent answer (e.g. a host removed from the config:
        nothing is left that could be reached).

    Raises:
        ProviderError: a Transient or QuotaExceeded answer.
    """
    try:
        provider.get(provider_id)
    except NotFound:
        return False
    except Permanent as exc:
        log.info("instance %s: cannot be checked (%s); counting it as gone", provider_id, exc)
        return False
    return True
