"""The metrics decorator every provider is wrapped in.

Counts requests by provider, type, operation and outcome class (``ok`` or the taxonomy class
name) and observes their duration.  Health checks use the unwrapped provider, so they never
count as provider requests; ``check`` is therefore not forwarded through the wrapper.

Capabilities are declared by the wrapper's class, never forwarded by accident: a wrapped
:class:`~app.providers.base.ShardedProvider` is a :class:`MeteredShardedProvider`, which
implements that Protocol itself; a plain :class:`MeteredProvider` refuses the capability members
(``hosts``, ``host_of``, ``check_host``, ``check``), so ``isinstance(wrapper, <capability>)``
answers what the wrapper's class declares.
"""

from __future__ import annotations

import time

from app.observability.metrics import PROVIDER_DURATION, PROVIDER_REQUESTS
from app.providers.base import Provider, ShardedProvider
from app.errors import classify

OPERATIONS = ("create", "get", "delete", "list_by_tag", "abandon", "start")
#: Members of capability Protocols: only a wrapper class that declares the capability has them.
CAPABILITY_MEMBERS = frozenset({"check", "hosts", "host_of", "check_host"})


class MeteredProvider(Provider):
    """Wraps a provider; other attributes than the metered operations pass through, except the
    capability members (:data:`CAPABILITY_MEMBERS`), which raise ``AttributeError``.

    Args:
        inner: the provider.
        name / ptype: labels for the metrics.
    """

    def __init__(self, inner, name: str, ptype: str) -> None:
        self.inner, self.name, self.type = inner, name, ptype

    @property
    def credentials_in_instance(self) -> bool:  # type: ignore[override]  # read-only: the wrapped provider says
        """The wrapped provider's :attr:`~app.providers.base.Provider.credentials_in_instance`."""
        return bool(self.inner.credentials_in_instance)

    def _call(self, operation: str, *args, **kwargs):
        start = time.perf_counter()
        outcome = "ok"
        try:
            return getattr(self.inner, operation)(*args, **kwargs)
        except Exception as exc:
            outcome = classify(exc).__name__
            raise
        finally:
            PROVIDER_REQUESTS.labels(self.name, self.type, operation, outcome).inc()
            PROVIDER_DURATION.labels(self.name, self.type, operation).observe(time.perf_counter() - start)

    def create(self, request):
        return self._call("create", request)

    def get(self, provider_id):
        return self._call("get", provider_id)

    def delete(self, provider_id):
        return self._call("delete", provider_id)

    def list_by_tag(self, tag, **kwargs):
        return self._call("list_by_tag", tag, **kwargs)

    def abandon(self, provider_id):
        return self._call("abandon", provider_id)

    def start(self, provider_id):
        return self._call("start", provider_id)

    def instance_ids(self, name, namespace, zone=None):
        return self.inner.instance_ids(name, namespace, zone)

    def __getattr__(self, attr):
        if attr == "check":
            raise AttributeError("health checks must use the unwrapped provider")
        if attr in CAPABILITY_MEMBERS:
            raise AttributeError(f"{attr}: not a capability this wrapper declares")
        return getattr(self.inner, attr)


class MeteredShardedProvider(MeteredProvider, ShardedProvider):
    """:class:`MeteredProvider` of a :class:`~app.providers.base.ShardedProvider` (kvm), declaring it too.

    ``hosts``, ``host_of`` and ``check_host`` pass through unmetered (``check_host`` is a health
    check); ``list_by_tag(tag, host=...)`` is metered like every listing.
    """

    def hosts(self) -> list[str]:
        return self.inner.hosts()

    def host_of(self, provider_id: str) -> str | None:
        return self.inner.host_of(provider_id)

    def check_host(self, host: str):
        return self.inner.check_host(host)

    def list_by_tag(self, tag, host=None, **kwargs):
        if host is not None:
            kwargs["host"] = host
        return self._call("list_by_tag", tag, **kwargs)


def wrap(provider, pc) -> MeteredProvider:
    """Registry ``wrap`` hook: meter ``provider`` under its config entry's name and type.

    Returns a :class:`MeteredShardedProvider` when ``provider`` is a
    :class:`~app.providers.base.ShardedProvider`, else a :class:`MeteredProvider`.
    """
    cls = MeteredShardedProvider if isinstance(provider, ShardedProvider) else MeteredProvider
    return cls(provider, pc.name, pc.type)
