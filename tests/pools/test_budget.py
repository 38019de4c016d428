"""Cost guardrails of pools (app/pools/budget.py): instance-hours per UTC day counted in Redis,
a pool whose ``spec.maxInstanceHoursPerDay`` is used up creating nothing (BudgetExhausted), and the
estimated cost per hour by provider and pool from the providers config's price table."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from kubernetes import client as k8s

from app.config.costs import CostTable
from app.kube.gateway import KubernetesGateway
from app.pools import budget, controller
from app.pools.controller import PoolRef
from app.resources import GROUP, PLURAL, POOL_PLURAL, VERSION, Proxy
from app.serving import leases, view as serving
from app.store import keys as redis_keys
from app.wiring import parse_config
from devcluster.cluster import FakeCluster
from tests.support.contexts import k8s_provider

pytestmark = pytest.mark.timeout(60)
NS = "crawl"
NOON = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc).timestamp()


def _midnight(epoch: float) -> float:
    d = datetime.fromtimestamp(epoch, timezone.utc)
    return datetime(d.year, d.month, d.day, tzinfo=timezone.utc).timestamp() + 86400


def test_hours_accrue_per_member_between_passes_and_restart_at_midnight(redis_client):
    assert budget.account(redis_client, "u1", 4, now=NOON) == 0.0
    assert budget.account(redis_client, "u1", 2, now=NOON + 300) == pytest.approx(4 * 300 / 3600)  # 4 members, 5 min
    assert budget.account(redis_client, "u1", 2, now=NOON + 600) == pytest.approx((4 * 300 + 2 * 300) / 3600)
    # A gap longer than MAX_GAP (an operator outage) counts MAX_GAP only.
    hours = budget.account(redis_client, "u1", 2, now=NOON + 600 + 7200)
    assert hours == pytest.approx((4 * 300 + 2 * 300 + 2 * budget.MAX_GAP) / 3600)
    # Across midnight UTC only the part after midnight is today's.
    midnight = datetime(2026, 12, 3, tzinfo=timezone.utc).timestamp()
    budget.account(redis_client, "u1", 2, now=midnight - 120)
    assert budget.account(redis_client, "u1", 2, now=midnight + 180) == pytest.approx(2 * 180 / 3600)


def test_the_count_resumes_from_the_status_of_the_same_day_only(redis_client):
    today = {"instanceHoursDay": budget.day_of(NOON), "instanceHoursToday": 3.5}
    assert budget.account(redis_client, "u2", 1, now=NOON, recorded=today) == 3.5  # Redis lost it
    assert budget.account(redis_client, "u2", 1, now=NOON + 360, recorded=today) == pytest.approx(3.6)
    yesterday = {"instanceHoursDay": budget.day_of(NOON - 86400), "instanceHoursToday": 9.0}
    assert budget.account(redis_client, "u3", 1, now=NOON, recorded=yesterday) == 0.0
    for bad in ({"instanceHoursDay": budget.day_of(NOON), "instanceHoursToday": "lots"},
                {"instanceHoursDay": budget.day_of(NOON), "instanceHoursToday": True}, {}):
        assert budget.account(redis_client, "u4", 1, now=NOON, recorded=bad) == 0.0


def test_refusal_names_the_field_the_count_and_when_it_ends():
    assert budget.refusal(None, 1000.0, now=NOON) is None
    assert budget.refusal(10, 9.9, now=NOON) is None
    why = budget.refusal(10, 10.25, now=NOON)
    assert why.startswith("spec.maxInstanceHoursPerDay: 10.25 instance-hours used today of 10")
    assert "2026-12-03T00:00:00Z" in why


def _proxy(name: str, *, provider: str, pool: str | None = None, machine_type: str | None = None,
           capacity: str | None = None, phase: str = "Ready", provider_id: str | None = "id") -> Proxy:
    placement = {k: v for k, v in (("machineType", machine_type), ("capacity", capacity)) if v}
    return Proxy.from_dict({
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": {"crawl.example.com/pool": pool}
                     if pool else {}},
        "spec": {"provider": provider, "placement": placement},
        "status": {"phase": phase, "providerID": provider_id}})


def test_estimate_prices_instances_by_type_and_capacity_per_provider_and_pool():
    cfg = parse_config({"providers": [
        {"name": "aws-eu", "type": "kubernetes", "costs": {
            "onDemand": {"t3.small": 0.02, "default": 0.01}, "spot": {"t3.small": 0.006}}},
        {"name": "k8s", "type": "kubernetes"}]}, "providers.yaml")
    configs = {pc.name: pc for pc in cfg.providers}
    proxies = [
        _proxy("a", provider="aws-eu", pool="web", machine_type="t3.small"),
        _proxy("b", provider="aws-eu", pool="web", machine_type="t3.small", capacity="Spot"),
        _proxy("c", provider="aws-eu", pool="web"),                               # the default type
        _proxy("d", provider="aws-eu", machine_type="c7g.large", capacity="Spot"),  # no spot price, no type: default
        _proxy("e", provider="aws-eu", pool="web", phase="Failed"),                 # no instance: free
        _proxy("f", provider="aws-eu", pool="web", provider_id=None, phase="Pending"),
        _proxy("g", provider="k8s", pool="web"),                                    # no costs table: left out
    ]
    assert budget.estimate(proxies, configs) == pytest.approx({("aws-eu", "web"): 0.02 + 0.006 + 0.01,
                                                               ("aws-eu", ""): 0.01})
    assert CostTable(on_demand={"x": 1.0}).price("y", "OnDemand") == 0.0


def test_a_bad_costs_block_is_refused_naming_the_field():
    from app.config.validation import ConfigError

    for costs, field in (({"onDemand": {"t3.micro": -1}}, "costs.onDemand.t3.micro"),
                         ({"spot": [0.1]}, "costs.spot"), ({"budgetPerHour": "lots"}, "costs.budgetPerHour"),
                         ({"onDemnd": {}}, "costs.onDemnd")):
        with pytest.raises(ConfigError) as err:
            parse_config({"providers": [{"name": "k", "type": "kubernetes", "costs": costs}]}, "providers.yaml")
        assert err.value.field == field


@pytest.mark.parametrize("costs, field", [
    ({"onDemand": {"t3.micro": float("nan")}}, "costs.onDemand.t3.micro"),
    ({"spot": {"default": float("inf")}}, "costs.spot.default"),
    ({"budgetPerHour": float("nan")}, "costs.budgetPerHour"),
    ({"budgetPerHour": float("inf")}, "costs.budgetPerHour"),
])
def test_a_price_that_is_not_a_finite_number_is_refused(costs, field):
    """YAML's .nan and .inf are floats: a NaN price makes every estimate NaN and the budget alert never fires."""
    from app.config.validation import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_config({"providers": [{"name": "k", "type": "kubernetes", "costs": costs}]}, "providers.yaml")
    assert err.value.field == field


# -- the controller refuses creates beyond the budget ----------------------------------------------
@pytest.fixture()
def api():
    with FakeCluster(kubelet=False) as c:
        client = c.fake.api_client()
        yield client
        client.close()


def test_a_pool_over_its_daily_budget_creates_nothing_and_says_why(api, redis_client):
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": "web", "namespace": NS},
            "spec": {"replicas": 2, "maxInstanceHoursPerDay": 0.9,
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"provider": "k8s-local"}}}}
    obj = k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, body)
    ref = PoolRef(NS, "web", obj["metadata"]["uid"])
    gw = KubernetesGateway(api)
    configs = {"k8s-local": k8s_provider("k8s-local")}

    start = time.time()
    if _midnight(start) - start < 7200:  # keep the simulated half hour inside one UTC day
        start += 7200
    out = controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30, now=start)
    assert out.state == "done" and len(out.plan.creates) == 2
    for m in gw.list_proxies_in(NS):  # both got an instance and serve, as the reconciler and the probes make them
        k8s.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, m.name, {"status": {"phase": "Ready", "providerID": f"{NS}/{m.name}"}})
        serving.publish(redis_client, m, address="203.0.113.9", port=3128, phase="Ready")
        redis_client.hset(redis_keys.proxy(m.uid), mapping={"health": "healthy", "healthy": "1"})
        leases.reindex(redis_client, m.uid)
    for t in range(60, 1860, 300):  # the pool resync passes (every 30 s by default; every 5 min here)
        controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30, now=start + t)
    # 2 members x 30 min = 1 instance-hour, over 0.9: the budget is used up; a lost member is not replaced.
    lost = gw.list_proxies_in(NS)[0]
    k8s.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, lost.name)
    out = controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30, now=start + 60 + 1800)
    assert out.state == "stalled"
    assert len(gw.list_proxies_in(NS)) == 1
    status = k8s.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "web")["status"]
    assert status["instanceHoursToday"] == 1.0
    cond = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert cond["status"] == "False" and cond["reason"] == "BudgetExhausted"
    assert "spec.maxInstanceHoursPerDay" in cond["message"]
    assert status["instanceHoursDay"] == budget.day_of(start)
    # A flushed Redis loses the count, not the budget: the pass resumes from the status
    redis_client.flushdb()
    out = controller.run(gw, redis_client, configs, ref=ref, lock_timeout=30, now=start + 120 + 1800)
    assert out.state == "stalled" and len(gw.list_proxies_in(NS)) == 1
    # The next day the count starts again (below the budget: creates go through).
    assert budget.account(redis_client, ref.uid, 1, now=start + 86400) < 0.9


def test_the_resync_exports_the_estimate_and_the_budget_line(redis_client):
    from prometheus_client import REGISTRY

    from app.dispatch.proxies import Dispatcher
    from app.wiring import router

    cfg = parse_config({"providers": [{"name": "k8s-costed", "type": "kubernetes", "costs": {
        "onDemand": {"default": 0.25}, "spot": {"default": 0.1}, "budgetPerHour": 0.3}}]}, "providers.yaml")
    dispatcher = Dispatcher(redis_client, router(cfg), lambda *a, **kw: None)

    def value(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    dispatcher.resync([_proxy("a", provider="k8s-costed", pool="p-cost", phase="Failed"),
                       _proxy("b", provider="k8s-costed", pool="p-cost", capacity="Spot", phase="Failed"),
                       _proxy("c", provider="k8s-costed", pool="p-cost", phase="Pending", provider_id=None)])
    assert value("proxy_operator_estimated_cost_per_hour", provider="k8s-costed", pool="p-cost") is None
    assert value("proxy_operator_cost_budget_per_hour", provider="k8s-costed") == 0.3
    proxies = [_proxy("a", provider="k8s-costed", pool="p-cost", phase="Provisioning"),
               _proxy("b", provider="k8s-costed", pool="p-cost", capacity="Spot", phase="Provisioning")]
    dispatcher.resync(proxies)
    assert value("proxy_operator_estimated_cost_per_hour", provider="k8s-costed", pool="p-cost") == pytest.approx(0.35)
    dispatcher.resync([])  # the pool's instances are gone: its line reads 0, not its last value
    assert value("proxy_operator_estimated_cost_per_hour", provider="k8s-costed", pool="p-cost") == 0
