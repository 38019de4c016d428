"""A GC sweep over a partial listing deletes nothing and says so in
``proxy_operator_gc_partial_sweeps_total`` (docs/observability.md, "Workers").

Real processes: a Celery worker (prefork, ``METRICS_BIND`` and ``PROMETHEUS_MULTIPROC_DIR`` as
deployed) and beat sending ``gc.sweep`` every 2 s, with a gcp provider whose ``apiEndpoint``
is the Compute REST fake, and the Kubernetes API fake (no Proxy names the orphan).  One zone
of the aggregated list is unreachable: the orphan in the reachable zone must survive, and the
counter is read from a real scrape of the worker.  With the zone back, the next sweep deletes
the orphan (``proxy_operator_gc_deleted_total``) and the partial counter stays where it was.
"""

from __future__ import annotations

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.providers.naming import tags_for
from devcluster.cluster import FakeCluster
from devcluster.redis_server import free_port
from tests.gcp.conftest import PROJECT
from tests.support.processes import celery_beat, celery_worker
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
PROVIDER = "gcp-eu"
ZONES = ["europe-west1-b", "europe-west1-c"]


def _value(url: str, name: str, labels: dict) -> float:
    """One sample of a real scrape (0 when the series does not exist yet)."""
    for family in text_string_to_metric_families(requests.get(url, timeout=5).text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_a_sweep_with_an_unreachable_zone_is_partial_and_counted(compute, redis_url, tmp_path):
    compute.add_instance(PROJECT, ZONES[0], "proxy-orphan", tags_for("0b1c2d3e-0000-4000-8000-00000000dead"))
    compute.unreachable_zones = {ZONES[1]}
    providers = tmp_path / "providers.yaml"
    providers.write_text(yaml.safe_dump({"providers": [{
        "name": PROVIDER, "type": "gcp", "checkInterval": "0s",
        "gcp": {"project": PROJECT, "zones": ZONES, "apiEndpoint": compute.url, "anonymous": True,
                "requestTimeout": "5s", "operationTimeout": "10s"}}]}))
    port = free_port()
    (tmp_path / "prom").mkdir()
    with FakeCluster(kubelet=False, bookmark_interval=1.0) as cluster:
        env = {"KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp_path / "kubeconfig")), "REDIS_URL": redis_url,
               "PROVIDERS_CONFIG": str(providers), "GC_INTERVAL": "2", "GC_GRACE": "0", "RESYNC_INTERVAL": "3600",
               "HEALTH_SWEEP_INTERVAL": "3600", "TASK_SOFT_TIME_LIMIT": "20", "TASK_TIME_LIMIT": "25"}
        worker = celery_worker({**env, "METRICS_BIND": f"127.0.0.1:{port}",
                                "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")}, concurrency=1).start()
        beat = None
        try:
            worker.wait_for_log("ready", timeout=60)
            beat = celery_beat(env, str(tmp_path)).start()
            url = f"http://127.0.0.1:{port}/metrics"
            partial = {"provider": PROVIDER}
            wait_for(lambda: _value(url, "proxy_operator_gc_partial_sweeps_total", partial) >= 2, 60,
                     f"two partial sweeps counted; worker log: {worker.log()[-3000:]}")
            assert (PROJECT, ZONES[0], "proxy-orphan") in compute.instances, "a partial sweep deletes nothing"
            assert not compute.calls("DELETE", r"/instances/proxy-orphan$")
            assert _value(url, "proxy_operator_gc_deleted_total", partial) == 0

            compute.unreachable_zones = set()
            wait_for(lambda: (PROJECT, ZONES[0], "proxy-orphan") not in compute.instances, 60,
                     "the orphan deleted by a complete sweep")
            wait_for(lambda: _value(url, "proxy_operator_gc_deleted_total", partial) >= 1, 20, "the deletion counted")
            # sweeps go on, complete now: the partial count does not move any more
            counted = _value(url, "proxy_operator_gc_partial_sweeps_total", partial)
            sweeps = len(compute.calls("GET", r"/aggregated/instances$"))
            wait_for(lambda: len(compute.calls("GET", r"/aggregated/instances$")) >= sweeps + 2, 30,
                     "two more sweeps")
            assert _value(url, "proxy_operator_gc_partial_sweeps_total", partial) == counted
        finally:
            if beat is not None:
                beat.stop()
            worker.stop()
