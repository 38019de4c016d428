"""The CRDs in deploy/crd, admitted the way kube-apiserver admits custom resources.

Every ``x-kubernetes-validations`` rule of the Proxy CRD is evaluated with cel-python
(through devcluster/crd_validation.py) on an object that satisfies it and on one that
breaks it, and the schema defaults are checked against app/resources.py, which mirrors them.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from app import resources
from devcluster.crd_validation import Invalid, StrictDecodingError, admit, load_crd, schema_of
from tests.support.crd import CRD_DIR, NOT_CHECKED, SAMPLES, crd_fixture, errors_of

pytestmark = pytest.mark.timeout(60)
crd = crd_fixture("proxy.yaml", "crd")
ph_crd = crd_fixture("providerhealth.yaml", "ph_crd")


def proxy(spec: dict | None = None, **extra) -> dict:
    obj = {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "p1", "namespace": "default"},
        "spec": copy.deepcopy(spec) if spec is not None else {"provider": "k8s-local"},
    }
    obj.update(extra)
    return obj


MANAGED = {"provider": "k8s-local"}
EXTERNAL = {"mode": "External", "endpoint": {"host": "squid.example.internal"}}


def spec_error(message: str) -> str:
    return f'spec: Invalid value: "object": {message}'


# -- the CRD itself -------------------------------------------------------------------------

def _walk(node: dict, path: str):
    yield path, node
    for key, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("name", ["proxy.yaml", "providerhealth.yaml"])
def test_crd_schema_is_structural_and_rules_have_messages(name):
    doc = load_crd(CRD_DIR / name)
    assert doc["apiVersion"] == "apiextensions.k8s.io/v1"
    assert doc["spec"]["group"] == resources.GROUP
    [version] = doc["spec"]["versions"]
    assert version["name"] == resources.VERSION and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    for path, node in _walk(version["schema"]["openAPIV3Schema"], ""):
        assert "type" in node, f"{name}: schema node {path or '<root>'} has no type (not structural)"
        for rule in node.get("x-kubernetes-validations") or ():
            message = rule.get("message", "")
            assert message and "\n" not in message, f"{name}: rule at {path} needs a one-line message"


def test_proxy_crd_names_scope_and_printer_columns(crd):
    assert crd["metadata"]["name"] == f"{resources.PLURAL}.{resources.GROUP}"
    assert crd["spec"]["scope"] == "Namespaced"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (resources.KIND, resources.PLURAL, ["px"])
    columns = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase", "Provider": ".spec.provider", "Address": ".status.address",
        "Egress IP": ".status.egressIP", "Burned": ".status.bannedTargets",
        "Healthy": '.status.conditions[?(@.type=="Healthy")].status',
        "Age": ".metadata.creationTimestamp",
    }
    status = schema_of(crd)["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == list(resources.PHASES)


def test_providerhealth_crd_is_cluster_scoped_and_status_only(ph_crd):
    assert ph_crd["spec"]["scope"] == "Cluster"
    schema = schema_of(ph_crd)
    assert "spec" not in schema["properties"]
    columns = [c["name"] for c in ph_crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[0] == "Ready" and columns[-1] == "Age"
    paths = {c["jsonPath"] for c in ph_crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {".status.readyTargets", ".status.totalTargets"} <= paths


# -- defaults -------------------------------------------------------------------------------

def test_defaults_apply_when_healthcheck_endpoint_and_maxleases_are_omitted(crd):
    spec = admit(crd, proxy({"provider": "k8s-local"}))["spec"]
    assert spec == {
        "mode": "Managed",
        "provider": "k8s-local",
        "endpoint": {"port": 3128},
        "healthCheck": {
            "url": "http://connectivitycheck.gstatic.com/generate_204",
            "expectedStatus": 204, "intervalSeconds": 30, "timeoutSeconds": 10,
            "failureThreshold": 3, "successThreshold": 1, "rateLimited": "Keep",
        },
        "maxLeases": 5,
    }


def test_partial_healthcheck_gets_the_missing_defaults(crd):
    spec = admit(crd, proxy({"provider": "k8s-local", "healthCheck": {"intervalSeconds": 15}}))["spec"]
    assert spec["healthCheck"] == {
        "url": resources.DEFAULT_HEALTH_URL, "expectedStatus": 204, "intervalSeconds": 15,
        "timeoutSeconds": 10, "failureThreshold": 3, "successThreshold": 1, "rateLimited": "Keep",
    }


def test_rate_limited_is_keep_or_withdraw(crd):
    spec = admit(crd, proxy({"provider": "k8s-local", "healthCheck": {"rateLimited": "Withdraw"}}))["spec"]
    assert spec["healthCheck"]["rateLimited"] == "Withdraw"
    with pytest.raises(Invalid):
        admit(crd, proxy({"provider": "k8s-local", "healthCheck": {"rateLimited": "Sometimes"}}))


def test_explicit_zero_max_leases_is_kept(crd):
    assert admit(crd, proxy({"provider": "k8s-local", "maxLeases": 0}))["spec"]["maxLeases"] == 0


def test_null_fields_are_defaulted_like_missing_ones(crd):
    spec = admit(crd, proxy({"provider": "k8s-local", "maxLeases": None, "healthCheck": None}))["spec"]
    assert spec["maxLeases"] == 5 and spec["healthCheck"]["expectedStatus"] == 204


@pytest.mark.parametrize("spec", [
    {"provider": "k8s-local"},
    {"provider": "k8s-local", "maxLeases": 0, "endpoint": {"port": 8080}},
    {"provider": "kvm-lab", "placement": {"zone": "lab1", "image": "debian-12", "machineType": "small"},
     "cloudInit": {"inline": "#cloud-config\n"}, "healthCheck": {"url": "https://example.com/", "expectedStatus": 200}},
    {"mode": "External", "endpoint": {"host": "10.1.2.3", "port": 8888}, "healthCheck": {"failureThreshold": 1}},
])
def test_python_model_defaults_agree_with_the_crd(crd, spec):
    """app.resources reads a raw (undefaulted) spec exactly as the API server would store it."""
    admitted = admit(crd, proxy(spec))["spec"]
    assert resources.ProxySpec.from_dict(spec) == resources.ProxySpec.from_dict(admitted)
    assert resources.spec_hash(spec) == resources.spec_hash(admitted)


def test_undeclared_fields_are_pruned_or_rejected_when_strict(crd):
    obj = proxy({"provider": "k8s-local", "replicas": 3})
    warnings: list[str] = []
    assert "replicas" not in admit(crd, obj, warnings=warnings)["spec"]
    assert warnings == ['unknown field "spec.replicas"']
    with pytest.raises(StrictDecodingError) as exc:
        admit(crd, obj, field_validation="Strict")
    assert str(exc.value) == 'strict decoding error: unknown field "spec.replicas"'


def test_admit_leaves_the_input_alone_and_keeps_metadata(crd):
    obj = proxy({"provider": "k8s-local"}, metadata={"name": "p1", "namespace": "ns", "labels": {"a": "b"}})
    before = copy.deepcopy(obj)
    out = admit(crd, obj)
    assert obj == before
    assert out["metadata"] == before["metadata"]


# -- CEL rules, one case per rule, both ways -------------------------------------------------

def test_provider_required_when_managed(crd):
    assert errors_of(crd, proxy({"mode": "Managed"})) == [
        spec_error("spec.provider is required when spec.mode is Managed")]
    assert errors_of(crd, proxy({})) == [spec_error("spec.provider is required when spec.mode is Managed")]
    assert errors_of(crd, proxy({"mode": "Managed", "provider": "gcp-eu"})) == []


def test_provider_forbidden_when_external(crd):
    assert errors_of(crd, proxy({**EXTERNAL, "provider": "k8s-local"})) == [
        spec_error("spec.provider must not be set when spec.mode is External")]
    assert errors_of(crd, proxy(EXTERNAL)) == []


def test_endpoint_host_required_when_external(crd):
    expected = [spec_error("spec.endpoint.host is required when spec.mode is External")]
    assert errors_of(crd, proxy({"mode": "External"})) == expected
    assert errors_of(crd, proxy({"mode": "External", "endpoint": {"port": 3128}})) == expected
    assert errors_of(crd, proxy(EXTERNAL)) == []


def test_endpoint_host_forbidden_when_managed(crd):
    assert errors_of(crd, proxy({**MANAGED, "endpoint": {"host": "1.2.3.4"}})) == [spec_error(
        "spec.endpoint.host must not be set when spec.mode is Managed (the provider reports the address)")]
    assert errors_of(crd, proxy({**MANAGED, "endpoint": {"port": 8080}})) == []


@pytest.mark.parametrize("cloud_init", [
    {"inline": "#cloud-config\n", "secretRef": {"name": "s", "key": "user-data"}},
    {},
])
def test_cloud_init_needs_exactly_one_source(crd, cloud_init):
    assert errors_of(crd, proxy({**MANAGED, "cloudInit": cloud_init})) == [
        'spec.cloudInit: Invalid value: "object": spec.cloudInit must set exactly one of inline or secretRef']


@pytest.mark.parametrize("cloud_init", [
    {"inline": "#cloud-config\n"},
    {"secretRef": {"name": "s", "key": "user-data"}},
])
def test_cloud_init_with_one_source_is_admitted(crd, cloud_init):
    assert errors_of(crd, proxy({**MANAGED, "cloudInit": cloud_init})) == []


def test_cloud_init_inline_must_not_be_empty(crd):
    assert errors_of(crd, proxy({**MANAGED, "cloudInit": {"inline": ""}})) == [
        'spec.cloudInit.inline: Invalid value: "": spec.cloudInit.inline in body should be at least 1 chars long']


def test_cloud_init_secret_ref_needs_name_and_key(crd):
    assert errors_of(crd, proxy({**MANAGED, "cloudInit": {"secretRef": {"name": "s"}}})) == [
        "spec.cloudInit.secretRef.key: Required value", NOT_CHECKED]
    assert errors_of(crd, proxy({**MANAGED, "cloudInit": {"secretRef": {"key": "user-data"}}})) == [
        "spec.cloudInit.secretRef.name: Required value", NOT_CHECKED]
    assert errors_of(crd, proxy({**MANAGED, "cloudInit": {"secretRef": {"name": "", "key": "k"}}})) == [
        'spec.cloudInit.secretRef.name: Invalid value: "": '
        "spec.cloudInit.secretRef.name in body should be at least 1 chars long"]


@pytest.mark.parametrize("field,value", [
    ("placement", {"zone": "lab1"}),
    ("cloudInit", {"inline": "#cloud-config\n"}),
    ("vendorData", "#!/bin/sh\n"),
])
def test_instance_fields_only_for_managed(crd, field, value):
    assert errors_of(crd, proxy({**EXTERNAL, field: value})) == [
        spec_error(f"spec.{field} is only allowed when spec.mode is Managed")]
    assert errors_of(crd, proxy({**MANAGED, field: value})) == []


def test_health_check_url_must_be_http_or_https(crd):
    assert errors_of(crd, proxy({**MANAGED, "healthCheck": {"url": "ftp://example.com/"}})) == [
        'spec.healthCheck.url: Invalid value: "string": spec.healthCheck.url must be an http:// or https:// URL']
    assert errors_of(crd, proxy({**MANAGED, "healthCheck": {"url": "https://example.com/"}})) == []


@pytest.mark.parametrize("url", [
    "http://example.com/ HTTP/1.1\r\nHost: evil",       # request-line / header injection
    "http://example.com/a b",
    "http://example.com/\n",
    "http://example.com/\tx",
    "http://example.com/\x00",
    "http://example.com/\x7f",
])
def test_health_check_url_refuses_spaces_and_control_characters(crd, url):
    assert errors_of(crd, proxy({**MANAGED, "healthCheck": {"url": url}})) == [
        'spec.healthCheck.url: Invalid value: "string": '
        "spec.healthCheck.url must not contain spaces or control characters"]


def test_health_check_url_with_percent_encoding_and_a_query_is_admitted(crd):
    url = "https://example.com:8443/generate_204?a=b%20c&d=%0D%0A#frag"
    assert errors_of(crd, proxy({**MANAGED, "healthCheck": {"url": url}})) == []


@pytest.mark.parametrize("host", ["squid.example.internal", "10.1.2.3", "2001:db8::7", "proxy-1.lab"])
def test_endpoint_host_names_and_addresses_are_admitted(crd, host):
    assert errors_of(crd, proxy({"mode": "External", "endpoint": {"host": host}})) == []


@pytest.mark.parametrize("host", ["squid.example.internal\r\nX: y", "a b", "user@host", "host/path", "[::1]",
                                  "host\n"])
def test_endpoint_host_refuses_anything_but_a_name_or_an_address(crd, host):
    assert errors_of(crd, proxy({"mode": "External", "endpoint": {"host": host}})) == [
        'spec.endpoint.host: Invalid value: "string": spec.endpoint.host must be a host name or an IP address '
        "(letters, digits, '-', '.' and ':' only)"]


def test_health_check_timeout_is_capped_at_60_seconds(crd):
    assert errors_of(crd, proxy({**MANAGED, "healthCheck": {"intervalSeconds": 300, "timeoutSeconds": 61}})) == [
        "spec.healthCheck.timeoutSeconds: Invalid value: 61: "
        "spec.healthCheck.timeoutSeconds in body should be less than or equal to 60"]
    assert errors_of(crd, proxy({**MANAGED, "healthCheck": {"intervalSeconds": 300, "timeoutSeconds": 60}})) == []


@pytest.mark.parametrize("health,ok", [
    ({"intervalSeconds": 5, "timeoutSeconds": 6}, False),
    ({"intervalSeconds": 5}, False),                       # the default timeout (10 s) exceeds it
    ({"intervalSeconds": 5, "timeoutSeconds": 5}, False),  # below the interval, not equal (docs/security.md, "probe capacity")
    ({"intervalSeconds": 10}, False),                      # the default timeout (10 s) equals it
    ({"timeoutSeconds": 30}, False),                       # the default interval is 30 s
    ({"intervalSeconds": 5, "timeoutSeconds": 4}, True),
    ({"intervalSeconds": 2, "timeoutSeconds": 1}, True),
    ({"intervalSeconds": 11}, True),
    ({"timeoutSeconds": 29}, True),
])
def test_health_check_timeout_must_be_below_the_interval(crd, health, ok):
    expected = [] if ok else [
        'spec.healthCheck: Invalid value: "object": '
        "spec.healthCheck.timeoutSeconds must be less than spec.healthCheck.intervalSeconds"]
    assert errors_of(crd, proxy({**MANAGED, "healthCheck": health})) == expected


def test_health_check_interval_is_at_least_2_seconds(crd):
    """timeoutSeconds is at least 1 and must be below intervalSeconds: 1 s leaves no timeout."""
    errors = errors_of(crd, proxy({**MANAGED, "healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 1}}))
    assert ("spec.healthCheck.intervalSeconds: Invalid value: 1: "
            "spec.healthCheck.intervalSeconds in body should be greater than or equal to 2") in errors


def test_mode_is_immutable(crd):
    old = proxy(EXTERNAL)
    new = proxy({"mode": "Managed", "provider": "k8s-local"})
    errors = errors_of(crd, new, old)
    assert 'spec.mode: Invalid value: "string": spec.mode is immutable' in errors
    # Omitting mode is the same as the default: no change.
    assert errors_of(crd, proxy({"provider": "k8s-local", "maxLeases": 2}),
                     proxy({"mode": "Managed", "provider": "k8s-local"})) == []


def test_provider_is_immutable(crd):
    old = proxy({"provider": "k8s-local"})
    assert errors_of(crd, proxy({"provider": "gcp-eu"}), old) == [spec_error("spec.provider is immutable")]
    assert spec_error("spec.provider is immutable") in errors_of(crd, proxy({}), old)
    assert errors_of(crd, proxy({"provider": "k8s-local", "maxLeases": 0}), old) == []


def test_transition_rules_do_not_run_on_create(crd):
    # On create there is no oldSelf: only the non-transition rules apply.
    assert errors_of(crd, proxy({"provider": "gcp-eu"})) == []


def test_provider_must_be_a_non_empty_identifier(crd):
    assert errors_of(crd, proxy({"provider": ""})) == [
        'spec.provider: Invalid value: "": spec.provider in body should be at least 1 chars long',
        "spec.provider: Invalid value: \"\": spec.provider in body should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'",
    ]
    assert errors_of(crd, proxy({"provider": "Bad_Name"})) == [
        "spec.provider: Invalid value: \"Bad_Name\": spec.provider in body should match "
        "'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"]


# -- schema checks the operator relies on -----------------------------------------------------

def test_unknown_mode_is_rejected_and_rules_are_not_checked(crd):
    assert errors_of(crd, proxy({"mode": "Hybrid"})) == [
        'spec.mode: Unsupported value: "Hybrid": supported values: "Managed", "External"', NOT_CHECKED]


@pytest.mark.parametrize("spec,error", [
    ({**MANAGED, "maxLeases": -1},
     "spec.maxLeases: Invalid value: -1: spec.maxLeases in body should be greater than or equal to 0"),
    ({**MANAGED, "maxLeases": "5"},
     'spec.maxLeases: Invalid value: "string": spec.maxLeases in body must be of type integer: "string"'),
    ({**MANAGED, "endpoint": {"port": 0}},
     "spec.endpoint.port: Invalid value: 0: spec.endpoint.port in body should be greater than or equal to 1"),
    ({**MANAGED, "endpoint": {"port": 65536}},
     "spec.endpoint.port: Invalid value: 65536: spec.endpoint.port in body should be less than or equal to 65535"),
    ({**MANAGED, "healthCheck": {"failureThreshold": 0}},
     "spec.healthCheck.failureThreshold: Invalid value: 0: "
     "spec.healthCheck.failureThreshold in body should be greater than or equal to 1"),
    ({**MANAGED, "placement": {"zone": ""}},
     'spec.placement.zone: Invalid value: "": spec.placement.zone in body should be at least 1 chars long'),
    ({**MANAGED, "vendorData": ""},
     'spec.vendorData: Invalid value: "": spec.vendorData in body should be at least 1 chars long'),
])
def test_schema_violations_name_the_field(crd, spec, error):
    assert error in errors_of(crd, proxy(spec))


def test_spec_is_required(crd):
    obj = proxy()
    del obj["spec"]
    assert errors_of(crd, obj) == ["spec: Required value", NOT_CHECKED]


def _condition(ctype: str, status: str = "True", reason: str = "Probed") -> dict:
    return {"type": ctype, "status": status, "reason": reason, "message": "",
            "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 1}


def test_status_as_the_operator_writes_it_is_admitted(crd):
    status = {
        "phase": "Ready", "providerID": "default/proxy-abc", "instanceName": "proxy-abc",
        "address": "10.0.0.7", "port": 3128, "egressIP": "203.0.113.9", "specHash": "0123456789abcdef",
        "observedGeneration": 2, "lastProbeTime": "2026-01-02T03:04:05.123456+00:00",
        "lastProbeLatencyMs": 42,
        "conditions": [_condition("Provisioned"), _condition("Healthy"), _condition("Ready")],
    }
    assert admit(crd, proxy(MANAGED, status=status))["status"] == status


@pytest.mark.parametrize("status,error", [
    ({"phase": "Booting"},
     'status.phase: Unsupported value: "Booting": supported values: "Pending", "Provisioning", "Running", '
     '"Ready", "Unhealthy", "Failed", "Terminating"'),
    ({"conditions": [_condition("Ready"), _condition("Ready", "False")]},
     'status.conditions[1]: Duplicate value: map[string]interface {}{"type":"Ready"}'),
    ({"conditions": [_condition("Ready", "Yes")]},
     'status.conditions[0].status: Unsupported value: "Yes": supported values: "True", "False", "Unknown"'),
    ({"conditions": [_condition("Ready", reason="not camel case")]},
     "status.conditions[0].reason: Invalid value: \"not camel case\": status.conditions[0].reason in body "
     "should match '^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$'"),
    ({"lastProbeTime": "yesterday"},
     'status.lastProbeTime: Invalid value: "yesterday": status.lastProbeTime in body must be of type '
     'date-time: "yesterday"'),
    ({"lastProbeLatencyMs": 12.5},
     'status.lastProbeLatencyMs: Invalid value: "number": status.lastProbeLatencyMs in body must be of type '
     'integer: "number"'),
])
def test_bad_status_is_rejected(crd, status, error):
    assert error in errors_of(crd, proxy(MANAGED, status=status))


def test_condition_without_required_fields_is_rejected(crd):
    errors = errors_of(crd, proxy(MANAGED, status={"conditions": [{"type": "Ready", "status": "True"}]}))
    assert errors[:3] == ["status.conditions[0].lastTransitionTime: Required value",
                          "status.conditions[0].reason: Required value",
                          "status.conditions[0].message: Required value"]


def test_invalid_renders_the_api_server_status(crd):
    with pytest.raises(Invalid) as exc:
        admit(crd, proxy({"mode": "External"}))
    body = exc.value.status("Proxy", "crawl.example.com", "p1")
    assert body["code"] == 422 and body["reason"] == "Invalid"
    assert body["message"] == ('Proxy.crawl.example.com "p1" is invalid: spec: Invalid value: "object": '
                               "spec.endpoint.host is required when spec.mode is External")
    assert body["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": "spec",
        "message": 'Invalid value: "object": spec.endpoint.host is required when spec.mode is External',
    }]


# -- ProviderHealth -----------------------------------------------------------------------

def _provider_health(status: dict) -> dict:
    return {"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProviderHealth",
            "metadata": {"name": "kvm-lab", "labels": {"app.kubernetes.io/managed-by": "proxy-operator"}},
            "status": status}


def test_provider_health_status_is_admitted(ph_crd):
    status = {
        "conditions": [_condition("Ready", "False", "TargetsNotReady")],
        "targets": [
            {"name": "lab1", "ready": True, "reason": "Ok", "message": "libvirt 9.0.0",
             "lastTransitionTime": "2026-01-02T03:04:05Z", "details": {"freePoolBytes": "1073741824"}},
            {"name": "lab2", "ready": False, "reason": "DialFailed", "message": "ssh handshake: timeout",
             "lastTransitionTime": "2026-01-02T03:04:05Z"},
        ],
        "readyTargets": 1, "totalTargets": 2,
    }
    assert admit(ph_crd, _provider_health(status))["status"] == status


@pytest.mark.parametrize("status,error", [
    ({"targets": [{"name": "lab1", "ready": True}, {"name": "lab1", "ready": False}]},
     'status.targets[1]: Duplicate value: map[string]interface {}{"name":"lab1"}'),
    ({"targets": [{"name": "lab1"}]}, "status.targets[0].ready: Required value"),
    ({"targets": [{"name": "lab1", "ready": True, "details": {"freePoolBytes": 1024}}]},
     'status.targets[0].details.freePoolBytes: Invalid value: "integer": '
     'status.targets[0].details.freePoolBytes in body must be of type string: "integer"'),
    ({"readyTargets": -1},
     "status.readyTargets: Invalid value: -1: status.readyTargets in body should be greater than or equal to 0"),
])
def test_bad_provider_health_status_is_rejected(ph_crd, status, error):
    assert error in errors_of(ph_crd, _provider_health(status))


# -- samples --------------------------------------------------------------------------------

def _sample_proxies():
    for path in sorted(SAMPLES.glob("proxy_*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Proxy":
                yield pytest.param(doc, id=f"{path.name}:{doc['metadata']['name']}")


@pytest.mark.parametrize("doc", list(_sample_proxies()))
def test_every_sample_proxy_is_admitted(crd, doc):
    out = admit(crd, doc, field_validation="Strict")
    assert out["spec"]["healthCheck"]["timeoutSeconds"] >= 1
    resources.Proxy.from_dict({**out, "metadata": {**out["metadata"], "uid": "u-1"}})


def test_samples_cover_every_mode_and_provider_type():
    docs = [p.values[0] for p in _sample_proxies()]
    providers = {d["spec"].get("provider") for d in docs}
    assert {"k8s-local", "gcp-eu", "kvm-lab"} <= providers
    assert any(d["spec"].get("mode") == "External" for d in docs)
    kube = yaml.safe_load((SAMPLES / "proxy_kubernetes.yaml").read_text())
    assert kube["metadata"]["namespace"] == "default" and "cloudInit" not in kube["spec"]
