"""Provider health through the real processes (decision 18).

A real worker (prefork, two children), beat and watcher against the Kubernetes API fake and a
private Redis.  Two kubernetes providers: ``k8s-hourly`` (checked once an hour: its
ProviderHealth can only appear because the first round runs at start) and ``k8s-fast``
(every 10 s).  Every Pod list the checks send is answered late (longer than ``checkTimeout``),
so each round times out: the verdict and the ``proxy_operator_provider_up`` gauge (read from
beat's scrape, computed from the Redis snapshot) name the target ``cluster``, never a generic
stand-in.  Then the worker is killed: nobody checks ``k8s-fast`` any more, and within three
intervals the watcher's stale sweep turns its target ``CheckStale``, logs the reason change,
and beat's scrape says ``stale``.
"""

from __future__ import annotations

import pytest
import requests
import yaml
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from app.resources import GROUP, VERSION
from devcluster.apiserver.server import FakeKube
from devcluster.redis_server import free_port
from tests.support.processes import celery_beat, celery_worker, watcher
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def scrape(url: str) -> dict[tuple, float]:
    """``{(sample name, sorted label items...): value}`` of one real scrape."""
    text = requests.get(url, timeout=5).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def provider_health(api, name: str) -> dict | None:
    try:
        return k8s.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, "providerhealths", name)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def target(api, provider: str, name: str = "cluster") -> dict | None:
    obj = provider_health(api, provider) or {}
    return next((t for t in (obj.get("status") or {}).get("targets") or () if t["name"] == name), None)


def test_timeouts_and_silence_are_told_from_one_snapshot(redis_url, tmp_path):
    with FakeKube(bookmark_interval=1.0) as fake:
        api = fake.api_client()
        # Every Pod list (the kubernetes provider's check, and GC) is answered after 3 s.
        fake.delay_next("list", "pods", seconds=3, times=10_000)
        providers = tmp_path / "providers.yaml"
        providers.write_text(yaml.safe_dump({"providers": [
            {"name": "k8s-hourly", "type": "kubernetes", "checkInterval": "1h", "checkTimeout": "1s"},
            {"name": "k8s-fast", "type": "kubernetes", "checkInterval": "10s", "checkTimeout": "1s"}]}))
        env = {"KUBECONFIG": fake.write_kubeconfig(str(tmp_path / "kubeconfig")), "REDIS_URL": redis_url,
               "PROVIDERS_CONFIG": str(providers), "RESYNC_INTERVAL": "300", "GC_INTERVAL": "3600",
               "LOG_LEVEL": "INFO"}
        (tmp_path / "prom").mkdir()
        beat_port, watcher_port = free_port(), free_port()
        worker = celery_worker({**env, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")}, queues="health",
                               concurrency=2).start()
        beat = celery_beat({**env, "METRICS_BIND": f"127.0.0.1:{beat_port}"}, str(tmp_path)).start()
        watch = watcher({**env, "METRICS_BIND": f"127.0.0.1:{watcher_port}"}).start()
        beat_metrics = f"http://127.0.0.1:{beat_port}/metrics"
        try:
            # The first round runs at start: an hourly provider has its object within the test.
            for name in ("k8s-hourly", "k8s-fast"):
                # (the watcher's stale sweep may publish "CheckPending" before the round's verdict)
                t = wait_for(lambda n=name: (t := target(api, n)) and t["reason"] != "CheckPending" and t, 40,
                             f"{name}'s first check round")
                assert (t["ready"], t["reason"]) == (False, "CheckTimeout"), t
            values = wait_for(lambda: (v := scrape(beat_metrics)) and
                              ("proxy_operator_provider_up", ("provider", "k8s-fast"), ("target", "cluster")) in v
                              and v, 20, "beat to export k8s-fast")
            for name in ("k8s-hourly", "k8s-fast"):
                assert values[("proxy_operator_provider_up", ("provider", name), ("target", "cluster"))] == 0
                assert values[("proxy_operator_provider_check_stale", ("provider", name), ("target", "cluster"))] == 0
            assert not any(("target", "provider") in key for key in values), "a generic stand-in target"

            # Nobody checks any more: CheckStale within three intervals, whoever was meant to check.
            worker.kill()
            t = wait_for(lambda: (t := target(api, "k8s-fast")) and t["reason"] == "CheckStale" and t, 50,
                         "k8s-fast to go CheckStale")
            assert not t["ready"]
            assert target(api, "k8s-hourly")["reason"] == "CheckTimeout"  # 3 h not over
            ready = next(c for c in provider_health(api, "k8s-fast")["status"]["conditions"] if c["type"] == "Ready")
            assert ready["status"] == "False"
            watch.wait_for_log("k8s-fast target cluster still down, reason changed CheckTimeout -> CheckStale", 10)
            values = scrape(beat_metrics)
            assert values[("proxy_operator_provider_check_stale", ("provider", "k8s-fast"), ("target", "cluster"))] == 1
            assert values[("proxy_operator_provider_up", ("provider", "k8s-fast"), ("target", "cluster"))] == 0
        finally:
            for p in (watch, beat, worker):
                p.stop()
            api.close()
