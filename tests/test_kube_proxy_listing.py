"""The gateway's cluster-wide Proxy listings against the API fake: paged, page by page, 410 restarts.

:meth:`app.kube.gateway.KubernetesGateway.list_proxies` and :meth:`~app.kube.gateway.KubernetesGateway.list_proxy_refs`
list as kube-apiserver serves large lists (API concepts, "Retrieving large results sets in
chunks"): ``limit`` and ``continue`` from one snapshot; a continue token that expired (410
Expired) starts the listing over, at most ``LIST_RESTARTS`` times, and nothing is yielded twice.
"""

from __future__ import annotations

import types

import pytest
from kubernetes import client as k8s

from app.kube import proxies as kube_mod
from app.kube.gateway import KubernetesGateway
from app.resources import GROUP, PLURAL, VERSION, Proxy, ProxyRef

pytestmark = pytest.mark.timeout(30)


def create(custom: k8s.CustomObjectsApi, name: str, namespace: str = "default", provider_id: str | None = None) -> str:
    """Create Proxy ``namespace/name`` (``status.providerID`` set when given); return its UID."""
    obj = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": name},
        "spec": {"provider": "k8s"}})
    if provider_id:
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name,
                                                     {"status": {"providerID": provider_id}})
    return obj["metadata"]["uid"]


@pytest.fixture
def gateway(kube_client, monkeypatch):
    """A gateway whose listings page 3 Proxies at a time and record each page's continue token."""
    monkeypatch.setattr(kube_mod, "LIST_PAGE_SIZE", 3)
    gw = KubernetesGateway(kube_client)
    gw.tokens = []
    real = gw._proxy_page

    def page(token):
        gw.tokens.append(token)
        return real(token)

    gw._proxy_page = page
    return gw


def test_lists_every_proxy_in_pages_and_page_by_page(custom_api, gateway):
    uids = {create(custom_api, f"p{i}", namespace=f"ns{i % 2}"): f"ns{i % 2}/p{i}" for i in range(7)}
    listing = gateway.list_proxies()
    assert isinstance(listing, types.GeneratorType) and gateway.tokens == []  # nothing read yet
    first = next(listing)
    assert isinstance(first, Proxy) and gateway.tokens == [None]  # one page read, not the whole list
    proxies = [first, *listing]
    assert {p.uid: p.key for p in proxies} == uids and len(proxies) == 7
    assert [t is None for t in gateway.tokens] == [True, False, False]  # 3 + 3 + 1


def test_refs_carry_the_uid_and_recorded_provider_id(custom_api, gateway):
    with_id = create(custom_api, "placed", provider_id="default/proxy-abc")
    without = [create(custom_api, f"new{i}") for i in range(4)]
    refs = list(gateway.list_proxy_refs())
    assert all(isinstance(r, ProxyRef) for r in refs) and len(refs) == 5 and len(gateway.tokens) == 2
    assert set(refs) == {ProxyRef(with_id, "default/proxy-abc"), *(ProxyRef(u, None) for u in without)}


def test_an_expired_continue_token_starts_the_listing_over_without_repeats(kube, custom_api, gateway):
    uids = {create(custom_api, f"p{i}"): f"p{i}" for i in range(5)}
    real = gateway._proxy_page
    yielded = []

    def expire_after_first_page(token):
        page = real(token)
        if len(gateway.tokens) == 1:  # a write and a compaction between two pages: the token is too old
            uids[create(custom_api, "late")] = "late"
            custom_api.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "p0")  # already yielded
            kube.compact()
        return page

    gateway._proxy_page = expire_after_first_page
    for proxy in gateway.list_proxies():
        yielded.append(proxy.name)
    # p0..p2 from the first snapshot, then the fresh snapshot's Proxies not yet yielded (late included)
    assert yielded[:3] == ["p0", "p1", "p2"]
    assert sorted(yielded) == sorted(uids.values()) and len(yielded) == len(set(yielded)) == 6
    assert [t is None for t in gateway.tokens] == [True, False, True, False]  # 410 on page 2, then a full pass


def test_gives_up_with_the_410_after_the_restarts(custom_api, gateway):
    for i in range(4):
        create(custom_api, f"p{i}")
    real = gateway._proxy_page

    def always_expired(token):
        if token is not None:
            gateway.tokens.append(token)
            raise k8s.ApiException(status=410, reason="Expired")
        return real(token)

    gateway._proxy_page = always_expired
    with pytest.raises(k8s.ApiException) as err:
        list(gateway.list_proxy_refs())
    assert err.value.status == 410
    assert gateway.tokens.count(None) == kube_mod.LIST_RESTARTS + 1


def test_other_errors_are_not_retried(kube_client, monkeypatch):
    gw = KubernetesGateway(kube_client)
    calls = []

    def forbidden(token):
        calls.append(token)
        raise k8s.ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(gw, "_proxy_page", forbidden)
    with pytest.raises(k8s.ApiException) as err:
        list(gw.list_proxies())
    assert err.value.status == 403 and calls == [None]


def test_a_ref_needs_a_uid():
    with pytest.raises(ValueError):
        ProxyRef.from_dict({"metadata": {"name": "x"}})
    assert ProxyRef.from_dict({"metadata": {"uid": "u"}, "status": {"providerID": ""}}) == ProxyRef("u", None)
