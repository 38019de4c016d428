"""core/v1 Events about the operator's objects: one body, recorded best effort.

:func:`record_event` builds and creates every Event the operator records (about Proxies, through
the status writer and the reconciler, and about ProxyPools, through the pool controller);
:class:`EventApi` is the gateway's part for them and :class:`KubernetesEvents` implements it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol

from kubernetes import client as k8s

from app.kube.client import ApiGroups
from app.pools.model import Pool
from app.resources import GROUP, KIND, POOL_KIND, VERSION, Proxy

log = logging.getLogger(__name__)

#: The longest Event message sent, characters (longer ones are cut).
MESSAGE_LIMIT = 1024
#: ``source.component`` and ``reportingComponent`` of every Event.
COMPONENT = "proxy-operator"


@dataclass(frozen=True)
class Involved:
    """The object an Event is about (its ``involvedObject``).

    Attributes:
        kind: ``Proxy`` or ``ProxyPool`` (group and version are the operator's).
        namespace / name / uid / resource_version: the object as last read or written.
    """

    kind: str
    namespace: str
    name: str
    uid: str
    resource_version: str


def event_body(about: Involved, event_type: str, reason: str, message: str) -> k8s.CoreV1Event:
    """Return the core/v1 Event ``about`` an object, stamped now.

    Args:
        about: the object.
        event_type: ``"Normal"`` or ``"Warning"``.
        reason: CamelCase reason.
        message: human-readable, never secrets; cut at :data:`MESSAGE_LIMIT` characters.
    Returns:
        the Event (``metadata.generateName`` ``<name>.``, count 1).
    """
    now = datetime.now(timezone.utc)
    return k8s.CoreV1Event(
        metadata=k8s.V1ObjectMeta(generate_name=f"{about.name}.", namespace=about.namespace),
        involved_object=k8s.V1ObjectReference(
            api_version=f"{GROUP}/{VERSION}", kind=about.kind, name=about.name,
            namespace=about.namespace, uid=about.uid, resource_version=about.resource_version),
        reason=reason, message=message[:MESSAGE_LIMIT], type=event_type,
        first_timestamp=now, last_timestamp=now, count=1,
        source=k8s.V1EventSource(component=COMPONENT),
        reporting_component=COMPONENT, reporting_instance=os.environ.get("HOSTNAME", COMPONENT),
    )


def record_event(core: k8s.CoreV1Api, about: Involved, event_type: str, reason: str, *, message: str,
                 label: str) -> None:
    """Create an Event ``about`` an object; best effort (a failure is logged, never raised).

    Args:
        core: the ``CoreV1Api`` to create it through.
        about: the object.
        event_type / reason / message: as :func:`event_body` takes them.
        label: how the log names the object when the Event is not recorded.
    """
    try:
        core.create_namespaced_event(about.namespace, event_body(about, event_type, reason, message))
    except Exception as exc:  # noqa: BLE001 - events are best effort by design
        log.warning("event not recorded for %s: %s %s", label, reason, exc)


class EventApi(Protocol):
    """The gateway's Events (core/v1): best effort, never raising."""

    def record_event(self, proxy: Proxy, event_type: str, reason: str, *, message: str) -> None:
        """Create an Event about ``proxy``; best effort (never raises)."""

    def record_pool_event(self, pool: Pool, event_type: str, reason: str, *, message: str) -> None:
        """Create an Event about ``pool``; best effort (never raises)."""


class KubernetesEvents(ApiGroups):
    """:class:`EventApi` over the ``kubernetes`` client (a part of :class:`app.kube.gateway.KubernetesGateway`)."""

    def record_event(self, proxy: Proxy, event_type: str, reason: str, *, message: str) -> None:
        """Create a core/v1 Event about ``proxy`` (best effort: failures are logged, not raised).

        Args:
            proxy: the Proxy as last read or written.
            event_type: ``"Normal"`` or ``"Warning"``.
            reason: CamelCase reason (e.g. ``"Provisioning"``).
            message: human-readable, never secrets (cut at 1024 characters).
        """
        about = Involved(KIND, proxy.namespace, proxy.name, proxy.uid, proxy.resource_version)
        record_event(self.core, about, event_type, reason, message=message, label=proxy.key)

    def record_pool_event(self, pool: Pool, event_type: str, reason: str, *, message: str) -> None:
        """Create a core/v1 Event about ``pool`` (best effort: failures are logged, not raised).

        Args:
            pool: the ProxyPool as last read or written.
            event_type: ``"Normal"`` or ``"Warning"``.
            reason: CamelCase reason (``"MemberCreated"``, ``"MemberDraining"``, ``"MemberDeleted"``).
            message: human-readable (member names, counts; never a spec), cut at 1024 characters.
        """
        about = Involved(POOL_KIND, pool.namespace, pool.name, pool.uid, pool.resource_version)
        record_event(self.core, about, event_type, reason, message=message, label=f"pool {pool.key}")


__all__ = ["COMPONENT", "MESSAGE_LIMIT", "EventApi", "Involved", "KubernetesEvents", "event_body", "record_event"]
