"""The Kubernetes API fake: list+watch from a resourceVersion, bookmarks, timeouts and 410 Gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import urllib3
from kubernetes import client as k8s
from kubernetes import watch

from devcluster.apiserver import FakeKube

G, V, P = "crawl.example.com", "v1alpha1", "proxies"
pytestmark = pytest.mark.timeout(30)


def proxy(name: str, labels=None) -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "Proxy", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"provider": "k8s"}}


def stream(custom_api, seconds: int, **kwargs) -> list[dict]:
    """All events of one server-limited watch of every Proxy."""
    return list(watch.Watch().stream(custom_api.list_cluster_custom_object, G, V, P, timeout_seconds=seconds,
                                     _request_timeout=(5, seconds + 5), **kwargs))


def later(delay: float, fn) -> threading.Thread:
    t = threading.Timer(delay, fn)
    t.start()
    return t


def test_watch_from_a_resource_version_sends_only_later_changes(custom_api):
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("old"))
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    custom_api.patch_namespaced_custom_object(G, V, "ns1", P, "old", {"metadata": {"labels": {"x": "y"}}})
    custom_api.create_namespaced_custom_object(G, V, "ns2", P, proxy("new"))
    custom_api.delete_namespaced_custom_object(G, V, "ns1", P, "old")
    events = stream(custom_api, 1, resource_version=mark)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "old"), ("ADDED", "new"), ("DELETED", "old")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(mark)


def test_watch_without_a_resource_version_starts_with_the_current_objects(custom_api):
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("a"))
    custom_api.create_namespaced_custom_object(G, V, "ns2", P, proxy("b"))
    events = stream(custom_api, 1)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a"), ("ADDED", "b")]


def test_namespaced_watch_sees_only_its_namespace(custom_api):
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("a"))
    custom_api.create_namespaced_custom_object(G, V, "ns2", P, proxy("b"))
    events = list(watch.Watch().stream(custom_api.list_namespaced_custom_object, G, V, "ns2", P,
                                       resource_version=mark, timeout_seconds=1))
    assert [e["object"]["metadata"]["name"] for e in events] == ["b"]


def test_events_arrive_while_the_stream_is_open(custom_api):
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    later(0.3, lambda: custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("a")))
    start = time.monotonic()
    w = watch.Watch()
    for ev in w.stream(custom_api.list_cluster_custom_object, G, V, P, resource_version=mark, timeout_seconds=10):
        assert ev["type"] == "ADDED"
        w.stop()
    assert time.monotonic() - start < 3


def test_bookmarks_carry_the_newest_resource_version(kube, custom_api, kube_client):
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    core = k8s.CoreV1Api(kube_client)
    pod = core.create_namespaced_pod("default", {"metadata": {"name": "p"},
                                                 "spec": {"containers": [{"name": "c", "image": "i"}]}})
    w = watch.Watch()
    events = list(w.stream(custom_api.list_cluster_custom_object, G, V, P, resource_version=mark,
                           allow_watch_bookmarks=True, timeout_seconds=1))
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert len(bookmarks) >= 3  # every 0.2 s
    assert all(e["type"] == "BOOKMARK" for e in events)  # the Pod is not a Proxy
    assert bookmarks[-1]["object"]["metadata"]["resourceVersion"] == pod.metadata.resource_version
    assert bookmarks[-1]["object"]["kind"] == "Proxy"
    assert w.resource_version == pod.metadata.resource_version


def test_no_bookmarks_unless_asked(custom_api):
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    assert stream(custom_api, 1, resource_version=mark) == []


def test_timeout_seconds_ends_the_stream_server_side(custom_api):
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    start = time.monotonic()
    list(watch.Watch().stream(custom_api.list_cluster_custom_object, G, V, P, resource_version=mark,
                              timeout_seconds=1, _request_timeout=(5, 30)))
    assert 0.9 <= time.monotonic() - start < 3


def test_compacted_history_gives_410_as_an_error_event(kube, custom_api):
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("a"))
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("b"))
    kube.compact()
    raw = urllib.request.urlopen(f"{kube.url}/apis/{G}/{V}/{P}?watch=true&resourceVersion={mark}", timeout=5)
    assert raw.status == 200
    lines = [json.loads(line) for line in raw.read().splitlines()]
    assert len(lines) == 1 and lines[0]["type"] == "ERROR"
    status = lines[0]["object"]
    assert status["kind"] == "Status" and status["code"] == 410 and status["reason"] == "Expired"
    assert "too old resource version" in status["message"]
    with pytest.raises(k8s.ApiException) as err:
        stream(custom_api, 1, resource_version=mark)
    assert err.value.status == 410
    # the current version is still good
    now = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    assert stream(custom_api, 1, resource_version=now) == []


def test_history_window_is_configurable():
    with FakeKube(history_limit=20) as fake:
        client = fake.api_client()
        custom_api = k8s.CustomObjectsApi(client)
        mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
        for i in range(30):
            custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy(f"p{i}"))
        with pytest.raises(k8s.ApiException) as err:
            stream(custom_api, 1, resource_version=mark)
        assert err.value.status == 410
        recent = str(fake.store.resource_version - 5)
        assert len(stream(custom_api, 1, resource_version=recent)) == 5
        client.close()


def test_an_open_watch_gets_410_when_history_it_has_not_read_is_compacted(kube, custom_api):
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    sub = kube.store.subscribe(kube.store.type_named(P), resource_version=mark)
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("a"))
    kube.compact()
    with pytest.raises(Exception) as err:
        sub.next(0)
    assert getattr(err.value, "code", None) == 410


def test_label_selector_watch_reports_leaving_and_entering(custom_api):
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("a", {"pool": "x"}))
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    custom_api.patch_namespaced_custom_object(G, V, "ns1", P, "a", {"metadata": {"labels": {"pool": "y"}}})
    custom_api.patch_namespaced_custom_object(G, V, "ns1", P, "a", {"metadata": {"labels": {"pool": "x"}}})
    custom_api.patch_namespaced_custom_object(G, V, "ns1", P, "a", {"metadata": {"labels": {"pool": "x", "z": "1"}}})
    events = stream(custom_api, 1, resource_version=mark, label_selector="pool=x")
    assert [e["type"] for e in events] == ["DELETED", "ADDED", "MODIFIED"]


def test_cluster_wide_pod_watch_with_the_typed_client(kube_client):
    core = k8s.CoreV1Api(kube_client)
    mark = core.list_pod_for_all_namespaces().metadata.resource_version
    core.create_namespaced_pod("a", {"metadata": {"name": "p", "labels": {"app": "squid"}},
                                     "spec": {"containers": [{"name": "c", "image": "i"}]}})
    core.patch_namespaced_pod_status("p", "a", {"status": {"phase": "Running", "podIP": "10.42.0.10"}})
    events = list(watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=mark,
                                       label_selector="app=squid", timeout_seconds=1))
    assert [(e["type"], e["object"].status.phase) for e in events] == [("ADDED", "Pending"), ("MODIFIED", "Running")]
    assert events[-1]["object"].status.pod_ip == "10.42.0.10"


def test_finalizer_release_is_seen_as_modified_then_deleted(custom_api):
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, {**proxy("a"), "metadata": {
        "name": "a", "finalizers": ["crawl.example.com/cleanup"]}})
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    custom_api.delete_namespaced_custom_object(G, V, "ns1", P, "a")
    custom_api.patch_namespaced_custom_object(G, V, "ns1", P, "a", {"metadata": {"finalizers": None}})
    events = stream(custom_api, 1, resource_version=mark)
    assert [e["type"] for e in events] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert events[0]["object"]["metadata"]["deletionTimestamp"]


def test_a_hung_watch_stays_silent_until_the_client_times_out(kube, custom_api):
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    got: list = []
    failure: list = []

    def consume():
        try:
            for ev in watch.Watch().stream(custom_api.list_cluster_custom_object, G, V, P, resource_version=mark,
                                           allow_watch_bookmarks=True, timeout_seconds=20,
                                           _request_timeout=(2, 1.0)):
                got.append(ev["type"])
        except Exception as exc:  # noqa: BLE001 - the point of the test
            failure.append(exc)

    t = threading.Thread(target=consume)
    t.start()
    deadline = time.monotonic() + 5
    while kube.open_watches(P) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kube.hang_watches(P) == 1
    hung_at = len(got)
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("unseen"))
    t.join(timeout=10)
    assert not t.is_alive()
    assert isinstance(failure[0], urllib3.exceptions.ReadTimeoutError)
    assert len(got) == hung_at and "ADDED" not in got
    # a new watch is not hung and sees what the hung one never delivered
    events = stream(custom_api, 1, resource_version=mark)
    assert [e["object"]["metadata"]["name"] for e in events] == ["unseen"]
    kube.release_hung_watches()


def test_request_counting_and_injected_failures(kube, custom_api):
    custom_api.list_cluster_custom_object(G, V, P)
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("a"))
    custom_api.patch_namespaced_custom_object_status(G, V, "ns1", P, "a", {"status": {"phase": "Running"}})
    assert kube.request_count("list", P) == 1 and kube.request_count("create") == 1
    assert kube.request_count("patch", f"{P}/status") == 1 and kube.request_count(resource=P) == 2
    kube.fail_next("get", P, code=503, times=2, reason="ServiceUnavailable")
    for _ in range(2):
        with pytest.raises(k8s.ApiException) as err:
            custom_api.get_namespaced_custom_object(G, V, "ns1", P, "a")
        assert err.value.status == 503
    assert custom_api.get_namespaced_custom_object(G, V, "ns1", P, "a")["metadata"]["name"] == "a"


def test_kubeconfig_lets_a_subprocess_reach_the_fake(kube, custom_api, tmp_path):
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("from-test"))
    path = kube.write_kubeconfig(str(tmp_path / "kubeconfig"))
    code = ("from kubernetes import client; from app.kube import client as kube; "
            "print([o['metadata']['name'] for o in client.CustomObjectsApi(kube.api_client())"
            ".list_cluster_custom_object('crawl.example.com', 'v1alpha1', 'proxies')['items']])")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "KUBECONFIG": path}, cwd=root,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['from-test']"


def test_a_watch_whose_client_left_is_closed_server_side(kube, custom_api):
    mark = custom_api.list_cluster_custom_object(G, V, P)["metadata"]["resourceVersion"]
    conn = urllib.request.urlopen(f"{kube.url}/apis/{G}/{V}/{P}?watch=true&resourceVersion={mark}", timeout=5)
    deadline = time.monotonic() + 3
    while kube.open_watches(P) != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kube.open_watches(P) == 1
    conn.close()
    deadline = time.monotonic() + 3
    while kube.open_watches(P) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kube.open_watches(P) == 0


def test_a_delayed_write_lands_even_when_its_client_gave_up(kube, custom_api):
    kube.delay_next("create", P, seconds=1.0)
    start = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("slow"), _request_timeout=(2, 0.3))
    assert kube.request_count("create", P) == 1  # counted on arrival
    assert kube.store.find(P, "ns1", "slow") is None  # still in flight
    deadline = time.monotonic() + 3
    while kube.store.find(P, "ns1", "slow") is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kube.store.find(P, "ns1", "slow") is not None and time.monotonic() - start >= 1.0
    # only the next request was delayed
    t = time.monotonic()
    custom_api.create_namespaced_custom_object(G, V, "ns1", P, proxy("fast"))
    assert time.monotonic() - t < 0.5
