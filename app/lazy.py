"""Fork-aware lazy singletons: one value per process, built on first use.

Clients (Kubernetes, Redis, SSH, thread pools) must not be shared across ``fork``: a Celery
prefork child or a granian worker inherits its parent's module globals, sockets and locks
included.  :func:`per_process` wraps a factory so that each process builds its own value the
first time it asks, and every thread of that process gets the same one::

    @per_process
    def api_client() -> k8s.ApiClient:
        \"\"\"This process's client.\"\"\"
        return k8s.ApiClient(load_configuration())

    api_client()        # built here (once per PID)
    api_client.reset()  # tests: the next call builds a new one
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """A callable that returns ``factory()``, built once per process (see :func:`per_process`).

    Thread-safe: concurrent first calls build one value.  A factory that raises leaves nothing
    cached, so the next call tries again.  The value an inherited parent built is never
    returned in a forked child, and never closed by it (its sockets are the parent's).
    """

    _instances: "weakref.WeakSet[PerProcess]" = weakref.WeakSet()

    def __init__(self, factory: Callable[[], T]) -> None:
        self.factory = factory
        self._lock = threading.Lock()
        self._value: T | None = None
        self._pid: int | None = None
        functools.update_wrapper(self, factory)
        PerProcess._instances.add(self)

    def __call__(self) -> T:
        """Return this process's value, building it on the first call in this process."""
        pid = os.getpid()
        if self._pid == pid:
            return self._value  # type: ignore[return-value]
        with self._lock:
            if self._pid != pid:
                self._value = self.factory()
                self._pid = pid
            return self._value  # type: ignore[return-value]

    def reset(self) -> None:
        """Forget the value, so the next call builds a new one (for tests; nothing is closed)."""
        with self._lock:
            self._pid = None
            self._value = None


def _new_locks_in_child() -> None:
    # A lock held by another thread at fork time stays held in the child: give each its own.
    for instance in list(PerProcess._instances):
        instance._lock = threading.Lock()


os.register_at_fork(after_in_child=_new_locks_in_child)


def per_process(factory: Callable[[], T]) -> PerProcess[T]:
    """Return a thread-safe callable that builds ``factory()`` once per process (PID).

    Usable as a decorator; the result keeps the factory's name and docstring and has a
    ``reset()`` for tests.
    """
    return PerProcess(factory)


__all__ = ["PerProcess", "per_process"]
