"""The Kubernetes API fake: garbage collection by ownerReferences, as on a real cluster.

Everything goes over HTTP with the real ``kubernetes`` client: a ProxyPool owns Proxies
(``blockOwnerDeletion: true``, one of them holding the operator's finalizer), a Proxy owns
its credentials Secret.  Deleting the pool with propagationPolicy Background (the default),
Foreground or Orphan does what the Kubernetes docs say
(https://kubernetes.io/docs/concepts/architecture/garbage-collection/); dependents of owners
that went away while the collector was paused are collected once it runs.
"""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client as k8s

from app.resources import FINALIZER
from devcluster.apiserver import FakeKube
from tests.support.waiting import wait_for

G, V = "crawl.example.com", "v1alpha1"
NS = "default"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def core(kube_client):
    return k8s.CoreV1Api(kube_client)


def owner_ref(obj: dict, *, block: bool = True, controller: bool = True) -> dict:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": controller, "blockOwnerDeletion": block}


def make_pool(custom_api, name: str = "pool") -> dict:
    return custom_api.create_namespaced_custom_object(G, V, NS, "proxypools", {
        "apiVersion": f"{G}/{V}", "kind": "ProxyPool", "metadata": {"name": name},
        "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": "squid"}},
                                             "spec": {"provider": "k8s-local"}}}})


def make_proxy(custom_api, name: str, owners: list[dict], finalizers: list[str] | None = None) -> dict:
    meta = {"name": name, "ownerReferences": owners, "labels": {"app": "squid"}}
    if finalizers:
        meta["finalizers"] = finalizers
    return custom_api.create_namespaced_custom_object(G, V, NS, "proxies", {
        "apiVersion": f"{G}/{V}", "kind": "Proxy", "metadata": meta, "spec": {"provider": "k8s-local"}})


def make_secret(core, name: str, owners: list[dict]) -> dict:
    return core.create_namespaced_secret(NS, {"metadata": {"name": name, "ownerReferences": owners},
                                              "stringData": {"username": "u"}}).to_dict()


def proxy(custom_api, name: str) -> dict | None:
    try:
        return custom_api.get_namespaced_custom_object(G, V, NS, "proxies", name)
    except k8s.ApiException as exc:
        assert exc.status == 404
        return None


def pool_of(custom_api, name: str = "pool") -> dict | None:
    try:
        return custom_api.get_namespaced_custom_object(G, V, NS, "proxypools", name)
    except k8s.ApiException as exc:
        assert exc.status == 404
        return None


def secret(core, name: str):
    try:
        return core.read_namespaced_secret(name, NS)
    except k8s.ApiException as exc:
        assert exc.status == 404
        return None


def release(custom_api, name: str) -> None:
    """What the operator does when it is done with a Proxy: drop its finalizer."""
    custom_api.patch_namespaced_custom_object(G, V, NS, "proxies", name, {"metadata": {"finalizers": None}})


@pytest.fixture
def family(custom_api, core):
    """A pool owning two Proxies (``held`` carries the operator's finalizer, ``free`` none);
    ``free`` owns a Secret.  Returns the pool."""
    pool = make_pool(custom_api)
    held = make_proxy(custom_api, "held", [owner_ref(pool)], [FINALIZER])
    free = make_proxy(custom_api, "free", [owner_ref(pool)])
    make_secret(core, "free-proxy-auth", [owner_ref(free, block=False)])
    return {"pool": pool, "held": held, "free": free}


# -- background (the default) ---------------------------------------------------------------------

@pytest.mark.parametrize("body", [None, {"propagationPolicy": "Background"}], ids=["default", "explicit"])
def test_background_deletes_the_owner_at_once_then_its_dependents(kube, custom_api, core, family, body):
    kwargs = {"body": body} if body else {}
    custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool", **kwargs)
    assert pool_of(custom_api) is None  # gone at once: nothing waits for the dependents
    wait_for(lambda: proxy(custom_api, "free") is None, 10, "the Proxy without a finalizer collected")
    wait_for(lambda: secret(core, "free-proxy-auth") is None, 10, "the Secret of that Proxy collected in turn")
    held = wait_for(lambda: (proxy(custom_api, "held") or {}).get("metadata", {}).get("deletionTimestamp")
                    and proxy(custom_api, "held"), 10, "the Proxy with a finalizer marked deleted")
    assert held["metadata"]["finalizers"] == [FINALIZER]  # stays until the operator lets go
    time.sleep(0.3)
    assert proxy(custom_api, "held") is not None
    release(custom_api, "held")
    assert proxy(custom_api, "held") is None


def test_dependents_with_another_owner_left_lose_only_the_reference(kube, custom_api, family):
    other = make_pool(custom_api, "other")
    shared = make_proxy(custom_api, "shared", [owner_ref(family["pool"]), owner_ref(other, controller=False)])
    custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool")
    wait_for(lambda: [r["uid"] for r in proxy(custom_api, "shared")["metadata"].get("ownerReferences", [])]
             == [other["metadata"]["uid"]], 10, "the reference to the deleted pool removed")
    assert proxy(custom_api, "shared")["metadata"]["uid"] == shared["metadata"]["uid"]
    assert "deletionTimestamp" not in proxy(custom_api, "shared")["metadata"]


def test_a_dependent_released_by_a_merge_patch_survives_its_former_owner(kube, custom_api, family):
    # what a controller's release does (a ReplicaSet letting go of a Pod): the list without the
    # reference, under the resourceVersion and UID read; the collector no longer counts it a dependent
    other = make_pool(custom_api, "other")
    free = family["free"]
    make_proxy(custom_api, "kept", [owner_ref(family["pool"]), owner_ref(other, controller=False)])
    kept = proxy(custom_api, "kept")
    for obj, refs in ((free, None), (kept, [owner_ref(other, controller=False)])):
        custom_api.patch_namespaced_custom_object(G, V, NS, "proxies", obj["metadata"]["name"], {"metadata": {
            "ownerReferences": refs, "resourceVersion": obj["metadata"]["resourceVersion"],
            "uid": obj["metadata"]["uid"]}})
    custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool")
    wait_for(lambda: (proxy(custom_api, "held") or {}).get("metadata", {}).get("deletionTimestamp"), 10,
             "the pool's remaining dependent collected")
    kube.gc.collect()
    for name in ("free", "kept"):
        left = proxy(custom_api, name)
        assert left is not None and "deletionTimestamp" not in left["metadata"], name
    assert "ownerReferences" not in proxy(custom_api, "free")["metadata"]
    assert [r["uid"] for r in proxy(custom_api, "kept")["metadata"]["ownerReferences"]] == [other["metadata"]["uid"]]


def test_a_new_owner_of_the_same_name_does_not_adopt_the_old_dependents(kube, custom_api):
    old = make_pool(custom_api)
    with kube.gc.paused():
        make_proxy(custom_api, "orphaned", [owner_ref(old)])
        custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool")
        make_pool(custom_api)  # same name, another UID
        time.sleep(0.3)
        assert proxy(custom_api, "orphaned") is not None  # paused: nothing happens
    wait_for(lambda: proxy(custom_api, "orphaned") is None, 10, "a dependent of the old UID collected")
    assert pool_of(custom_api) is not None


def test_dependents_of_an_owner_deleted_while_the_collector_was_paused(kube, custom_api, core, family):
    kube.gc.pause()
    custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool")
    time.sleep(0.5)
    assert proxy(custom_api, "free") is not None and secret(core, "free-proxy-auth") is not None
    kube.gc.resume()
    wait_for(lambda: proxy(custom_api, "free") is None and secret(core, "free-proxy-auth") is None, 10,
             "dependents of the vanished owner collected")
    assert proxy(custom_api, "held")["metadata"].get("deletionTimestamp")


def test_a_dependent_created_with_a_missing_owner_is_collected(kube, custom_api, core):
    make_secret(core, "stray", [{"apiVersion": f"{G}/{V}", "kind": "Proxy", "name": "never",
                                 "uid": "0000-never-existed", "controller": True}])
    wait_for(lambda: secret(core, "stray") is None, 10, "a Secret owned by a Proxy that never existed collected")


def test_unresolvable_owner_kinds_are_left_alone(kube, core):
    make_secret(core, "owned-by-unknown", [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                            "uid": "1234", "controller": True}])
    kube.gc.collect()
    assert secret(core, "owned-by-unknown") is not None


# -- foreground -------------------------------------------------------------------------------------

def test_foreground_waits_for_blocking_dependents_and_their_finalizers(kube, custom_api, core, family):
    out = custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool",
                                                     body={"propagationPolicy": "Foreground"})
    assert out["metadata"]["deletionTimestamp"] and out["metadata"]["finalizers"] == ["foregroundDeletion"]
    wait_for(lambda: proxy(custom_api, "free") is None, 10, "the free Proxy deleted first")
    wait_for(lambda: secret(core, "free-proxy-auth") is None, 10, "and its Secret")
    held = wait_for(lambda: (proxy(custom_api, "held") or {}).get("metadata", {}).get("deletionTimestamp")
                    and proxy(custom_api, "held"), 10, "the held Proxy marked deleted")
    assert held["metadata"]["finalizers"] == [FINALIZER]
    time.sleep(0.5)
    pool = pool_of(custom_api)
    assert pool is not None and pool["metadata"]["finalizers"] == ["foregroundDeletion"]  # still waiting
    release(custom_api, "held")
    wait_for(lambda: pool_of(custom_api) is None, 10, "the pool removed once its last blocking dependent is gone")


def test_foreground_does_not_wait_for_non_blocking_dependents(kube, custom_api):
    pool = make_pool(custom_api)
    make_proxy(custom_api, "loose", [owner_ref(pool, block=False)], [FINALIZER])
    custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool",
                                               body={"propagationPolicy": "Foreground"})
    wait_for(lambda: pool_of(custom_api) is None, 10, "the pool removed without waiting")
    loose = proxy(custom_api, "loose")
    assert loose["metadata"]["deletionTimestamp"] and loose["metadata"]["finalizers"] == [FINALIZER]
    release(custom_api, "loose")
    assert proxy(custom_api, "loose") is None


def test_foreground_with_the_owners_own_finalizer(kube, custom_api):
    pool = custom_api.patch_namespaced_custom_object(G, V, NS, "proxypools", make_pool(custom_api)["metadata"]["name"],
                                                     {"metadata": {"finalizers": ["crawl.example.com/pool"]}})
    make_proxy(custom_api, "member", [owner_ref(pool)])
    custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool",
                                               body={"propagationPolicy": "Foreground"})
    wait_for(lambda: proxy(custom_api, "member") is None, 10, "the member deleted")
    wait_for(lambda: pool_of(custom_api)["metadata"]["finalizers"] == ["crawl.example.com/pool"], 10,
             "foregroundDeletion removed, the pool's own finalizer kept")
    custom_api.patch_namespaced_custom_object(G, V, NS, "proxypools", "pool", {"metadata": {"finalizers": None}})
    assert pool_of(custom_api) is None


def test_foreground_from_the_query_string(kube, custom_api):
    import requests

    make_proxy(custom_api, "member", [owner_ref(make_pool(custom_api))], [FINALIZER])
    res = requests.delete(f"{kube.url}/apis/{G}/{V}/namespaces/{NS}/proxypools/pool",
                          params={"propagationPolicy": "Foreground"}, timeout=5)
    assert res.status_code == 200 and res.json()["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert pool_of(custom_api)["metadata"]["finalizers"] == ["foregroundDeletion"]
    wait_for(lambda: proxy(custom_api, "member")["metadata"].get("deletionTimestamp"), 10, "member deleting")
    release(custom_api, "member")
    wait_for(lambda: pool_of(custom_api) is None, 10, "pool gone")


def test_foreground_goes_down_a_chain_of_owners(kube, custom_api, core):
    member = make_proxy(custom_api, "member", [owner_ref(make_pool(custom_api))])
    core.create_namespaced_secret(NS, {"metadata": {"name": "member-proxy-auth", "finalizers": ["example.com/keep"],
                                                    "ownerReferences": [owner_ref(member)]}})
    custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool",
                                               body={"propagationPolicy": "Foreground"})
    # the member has a dependent of its own: it is deleted in the foreground too, and waits for it
    wait_for(lambda: proxy(custom_api, "member")["metadata"].get("finalizers") == ["foregroundDeletion"], 10,
             "the member deleting its dependents first")
    wait_for(lambda: secret(core, "member-proxy-auth").metadata.deletion_timestamp, 10, "the Secret deleting")
    time.sleep(0.3)
    assert pool_of(custom_api) is not None and proxy(custom_api, "member") is not None
    core.patch_namespaced_secret("member-proxy-auth", NS, {"metadata": {"finalizers": None}})
    wait_for(lambda: proxy(custom_api, "member") is None, 10, "the member gone after its Secret")
    wait_for(lambda: pool_of(custom_api) is None, 10, "the pool gone last")


# -- orphan -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [{"propagationPolicy": "Orphan"}, {"orphanDependents": True}],
                         ids=["propagationPolicy", "orphanDependents"])
def test_orphan_removes_the_references_and_keeps_the_dependents(kube, custom_api, core, family, body):
    out = custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool", body=body)
    assert out["metadata"]["finalizers"] == ["orphan"]
    wait_for(lambda: pool_of(custom_api) is None, 10, "the pool removed after orphaning")
    for name in ("held", "free"):
        p = proxy(custom_api, name)
        assert "ownerReferences" not in p["metadata"] and "deletionTimestamp" not in p["metadata"], name
    assert secret(core, "free-proxy-auth").metadata.owner_references[0].name == "free"  # not the pool's


def test_orphan_waits_while_the_collector_is_paused(kube, custom_api, family):
    with kube.gc.paused():
        custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool", body={"propagationPolicy": "Orphan"})
        time.sleep(0.3)
        assert pool_of(custom_api)["metadata"]["finalizers"] == ["orphan"]  # the API server only marks it
        assert proxy(custom_api, "free")["metadata"]["ownerReferences"]
    wait_for(lambda: pool_of(custom_api) is None, 10, "orphaned after resume")
    assert "ownerReferences" not in proxy(custom_api, "free")["metadata"]


# -- the API server's part --------------------------------------------------------------------------

def test_bad_propagation_options_are_422(custom_api):
    make_pool(custom_api)
    with pytest.raises(k8s.ApiException) as err:
        custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool", body={"propagationPolicy": "Later"})
    body = json.loads(err.value.body)
    assert err.value.status == 422 and body["message"] == (
        'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: "Later": supported '
        'values: "Foreground", "Background", "Orphan", "nil"')
    with pytest.raises(k8s.ApiException) as err:
        custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool",
                                                   body={"propagationPolicy": "Orphan", "orphanDependents": True})
    assert err.value.status == 422 and "orphanDependents and deletionPropagation cannot be both set" in err.value.body
    assert pool_of(custom_api) is not None


def test_a_second_delete_may_change_the_policy(kube, custom_api):
    pool = make_pool(custom_api)
    make_proxy(custom_api, "member", [owner_ref(pool)], [FINALIZER])
    with kube.gc.paused():
        first = custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool",
                                                           body={"propagationPolicy": "Foreground"})
        again = custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool",
                                                           body={"propagationPolicy": "Foreground"})
        assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]  # nothing new
        orphaning = custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool",
                                                               body={"propagationPolicy": "Orphan"})
        assert orphaning["metadata"]["finalizers"] == ["orphan"]
        assert orphaning["metadata"]["deletionTimestamp"] == first["metadata"]["deletionTimestamp"]
        assert orphaning["metadata"]["generation"] == first["metadata"]["generation"]
    wait_for(lambda: pool_of(custom_api) is None, 10, "pool gone")
    assert "ownerReferences" not in proxy(custom_api, "member")["metadata"]


def test_without_a_collector_nothing_is_collected():
    with FakeKube(garbage_collector=False) as fake:
        client = fake.api_client()
        try:
            custom = k8s.CustomObjectsApi(client)
            make_proxy(custom, "member", [owner_ref(make_pool(custom))])
            custom.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool",
                                                   body={"propagationPolicy": "Foreground"})
            time.sleep(0.3)
            assert fake.gc is None
            assert pool_of(custom)["metadata"]["finalizers"] == ["foregroundDeletion"]
            assert proxy(custom, "member") is not None
        finally:
            client.close()


def test_collector_writes_are_not_client_requests(kube, custom_api, family):
    seen = kube.audit("kubefake")
    before = kube.request_count("delete", "proxies")
    custom_api.delete_namespaced_custom_object(G, V, NS, "proxypools", "pool")
    wait_for(lambda: proxy(custom_api, "free") is None, 10, "collected")
    assert kube.request_count("delete", "proxies") == before
    assert ("delete", G, "proxies", NS) not in seen


def test_owner_references_are_validated(custom_api, core):
    pool = make_pool(custom_api)
    other = make_pool(custom_api, "other")
    with pytest.raises(k8s.ApiException) as err:
        make_proxy(custom_api, "two-controllers", [owner_ref(pool), owner_ref(other)])
    body = json.loads(err.value.body)
    assert err.value.status == 422 and body["details"]["causes"][0]["field"] == "metadata.ownerReferences"
    assert ('Only one reference can have Controller set to true. Found "true" in references for ProxyPool/pool and '
            "ProxyPool/other") in body["message"]
    with pytest.raises(k8s.ApiException) as err:
        make_secret(core, "no-uid", [{"apiVersion": f"{G}/{V}", "kind": "Proxy", "name": "x", "uid": ""}])
    assert err.value.status == 422 and 'metadata.ownerReferences.uid: Invalid value: "": must not be empty' in \
        json.loads(err.value.body)["message"]
    with pytest.raises(k8s.ApiException) as err:
        custom_api.patch_namespaced_custom_object(G, V, NS, "proxypools", "other", {"metadata": {"ownerReferences": [
            {"apiVersion": "", "kind": "Proxy", "name": "x", "uid": "1"}]}})
    assert err.value.status == 422 and "version must not be empty" in err.value.body
