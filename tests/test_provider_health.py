"""ProviderHealth objects: created with the managed-by label, status merge patches, stable
transition times, pruning of providers no longer configured."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from app.config import ProviderConfig
from app.provider_health import PLURAL, ProviderHealthWriter, check, status_for
from app.providers.base import TargetVerdict
from app.providers.kubernetes.config import KubernetesSettings
from app.providers.kubernetes.provider import KubernetesProvider
from app.resources import GROUP, VERSION
from tests.kubefake.server import FakeKube


@pytest.fixture()
def fake():
    with FakeKube() as server:
        yield server


def read(api, name):
    return k8s.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, PLURAL, name)


def test_publish_creates_labelled_object_and_keeps_transition_times(fake):
    api = fake.api_client()
    writer = ProviderHealthWriter(api)
    writer.publish("kvm-lab", [TargetVerdict("lab1", True, "Ready", details={"freeBytes": "100"}),
                               TargetVerdict("lab2", False, "DialFailed", "TCP: connection refused")])
    obj = read(api, "kvm-lab")
    assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "proxy-operator"
    status = obj["status"]
    assert status["readyTargets"] == 1 and status["totalTargets"] == 2
    assert status["conditions"][0]["status"] == "False" and "lab2" in status["conditions"][0]["message"]
    first = {t["name"]: t["lastTransitionTime"] for t in status["targets"]}

    # Next round: lab1 still ready (time kept), lab2 flips (time moves).
    before = status_for([TargetVerdict("lab1", True, "Ready"), TargetVerdict("lab2", True, "Ready")],
                        status, now="2099-01-01T00:00:00Z")
    assert before["targets"][0]["lastTransitionTime"] == first["lab1"]
    assert before["targets"][1]["lastTransitionTime"] == "2099-01-01T00:00:00Z"
    writer.publish("kvm-lab", [TargetVerdict("lab1", True, "Ready"), TargetVerdict("lab2", True, "Ready")])
    status = read(api, "kvm-lab")["status"]
    assert status["readyTargets"] == 2 and status["conditions"][0]["status"] == "True"
    assert {t["name"]: t["lastTransitionTime"] for t in status["targets"]}["lab1"] == first["lab1"]


def test_prune_removes_unconfigured_and_unchecked_providers(fake):
    api = fake.api_client()
    writer = ProviderHealthWriter(api)
    for name in ("keep", "gone", "checks-off"):
        writer.publish(name, [TargetVerdict("t", True, "Ready")])
    assert sorted(writer.prune(["keep", "checks-off"], {"keep"})) == ["checks-off", "gone"]
    names = [o["metadata"]["name"] for o in
             k8s.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]]
    assert names == ["keep"]


def test_kubernetes_check_reports_ready_and_forbidden(fake):
    api = fake.api_client()
    provider = KubernetesProvider(ProviderConfig("k8s", "kubernetes", 60, 15, KubernetesSettings()), client=api)
    [verdict] = check(provider, "k8s", timeout=5)
    assert verdict.ready and verdict.name == "cluster"
    fake.fail_next("list", "pods", code=403, reason="Forbidden")
    [verdict] = check(provider, "k8s", timeout=5)
    assert not verdict.ready and verdict.reason == "Forbidden"


def test_a_check_that_hangs_or_raises_becomes_one_not_ready_verdict():
    import threading

    class Hanging:
        def check(self):
            threading.Event().wait(5)

    class Broken:
        def check(self):
            raise RuntimeError("boom")

    [v] = check(Hanging(), "slow", timeout=0.2)
    assert not v.ready and v.reason == "CheckTimeout"
    [v] = check(Broken(), "broken", timeout=1)
    assert not v.ready and v.reason == "CheckFailed" and "boom" in v.message
