"""The ProxyPool spec as the controller reads it: defaults, rounding, errors, template hash, age limits."""

from __future__ import annotations

import pytest

from app.serving import selectors
from app.pools.model import (AGE_JITTER, Pool, PoolSpec, PoolSpecError, age_limit, format_time, parse_time,
                             selector_requirements, selector_string, template_hash)

TEMPLATE = {"metadata": {"labels": {"app": "web"}}, "spec": {"provider": "k8s"}}


def spec(**fields) -> PoolSpec:
    return PoolSpec.from_dict({"template": TEMPLATE, **fields})


def test_defaults():
    s = spec()
    assert s.replicas == 1
    assert (s.max_surge, s.max_unavailable) == (1, 0)
    assert s.drain_timeout == 600
    assert s.max_age is None and s.autoscale is None and s.zones == ()
    assert s.selector == (selectors.Requirement("app", "=", ("web",)),)
    assert s.provider == "k8s" and s.max_leases == 5
    assert s.hash == template_hash({"app": "web"}, {"provider": "k8s"})


def test_percentages_round_like_a_deployment():
    s = spec(replicas=10, rollout={"maxSurge": "25%", "maxUnavailable": "25%"})
    assert (s.max_surge, s.max_unavailable) == (3, 2)  # surge rounds up, unavailable down


def test_surge_and_unavailable_both_zero_reads_as_surge_one():
    s = spec(replicas=4, rollout={"maxSurge": 0, "maxUnavailable": 0})
    assert (s.max_surge, s.max_unavailable) == (1, 0)


def test_max_age_and_drain_and_spread():
    s = spec(maxAge="6h", drain={"drainTimeoutSeconds": 120}, spread={"zones": ["a", "b"]})
    assert s.max_age == 6 * 3600 and s.drain_timeout == 120 and s.zones == ("a", "b")


@pytest.mark.parametrize("fields, path", [
    ({"replicas": -1}, "spec.replicas"),
    ({"maxAge": "six hours"}, "spec.maxAge"),
    ({"maxAge": "59s"}, "spec.maxAge"),
    ({"rollout": {"maxSurge": "lots"}}, "spec.rollout.maxSurge"),
    ({"rollout": {"maxUnavailable": -2}}, "spec.rollout.maxUnavailable"),
    ({"selector": {"matchLabels": {"app": "other"}}}, "spec.template.metadata.labels"),
    ({"selector": {"matchExpressions": [{"key": "app", "operator": "Near"}]}}, "spec.selector.matchExpressions[0].operator"),
    ({"selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}, "spec.selector.matchExpressions[0].values"),
    ({"spread": {"zones": ["a", "a"]}}, "spec.spread.zones"),
    ({"autoscale": {"minReplicas": 3, "maxReplicas": 2}}, "spec.autoscale.maxReplicas"),
    ({"autoscale": {"minReplicas": 1, "maxReplicas": 2, "targetLeaseUtilization": 1.5}},
     "spec.autoscale.targetLeaseUtilization"),
    ({"autoscale": {"minReplicas": 1, "maxReplicas": 2, "targetLeaseUtilization": "much"}},
     "spec.autoscale.targetLeaseUtilization"),
])
def test_errors_name_the_field(fields, path):
    with pytest.raises(PoolSpecError) as err:
        spec(**fields)
    assert err.value.field == path
    assert str(err.value).startswith(path + ": ")


def test_template_must_be_managed_with_a_provider():
    with pytest.raises(PoolSpecError, match="spec.template.spec.mode"):
        PoolSpec.from_dict({"template": {"metadata": {"labels": {"a": "b"}}, "spec": {"mode": "External"}}})
    with pytest.raises(PoolSpecError, match="spec.template.spec.provider"):
        PoolSpec.from_dict({"template": {"metadata": {"labels": {"a": "b"}}, "spec": {}}})
    with pytest.raises(PoolSpecError, match="spec.selector"):
        PoolSpec.from_dict({"template": {"spec": {"provider": "k8s"}}})


def test_an_invalid_spec_is_kept_as_an_error_on_the_pool():
    p = Pool.from_dict({"metadata": {"name": "p", "namespace": "n", "uid": "u"}, "spec": {"template": {}}})
    assert p.spec is None and "spec." in p.spec_error
    with pytest.raises(ValueError):
        Pool.from_dict({"metadata": {"name": "p"}})


def test_target_utilization_as_percentage():
    s = spec(autoscale={"minReplicas": 0, "maxReplicas": 9, "targetLeaseUtilization": "80%",
                        "scaleDownDelaySeconds": 60})
    assert s.autoscale.target == pytest.approx(0.8)
    assert (s.autoscale.min_replicas, s.autoscale.max_replicas, s.autoscale.scale_down_delay) == (0, 9, 60)


def test_template_hash_follows_labels_and_spec_only():
    base = template_hash({"app": "web"}, {"provider": "k8s", "maxLeases": 5})
    assert base == template_hash({"app": "web"}, {"maxLeases": 5, "provider": "k8s"})  # order does not matter
    assert base != template_hash({"app": "web", "tier": "b"}, {"provider": "k8s", "maxLeases": 5})
    assert base != template_hash({"app": "web"}, {"provider": "k8s", "maxLeases": 4})
    assert len(base) == 10
    # the spread's zones are not part of the template
    assert spec(spread={"zones": ["a"]}).hash == spec(spread={"zones": ["b", "c"]}).hash


def test_age_limit_is_jittered_deterministically_within_a_quarter():
    limits = [age_limit(f"uid-{i}", 3600.0) for i in range(500)]
    assert all((1 - AGE_JITTER) * 3600 <= x <= 3600 for x in limits)
    assert age_limit("uid-7", 3600.0) == age_limit("uid-7", 3600.0)
    # spread over the window, not bunched: every tenth of it holds some
    buckets = {int((3600 - x) / (AGE_JITTER * 3600) * 10) for x in limits}
    assert buckets >= set(range(10))


def test_selector_round_trip_to_a_string():
    reqs = selector_requirements({"matchLabels": {"app": "web"},
                                  "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                                       {"key": "legacy", "operator": "DoesNotExist"},
                                                       {"key": "ssd", "operator": "Exists"},
                                                       {"key": "spot", "operator": "NotIn", "values": ["true"]}]})
    text = selector_string(reqs)
    assert text == "app=web,tier in (a,b),!legacy,ssd,spot notin (true)"
    assert selectors.parse(text) == reqs


def test_times():
    assert parse_time("2026-01-02T03:04:05Z") == pytest.approx(1767323045.0)
    assert parse_time("garbage") is None and parse_time(None) is None
    assert format_time(1767323045.2) == "2026-01-02T03:04:06Z"  # rounded up: never earlier than meant
    assert parse_time(format_time(1767323045.0)) == 1767323045.0
