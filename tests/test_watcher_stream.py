"""The Proxy list+watch loop against the API fake with the real kubernetes client."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from kubernetes import client as k8s

from tests.support.waiting import wait_until
from watchers.stream import ProxyStream, StreamSettings, backoff_delay

G, V, P = "crawl.example.com", "v1alpha1", "proxies"
pytestmark = pytest.mark.timeout(60)

FAST = StreamSettings(server_timeout=30, read_timeout=1.0, connect_timeout=2.0, list_timeout=5.0,
                      backoff_initial=0.05, backoff_max=0.3)


class Recorder:
    """Collects (event_type, namespace/name) pairs delivered by the stream."""

    def __init__(self, fail_first: int = 0) -> None:
        self.events: list[tuple[str, str]] = []
        self.cond = threading.Condition()
        self.fail_first = fail_first

    def __call__(self, etype: str, obj: dict) -> None:
        meta = obj["metadata"]
        with self.cond:
            self.events.append((etype, f"{meta['namespace']}/{meta['name']}"))
            self.cond.notify_all()
        if self.fail_first > 0:
            self.fail_first -= 1
            raise RuntimeError("handler exploded")

    def names(self, *types: str) -> set[str]:
        with self.cond:
            return {n for t, n in self.events if not types or t in types}

    def wait_for(self, pred, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out; events so far: {self.events}")
                self.cond.wait(left)


def create(custom_api, ns: str, name: str, **spec) -> dict:
    return custom_api.create_namespaced_custom_object(G, V, ns, P, {
        "apiVersion": f"{G}/{V}", "kind": "Proxy", "metadata": {"name": name},
        "spec": spec or {"provider": "k8s"}})


class Running:
    """A ProxyStream running in a thread for the duration of a with-block."""

    def __init__(self, custom_api, on_event, settings: StreamSettings = FAST, *, plural: str = P) -> None:
        self.progress = 0
        self.stream = ProxyStream(custom_api, on_event, settings, on_progress=self._progress, plural=plural)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.stream.run, args=(self.stop,), daemon=True)

    def _progress(self) -> None:
        self.progress += 1

    def __enter__(self) -> "Running":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.stream.interrupt()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive(), "stream did not stop"


def test_lists_then_watches_every_change(fake, custom_api):
    create(custom_api, "ns1", "old-a")
    create(custom_api, "ns2", "old-b")
    rec = Recorder()
    with Running(custom_api, rec):
        rec.wait_for(lambda: len(rec.events) == 2)
        assert sorted(rec.events) == [("SYNC", "ns1/old-a"), ("SYNC", "ns2/old-b")]
        wait_until(lambda: fake.open_watches(P) == 1, what="watch open")
        create(custom_api, "ns3", "new")
        custom_api.patch_namespaced_custom_object(G, V, "ns1", P, "old-a", {"spec": {"maxLeases": 0}})
        custom_api.delete_namespaced_custom_object(G, V, "ns2", P, "old-b")
        rec.wait_for(lambda: len(rec.events) == 5)
        assert rec.events[2:] == [("ADDED", "ns3/new"), ("MODIFIED", "ns1/old-a"), ("DELETED", "ns2/old-b")]
    assert fake.request_count("list", P) == 1


def test_misses_no_proxy_across_a_forced_410(fake, custom_api, caplog):
    caplog.set_level(logging.INFO, logger="watchers.stream")
    create(custom_api, "ns1", "before")
    create(custom_api, "ns1", "doomed")
    rec = Recorder()
    with Running(custom_api, rec) as run:
        rec.wait_for(lambda: len(rec.events) == 2)
        wait_until(lambda: fake.open_watches(P) == 1, what="watch open")
        # Make the open stream go silent, change things meanwhile, then compact the history
        # those changes live in: the reconnect from the old resourceVersion gets 410.
        old_rv = run.stream.resource_version
        assert fake.hang_watches(P) == 1
        created = [f"ns{i % 3}/gap-{i}" for i in range(20)]
        for name in created:
            ns, n = name.split("/")
            create(custom_api, ns, n)
        custom_api.delete_namespaced_custom_object(G, V, "ns1", P, "doomed")
        assert fake.compact() > int(old_rv)
        rec.wait_for(lambda: set(created) <= rec.names("SYNC", "ADDED") and "ns1/doomed" in rec.names("DELETED"))
        assert fake.request_count("list", P) == 2, "a 410 must lead to a relist"
        assert "410" in caplog.text
        # and the stream goes on watching after the relist
        create(custom_api, "ns9", "after")
        rec.wait_for(lambda: "ns9/after" in rec.names("ADDED"))
    fake.release_hung_watches()


def test_survives_a_stream_the_server_stops_answering(fake, custom_api):
    rec = Recorder()
    with Running(custom_api, rec) as run:
        wait_until(lambda: fake.open_watches(P) == 1, what="watch open")
        assert fake.hang_watches(P) == 1
        start = time.monotonic()
        for i in range(10):
            create(custom_api, "ns1", f"meanwhile-{i}")
        # the client-side read timeout (1 s) ends the dead stream; the reconnect resumes
        # from the last resourceVersion and delivers everything created meanwhile
        rec.wait_for(lambda: len(rec.names("ADDED")) == 10)
        assert time.monotonic() - start < 5
        assert fake.request_count("watch", P) >= 2
        assert fake.request_count("list", P) == 1, "a dead stream needs a reconnect, not a relist"
        assert run.stream.resource_version == str(fake.store.resource_version)
    fake.release_hung_watches()


def test_bookmarks_advance_the_resource_version(fake, custom_api):
    rec = Recorder()
    with Running(custom_api, rec) as run:
        wait_until(lambda: run.stream.resource_version is not None, what="first list")
        start_rv = int(run.stream.resource_version)
        pod = k8s.CoreV1Api(custom_api.api_client).create_namespaced_pod(
            "default", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
        wait_until(lambda: run.stream.resource_version == pod.metadata.resource_version, timeout=5,
                   what="bookmark carrying the Pod's resourceVersion")
        assert int(pod.metadata.resource_version) > start_rv
        assert rec.events == []  # a bookmark is not handed to the callback


def test_server_side_timeout_resumes_without_relisting(fake, custom_api):
    rec = Recorder()
    settings = StreamSettings(server_timeout=1, read_timeout=5.0, backoff_initial=0.05, backoff_max=0.3)
    with Running(custom_api, rec, settings):
        wait_until(lambda: fake.open_watches(P) == 1, what="watch open")
        for i in range(3):
            create(custom_api, "ns1", f"p{i}")
            time.sleep(0.8)
        rec.wait_for(lambda: len(rec.names("ADDED")) == 3)
        wait_until(lambda: fake.request_count("watch", P) >= 3, what="watch renewed by server timeouts")
    assert fake.request_count("list", P) == 1
    assert [t for t, _ in rec.events] == ["ADDED"] * 3


def test_callback_exceptions_do_not_kill_the_stream(fake, custom_api, caplog):
    create(custom_api, "ns1", "a")
    rec = Recorder(fail_first=2)
    with Running(custom_api, rec):
        rec.wait_for(lambda: len(rec.events) == 1)
        wait_until(lambda: fake.open_watches(P) == 1, what="watch open")
        create(custom_api, "ns1", "b")
        create(custom_api, "ns1", "c")
        rec.wait_for(lambda: rec.names("ADDED") == {"ns1/b", "ns1/c"})
    assert caplog.text.count("proxy event handler failed") == 2
    assert fake.request_count("list", P) == 1 and fake.request_count("watch", P) == 1


def test_errors_lead_to_reconnects_with_backoff(fake, custom_api):
    fake.fail_next("list", P, code=500, times=2)
    fake.fail_next("watch", P, code=503, times=2, reason="ServiceUnavailable")
    create(custom_api, "ns1", "a")
    rec = Recorder()
    with Running(custom_api, rec):
        rec.wait_for(lambda: rec.names("SYNC") == {"ns1/a"})
        wait_until(lambda: fake.open_watches(P) == 1, what="watch open after failures")
        create(custom_api, "ns1", "b")
        rec.wait_for(lambda: "ns1/b" in rec.names("ADDED"))
    assert fake.request_count("list", P) == 3 and fake.request_count("watch", P) == 3


def test_backoff_is_capped_exponential_with_jitter():
    s = StreamSettings(backoff_initial=0.5, backoff_max=8.0)
    highs = [backoff_delay(a, s, rand=lambda: 1.0) for a in range(8)]
    lows = [backoff_delay(a, s, rand=lambda: 0.0) for a in range(8)]
    assert highs == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    assert lows == [h / 2 for h in highs]


def test_settings_reject_nonsense():
    with pytest.raises(ValueError, match="server_timeout"):
        StreamSettings(server_timeout=0)
    with pytest.raises(ValueError, match="backoff_max"):
        StreamSettings(backoff_initial=5, backoff_max=1)


def test_logs_name_events_but_never_carry_the_spec(fake, custom_api, caplog):
    caplog.set_level(logging.DEBUG, logger="watchers.stream")
    create(custom_api, "ns1", "a", provider="kvm-lab", cloudInit={"inline": "#cloud-config\npassword: HUNTER2-SECRET"})
    rec = Recorder()
    with Running(custom_api, rec):
        rec.wait_for(lambda: len(rec.events) == 1)
        wait_until(lambda: fake.open_watches(P) == 1, what="watch open")
        custom_api.patch_namespaced_custom_object(G, V, "ns1", P, "a", {"spec": {"vendorData": "VENDOR-SECRET"}})
        rec.wait_for(lambda: len(rec.events) == 2)
    text = caplog.text
    assert "HUNTER2-SECRET" not in text and "VENDOR-SECRET" not in text and "cloud-config" not in text
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "ns1/a" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith("proxy SYNC") and lines[1].startswith("proxy MODIFIED")


def test_listed_objects_are_frozen_out_of_the_cyclic_collector(fake, custom_api):
    """Each listed page is frozen (gc.freeze): the collector no longer walks the last-seen copies."""
    import gc

    for i in range(3):
        create(custom_api, "default", f"f{i}")
    stream = ProxyStream(custom_api, lambda etype, obj: None, StreamSettings(page_size=2))
    try:
        stream._relist(threading.Event())
        known = list(stream._known.values())
        assert len(known) == 3 and gc.get_freeze_count() > 0
        tracked = {id(o) for o in gc.get_objects()}  # generations 0-2, not the permanent one
        assert not any(id(o) in tracked for o in known)
    finally:
        gc.unfreeze()  # hand this process's objects back to the collector


def _sample(name: str, **labels: str) -> float:
    """The watcher metric's current value in this process (0 when the series does not exist yet)."""
    from prometheus_client import REGISTRY
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_proxy_and_proxypool_streams_count_under_their_own_resource(fake, custom_api):
    """Both streams run side by side in the leader (watchers.main); their watch metrics carry
    ``resource`` so ProxyPool traffic, restarts and 410s are not counted as Proxy ones."""
    def snapshot() -> dict[tuple, float]:
        out = {}
        for res in ("proxies", "proxypools"):
            for t in ("SYNC", "ADDED"):
                out[("events", res, t)] = _sample("proxy_operator_watch_events_total", resource=res, type=t)
            out[("relists", res)] = _sample("proxy_operator_watch_relists_total", resource=res)
            out[("gone", res)] = _sample("proxy_operator_watch_gone_total", resource=res)
            out[("restarts-gone", res)] = _sample("proxy_operator_watch_restarts_total", resource=res, reason="gone")
        return out

    def pool(name: str) -> None:
        custom_api.create_namespaced_custom_object(G, V, "ns1", "proxypools", {
            "apiVersion": f"{G}/{V}", "kind": "ProxyPool", "metadata": {"name": name},
            "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": "squid"}}, "spec": {"provider": "k8s"}}}})

    create(custom_api, "ns1", "a-proxy")
    pool("listed-pool")
    before = snapshot()
    proxies, pools = Recorder(), Recorder()
    pool_run = Running(custom_api, pools, plural="proxypools")
    # the series exist (at 0) as soon as the streams do, before anything happened
    from prometheus_client import REGISTRY
    assert REGISTRY.get_sample_value("proxy_operator_watch_gone_total", {"resource": "proxypools"}) is not None
    with Running(custom_api, proxies) as xrun, pool_run as prun:
        proxies.wait_for(lambda: proxies.names("SYNC") == {"ns1/a-proxy"})
        pools.wait_for(lambda: pools.names("SYNC") == {"ns1/listed-pool"})
        wait_until(lambda: fake.open_watches("proxypools") == 1 and fake.open_watches(P) == 1, what="both watches")
        pool("watched-pool")
        pools.wait_for(lambda: "ns1/watched-pool" in pools.names("ADDED"))
        # a 410 on the pool stream only: its watch goes silent, the history is compacted
        old_rv = prun.stream.resource_version
        assert fake.hang_watches("proxypools") == 1
        pool("gap-pool")
        compacted = fake.compact()
        assert compacted > int(old_rv)
        pools.wait_for(lambda: "ns1/gap-pool" in pools.names("SYNC", "ADDED"))
        wait_until(lambda: _sample("proxy_operator_watch_relists_total", resource="proxypools")
                   >= before[("relists", "proxypools")] + 2, what="the pool relist after the 410")
        # The Proxy stream restarts its idle watch every read timeout; one that restarts from
        # before the compaction gets a 410 and relists.  Wait until it is past the compaction
        # (relisted, or moved on by a bookmark): no 410 can come any more.
        wait_until(lambda: int(xrun.stream.resource_version or 0) >= compacted,
                   what="the proxy stream past the compaction")
    # Read the counters once both streams have stopped: a relist counts its SYNC events as it
    # delivers them and itself only at its end, so a snapshot taken while one runs sees the
    # event without its relist.
    after = snapshot()
    fake.release_hung_watches()
    delta = {k: after[k] - before[k] for k in before}
    # The compaction is the fake's whole history: a Proxy watch that happens to restart in that
    # window gets its own 410 and relists too (one SYNC of its one Proxy each time), but never
    # counts the pools' traffic.
    relisted = delta[("relists", "proxies")]
    assert relisted >= 1 and delta[("events", "proxies", "SYNC")] == relisted
    assert delta[("events", "proxies", "ADDED")] == 0
    assert delta[("gone", "proxies")] == relisted - 1 == delta[("restarts-gone", "proxies")]
    assert delta[("events", "proxypools", "SYNC")] >= 2  # listed-pool at start, then the relist
    assert delta[("events", "proxypools", "ADDED")] == 1
    assert delta[("relists", "proxypools")] == 2
    assert delta[("gone", "proxypools")] == 1 and delta[("restarts-gone", "proxypools")] == 1
