"""The watcher's event hand-off (watchers.handoff.Handoff): a failing callback never loses an event.

The callback here stands in for ``watchers.events`` (the dispatcher's ``on_event``) while Redis is unreachable: it
raises ``redis.ConnectionError`` until told Redis is back.  The last test runs the whole
watcher (``watchers.main.run``) against the Kubernetes API fake.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis
from kubernetes import client as k8s

from devcluster.apiserver import FakeKube
from tests.support.waiting import wait_until
from watchers.handoff import Handoff
from watchers.leader import ElectionSettings
from watchers.main import WatcherSettings, run
from watchers.stream import StreamSettings

pytestmark = pytest.mark.timeout(60)
FAST = StreamSettings(backoff_initial=0.02, backoff_max=0.1)
G, V, P = "crawl.example.com", "v1alpha1", "proxies"


def proxy(name: str, uid: str | None = None, rv: str = "1") -> dict:
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid or f"uid-{name}", "resourceVersion": rv}}


class FlakyDispatcher:
    """Records what it handled; raises ConnectionError while ``down`` is set."""

    def __init__(self, down: bool = False) -> None:
        self.down = threading.Event()
        if down:
            self.down.set()
        self.handled: list[tuple[str, str, str]] = []
        self.calls = 0
        self.threads: set[str] = set()

    def __call__(self, etype: str, obj: dict) -> None:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.down.is_set():
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        meta = obj["metadata"]
        self.handled.append((etype, meta["name"], meta["resourceVersion"]))


class Running:
    def __init__(self, handoff: Handoff) -> None:
        self.handoff, self.stop = handoff, threading.Event()
        self.thread = threading.Thread(target=handoff.run, args=(self.stop,), name="handoff", daemon=True)

    def __enter__(self) -> "Running":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(5)
        assert not self.thread.is_alive()


def test_events_are_delivered_in_order_from_one_thread():
    d = FlakyDispatcher()
    h = Handoff(d, FAST)
    with Running(h):
        for i in range(20):
            h.submit("ADDED", proxy(f"p{i}"))
        wait_until(lambda: len(d.handled) == 20, 5, "all delivered")
    assert [name for _, name, _ in d.handled] == [f"p{i}" for i in range(20)]
    assert d.threads == {"handoff"} and h.backlog() == 0


def test_a_failing_event_is_retried_with_backoff_until_it_goes_through(caplog):
    caplog.set_level(logging.INFO, logger="watchers.handoff")
    d = FlakyDispatcher(down=True)
    h = Handoff(d, FAST)
    with Running(h):
        h.submit("ADDED", proxy("a"))
        h.submit("ADDED", proxy("b"))
        wait_until(lambda: d.calls >= 5, 5, "several attempts")
        assert d.handled == [] and h.backlog() == 2 and h.failing_for() > 0
        calls = d.calls
        time.sleep(0.3)
        assert d.calls - calls <= 10, "backoff between attempts (0.05-0.1 s once capped)"
        d.down.clear()  # Redis is back
        wait_until(lambda: len(d.handled) == 2, 5, "both delivered")
    assert d.handled == [("ADDED", "a", "1"), ("ADDED", "b", "1")]  # nothing dropped, order kept
    assert h.failing_for() == 0
    assert "hand-off failed for ADDED ns/a (attempt 1: ConnectionError" in caplog.text
    assert "proxy event ADDED ns/a handed off after" in caplog.text


def test_an_error_retrying_cannot_fix_does_not_hold_up_the_events_behind_it(caplog):
    handled = []

    def dispatcher(etype: str, obj: dict) -> None:
        if obj["metadata"]["name"] == "bad":
            raise KeyError("spec")  # a bug or a strange object, not an outage
        handled.append(obj["metadata"]["name"])

    h = Handoff(dispatcher, FAST)
    with Running(h):
        for name in ("a", "bad", "b"):
            h.submit("ADDED", proxy(name))
        wait_until(lambda: handled == ["a", "b"], 5, "the events behind it delivered")
    assert h.backlog() == 0 and "proxy event ADDED ns/bad dropped" in caplog.text


def test_submit_never_blocks_while_the_callback_hangs():
    gate = threading.Event()
    h = Handoff(lambda etype, obj: gate.wait(5), FAST)
    with Running(h):
        h.submit("ADDED", proxy("stuck"))
        start = time.monotonic()
        for i in range(1000):
            h.submit("ADDED", proxy(f"p{i}"))
        assert time.monotonic() - start < 1
        gate.set()


def test_events_of_one_proxy_waiting_behind_a_failure_become_one_sync_of_the_newest():
    d = FlakyDispatcher(down=True)
    h = Handoff(d, FAST)
    with Running(h):
        h.submit("ADDED", proxy("head"))
        wait_until(lambda: d.calls >= 1, 5, "the head attempted")
        for rv in ("2", "3", "4"):
            h.submit("MODIFIED", proxy("x", rv=rv))
        h.submit("ADDED", proxy("y"))
        h.submit("MODIFIED", proxy("head", rv="9"))  # newer event for the one being retried
        assert h.backlog() == 3
        d.down.clear()
        wait_until(lambda: len(d.handled) == 3, 5, "delivered")
    # the head keeps its place and carries the newest object; x's three events are one SYNC
    assert d.handled == [("SYNC", "head", "9"), ("SYNC", "x", "4"), ("ADDED", "y", "1")]


def test_a_deletion_waiting_behind_a_failure_replaces_what_was_waiting():
    d = FlakyDispatcher(down=True)
    h = Handoff(d, FAST)
    with Running(h):
        h.submit("ADDED", proxy("head"))
        wait_until(lambda: d.calls >= 1, 5, "the head attempted")
        h.submit("MODIFIED", proxy("gone", rv="2"))
        h.submit("DELETED", proxy("gone", rv="3"))
        d.down.clear()
        wait_until(lambda: len(d.handled) == 2, 5, "delivered")
    assert d.handled == [("ADDED", "head", "1"), ("DELETED", "gone", "3")]


def test_events_waiting_when_a_run_stops_are_delivered_by_the_next_run():
    d = FlakyDispatcher(down=True)
    h = Handoff(d, FAST)
    with Running(h):
        h.submit("ADDED", proxy("a"))
        wait_until(lambda: d.calls >= 2, 5, "attempts")
    assert h.backlog() == 1  # leadership lost: kept, not dropped
    d.down.clear()
    with Running(h):
        wait_until(lambda: d.handled == [("ADDED", "a", "1")], 5, "delivered by the next term")


def test_the_watcher_keeps_streaming_and_delivers_what_arrived_while_the_callback_failed(caplog):
    caplog.set_level(logging.INFO, logger="watchers")
    settings = WatcherSettings(
        stream=StreamSettings(server_timeout=30, read_timeout=1.0, backoff_initial=0.05, backoff_max=0.2),
        election=ElectionSettings(lease_duration=1.5, renew_deadline=1.0, retry_period=0.1, request_timeout=2.0))
    with FakeKube(bookmark_interval=0.2) as fake:
        client = fake.api_client()
        api = k8s.CustomObjectsApi(client)
        d = FlakyDispatcher(down=True)
        stop = threading.Event()
        t = threading.Thread(target=run, args=(d,), kwargs=dict(
            lease_namespace="proxy-operator", identity="w1", stop=stop, settings=settings,
            api_client=fake.api_client()), daemon=True)
        t.start()
        try:
            wait_until(lambda: fake.open_watches(P) == 1, 5, "streaming")
            for i in range(3):
                api.create_namespaced_custom_object(G, V, "ns", P, {
                    "apiVersion": f"{G}/{V}", "kind": "Proxy", "metadata": {"name": f"during-{i}"},
                    "spec": {"provider": "k8s"}})
            wait_until(lambda: d.calls >= 6, 5, "failed attempts")
            time.sleep(1.5)  # several read timeouts and bookmarks pass: the stream is not stalled
            assert fake.request_count("list", P) == 1 and fake.open_watches(P) == 1
            d.down.clear()
            wait_until(lambda: {n for _, n, _ in d.handled} == {"during-0", "during-1", "during-2"}, 5,
                       "every event delivered once Redis is back")
        finally:
            stop.set()
            t.join(10)
            client.close()
    assert [t for t, _, _ in d.handled] == ["ADDED"] * 3
    assert "proxy event handler failed" not in caplog.text


def test_the_backlog_and_latency_of_each_handoff_carry_its_resource():
    """The Proxy and ProxyPool hand-offs (watchers.main) export their own backlog: one stuck
    behind a Redis outage does not show as, or get overwritten by, the other's."""
    from prometheus_client import REGISTRY

    def sample(name: str, resource: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"resource": resource})

    stuck, flowing = FlakyDispatcher(down=True), FlakyDispatcher()
    proxies, pools = Handoff(stuck, FAST), Handoff(flowing, FAST, resource="proxypools")
    done_before = sample("proxy_operator_watch_event_to_enqueue_seconds_count", "proxypools") or 0
    with Running(proxies), Running(pools):
        for name in ("a", "b", "c"):
            proxies.submit("ADDED", proxy(name))
        pools.submit("ADDED", proxy("pool"))
        wait_until(lambda: flowing.handled, 5, "the pool event delivered")
        wait_until(lambda: sample("proxy_operator_watch_handoff_backlog", "proxypools") == 0, 5, "pool backlog 0")
        assert sample("proxy_operator_watch_handoff_backlog", "proxies") == 3
        assert sample("proxy_operator_watch_event_to_enqueue_seconds_count", "proxypools") == done_before + 1
        stuck.down.clear()
        wait_until(lambda: sample("proxy_operator_watch_handoff_backlog", "proxies") == 0, 5, "proxy backlog 0")
