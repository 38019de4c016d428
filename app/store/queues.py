"""The broker's queue names (the broker is Redis: kombu keeps each queue in a list of that name).

One definition, read by the dispatcher (which queue a message goes to), Celery's routing and
broker checks (``workers/``) and the ACL users (:mod:`app.store.acl`: which lists a component
may touch).
"""

PROXIES = "proxies"
HEALTH = "health"
GC = "gc"
#: Every host queue starts with this (the broker re-creates lost bindings of these queues).
HOST_QUEUE_PREFIX = "kvm."


def kvm_queue(provider: str, host: str) -> str:
    """Return the queue of KVM host ``host`` of provider ``provider``: ``"kvm.<provider>.<host>"``.

    The one definition of a host queue's name: the dispatcher routes to it, a dedicated worker
    (``proxy-operator worker --kvm-host <provider>/<host>``) consumes it.
    """
    return f"{HOST_QUEUE_PREFIX}{provider}.{host}"
