"""The metrics decorator every provider is wrapped in.

Counts requests by provider, type, operation and outcome class (``ok`` or the taxonomy class
name) and observes their duration.  Health checks use the unwrapped provider, so they never
count as provider requests; ``check`` is therefore not forwarded through the wrapper.
"""

from __future__ import annotations

import time

from app.metrics import PROVIDER_DURATION, PROVIDER_REQUESTS
from app.providers.errors import classify

OPERATIONS = ("create", "get", "delete", "list_by_tag", "abandon", "start")


class MeteredProvider:
    """Wraps a provider; attributes other than the metered operations pass through (except ``check``).

    Args:
        inner: the provider.
        name / ptype: labels for the metrics.
    """

    def __init__(self, inner, name: str, ptype: str) -> None:
        self.inner, self.name, self.type = inner, name, ptype

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

    def __getattr__(self, attr):
        if attr == "check":
            raise AttributeError("health checks must use the unwrapped provider")
        return getattr(self.inner, attr)


def wrap(provider, pc) -> MeteredProvider:
    """Registry ``wrap`` hook: meter ``provider`` under its config entry's name and type."""
    return MeteredProvider(provider, pc.name, pc.type)
