"""ProxyPool metrics from real scrapes (docs/observability.md): the pool gauges on beat's
``/metrics`` (one snapshot in Redis, read at scrape time) and the pool counters on a prefork
worker's (summed over its children by prometheus-client's multiprocess mode).

The real watcher, a worker with two prefork children and beat, started through their commands,
against the API fake (real CRDs, its garbage collector, the kubelet stand-in running a real
Squid per member) and a private Redis.  An autoscaled pool is raised 1 -> 2 by its bounds, its
members go Ready through real probes, then its bounds drop it to 1 (a scale-down: drained and
deleted), then it is deleted.  Each step is read from the scrapes, as Prometheus would.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import redis as redis_lib
import requests
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from app.store import keys as redis_keys
from app.resources import GROUP, POOL_PLURAL, VERSION
from devcluster.cluster import FakeCluster
from tests.pools.env import pool_operator_env
from tests.support.origin import origin_server
from tests.support.processes import celery_beat, celery_worker, watcher
from devcluster.redis_server import RedisServer, free_port
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
NS = "default"
DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


def scrape(url: str) -> dict[tuple, float]:
    """``{(sample name, sorted label items...): value}`` of one real scrape."""
    out = {}
    for family in text_string_to_metric_families(requests.get(url, timeout=5).text):
        for s in family.samples:
            out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def pool_values(values: dict, pool: str) -> dict[str, float]:
    """The gauges of ``pool`` in a scrape: ``{metric name: value}``."""
    return {key[0]: v for key, v in values.items()
            if key[0].startswith("proxy_operator_pool_") and ("pool", pool) in key[1:] and ("namespace", NS) in key[1:]}


def counter(values: dict, name: str, **labels) -> float:
    want = {("namespace", NS), *labels.items()}
    return sum(v for key, v in values.items() if key[0] == name and want <= set(key[1:]))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pool-metrics")
    redis = RedisServer()
    with FakeCluster(bookmark_interval=1.0) as cluster, origin_server() as origin:
        env = pool_operator_env(tmp, cluster, redis.url)
        (tmp / "prom").mkdir()
        ports = {"worker": free_port(), "beat": free_port()}
        procs = [celery_worker({**env, "METRICS_BIND": f"127.0.0.1:{ports['worker']}",
                                "PROMETHEUS_MULTIPROC_DIR": str(tmp / "prom")}, concurrency=2).start(),
                 celery_beat({**env, "METRICS_BIND": f"127.0.0.1:{ports['beat']}"}, str(tmp)).start(),
                 watcher(env).start()]
        try:
            procs[0].wait_for_log("ready", timeout=90)
            procs[2].wait_for_log("listed 0 proxypools", timeout=60)
            yield {"cluster": cluster, "origin": origin, "custom": k8s.CustomObjectsApi(cluster.fake.api_client()),
                   "r": redis_lib.Redis.from_url(redis.url, decode_responses=True),
                   "urls": {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}}
        finally:
            for p in procs:
                p.stop()
            redis.stop()


def test_pool_gauges_and_counters_follow_the_pool_from_real_scrapes(stack):
    custom, beat, worker = stack["custom"], stack["urls"]["beat"], stack["urls"]["worker"]
    template = {"metadata": {"labels": {"app": "metered"}},
                "spec": {"provider": "k8s-local", "maxLeases": 2,
                         "healthCheck": {"url": f"{stack['origin']}/generate_204", "intervalSeconds": 2,
                                         "timeoutSeconds": 1}}}
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": "metered", "namespace": NS},
        "spec": {"replicas": 1, "template": template, "drain": {"drainTimeoutSeconds": 60},
                 "autoscale": {"minReplicas": 2, "maxReplicas": 2, "scaleDownDelaySeconds": 0}}})

    # the autoscaler's bounds raise it to 2; both members go Ready and leasable
    want = {"proxy_operator_pool_desired_replicas": 2, "proxy_operator_pool_replicas": 2,
            "proxy_operator_pool_ready_replicas": 2, "proxy_operator_pool_leasable_replicas": 2,
            "proxy_operator_pool_updated_replicas": 2, "proxy_operator_pool_draining_replicas": 0,
            "proxy_operator_pool_skipped_zones": 0}
    values = wait_for(lambda: (v := pool_values(scrape(beat), "metered")) and
                      {k: v.get(k) for k in want} == want and v, 90, "beat to export a pool of 2 leasable members")
    assert time.time() - 30 < values["proxy_operator_pool_last_pass_timestamp_seconds"] <= time.time() + 1
    status = custom.get_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "metered")["status"]
    assert (status["leasableReplicas"], status["updatedReplicas"]) == (2, 2)  # the gauges say what the status says
    counts = scrape(worker)  # two prefork children: the endpoint sums them
    assert counter(counts, "proxy_operator_pool_members_created_total", pool="metered") == 2
    assert counter(counts, "proxy_operator_pool_rescales_total", pool="metered", direction="up") == 1
    assert counter(counts, "proxy_operator_pool_members_deleted_total", pool="metered") == 0

    # the bounds drop to 1: one member drains (no lease: deleted at once), the gauges follow
    custom.patch_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "metered",
                                          {"spec": {"autoscale": {"minReplicas": 1, "maxReplicas": 1}}})
    want = {**want, "proxy_operator_pool_desired_replicas": 1, "proxy_operator_pool_replicas": 1,
            "proxy_operator_pool_ready_replicas": 1, "proxy_operator_pool_leasable_replicas": 1,
            "proxy_operator_pool_updated_replicas": 1}
    wait_for(lambda: {k: pool_values(scrape(beat), "metered").get(k) for k in want} == want, 60,
             "beat to export the pool at 1 member")
    counts = wait_for(lambda: (c := scrape(worker)) and counter(
        c, "proxy_operator_pool_members_deleted_total", pool="metered", reason="Drained") == 1 and c, 30,
        "the drained member's deletion counted")
    assert counter(counts, "proxy_operator_pool_members_draining_total", pool="metered", reason="ScaleDown") == 1
    assert counter(counts, "proxy_operator_pool_rescales_total", pool="metered", direction="down") == 1
    assert counter(counts, "proxy_operator_pool_members_created_total", pool="metered") == 2

    # every pool metric docs/observability.md names was read from one of these two scrapes
    documented = set(re.findall(r"^\| `(proxy_operator_pool_[a-z0-9_]+)`", DOC.read_text(), re.M))
    seen = {key[0] for key in {**scrape(beat), **counts}}
    assert len(documented) >= 12 and documented <= seen, sorted(documented - seen)

    # deleted: its series leave beat's scrape with its last pass, and nothing is left in Redis
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, POOL_PLURAL, "metered")
    wait_for(lambda: pool_values(scrape(beat), "metered") == {}, 60, "the deleted pool's gauges to go")
    assert not stack["r"].hexists(redis_keys.POOL_STATS, f"{NS}/metered")
