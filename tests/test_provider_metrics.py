"""The metrics decorator counts provider requests by outcome class; checks bypass it."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from app.config.providers import ProviderConfig, ProvidersConfig
from app.providers.base import Instance, InstanceState, ListResult, TargetVerdict
from app.errors import NotFound
from app.providers.metrics import wrap
from app.providers.registry import UnknownProvider, build


class Toy:
    """A provider whose get always misses."""

    def create(self, request):
        return Instance("id", "n", InstanceState.RUNNING)

    def get(self, provider_id):
        raise NotFound("no such instance")

    def delete(self, provider_id):
        raise RuntimeError("unclassified")

    def list_by_tag(self, tag):
        return ListResult([])

    def check(self):
        return [TargetVerdict("t", True, "Ready")]


def count(op, outcome, provider="toy"):
    return REGISTRY.get_sample_value("proxy_operator_provider_requests_total",
                                     {"provider": provider, "type": "toytype", "operation": op, "outcome": outcome}) or 0


def test_requests_counted_by_outcome_class_and_checks_not_counted():
    registry = build(ProvidersConfig((ProviderConfig("toy", "toytype", 60, 15, None),)),
                     {"toytype": lambda pc: Toy()}, wrap=wrap)
    provider = registry.get("toy")
    provider.create(None)
    with pytest.raises(NotFound):
        provider.get("x")
    with pytest.raises(RuntimeError):
        provider.delete("x")
    assert count("create", "ok") == 1 and count("get", "NotFound") == 1 and count("delete", "Transient") == 1
    with pytest.raises(AttributeError):
        provider.check  # noqa: B018 - health checks must go through the unwrapped provider
    registry.unwrapped["toy"].check()
    assert sum(count(op, o) for op in ("check",) for o in ("ok",)) == 0
    with pytest.raises(UnknownProvider, match="'nope' is not configured"):
        registry.get("nope")
