"""The Kubernetes API fake: the per-resource admission hook (CRD defaulting and validation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client as k8s

from devcluster.apiserver import FakeKube, Invalid

G, V, P = "crawl.example.com", "v1alpha1", "proxies"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(30)


def proxy(name: str, **spec) -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "Proxy", "metadata": {"name": name}, "spec": spec}


def test_hook_defaults_and_rejects_with_422(kube, kube_client):
    calls = []

    def admit(obj, old):
        calls.append((obj["metadata"]["name"], old is not None))
        spec = obj.setdefault("spec", {})
        spec.setdefault("maxLeases", 5)
        problems = []
        if spec.get("mode", "Managed") == "Managed" and not spec.get("provider"):
            problems.append(("spec.provider", "Required value"))
        if old is not None and old["spec"].get("mode") != spec.get("mode"):
            problems.append("spec.mode: Invalid value: \"External\": mode is immutable")
        if problems:
            raise Invalid(problems)
        return obj

    kube.set_admission(P, admit)
    api = k8s.CustomObjectsApi(kube_client)
    out = api.create_namespaced_custom_object(G, V, "default", P, proxy("a", provider="k8s", mode="Managed"))
    assert out["spec"]["maxLeases"] == 5
    zero = api.create_namespaced_custom_object(G, V, "default", P, proxy("z", provider="k8s", maxLeases=0))
    assert zero["spec"]["maxLeases"] == 0
    with pytest.raises(k8s.ApiException) as err:
        api.create_namespaced_custom_object(G, V, "default", P, proxy("b"))
    body = json.loads(err.value.body)
    assert err.value.status == 422 and body["reason"] == "Invalid"
    assert body["message"] == 'Proxy.crawl.example.com "b" is invalid: spec.provider: Required value'
    assert body["details"]["causes"] == [{"reason": "FieldValueInvalid", "message": "Required value",
                                          "field": "spec.provider"}]
    with pytest.raises(k8s.ApiException) as err:
        api.patch_namespaced_custom_object(G, V, "default", P, "a", {"spec": {"mode": "External"}})
    assert err.value.status == 422 and "mode is immutable" in err.value.body
    api.patch_namespaced_custom_object_status(G, V, "default", P, "a", {"status": {"phase": "Running"}})
    assert ("a", True) in calls and ("b", False) in calls
    assert api.get_namespaced_custom_object(G, V, "default", P, "a")["spec"]["mode"] == "Managed"


def test_the_crd_schema_validator_plugs_in():
    from devcluster import crd_validation

    crd = crd_validation.load_crd(ROOT / "deploy" / "crd" / "proxy.yaml")
    with FakeKube(admission={P: lambda obj, old: crd_validation.admit(crd, obj, old)}) as fake:
        client = fake.api_client()
        api = k8s.CustomObjectsApi(client)
        out = api.create_namespaced_custom_object(G, V, "default", P, proxy("a", provider="k8s"))
        assert out["spec"]["maxLeases"] == 5 and out["metadata"]["uid"]  # defaulted by the schema
        with pytest.raises(k8s.ApiException) as err:
            api.create_namespaced_custom_object(G, V, "default", P, proxy("b", mode="Managed"))
        body = json.loads(err.value.body)
        assert err.value.status == 422 and body["reason"] == "Invalid"
        assert "spec.provider is required" in body["message"]
        client.close()


def test_the_kube_fixture_admits_proxies_with_the_crd_rules(custom_api):
    """The shared ``kube`` fixture's fake applies deploy/crd's schema defaults and CEL rules, as
    the real API server does, so no test can build a Proxy history a cluster would refuse."""
    out = custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a", provider="k8s-a"))
    assert out["spec"]["mode"] == "Managed"  # a schema default
    with pytest.raises(k8s.ApiException) as err:
        custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"spec": {"provider": "k8s-b"}})
    body = json.loads(err.value.body)
    assert err.value.status == 422 and body["reason"] == "Invalid"
    assert "spec.provider is immutable" in body["message"]
    assert custom_api.get_namespaced_custom_object(G, V, "default", P, "a")["spec"]["provider"] == "k8s-a"


@pytest.mark.no_crd_admission("the marker's own test")
def test_the_no_crd_admission_marker_gives_a_fake_without_the_crd_rules(custom_api):
    custom_api.create_namespaced_custom_object(G, V, "default", P, proxy("a", provider="k8s-a"))
    out = custom_api.patch_namespaced_custom_object(G, V, "default", P, "a", {"spec": {"provider": "k8s-b"}})
    assert out["spec"] == {"provider": "k8s-b"}
