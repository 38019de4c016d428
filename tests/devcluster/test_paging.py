"""The Kubernetes API fake: chunked lists and metadata-only answers, as kube-apiserver serves them.

Upstream behaviour checked here (https://kubernetes.io/docs/reference/using-api/api-concepts/):

* "Retrieving large results sets in chunks": ``limit`` caps a page, ``metadata.continue``
  leads to the next one; every page of one list comes from the first page's snapshot (same
  ``resourceVersion``, objects as they were then); ``remainingItemCount`` counts what follows
  unless the list had selectors (ListMeta docs); a token older than the compacted history gets
  410 ``Expired`` whose Status carries a token for an inconsistent continuation.
* "Receiving resources as PartialObjectMetadata": ``Accept:
  application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`` lists metadata only
  (``meta.k8s.io/v1`` ``PartialObjectMetadataList`` of ``PartialObjectMetadata``), and
  ``as=PartialObjectMetadata`` does the same for one object or a watch; a form that does not fit
  the answer is 406 Not Acceptable.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from devcluster.apiserver import PODS, PROXIES
from devcluster.apiserver.negotiation import requested_form

G, V, P = "crawl.example.com", "v1alpha1", "proxies"
PARTIAL_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
PARTIAL = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
pytestmark = pytest.mark.timeout(30)


def proxy(name: str, labels: dict | None = None) -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "Proxy", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"provider": "k8s"}}


@pytest.fixture
def custom(kube_client):
    return k8s.CustomObjectsApi(kube_client)


@pytest.fixture
def core(kube_client):
    return k8s.CoreV1Api(kube_client)


def raw_list(core: k8s.CoreV1Api, accept: str | None = None, **kwargs) -> dict:
    """List Pods cluster-wide with ``accept`` and return the parsed body."""
    headers = {"Accept": accept} if accept else None
    resp = core.list_pod_for_all_namespaces(_preload_content=False, _headers=headers, **kwargs)
    try:
        return json.loads(resp.data)
    finally:
        resp.release_conn()


def make_pods(core: k8s.CoreV1Api, n: int, labels: dict | None = None, prefix: str = "pod") -> None:
    for i in range(n):
        core.create_namespaced_pod(f"ns{i % 2}", {
            "metadata": {"name": f"{prefix}{i}", "labels": labels or {"app": "squid"}},
            "spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": "BIG", "value": "x" * 200}]}]}})


def names(items) -> list[str]:
    return [o["metadata"]["name"] for o in items]


# -- chunks ----------------------------------------------------------------------------------
def test_continued_pages_come_from_the_first_pages_snapshot(custom):
    for i in range(7):
        custom.create_namespaced_custom_object(G, V, "default", P, proxy(f"p{i}"))
    first = custom.list_cluster_custom_object(G, V, P, limit=3)
    rv = first["metadata"]["resourceVersion"]
    assert names(first["items"]) == ["p0", "p1", "p2"] and first["metadata"]["remainingItemCount"] == 4
    before = custom.get_namespaced_custom_object(G, V, "default", P, "p4")
    # Meanwhile: one object changes, one goes, one comes (after the last key).
    custom.patch_namespaced_custom_object(G, V, "default", P, "p4", {"metadata": {"labels": {"changed": "yes"}}})
    custom.delete_namespaced_custom_object(G, V, "default", P, "p5")
    custom.create_namespaced_custom_object(G, V, "default", P, proxy("p9"))

    second = custom.list_cluster_custom_object(G, V, P, limit=3, _continue=first["metadata"]["continue"])
    assert second["metadata"]["resourceVersion"] == rv
    assert names(second["items"]) == ["p3", "p4", "p5"]
    assert second["items"][1] == before  # p4 as it was when the list began
    assert second["metadata"]["remainingItemCount"] == 1
    third = custom.list_cluster_custom_object(G, V, P, limit=3, _continue=second["metadata"]["continue"])
    assert names(third["items"]) == ["p6"] and third["metadata"]["resourceVersion"] == rv
    assert "continue" not in third["metadata"] and "remainingItemCount" not in third["metadata"]
    # A fresh list sees the new state.
    fresh = custom.list_cluster_custom_object(G, V, P)
    assert names(fresh["items"]) == ["p0", "p1", "p2", "p3", "p4", "p6", "p9"]
    assert int(fresh["metadata"]["resourceVersion"]) > int(rv)


def test_snapshot_is_rebuilt_from_history_when_many_lists_ran_meanwhile(kube, custom):
    for i in range(4):
        custom.create_namespaced_custom_object(G, V, "default", P, proxy(f"p{i}"))
    first = custom.list_cluster_custom_object(G, V, P, limit=2)
    custom.delete_namespaced_custom_object(G, V, "default", P, "p3")
    for i in range(12):  # more lists at other versions than the fake keeps snapshots for
        custom.create_namespaced_custom_object(G, V, "other", P, proxy(f"q{i}"))
        custom.list_cluster_custom_object(G, V, P, limit=1)
    rest = custom.list_cluster_custom_object(G, V, P, limit=10, _continue=first["metadata"]["continue"])
    assert names(rest["items"]) == ["p2", "p3"]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def test_remaining_item_count_only_without_selectors(core):
    make_pods(core, 5)
    page = raw_list(core, limit=2)
    assert page["metadata"]["remainingItemCount"] == 3 and page["metadata"]["continue"]
    selected = raw_list(core, limit=2, label_selector="app=squid")
    assert "remainingItemCount" not in selected["metadata"] and selected["metadata"]["continue"]
    one_ns = k8s.CoreV1Api(core.api_client).list_namespaced_pod("ns0", limit=2)
    assert one_ns.metadata.remaining_item_count == 1  # pod0, pod2, pod4 live in ns0
    rest = k8s.CoreV1Api(core.api_client).list_namespaced_pod("ns0", limit=2, _continue=one_ns.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["pod4"] and rest.metadata._continue is None


def test_label_selected_pages_cover_exactly_the_matches(core):
    make_pods(core, 6, {"app": "squid"})
    make_pods(core, 5, {"app": "other"}, prefix="x")
    seen, token, pages = [], None, 0
    while True:
        page = raw_list(core, limit=4, label_selector="app=squid", _continue=token)
        pages += 1
        seen += names(page["items"])
        token = page["metadata"].get("continue")
        if not token:
            break
    assert sorted(seen) == [f"pod{i}" for i in range(6)] and pages == 2


def test_expired_continue_token_is_410_with_an_inconsistent_continuation(kube, custom):
    for i in range(5):
        custom.create_namespaced_custom_object(G, V, "default", P, proxy(f"p{i}"))
    first = custom.list_cluster_custom_object(G, V, P, limit=2)
    custom.create_namespaced_custom_object(G, V, "default", P, proxy("p9"))
    kube.compact()  # the first page's revision is gone, as after an etcd compaction
    with pytest.raises(k8s.ApiException) as err:
        custom.list_cluster_custom_object(G, V, P, limit=2, _continue=first["metadata"]["continue"])
    assert err.value.status == 410
    status = json.loads(err.value.body)
    assert status["kind"] == "Status" and status["reason"] == "Expired" and status["code"] == 410
    assert "too old to display a consistent list result" in status["message"]
    token = status["metadata"]["continue"]
    # The Status's token goes on after the last key, from the current state (p9 shows up).
    rest = custom.list_cluster_custom_object(G, V, P, limit=10, _continue=token)
    assert names(rest["items"]) == ["p2", "p3", "p4", "p9"]
    assert int(rest["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])


@pytest.mark.parametrize("token", ["garbage", "eyJydiI6IDF9", "eyJydiI6IDk5OTk5OSwgInN0YXJ0IjogWyJhIiwgImIiXX0="])
def test_malformed_or_unknown_continue_token_is_400(custom, token):
    # the last one is well formed but names a resourceVersion the server never issued
    with pytest.raises(k8s.ApiException) as err:
        custom.list_cluster_custom_object(G, V, P, limit=2, _continue=token)
    assert err.value.status == 400


# -- metadata only ---------------------------------------------------------------------------
def test_partial_object_metadata_list_carries_metadata_only(core):
    make_pods(core, 3)
    body = raw_list(core, PARTIAL_LIST)
    assert body["kind"] == "PartialObjectMetadataList" and body["apiVersion"] == "meta.k8s.io/v1"
    assert body["metadata"]["resourceVersion"]
    full = {p.metadata.name: p for p in core.list_pod_for_all_namespaces().items}
    assert names(body["items"]) == ["pod0", "pod2", "pod1"]  # namespace/name order: ns0 first
    for item in body["items"]:
        assert set(item) == {"kind", "apiVersion", "metadata"}
        assert item["kind"] == "PartialObjectMetadata" and item["apiVersion"] == "meta.k8s.io/v1"
        pod = full[item["metadata"]["name"]]
        assert item["metadata"]["uid"] == pod.metadata.uid
        assert item["metadata"]["labels"] == {"app": "squid"}
        assert item["metadata"]["resourceVersion"] == pod.metadata.resource_version
        assert item["metadata"]["creationTimestamp"]


def test_partial_object_metadata_list_pages_like_the_full_list(core):
    make_pods(core, 5)
    first = raw_list(core, PARTIAL_LIST, limit=2)
    assert first["kind"] == "PartialObjectMetadataList"
    assert first["metadata"]["remainingItemCount"] == 3
    second = raw_list(core, PARTIAL_LIST, limit=10, _continue=first["metadata"]["continue"])
    assert second["kind"] == "PartialObjectMetadataList"
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert len(first["items"]) + len(second["items"]) == 5 and "continue" not in second["metadata"]


def test_first_producible_media_range_wins(core):
    make_pods(core, 1)
    fallback = f"application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,{PARTIAL_LIST},application/json"
    assert raw_list(core, fallback)["kind"] == "PartialObjectMetadataList"
    unknown = "application/json;as=Unknown;g=meta.k8s.io;v=v1,application/json"
    assert raw_list(core, unknown)["kind"] == "PodList"
    assert raw_list(core, "application/json")["kind"] == "PodList"
    assert requested_form("application/json;as=PartialObjectMetadataList;g=example.com;v=v1") is None
    assert requested_form("application/json;v=v1;g=meta.k8s.io;as=Table") == "Table"


def test_partial_object_metadata_of_one_object_and_406_for_a_mismatched_form(custom):
    created = custom.create_namespaced_custom_object(G, V, "default", P, proxy("p0", {"a": "b"}))
    resp = custom.get_namespaced_custom_object(G, V, "default", P, "p0", _preload_content=False,
                                               _headers={"Accept": PARTIAL})
    body = json.loads(resp.data)
    assert body == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": created["metadata"]}
    with pytest.raises(k8s.ApiException) as err:
        custom.get_namespaced_custom_object(G, V, "default", P, "p0", _headers={"Accept": PARTIAL_LIST})
    assert err.value.status == 406 and json.loads(err.value.body)["reason"] == "NotAcceptable"
    with pytest.raises(k8s.ApiException) as err:
        custom.list_cluster_custom_object(G, V, P, _headers={"Accept": PARTIAL})
    assert err.value.status == 406 and "is a list" in json.loads(err.value.body)["message"]


def test_watch_as_partial_object_metadata(custom):
    mark = custom.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    custom.create_namespaced_custom_object(G, V, "default", P, proxy("p0"))
    events = list(k8s_watch.Watch().stream(custom.list_cluster_custom_object, G, V, P, resource_version=mark,
                                           timeout_seconds=1, _headers={"Accept": PARTIAL}))
    assert [e["type"] for e in events] == ["ADDED"]
    obj = events[0]["raw_object"]
    assert set(obj) == {"kind", "apiVersion", "metadata"} and obj["kind"] == "PartialObjectMetadata"
    assert obj["metadata"]["name"] == "p0"


# -- bulk seeding (benchmarks) ---------------------------------------------------------------
def test_seed_stores_objects_as_given_and_compacts_history(kube, custom):
    mark = custom.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    objs = [{**proxy(f"s{i}"), "status": {"phase": "Ready"}} for i in range(3)]
    objs[0]["metadata"]["namespace"] = "bench"
    assert kube.store.seed(PROXIES, objs) == 3
    listed = custom.list_cluster_custom_object(G, V, P)["items"]
    assert names(listed) == ["s0", "s1", "s2"]  # bench/s0, then default/...
    assert all(o["status"] == {"phase": "Ready"} and o["metadata"]["uid"] and o["metadata"]["generation"] == 1
               for o in listed)
    assert len({o["metadata"]["resourceVersion"] for o in listed}) == 3
    with pytest.raises(k8s.ApiException) as err:  # no events were kept for them: a watch from before is 410
        list(k8s_watch.Watch().stream(custom.list_cluster_custom_object, G, V, P, resource_version=mark,
                                      timeout_seconds=1))
    assert err.value.status == 410
    with pytest.raises(Exception) as dup:
        kube.store.seed(PROXIES, [proxy("s1")])
    assert getattr(dup.value, "code", None) == 409
    kube.store.seed(PODS, [{"metadata": {"name": "pod", "namespace": "n"}, "spec": {"containers": []}}])
    assert [p.metadata.name for p in k8s.CoreV1Api(custom.api_client).list_namespaced_pod("n").items] == ["pod"]
