"""The kubernetes provider's GC listing: metadata only, paged, against the API fake."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from kubernetes import client as k8s

from app.config.providers import ProviderConfig
from app.providers.naming import MANAGED_BY, TAG_ABANDONED, TAG_MANAGED_BY, TAG_PROXY_UID
from app.providers.base import InstanceState
from app.errors import Transient
from app.providers.kubernetes import provider as kp
from app.providers.kubernetes.config import KubernetesSettings
from app.providers.kubernetes.provider import (LABEL_ABANDONED, LABEL_MANAGED_BY, LABEL_PROXY_UID,
                                               KubernetesProvider, instance_from_metadata)
from devcluster.apiserver import negotiation

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def provider(kube_client):
    return KubernetesProvider(ProviderConfig("k8s", "kubernetes", 60, 15, KubernetesSettings()), client=kube_client)


@pytest.fixture
def core(kube_client):
    return k8s.CoreV1Api(kube_client)


@pytest.fixture
def lists(kube, monkeypatch):
    """Record the keyword arguments of every Pod list the fake serves."""
    seen = []
    real = kube.store.list

    def spy(rt, namespace, **kwargs):
        if rt.plural == "pods":
            seen.append(kwargs)
        return real(rt, namespace, **kwargs)

    monkeypatch.setattr(kube.store, "list", spy)
    return seen


def pod(core, name, labels, namespace="default", finalizers=None):
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": name, "labels": labels, **({"finalizers": finalizers} if finalizers else {})},
        "spec": {"containers": [{"name": "squid", "image": "i", "env": [{"name": "SQUID_CONF", "value": "x" * 500}]}]}})


def managed(uid: str) -> dict:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_PROXY_UID: uid, "app.kubernetes.io/name": "squid"}


def test_lists_metadata_only_in_pages_with_the_label_selector(provider, core, lists, monkeypatch):
    monkeypatch.setattr(kp, "LIST_PAGE_SIZE", 3)
    for i in range(7):
        pod(core, f"p{i}", managed(f"uid-{i}"), namespace=f"ns{i % 3}")
    pod(core, "foreign", {LABEL_PROXY_UID: "uid-x"})
    pod(core, "helm", {LABEL_MANAGED_BY: "helm", LABEL_PROXY_UID: "uid-y"})

    result = provider.list_by_tag(MANAGED_BY)

    assert not result.partial
    assert sorted(i.provider_id for i in result.instances) == sorted(f"ns{i % 3}/p{i}" for i in range(7))
    assert len(lists) == 3  # 3 + 3 + 1
    assert all(kw["metadata_only"] and kw["limit"] == 3 and kw["label_selector"] == f"{LABEL_MANAGED_BY}={MANAGED_BY}"
               for kw in lists)
    assert [bool(kw["continue_token"]) for kw in lists] == [False, True, True]
    inst = next(i for i in result.instances if i.name == "p4")
    full = core.read_namespaced_pod("p4", "ns1")
    assert inst.tags == {TAG_MANAGED_BY: MANAGED_BY, TAG_PROXY_UID: "uid-4"}
    assert inst.zone == "ns1" and inst.created == full.metadata.creation_timestamp
    assert inst.created.tzinfo is not None
    assert inst.state == InstanceState.PROVISIONING and inst.address is None  # no status was read


def test_a_pod_being_deleted_is_terminated_and_abandoned_marks_are_tags(provider, core):
    pod(core, "going", managed("uid-1"), finalizers=["example.com/hold"])
    core.delete_namespaced_pod("going", "default")
    pod(core, "kept", {**managed("uid-2"), LABEL_ABANDONED: "true"})
    by_name = {i.name: i for i in provider.list_by_tag(MANAGED_BY).instances}
    assert by_name["going"].state == InstanceState.TERMINATED
    assert by_name["kept"].tags[TAG_ABANDONED] == "true"


def test_starts_over_when_the_continue_token_expires(kube, provider, core, monkeypatch):
    monkeypatch.setattr(kp, "LIST_PAGE_SIZE", 2)
    for i in range(5):
        pod(core, f"p{i}", managed(f"uid-{i}"))
    real = provider._metadata_page
    pages = []

    def expire_after_first_page(selector, token):
        pages.append(token)
        page = real(selector, token)
        if len(pages) == 1:  # a write and a compaction between two pages: the token is too old
            pod(core, "late", managed("uid-late"))
            kube.compact()
        return page

    monkeypatch.setattr(provider, "_metadata_page", expire_after_first_page)
    result = provider.list_by_tag(MANAGED_BY)
    assert sorted(i.name for i in result.instances) == ["late", "p0", "p1", "p2", "p3", "p4"]
    assert [t is None for t in pages] == [True, False, True, False, False]  # 410 on page 2, then a full pass


def test_gives_up_with_transient_when_tokens_keep_expiring(provider, core, monkeypatch):
    monkeypatch.setattr(kp, "LIST_PAGE_SIZE", 1)
    for i in range(3):
        pod(core, f"p{i}", managed(f"uid-{i}"))
    real = provider._metadata_page
    first_pages = []

    def page(selector, token):
        if token is not None:
            raise k8s.ApiException(status=410, reason="Expired")
        first_pages.append(token)
        return real(selector, token)

    monkeypatch.setattr(provider, "_metadata_page", page)
    with pytest.raises(Transient):
        provider.list_by_tag(MANAGED_BY)
    assert len(first_pages) == kp.LIST_RESTARTS + 1


def test_works_with_a_server_that_ignores_the_metadata_form(provider, core, monkeypatch):
    monkeypatch.setattr(negotiation, "requested_form", lambda accept: None)  # plain PodList answers
    pod(core, "p0", managed("uid-0"))
    [inst] = provider.list_by_tag(MANAGED_BY).instances
    assert inst.provider_id == "default/p0" and inst.tags[TAG_PROXY_UID] == "uid-0"


def test_api_errors_are_classified(kube, provider):
    kube.fail_next("list", "pods", code=403, reason="Forbidden")
    with pytest.raises(Exception) as err:
        provider.list_by_tag(MANAGED_BY)
    assert type(err.value).__name__ == "Permanent"
    kube.fail_next("list", "pods", code=503, reason="ServiceUnavailable")
    with pytest.raises(Transient):
        provider.list_by_tag(MANAGED_BY)


def test_instance_from_metadata_without_a_creation_time():
    inst = instance_from_metadata({"name": "p", "namespace": "n", "labels": managed("u")})
    assert inst.created is None and inst.provider_id == "n/p"
    inst = instance_from_metadata({"name": "p", "namespace": "n", "creationTimestamp": "2026-01-02T03:04:05Z"})
    assert inst.created == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc) and inst.tags == {}


def test_gc_collect_lists_with_the_cyclic_collector_paused(provider, core):
    import gc as pygc

    from app.proxy import gc as gc_logic

    pod(core, "p0", managed("uid-gone"))
    seen = []
    real_list = provider.list_by_tag

    def list_by_tag(tag):
        seen.append(("pods", pygc.isenabled()))
        return real_list(tag)

    def list_proxies():
        seen.append(("proxies", pygc.isenabled()))
        return []

    provider.list_by_tag = list_by_tag
    assert pygc.isenabled()
    report = gc_logic.collect("k8s", provider, list_proxies, abandoned=set(), grace_seconds=3600)
    assert seen == [("pods", False), ("proxies", False)] and report.listed == 1
    assert pygc.isenabled()


def test_cyclic_gc_pause_nests_and_leaves_a_disabled_collector_alone():
    import gc as pygc

    from app.proxy.gc import cyclic_gc_paused

    with cyclic_gc_paused():
        with cyclic_gc_paused():
            assert not pygc.isenabled()
        assert not pygc.isenabled()  # the outer pause still holds
    assert pygc.isenabled()
    pygc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not pygc.isenabled()  # it was off before: stays off
    finally:
        pygc.enable()
    with pytest.raises(RuntimeError):
        with cyclic_gc_paused():
            raise RuntimeError("listing failed")
    assert pygc.isenabled()
