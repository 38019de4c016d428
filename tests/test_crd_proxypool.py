"""The ProxyPool CRD (deploy/crd/proxypool.yaml), admitted the way kube-apiserver admits it.

The file is generated (deploy/crd/gen_proxypool.py: a skeleton plus the Proxy CRD's spec
schema as ``spec.template.spec``); it must be current.  Every ``x-kubernetes-validations``
rule is evaluated with cel-python (devcluster/crd_validation.py) on objects that satisfy
and break it; the defaults are checked against app/pools/model.py, which mirrors them, and
the samples deploy/samples/proxypool_*.yaml must be admitted with ``fieldValidation=Strict``.
"""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest
import yaml

from app import resources
from devcluster.crd_validation import admit, schema_of
from tests.support.crd import CRD_DIR, NOT_CHECKED, SAMPLES, crd_fixture, errors_of

pytestmark = pytest.mark.timeout(60)
crd = crd_fixture("proxypool.yaml", "crd")
proxy_crd = crd_fixture("proxy.yaml", "proxy_crd")


def _generator():
    spec = importlib.util.spec_from_file_location("gen_proxypool", CRD_DIR / "gen_proxypool.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TEMPLATE = {"metadata": {"labels": {"app": "squid"}}, "spec": {"provider": "k8s-local"}}


def pool(spec: dict | None = None, **extra) -> dict:
    obj = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
           "metadata": {"name": "pool-1", "namespace": "default"},
           "spec": copy.deepcopy(spec) if spec is not None else {"template": copy.deepcopy(TEMPLATE)}}
    obj.update(extra)
    return obj


def with_spec(**fields) -> dict:
    """A pool whose spec is the minimal one plus ``fields``."""
    return pool({"template": copy.deepcopy(TEMPLATE), **copy.deepcopy(fields)})


# -- the file and the CRD ---------------------------------------------------------------------

def test_the_file_is_what_the_generator_makes():
    gen = _generator()
    assert (CRD_DIR / "proxypool.yaml").read_text() == gen.render(), \
        "deploy/crd/proxypool.yaml is out of date: run .venv/bin/python deploy/crd/gen_proxypool.py"
    assert gen.main(["--check"]) == 0


def test_the_kustomization_installs_it():
    kustomization = yaml.safe_load((CRD_DIR / "kustomization.yaml").read_text())
    assert "proxypool.yaml" in kustomization["resources"]


def _walk(node: dict, path: str):
    yield path, node
    for key, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural_and_rules_have_messages(crd):
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    [version] = crd["spec"]["versions"]
    assert version["name"] == resources.VERSION and version["served"] and version["storage"]
    int_or_string = []
    for path, node in _walk(version["schema"]["openAPIV3Schema"], ""):
        if node.get("x-kubernetes-int-or-string"):
            int_or_string.append(path)
            assert "type" not in node and "anyOf" not in node, path
        else:
            assert "type" in node, f"schema node {path or '<root>'} has no type (not structural)"
        for rule in node.get("x-kubernetes-validations") or ():
            message = rule.get("message", "")
            assert message and "\n" not in message, f"rule at {path} needs a one-line message"
            assert "\\." not in rule["rule"], f"rule at {path}: \\. is not a CEL string escape"
            # the API server refuses a CRD whose rules' estimated cost is too high: what a rule
            # scans must be bounded (strings by maxLength; int-or-string is estimated as dyn)
            if "self.matches(" in rule["rule"] and node.get("type") == "string":
                assert "maxLength" in node, f"rule at {path} matches a string of unbounded length"
    assert int_or_string == [".spec.rollout.maxSurge", ".spec.rollout.maxUnavailable",
                             ".spec.autoscale.targetLeaseUtilization"]


def test_names_scope_subresources_and_printer_columns(crd, proxy_crd):
    assert crd["metadata"]["name"] == f"proxypools.{resources.GROUP}"
    assert crd["spec"]["group"] == resources.GROUP and crd["spec"]["scope"] == "Namespaced"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["singular"], names["shortNames"]) == (
        resources.POOL_KIND, resources.POOL_PLURAL, "proxypool", ["pxp"])
    assert names["categories"] == proxy_crd["spec"]["names"]["categories"]
    [version] = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}}
    columns = [(c["name"], c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [("Desired", "integer", ".spec.replicas"), ("Ready", "integer", ".status.readyReplicas"),
                       ("Leasable", "integer", ".status.leasableReplicas"),
                       ("Updated", "integer", ".status.updatedReplicas"),
                       ("Burned", "integer", ".status.burnedReplicas"),
                       ("Recycled", "integer", ".status.recycledReplicas"),
                       ("Age", "date", ".metadata.creationTimestamp")]


def test_the_template_spec_is_the_proxy_spec_without_its_transition_rules(crd, proxy_crd):
    proxy_spec = schema_of(proxy_crd)["properties"]["spec"]
    template_spec = schema_of(crd)["properties"]["spec"]["properties"]["template"]["properties"]["spec"]
    assert template_spec["properties"].keys() == proxy_spec["properties"].keys()
    assert template_spec["properties"]["healthCheck"]["properties"] == {
        k: {**v, **({"x-kubernetes-validations": [
            {**r, "message": r["message"].replace("spec.", "spec.template.spec.")}
            for r in v["x-kubernetes-validations"]]} if "x-kubernetes-validations" in v else {})}
        for k, v in proxy_spec["properties"]["healthCheck"]["properties"].items()}
    rules = json.dumps(template_spec)
    assert "oldSelf" not in rules and "Immutable" not in rules
    assert template_spec["x-kubernetes-validations"][0]["rule"] == "self.mode == 'Managed'"


def test_a_changed_proxy_crd_changes_the_template(proxy_crd):
    gen = _generator()
    changed = copy.deepcopy(proxy_crd)
    schema_of(changed)["properties"]["spec"]["properties"]["maxLeases"]["default"] = 7
    spec = gen.build(changed)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["template"]["properties"]["spec"]["properties"]["maxLeases"]["default"] == 7


# -- defaults -----------------------------------------------------------------------------------

def test_defaults_of_a_minimal_pool(crd):
    out = admit(crd, pool())
    spec = out["spec"]
    assert spec["replicas"] == 1
    assert spec["rollout"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert spec["drain"] == {"drainTimeoutSeconds": 600}
    assert "selector" not in spec and "maxAge" not in spec and "autoscale" not in spec and "spread" not in spec
    template = spec["template"]["spec"]
    assert template["mode"] == "Managed" and template["maxLeases"] == 5
    assert template["endpoint"] == {"port": 3128} and template["healthCheck"]["timeoutSeconds"] == 10


def test_autoscale_defaults(crd):
    out = admit(crd, with_spec(autoscale={"maxReplicas": 4}))
    assert out["spec"]["autoscale"] == {"maxReplicas": 4, "minReplicas": 1, "targetLeaseUtilization": "70%",
                                        "scaleDownDelaySeconds": 300}


def test_the_pool_model_reads_the_defaults_the_crd_writes(crd):
    from app.pools import model

    spec = model.PoolSpec.from_dict(admit(crd, with_spec(autoscale={"maxReplicas": 4}))["spec"])
    bare = model.PoolSpec.from_dict({"template": TEMPLATE, "autoscale": {"maxReplicas": 4}})
    assert (spec.replicas, spec.max_surge, spec.max_unavailable, spec.drain_timeout) == (
        bare.replicas, bare.max_surge, bare.max_unavailable, bare.drain_timeout)
    assert spec.autoscale == bare.autoscale
    assert spec.max_leases == bare.max_leases


def test_undeclared_fields_are_pruned(crd):
    out = admit(crd, with_spec(minReadySeconds=5, template={**TEMPLATE, "metadata": {
        "labels": {"app": "squid"}, "annotations": {"a": "b"}}}))
    assert "minReadySeconds" not in out["spec"] and "annotations" not in out["spec"]["template"]["metadata"]


# -- template -----------------------------------------------------------------------------------

def test_template_mode_must_be_managed(crd):
    errors = errors_of(crd, with_spec(template={"metadata": {"labels": {"app": "x"}}, "spec": {
        "mode": "External", "endpoint": {"host": "squid.example.internal"}}}))
    assert errors == ['spec.template.spec: Invalid value: "object": spec.template.spec.mode must be Managed '
                      "(a ProxyPool creates Managed Proxies)"]


def test_template_spec_keeps_the_proxy_rules_with_the_template_path(crd):
    errors = errors_of(crd, with_spec(template={"metadata": {"labels": {"app": "x"}}, "spec": {}}))
    assert errors == ['spec.template.spec: Invalid value: "object": spec.template.spec.provider is required '
                      "when spec.template.spec.mode is Managed"]
    errors = errors_of(crd, with_spec(template={"metadata": {"labels": {"app": "x"}}, "spec": {
        "provider": "kvm-lab", "cloudInit": {"inline": "a", "secretRef": {"name": "s", "key": "k"}}}}))
    assert errors == ['spec.template.spec.cloudInit: Invalid value: "object": spec.template.spec.cloudInit must '
                      "set exactly one of inline or secretRef"]


def test_template_provider_and_spec_may_change(crd):
    old = admit(crd, pool())
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["provider"] = "gcp-eu"
    new["spec"]["template"]["metadata"]["labels"]["version"] = "2"
    assert errors_of(crd, new, old) == []


def test_template_labels_are_required_and_well_formed(crd):
    assert errors_of(crd, with_spec(template={"spec": {"provider": "k8s-local"}})) == [
        "spec.template.metadata: Required value", NOT_CHECKED]
    assert errors_of(crd, with_spec(template={"metadata": {}, "spec": {"provider": "k8s-local"}})) == [
        "spec.template.metadata.labels: Required value", NOT_CHECKED]
    assert errors_of(crd, with_spec(template={"metadata": {"labels": {}}, "spec": {"provider": "k8s-local"}})) == [
        "spec.template.metadata.labels: Invalid value: 0: spec.template.metadata.labels in body should have "
        "at least 1 properties"]
    bad_value = errors_of(crd, with_spec(template={"metadata": {"labels": {"app": "not ok"}},
                                                   "spec": {"provider": "k8s-local"}}))
    assert bad_value == ['spec.template.metadata.labels.app: Invalid value: "not ok": '
                         "spec.template.metadata.labels.app in body should match "
                         "'^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$'"]
    assert errors_of(crd, with_spec(template={"metadata": {"labels": {"example.com/tier": "a", "app": ""}},
                                              "spec": {"provider": "k8s-local"}})) == []


# -- selector -----------------------------------------------------------------------------------

MISMATCH = 'spec.template.metadata.labels: Invalid value: "object": `selector` does not match template `labels`'


@pytest.mark.parametrize("selector", [
    {"matchLabels": {"app": "squid"}},
    {"matchExpressions": [{"key": "app", "operator": "In", "values": ["squid", "other"]}]},
    {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]},
    {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]},
    {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
    {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
    {"matchLabels": {"app": "squid"}, "matchExpressions": [{"key": "app", "operator": "Exists"}]},
])
def test_a_selector_matching_the_template_labels_is_admitted(crd, selector):
    assert errors_of(crd, with_spec(selector=selector)) == []


@pytest.mark.parametrize("selector", [
    {"matchLabels": {"app": "other"}},
    {"matchLabels": {"tier": "web"}},
    {"matchExpressions": [{"key": "app", "operator": "In", "values": ["other"]}]},
    {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["x"]}]},
    {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["squid"]}]},
    {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
    {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]},
    {"matchLabels": {"app": "squid"}, "matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]},
])
def test_a_selector_that_does_not_match_is_rejected_like_a_replicaset(crd, selector):
    assert errors_of(crd, with_spec(selector=selector)) == [MISMATCH]


def test_an_empty_selector_is_rejected(crd):
    assert errors_of(crd, with_spec(selector={})) == [
        'spec.selector: Invalid value: "object": spec.selector must not be empty (omit it to select the '
        "template's labels)"]


@pytest.mark.parametrize("expression, ok", [
    ({"key": "app", "operator": "In"}, False),
    ({"key": "app", "operator": "In", "values": []}, False),
    ({"key": "app", "operator": "Exists", "values": ["squid"]}, False),
    ({"key": "app", "operator": "Exists", "values": []}, True),
])
def test_expression_values_only_with_in_and_notin(crd, expression, ok):
    errors = errors_of(crd, with_spec(selector={"matchExpressions": [expression]}))
    wanted = ('spec.selector.matchExpressions[0]: Invalid value: "object": values must be given for the '
              "operators In and NotIn, and only for them")
    assert (wanted not in errors) == ok, errors


def test_unknown_operator_is_unsupported(crd):
    errors = errors_of(crd, with_spec(selector={"matchExpressions": [{"key": "app", "operator": "Near",
                                                                       "values": ["x"]}]}))
    assert errors == ['spec.selector.matchExpressions[0].operator: Unsupported value: "Near": supported values: '
                      '"In", "NotIn", "Exists", "DoesNotExist"', NOT_CHECKED]


def test_selector_is_immutable_once_set(crd):
    old = admit(crd, with_spec(selector={"matchLabels": {"app": "squid"}}))
    changed = copy.deepcopy(old)
    changed["spec"]["selector"] = {"matchExpressions": [{"key": "app", "operator": "Exists"}]}
    immutable = 'spec: Invalid value: "object": spec.selector is immutable once set'
    assert errors_of(crd, changed, old) == [immutable]
    removed = copy.deepcopy(old)
    del removed["spec"]["selector"]
    assert errors_of(crd, removed, old) == [immutable]
    assert errors_of(crd, copy.deepcopy(old), old) == []
    # a pool without one may get one (it must match the labels anyway)
    bare = admit(crd, pool())
    added = copy.deepcopy(bare)
    added["spec"]["selector"] = {"matchLabels": {"app": "squid"}}
    assert errors_of(crd, added, bare) == []


def test_transition_rules_do_not_run_on_create(crd):
    assert errors_of(crd, with_spec(selector={"matchLabels": {"app": "squid"}})) == []


# -- maxAge, rollout, drain, spread ----------------------------------------------------------------

@pytest.mark.parametrize("value", ["6h", "30m", "1h30m", "90s", "60s", "1m", "2h0m10s", "48h"])
def test_max_age_durations_are_admitted(crd, value):
    assert errors_of(crd, with_spec(maxAge=value)) == []


@pytest.mark.parametrize("value, error", [
    ("six hours", "spec.maxAge: Invalid value: \"six hours\": spec.maxAge in body should match "
                  "'^([0-9]+h)?([0-9]+m)?([0-9]+s)?$'"),
    ("6d", "spec.maxAge: Invalid value: \"6d\": spec.maxAge in body should match '^([0-9]+h)?([0-9]+m)?([0-9]+s)?$'"),
    ("30m6h", "spec.maxAge: Invalid value: \"30m6h\": spec.maxAge in body should match "
              "'^([0-9]+h)?([0-9]+m)?([0-9]+s)?$'"),
    ("0s", 'spec.maxAge: Invalid value: "string": spec.maxAge must be at least 1m (a member must live long enough to be leased)'),
    ("0h0m", 'spec.maxAge: Invalid value: "string": spec.maxAge must be at least 1m (a member must live long enough to be leased)'),
    ("59s", 'spec.maxAge: Invalid value: "string": spec.maxAge must be at least 1m (a member must live long enough to be leased)'),
])
def test_bad_max_age_is_rejected(crd, value, error):
    assert error in errors_of(crd, with_spec(maxAge=value))


@pytest.mark.parametrize("rollout", [
    {"maxSurge": 0, "maxUnavailable": 1}, {"maxSurge": "25%"}, {"maxSurge": "150%"},
    {"maxSurge": "0%", "maxUnavailable": "10%"}, {"maxUnavailable": "100%"}, {"maxSurge": 3, "maxUnavailable": 2},
])
def test_rollout_numbers_and_percentages_are_admitted(crd, rollout):
    assert errors_of(crd, with_spec(rollout=rollout)) == []


BOTH_ZERO = ('spec.rollout: Invalid value: "object": spec.rollout.maxSurge and spec.rollout.maxUnavailable '
             "must not both be 0")


@pytest.mark.parametrize("rollout, error", [
    ({"maxSurge": 0}, BOTH_ZERO),
    ({"maxSurge": "0%", "maxUnavailable": 0}, BOTH_ZERO),
    ({"maxSurge": 0, "maxUnavailable": "00%"}, BOTH_ZERO),
    ({"maxSurge": -1}, 'spec.rollout.maxSurge: Invalid value: "": spec.rollout.maxSurge must be a number >= 0 '
                       'or a percentage such as "25%"'),
    ({"maxSurge": "one"}, 'spec.rollout.maxSurge: Invalid value: "": spec.rollout.maxSurge must be a number >= 0 '
                          'or a percentage such as "25%"'),
    ({"maxUnavailable": "150%"}, 'spec.rollout.maxUnavailable: Invalid value: "": spec.rollout.maxUnavailable '
                                 'must be a number >= 0 or a percentage from "0%" to "100%"'),
    ({"maxSurge": 1.5}, 'spec.rollout.maxSurge: Invalid value: "number": spec.rollout.maxSurge in body must be '
                        'of type integer,string: "number"'),
])
def test_bad_rollout_is_rejected(crd, rollout, error):
    assert error in errors_of(crd, with_spec(rollout=rollout))


def test_drain_and_spread(crd):
    out = admit(crd, with_spec(drain={"drainTimeoutSeconds": 0}, spread={"zones": ["a", "b"]}))
    assert out["spec"]["drain"] == {"drainTimeoutSeconds": 0} and out["spec"]["spread"] == {"zones": ["a", "b"]}
    assert errors_of(crd, with_spec(drain={"drainTimeoutSeconds": -1})) == [
        "spec.drain.drainTimeoutSeconds: Invalid value: -1: spec.drain.drainTimeoutSeconds in body should be "
        "greater than or equal to 0"]
    assert errors_of(crd, with_spec(spread={"zones": ["a", "a"]})) == ['spec.spread.zones[1]: Duplicate value: "a"']


def test_replicas_must_not_be_negative(crd):
    assert errors_of(crd, with_spec(replicas=-1)) == [
        "spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"]
    assert admit(crd, with_spec(replicas=0))["spec"]["replicas"] == 0


# -- autoscale ----------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["70%", "100%", "100.0%", "0.5%", "62.5%", "5%", 1])
def test_target_utilization_in_range_is_admitted(crd, target):
    assert errors_of(crd, with_spec(autoscale={"maxReplicas": 3, "targetLeaseUtilization": target})) == []


TARGET = ('spec.autoscale.targetLeaseUtilization: Invalid value: "": spec.autoscale.targetLeaseUtilization must '
          'be a percentage above "0%" and at most "100%", such as "70%" (or 1)')


@pytest.mark.parametrize("target, error", [
    ("0%", TARGET), ("0.0%", TARGET), ("150%", TARGET), ("100.5%", TARGET), ("0.7", TARGET), ("much", TARGET),
    (0, TARGET), (2, TARGET),
    (0.7, 'spec.autoscale.targetLeaseUtilization: Invalid value: "number": spec.autoscale.targetLeaseUtilization '
          'in body must be of type integer,string: "number"'),
])
def test_target_utilization_out_of_range_is_rejected(crd, target, error):
    assert error in errors_of(crd, with_spec(autoscale={"maxReplicas": 3, "targetLeaseUtilization": target}))


def test_autoscale_bounds(crd):
    assert errors_of(crd, with_spec(autoscale={"minReplicas": 4, "maxReplicas": 3})) == [
        'spec.autoscale: Invalid value: "object": spec.autoscale.minReplicas must not be greater than '
        "spec.autoscale.maxReplicas"]
    assert errors_of(crd, with_spec(autoscale={"minReplicas": 0, "maxReplicas": 1})) == []
    assert errors_of(crd, with_spec(autoscale={"minReplicas": 2})) == [
        "spec.autoscale.maxReplicas: Required value", NOT_CHECKED]
    assert errors_of(crd, with_spec(autoscale={"maxReplicas": 0, "minReplicas": 0})) == [
        "spec.autoscale.maxReplicas: Invalid value: 0: spec.autoscale.maxReplicas in body should be greater than "
        "or equal to 1"]


# -- status -------------------------------------------------------------------------------------

def test_status_as_the_controller_writes_it_is_admitted(crd):
    cond = {"status": "True", "lastTransitionTime": "2030-01-01T00:00:00Z", "reason": "Enough", "message": "3/3"}
    status = {"replicas": 3, "readyReplicas": 3, "leasableReplicas": 2, "updatedReplicas": 3,
              "observedGeneration": 4, "selector": "app=squid",
              "conditions": [{**cond, "type": "Available"}, {**cond, "type": "Progressing"},
                             {**cond, "type": "ScalingLimited", "status": "False"}]}
    assert admit(crd, pool(status=status))["status"] == status


@pytest.mark.parametrize("status, error", [
    ({"replicas": -1}, "status.replicas: Invalid value: -1: status.replicas in body should be greater than or "
                       "equal to 0"),
    ({"selector": 3}, 'status.selector: Invalid value: "integer": status.selector in body must be of type string: '
                      '"integer"'),
    ({"conditions": [{"type": "Available", "status": "Yes", "lastTransitionTime": "2030-01-01T00:00:00Z",
                      "reason": "R", "message": ""}]},
     'status.conditions[0].status: Unsupported value: "Yes": supported values: "True", "False", "Unknown"'),
])
def test_bad_status_is_rejected(crd, status, error):
    assert error in errors_of(crd, pool(status=status))


# -- samples ------------------------------------------------------------------------------------

def _sample_pools():
    for path in sorted(SAMPLES.glob("proxypool_*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ProxyPool":
                yield pytest.param(doc, id=f"{path.name}:{doc['metadata']['name']}")


@pytest.mark.parametrize("doc", list(_sample_pools()))
def test_every_sample_pool_is_admitted_and_read_by_the_model(crd, doc):
    from app.pools import model

    out = admit(crd, doc, field_validation="Strict")
    assert out["spec"]["template"]["spec"]["mode"] == "Managed"
    read = model.Pool.from_dict({**out, "metadata": {**out["metadata"], "uid": "u-1"}})
    assert read.spec_error == "" and read.spec.provider == doc["spec"]["template"]["spec"]["provider"]


def test_samples_cover_every_provider_type():
    names = sorted(p.name for p in SAMPLES.glob("proxypool_*.yaml"))
    assert names == ["proxypool_aws.yaml", "proxypool_gcp.yaml", "proxypool_kubernetes.yaml", "proxypool_kvm.yaml"]
    providers = {p.values[0]["spec"]["template"]["spec"]["provider"] for p in _sample_pools()}
    assert providers == {"k8s-local", "gcp-eu", "kvm-lab", "aws-eu"}
    features = json.dumps([p.values[0]["spec"] for p in _sample_pools()])
    for field in ("autoscale", "spread", "selector", "maxAge", "matchExpressions", "drainTimeoutSeconds"):
        assert field in features


def test_recycle_needs_one_rule_and_a_ban_percent_below_100(crd):
    assert errors_of(crd, with_spec(recycle={"maxBanPercent": 30})) == []
    assert errors_of(crd, with_spec(recycle={"bannedTargets": 2, "windowSeconds": 60})) == []
    [error] = errors_of(crd, with_spec(recycle={"windowSeconds": 60}))
    assert "spec.recycle" in error and "needs bannedTargets, maxBanPercent or both" in error
    assert any("spec.recycle.maxBanPercent" in e and "99" in e
               for e in errors_of(crd, with_spec(recycle={"maxBanPercent": 100})))
