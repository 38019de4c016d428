"""How many Proxies ProxyPools may ask for: the CRD's maximum per pool and the operator's cap per namespace.

The controller runs in-process against the API fake (which admits ProxyPools through the real
CRD) and a real Redis, as in tests/pools/test_controller.py.
"""

from __future__ import annotations

import pytest
from kubernetes.client import ApiException

from app.pools.model import MAX_REPLICAS, Pool
from app.resources import GROUP, POOL_PLURAL, VERSION
from app.config.settings import Settings
from tests.pools.test_controller import NS, TEMPLATE, api, cluster, custom, make_pool, pool_obj, proxies, run  # noqa: F401

pytestmark = pytest.mark.timeout(60)


def progressing(api, name: str) -> dict:
    return {c["type"]: c for c in pool_obj(api, name)["status"]["conditions"]}["Progressing"]


def members(api, ref) -> list:
    return [p for p in proxies(api) if (p.controller or {}).get("uid") == ref.uid]


@pytest.mark.parametrize("spec,field", [
    ({"replicas": MAX_REPLICAS + 1}, "spec.replicas"),
    ({"replicas": 2**31 - 1}, "spec.replicas"),
    ({"autoscale": {"maxReplicas": MAX_REPLICAS + 1}}, "spec.autoscale.maxReplicas"),
    ({"autoscale": {"minReplicas": MAX_REPLICAS + 1, "maxReplicas": MAX_REPLICAS}}, "spec.autoscale.minReplicas"),
])
def test_the_crd_refuses_a_pool_over_its_maximum(api, spec, field):
    with pytest.raises(ApiException) as info:
        make_pool(api, "huge", **spec)
    assert info.value.status == 422 and field in info.value.body
    make_pool(api, "largest", replicas=MAX_REPLICAS)  # the maximum itself is admitted


def test_a_stored_pool_over_the_maximum_is_invalid_naming_the_field():
    obj = {"metadata": {"name": "old", "namespace": NS, "uid": "u-1"},
           "spec": {"replicas": 2**31 - 1, "template": TEMPLATE}}
    pool = Pool.from_dict(obj)  # stored before the CRD had a maximum: never re-validated by the server
    assert pool.spec is None
    assert pool.spec_error.startswith(f"spec.replicas: must be at most {MAX_REPLICAS} (the CRD's maximum)")


def test_pools_of_a_namespace_share_the_operators_cap(api, redis_client):
    web = make_pool(api, "web", replicas=3)
    assert run(api, redis_client, web, namespace_cap=5).state == "done"
    assert len(members(api, web)) == 3

    more = make_pool(api, "more", replicas=3)
    out = run(api, redis_client, more, namespace_cap=5)
    assert out.state == "stalled" and members(api, more) == []
    cond = progressing(api, "more")
    assert (cond["status"], cond["reason"]) == ("False", "NamespaceCapExceeded")
    assert cond["message"] == (
        f"spec.replicas 3 refused: the ProxyPools of namespace {NS} may keep at most 5 Proxies together "
        "(the operator's POOL_NAMESPACE_MAX_REPLICAS); other ProxyPools of the namespace hold 3, leaving 2; "
        "no member is created or removed until the size fits")
    assert run(api, redis_client, web, namespace_cap=5).state == "done"  # the first pool is not disturbed

    custom(api).patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "more", {"spec": {"replicas": 2}})
    assert run(api, redis_client, more, namespace_cap=5).state == "done"
    assert len(members(api, more)) == 2


def test_an_autoscaled_pool_is_judged_by_its_max_replicas(api, redis_client):
    auto = make_pool(api, "auto", autoscale={"minReplicas": 1, "maxReplicas": 8})
    assert run(api, redis_client, auto, namespace_cap=5).state == "stalled"
    cond = progressing(api, "auto")
    assert cond["reason"] == "NamespaceCapExceeded"
    assert cond["message"].startswith(f"spec.autoscale.maxReplicas 8 refused: the ProxyPools of namespace {NS} "
                                      "may keep at most 5 Proxies together")
    assert members(api, auto) == []
    assert run(api, redis_client, auto, namespace_cap=8).state == "done"


def test_the_workers_read_the_cap_with_a_safe_default(monkeypatch):
    monkeypatch.delenv("POOL_NAMESPACE_MAX_REPLICAS", raising=False)
    assert Settings.from_env().pool_namespace_max_replicas == 100
    monkeypatch.setenv("POOL_NAMESPACE_MAX_REPLICAS", "250")
    assert Settings.from_env().pool_namespace_max_replicas == 250
    for bad, problem in (("0", "must be at least 1"), ("lots", "not an integer")):
        monkeypatch.setenv("POOL_NAMESPACE_MAX_REPLICAS", bad)
        with pytest.raises(ValueError, match=f"environment variable POOL_NAMESPACE_MAX_REPLICAS: {problem}"):
            Settings.from_env()
