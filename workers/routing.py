"""Queue names and task routing.

Every task that touches KVM host H of provider P runs on ``kvm.P.H`` so that one worker owns
H's pooled SSH+libvirt connection and a slow host never blocks the others.  The dispatcher
knows the Proxy (and so its provider and zone) when it enqueues, so it passes the queue
explicitly (:func:`queue_for`); :func:`route_task` only supplies defaults by task name.
"""

from __future__ import annotations

PROXIES = "proxies"
HEALTH = "health"
GC = "gc"

_DEFAULTS = {"health.": HEALTH, "gc.": GC, "proxy.resync": GC}


def kvm_queue(provider: str, host: str) -> str:
    """Return the queue of KVM host ``host`` of provider ``provider``: ``"kvm.<provider>.<host>"``."""
    return f"kvm.{provider}.{host}"


def queue_for(provider_obj, zone: str | None) -> str:
    """Return the queue for work on an instance of ``provider_obj`` in ``zone``.

    Providers that need dedicated queues implement ``queue_for(zone) -> str | None``
    (the kvm provider returns :func:`kvm_queue`); everything else uses ``proxies``.
    """
    fn = getattr(provider_obj, "queue_for", None)
    if fn is not None:
        queue = fn(zone)
        if queue:
            return queue
    return PROXIES


def queue_for_instance(provider_obj, provider_id: str) -> str:
    """Return the queue for work on the existing instance ``provider_id`` of ``provider_obj``.

    The place is read from the ID itself (a KVM provider ID names its host), never from a
    Proxy's spec, which may already point elsewhere.
    """
    host_of = getattr(provider_obj, "host_of", None)
    zone = host_of(provider_id) if host_of is not None else None
    return queue_for(provider_obj, zone) if zone else PROXIES


def host_queues(provider_obj) -> dict[str, str]:
    """Return ``{host: queue}`` for a provider whose work is split by host (kvm), else ``{}``.

    Sharded GC listings and per-host checks go to these queues, one task per host.
    """
    hosts = provider_obj.hosts() if hasattr(provider_obj, "hosts") else []
    return {host: queue_for(provider_obj, host) for host in hosts}


def route_task(name, args, kwargs, options, task=None, **kw):
    """Celery router: default queue by task-name prefix when the caller gave none."""
    for prefix, queue in _DEFAULTS.items():
        if name.startswith(prefix):
            return {"queue": queue}
    return None
