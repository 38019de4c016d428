"""The operator's tenancy settings: which namespaces may add External Proxies or run their own
cloud-init on an instance, read from the providers config and applied by the create step
(against the API fake and real Redis), and the tokens file's client scopes."""

from __future__ import annotations

import pytest

from app.serving import view as serving

from api import tokens
from app.proxy.reconcile import create
from app.config.tenancy import Tenancy
from app.config.validation import ConfigError
from app.wiring import parse_config
from tests.support.contexts import k8s_provider
from tests.support.proxies import apply, patch_spec, pods, read

TOKEN = "tenancy-test-token-0123456789"


def _provisioned(proxy) -> dict:
    return next(c for c in proxy.status["conditions"] if c["type"] == "Provisioned")


def test_by_default_no_namespace_may_add_an_external_proxy(make_context, api, redis_client):
    ctx = make_context(k8s_provider(), tenancy=parse_config({"providers": []}, "p.yaml").tenancy)
    ref = apply(api, "ext", {"mode": "External", "endpoint": {"host": "203.0.113.9", "port": 3128}}, namespace="team-x")
    assert create(ctx, ref) is None
    proxy = read(api, ref)
    cond = _provisioned(proxy)
    assert proxy.phase == "Failed" and cond["reason"] == "SpecNotAllowed"
    assert cond["message"].startswith("spec.endpoint: External Proxies are not allowed in namespace 'team-x'")
    assert "externalProxyNamespaces (p.yaml: tenancy)" in cond["message"]
    assert serving.get(redis_client, ref.uid) is None


def test_an_allowed_namespace_adds_external_proxies_and_others_do_not(make_context, api, redis_client):
    ctx = make_context(k8s_provider(), tenancy=parse_config(
        {"providers": [], "tenancy": {"externalProxyNamespaces": ["crawl-ops"]}}, "p.yaml").tenancy)
    ok = apply(api, "ext", {"mode": "External", "endpoint": {"host": "203.0.113.9"}}, namespace="crawl-ops")
    refused = apply(api, "ext", {"mode": "External", "endpoint": {"host": "203.0.113.9"}}, namespace="other")
    create(ctx, ok)
    create(ctx, refused)
    assert read(api, ok).phase == "Running" and serving.get(redis_client, ok.uid)["address"] == "203.0.113.9"
    assert read(api, refused).phase == "Failed"


def test_a_live_external_proxy_is_withdrawn_when_its_namespace_is_no_longer_allowed(make_context, api, redis_client):
    """After the operator narrows the setting, the next resync (a create step) fails and
    withdraws an External Proxy that was serving."""
    ref = apply(api, "ext", {"mode": "External", "endpoint": {"host": "203.0.113.9"}}, namespace="team-x")
    create(make_context(k8s_provider(), tenancy=Tenancy.open()), ref)
    assert serving.get(redis_client, ref.uid) is not None
    create(make_context(k8s_provider(), tenancy=Tenancy()), ref)
    assert read(api, ref).phase == "Failed" and serving.get(redis_client, ref.uid) is None


@pytest.mark.parametrize("extra,field", [
    ({"cloudInit": {"inline": "#cloud-config\nruncmd: [id]\n"}}, "spec.cloudInit"),
    ({"cloudInit": {"secretRef": {"name": "ud", "key": "user-data"}}}, "spec.cloudInit"),
    ({"vendorData": "#cloud-config\n"}, "spec.vendorData"),
])
def test_cloud_init_is_refused_outside_the_listed_namespaces(make_context, api, extra, field):
    ctx = make_context(k8s_provider(), tenancy=parse_config(
        {"providers": [], "tenancy": {"cloudInitNamespaces": ["crawl-ops"]}}, "p.yaml").tenancy)
    ref = apply(api, "squid", {"provider": "k8s-local", **extra}, namespace="team-x")
    assert create(ctx, ref) is None
    proxy = read(api, ref)
    cond = _provisioned(proxy)
    assert proxy.phase == "Failed" and cond["reason"] == "SpecNotAllowed"
    assert cond["message"].startswith(f"{field}: not allowed in namespace 'team-x'")
    assert "cloudInitNamespaces" in cond["message"]
    assert pods(api) == []  # nothing was created


def test_a_managed_proxy_without_cloud_init_needs_no_setting(make_context, api):
    ctx = make_context(k8s_provider(), tenancy=Tenancy())
    ref = apply(api, "squid", {"provider": "k8s-local"}, namespace="team-x")
    create(ctx, ref)
    assert read(api, ref).phase == "Provisioning" and len(pods(api)) == 1
    # adding cloud-init later is refused as well (a spec change goes through the create step)
    patch_spec(api, "squid", {"cloudInit": {"inline": "#cloud-config\n"}}, namespace="team-x")
    create(ctx, ref)
    assert read(api, ref).phase == "Failed"


@pytest.mark.parametrize("tenancy,field,problem", [
    ({"externalProxyNamespaces": ["Team_A"]}, "tenancy.externalProxyNamespaces[0]", "not a namespace name"),
    ({"cloudInitNamespaces": ["*", "a"]}, "tenancy.cloudInitNamespaces", "stands alone"),
    ({"cloudInitNamespaces": "a"}, "tenancy.cloudInitNamespaces", "must be a list"),
    ({"externalNamespaces": ["a"]}, "tenancy.externalNamespaces", "unknown key"),
])
def test_a_bad_tenancy_block_names_the_field(tenancy, field, problem):
    with pytest.raises(ConfigError) as exc:
        parse_config({"providers": [], "tenancy": tenancy}, "p.yaml")
    assert exc.value.field == field and problem in exc.value.problem


# -- client scopes (tokens file) ----------------------------------------------------------------

def _clients(doc: dict):
    return tokens.parse(doc, "tokens.yaml")


def test_scopes_and_shared_namespaces_are_read():
    a, b, legacy = _clients({"sharedNamespaces": ["crawl-shared"], "clients": [
        {"name": "a", "token": TOKEN + "a", "namespaces": ["team-a"]},
        {"name": "b", "token": TOKEN + "b", "pools": ["team-a/eu"]},
        {"name": "legacy", "token": TOKEN + "c"}]})
    assert a.scope.allows("team-a", "") and not a.scope.allows("team-b", "")
    assert b.scope.allows("team-a", "eu") and not b.scope.allows("team-b", "eu") and not b.scope.allows("team-a", "")
    assert legacy.scope.allows("crawl-shared", "") and not legacy.scope.allows("team-a", "")
    everyone, = _clients({"sharedNamespaces": ["*"], "clients": [{"name": "x", "token": TOKEN}]})
    assert everyone.scope.allows("anything", "")
    nobody, = _clients({"clients": [{"name": "x", "token": TOKEN}]})  # no shared namespace: nothing
    assert not nobody.scope.allows("default", "")


@pytest.mark.parametrize("client,field,problem", [
    ({"pools": ["eu"]}, "clients[0].pools[0]", "not <namespace>/<pool name>"),
    ({"pools": ["a/b/c"]}, "clients[0].pools[0]", "not <namespace>/<pool name>"),
    ({"namespaces": ["Team A"]}, "clients[0].namespaces[0]", "not a namespace name"),
    ({"namespaces": [], "pools": []}, "clients[0].namespaces", "leases nothing"),
    ({"namespaces": "team-a"}, "clients[0].namespaces", "must be a list"),
])
def test_a_bad_scope_names_the_field(client, field, problem):
    with pytest.raises(ConfigError) as exc:
        _clients({"clients": [{"name": "x", "token": TOKEN, **client}]})
    assert exc.value.field == field and problem in exc.value.problem
    assert TOKEN not in str(exc.value)


def test_bad_shared_namespaces_name_the_field():
    with pytest.raises(ConfigError) as exc:
        _clients({"sharedNamespaces": ["*", "x"], "clients": [{"name": "x", "token": TOKEN}]})
    assert exc.value.field == "sharedNamespaces"


def test_a_pool_named_like_a_dns_subdomain_can_be_scoped():
    """A ProxyPool's name is a DNS subdomain (dots allowed; the controller takes up to 63
    characters, a label value): ``eu.west-1`` is a pool the controller runs.  The tokens file must
    accept ``team-a/eu.west-1`` as a scope; it refuses it as "not <namespace>/<pool name>", so such
    a pool's members can only be leased by widening the client to the whole namespace."""
    client, = tokens.parse({"clients": [{"name": "a", "token": TOKEN, "pools": ["team-a/eu.west-1"]}]}, "tokens.yaml")
    assert client.scope.allows("team-a", "eu.west-1") and not client.scope.allows("team-a", "eu")
