"""Metrics from every process, the alert rules and the dashboard, with real processes.

Fast (promtool only): the rules in deploy/prometheus/prometheus_rule.yaml pass ``promtool
check rules`` and promtool's unit tests (tests/prometheus/alerts_test.yaml).

Slow, one stack for the module: the API fake with its kubelet stand-in (a real Squid per Pod),
a private Redis, and the watcher, a prefork worker, beat and the API started through their
real commands, each serving ``/metrics`` on its own loopback port.  One Proxy goes Ready and is
leased; the watcher's watches end every 2 s.  Then:

* every metric named in docs/observability.md is read from a real scrape of the process that
  exports it; the watcher's Proxy watch goes silent while the fake's history is compacted, and
  its 410 and relist show in the scrape under ``resource="proxies"`` (read before and after),
  and an External Proxy whose endpoint refuses connections produces a failed probe;
* the Grafana dashboard refers only to metrics those scrapes expose;
* a real Prometheus server (Debian's ``prometheus``) scrapes the four processes every second
  with the project's alert rules loaded (their ``for:`` cut to 2 s, expressions as shipped):
  every target is up, and a provider outage (every Pod list answered after the check's
  timeout) fires ``ProxyOperatorProviderDown``, which clears when the API answers again.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import requests
import yaml
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from app.resources import GROUP, PLURAL, VERSION
from devcluster.cluster import FakeCluster
from devcluster.redis_server import RedisServer, free_port
from devcluster.squid import LOOPBACK_SQUID_BLOCK
from tests.api.served import request as api_request
from tests.api.served import start_api
from tests.support.origin import origin_server
from tests.support.processes import Process, celery_beat, celery_worker, watcher
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
RULE = ROOT / "deploy" / "prometheus" / "prometheus_rule.yaml"
DASHBOARD = ROOT / "deploy" / "prometheus" / "grafana-dashboard.json"
DOC = ROOT / "docs" / "observability.md"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed")

#: What each process must export (read from a real scrape of that process).
EXPECTED = {
    "watcher": {"proxy_operator_watch_events_total", "proxy_operator_watch_restarts_total",
                "proxy_operator_watch_gone_total", "proxy_operator_watch_relists_total",
                "proxy_operator_watcher_leader", "proxy_operator_watch_event_to_enqueue_seconds",
                "proxy_operator_watch_handoff_backlog"},
    "beat": {"proxy_operator_beat_schedules_fired_total", "proxy_operator_beat_last_run_timestamp_seconds",
             "proxy_operator_beat_lock_held", "proxy_operator_provider_up", "proxy_operator_provider_check_stale",
             "proxy_operator_provider_check_duration_seconds", "proxy_operator_provider_check_timestamp_seconds",
             "proxy_operator_serving_proxies"},
    "worker": {"proxy_operator_queue_depth", "proxy_operator_task_duration_seconds", "proxy_operator_tasks_total",
               "proxy_operator_provider_requests_total", "proxy_operator_provider_request_duration_seconds",
               "proxy_operator_reconcile_total", "proxy_operator_proxies", "proxy_operator_gc_deleted_total",
               "proxy_operator_probe_duration_seconds", "proxy_operator_probe_results_total",
               "proxy_operator_probe_outage", "proxy_operator_health_status_writes_total"},
    "api": {"proxy_operator_lease_requests_total", "proxy_operator_leases_active"},
}


def rules_file(directory: Path, *, short_for: str | None = None) -> Path:
    """Write the PrometheusRule's ``spec`` as a plain rules file (``for:`` replaced if asked)."""
    spec = yaml.safe_load(RULE.read_text())["spec"]
    if short_for:
        for group in spec["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = short_for
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# -- promtool ---------------------------------------------------------------------------------
@needs_promtool
def test_the_rules_pass_promtool_check_rules(tmp_path):
    out = subprocess.run([PROMTOOL, "check", "rules", str(rules_file(tmp_path))], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    names = {r["alert"] for g in yaml.safe_load(RULE.read_text())["spec"]["groups"] for r in g["rules"]}
    assert {"ProxyOperatorProviderDown", "ProxyOperatorFleetMostlyUnhealthy", "ProxyOperatorNoLeaseCapacity",
            "ProxyOperatorQueueBacklogGrowing", "ProxyOperatorBeatNotScheduling",
            "ProxyOperatorWatcherNotLeading"} <= names
    doc = DOC.read_text()
    assert all(f"`{n}`" in doc for n in names), "every alert is described in docs/observability.md"


@needs_promtool
def test_each_alert_fires_on_what_it_is_about(tmp_path):
    rules_file(tmp_path)
    shutil.copy(ROOT / "tests" / "prometheus" / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    out = subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "alerts_test.yaml")], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


# -- names ------------------------------------------------------------------------------------
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                 "offset", "le", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are neither functions nor
    keywords, outside label matchers, ``by (...)`` lists and strings."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)            # strings
    text = re.sub(r"\{[^}]*\}", "", text)                        # label matchers
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)                       # ranges and subqueries
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word = m.group(0)
        rest = text[m.end():].lstrip()
        if word.lower() in _PROMQL_WORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


def documented_metrics() -> set[str]:
    """Metric names in the first column of docs/observability.md's metric tables."""
    return set(re.findall(r"^\| `(proxy_operator_[a-z0-9_]+)`", DOC.read_text(), re.M))


def family_names(text: str) -> set[str]:
    """Metric family names in a scrape, counters with their ``_total`` (as PromQL sees them)."""
    names = set()
    for family in text_string_to_metric_families(text):
        if not family.samples:
            continue
        names.add(family.name + "_total" if family.type == "counter" else family.name)
        names.update(s.name for s in family.samples)  # _bucket, _sum, _count, _total
    return names


def test_every_dashboard_query_parses_to_known_names():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    read = set().union(*(metric_names(e) for e in exprs))
    base = {re.sub(r"_(bucket|sum|count)$", "", n) for n in read}
    assert base <= documented_metrics(), f"not documented: {sorted(base - documented_metrics())}"
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("phase", "probe latency", "leases", "queue", "provider"):
        assert topic in titles, topic


def test_every_proxypool_event_reason_is_documented():
    """Every reason app/pools passes to ``record_pool_event`` is in docs/observability.md's
    "ProxyPool Events" table."""
    source = "\n".join(f.read_text() for f in sorted((ROOT / "app" / "pools").glob("*.py")))
    emitted = set(re.findall(r'record_pool_event\(\s*\w+,\s*"(?:Normal|Warning)",\s*"(\w+)"', source))
    assert {"MemberCreated", "MemberDraining", "MemberDeleted", "MemberReleased", "Rescaled"} <= emitted
    section = DOC.read_text().split("### ProxyPool Events", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    assert emitted <= documented, f"not documented: {sorted(emitted - documented)}"


def _permanent_reasons() -> set[str]:
    """``reason`` of :class:`Permanent` and every subclass any provider module defines (the
    reconciler's Failed Event takes the error's reason)."""
    import importlib
    import pkgutil

    import app.providers
    from app.errors import Permanent

    for mod in pkgutil.walk_packages(app.providers.__path__, "app.providers."):
        importlib.import_module(mod.name)
    found, todo = set(), [Permanent]
    while todo:
        cls = todo.pop()
        found.add(cls.reason)
        todo.extend(cls.__subclasses__())
    return found


def test_every_proxy_event_reason_is_documented():
    """Every reason a Proxy's Events can carry is in docs/observability.md's "Events" table:
    literal reasons passed to ``record_event`` / ``event=``, the health engine's, the phases
    the status writer names by default (Pending has no Event; Failed always carries its own
    reason), the Permanent errors' reasons (Failed by a provider error) and degraded instance
    notes (kvm's GuestAgentUnavailable)."""
    import app.providers.kvm.provider as kvm_provider
    from app.probes import status as health_status
    from app.resources import FAILED, PENDING, PHASES

    files = sorted((ROOT / "app").rglob("*.py"))
    source = "\n".join(f.read_text() for f in files if "pools" not in f.parts)
    emitted = set(re.findall(r'event=\(\s*"(?:Normal|Warning)",\s*"(\w+)"', source))
    emitted |= set(re.findall(r'record_event\(\s*[\w.]+,\s*"(?:Normal|Warning)",\s*"(\w+)"', source))
    assert {"QuotaExceeded", "Replacing", "InstanceLost", "InstanceStarted", "CredentialsRotated"} <= emitted
    emitted |= {health_status.EVENT_READY, health_status.EVENT_UNHEALTHY, health_status.EVENT_DEADLINE}
    emitted |= set(PHASES) - {PENDING, FAILED}
    emitted |= _permanent_reasons()
    notes = re.findall(r"InstanceNote\((\w+),(?:(?!InstanceNote\().)*?degraded=True\)", source, re.S)
    assert notes, "the degraded-note pattern finds kvm's GuestAgentUnavailable"
    emitted |= {getattr(kvm_provider, n, n) for n in notes}
    section = DOC.read_text().split("\n## Events", 1)[1].split("### ProxyPool Events", 1)[0]
    documented = {name for cell in re.findall(r"^\| ([^|]+) \|", section, re.M)
                  for name in re.findall(r"`(\w+)`", cell)}
    assert emitted <= documented, f"not documented: {sorted(emitted - documented)}"


# -- the real processes -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Redis, the API fake + kubelet, an origin, watcher/worker/beat/API with /metrics; one Ready,
    leased Proxy.  Yields ``{"urls": {process: metrics URL}, "cluster": ..., "procs": ...}``."""
    tmp = tmp_path_factory.mktemp("observability")
    redis = RedisServer()
    cluster = FakeCluster(bookmark_interval=1.0).start()
    procs: dict[str, Process] = {}
    with origin_server() as origin:
        try:
            providers = tmp / "providers.yaml"
            providers.write_text(yaml.safe_dump({"providers": [{
                "name": "k8s-local", "type": "kubernetes", "checkInterval": "10s", "checkTimeout": "2s",
                "squid": LOOPBACK_SQUID_BLOCK,
                # a price table: the resync exports the cost estimate and the budget line
                "costs": {"currency": "USD", "onDemand": {"default": 0.01}, "budgetPerHour": 1.0}}],
                # the test's External Proxy lives in "default"
                "tenancy": {"externalProxyNamespaces": ["default"]}}))
            env = {"KUBECONFIG": cluster.fake.write_kubeconfig(str(tmp / "kubeconfig")), "REDIS_URL": redis.url,
                   "PROVIDERS_CONFIG": str(providers), "RESYNC_INTERVAL": "3", "GC_INTERVAL": "3600",
                   "POLL_INITIAL": "0.5", "POLL_MAX": "1", "TASK_SOFT_TIME_LIMIT": "8", "TASK_TIME_LIMIT": "10",
                   "BROKER_VISIBILITY_TIMEOUT": "60", "HEALTH_SWEEP_INTERVAL": "1", "EGRESS_ECHO_URL": "",
                   "PROBE_ALLOWED_RANGES": "127.0.0.0/8", "WATCH_TIMEOUT": "2", "WATCH_READ_TIMEOUT": "3"}
            ports = {name: free_port() for name in ("watcher", "beat", "worker")}
            (tmp / "prom").mkdir()
            procs["worker"] = celery_worker({**env, "METRICS_BIND": f"127.0.0.1:{ports['worker']}",
                                             "PROMETHEUS_MULTIPROC_DIR": str(tmp / "prom")}).start()
            procs["beat"] = celery_beat({**env, "METRICS_BIND": f"127.0.0.1:{ports['beat']}"}, str(tmp)).start()
            procs["watcher"] = watcher({**env, "METRICS_BIND": f"127.0.0.1:{ports['watcher']}"}).start()
            procs["api"], ports["api"] = start_api(tmp, redis.url)
            procs["worker"].wait_for_log("ready", timeout=60)
            custom = k8s.CustomObjectsApi(cluster.fake.api_client())
            custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
                "metadata": {"name": "observed", "namespace": "default"},
                "spec": {"provider": "k8s-local", "healthCheck": {"url": f"{origin}/generate_204",
                                                                  "intervalSeconds": 2, "timeoutSeconds": 1}}})
            wait_for(lambda: (custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "observed")
                              .get("status") or {}).get("phase") == "Ready", 60, "the Proxy Ready")
            wait_for(lambda: api_request(ports["api"], "POST", "/v1/leases", b"{}")[0] == 201, 20, "a lease")
            urls = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}
            yield {"urls": urls, "cluster": cluster, "procs": procs, "tmp": tmp, "custom": custom, "origin": origin}
        finally:
            for p in procs.values():
                p.stop()
            cluster.close()
            redis.stop()


def scrape_names(url: str) -> set[str]:
    return family_names(requests.get(url, timeout=5).text)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_every_process_exports_its_metrics(stack):
    # A probe that fails: an External Proxy whose endpoint refuses connections (nothing listens on
    # its loopback port; the health origin itself is up, so the failure is held against the proxy).
    fake, custom = stack["cluster"].fake, stack["custom"]
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "refusing", "namespace": "default"},
        "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": free_port()},
                 "healthCheck": {"url": f"{stack['origin']}/generate_204", "intervalSeconds": 2, "timeoutSeconds": 1}}})
    for process, names in EXPECTED.items():
        seen = wait_for(lambda u=stack["urls"][process], n=names: (s := scrape_names(u)) >= n and s, 30,
                        f"{process} to export {sorted(names)}")
        assert names <= seen
    # the watcher leads, and its 2 s Proxy watches end and are reopened
    watcher_url = stack["urls"]["watcher"]
    proxies = {"resource": "proxies"}
    wait_for(lambda: _value(watcher_url, "proxy_operator_watcher_leader") == 1, 20, "the watcher leading")
    wait_for(lambda: _value(watcher_url, "proxy_operator_watch_restarts_total", {**proxies, "reason": "ended"}) >= 1,
             20, "a Proxy watch ended by its server timeout")
    # A 410 on the Proxy stream, read before and after: both streams relisted once at start, so
    # only the difference says the 410 led to a relist.  The open Proxy watch goes silent, the
    # Proxy changes meanwhile, the history is compacted: the watcher's resume (after its 3 s read
    # timeout) from the old resourceVersion gets 410 Gone and relists.
    gone_before = _value(watcher_url, "proxy_operator_watch_gone_total", proxies)
    relists_before = _value(watcher_url, "proxy_operator_watch_relists_total", proxies)
    assert not math.isnan(gone_before) and relists_before >= 1, "the series exist from the stream's start"
    wait_for(lambda: fake.hang_watches("proxies"), 10, "an open Proxy watch")
    try:
        custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "observed",
                                              {"metadata": {"annotations": {"example.com/poked": "1"}}})
        fake.compact()
        wait_for(lambda: _value(watcher_url, "proxy_operator_watch_gone_total", proxies) >= gone_before + 1, 20,
                 "a 410 on the Proxy watch")
        wait_for(lambda: _value(watcher_url, "proxy_operator_watch_relists_total", proxies)
                 >= relists_before + 1, 20, "the Proxy relist after the 410")
        assert _value(watcher_url, "proxy_operator_watch_restarts_total", {**proxies, "reason": "gone"}) >= 1
    finally:
        fake.release_hung_watches()
    # ConnectionRefused today; whatever reason the destination policy gives it, it is a failure
    wait_for(lambda: sum(s.value for f in text_string_to_metric_families(requests.get(stack["urls"]["worker"],
                                                                                          timeout=5).text)
                         for s in f.samples if s.name == "proxy_operator_probe_failures_total") >= 1, 30,
             "a failed probe counted")
    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "refusing")
    # every documented metric of these processes was read from one of the scrapes
    everything = set().union(*(scrape_names(u) for u in stack["urls"].values()))
    documented = documented_metrics()
    missing = {n for n in documented if n not in everything and n + "_total" not in everything}
    # counted only when GC found a partial listing: read from a real worker's scrape in
    # tests/gcp/test_gc_partial_sweeps.py; the ProxyPool metrics (no pool here) from real
    # scrapes of beat and a prefork worker in tests/pools/test_pool_metrics.py
    missing = {n for n in missing if not n.startswith("proxy_operator_pool_")}
    assert missing <= {"proxy_operator_gc_partial_sweeps_total"}, sorted(missing)
    # ... and every proxy_operator_* family a process exports is documented (name and type)
    doc_types = dict(re.findall(r"^\| `(proxy_operator_[a-z0-9_]+)` \| (\w+) \|", DOC.read_text(), re.M))
    for url in stack["urls"].values():
        for family in text_string_to_metric_families(requests.get(url, timeout=5).text):
            if not family.name.startswith("proxy_operator_") or family.name.endswith("_created"):
                continue  # (prometheus-client exports a counter's or histogram's _created as a gauge)
            name = family.name + "_total" if family.type == "counter" else family.name
            assert doc_types.get(name) == family.type, f"{name} ({family.type}) from {url}: documented as " \
                                                       f"{doc_types.get(name)}"
    queues = _labels(stack["urls"]["worker"], "proxy_operator_queue_depth", "queue")
    assert {"proxies", "health", "gc"} <= queues
    entries = _labels(stack["urls"]["beat"], "proxy_operator_beat_last_run_timestamp_seconds", "entry")
    assert {"health-sweep", "proxy-resync", "provider-check-k8s-local"} <= entries


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_dashboard_refers_only_to_metrics_the_processes_export(stack):
    everything = set().union(*(scrape_names(u) for u in stack["urls"].values()))
    dash = json.loads(DASHBOARD.read_text())
    read = set().union(*(metric_names(t["expr"]) for p in dash["panels"] for t in p.get("targets", [])))
    assert read <= everything, f"the dashboard reads metrics nobody exports: {sorted(read - everything)}"


def _value(url: str, name: str, labels: dict | None = None) -> float:
    for family in text_string_to_metric_families(requests.get(url, timeout=5).text):
        for s in family.samples:
            if s.name == name and (labels is None or all(s.labels.get(k) == v for k, v in labels.items())):
                return s.value
    return float("nan")


def _labels(url: str, name: str, label: str) -> set[str]:
    return {s.labels[label] for f in text_string_to_metric_families(requests.get(url, timeout=5).text)
            for s in f.samples if s.name == name}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus (Debian package prometheus) is not installed")
def test_a_real_prometheus_scrapes_everything_and_a_provider_outage_fires_and_clears(stack, tmp_path):
    targets = {name: url.removeprefix("http://").removesuffix("/metrics") for name, url in stack["urls"].items()}
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
              "rule_files": [str(rules_file(tmp_path, short_for="2s"))],
              "scrape_configs": [{"job_name": name, "static_configs": [{"targets": [t]}]}
                                 for name, t in targets.items()]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = Process("prometheus", [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={tmp_path / 'data'}",
                                    f"--web.listen-address=127.0.0.1:{port}"], {}, str(tmp_path)).start()
    api = f"http://127.0.0.1:{port}/api/v1"
    fake = stack["cluster"].fake

    def alerts(name: str) -> list[dict]:
        data = requests.get(f"{api}/alerts", timeout=5).json()["data"]["alerts"]
        return [a for a in data if a["labels"]["alertname"] == name]

    def query(expr: str) -> list:
        return requests.get(f"{api}/query", params={"query": expr}, timeout=5).json()["data"]["result"]

    try:
        def all_up():
            try:
                active = requests.get(f"{api}/targets", timeout=2).json()["data"]["activeTargets"]
            except (requests.RequestException, ValueError, KeyError):
                return False
            return len(active) == 4 and all(t["health"] == "up" for t in active) and active
        active = wait_for(all_up, 30, f"Prometheus to scrape all four processes; log: {server.log()[-2000:]}")
        assert {t["labels"]["job"] for t in active} == {"watcher", "beat", "worker", "api"}
        wait_for(lambda: query('proxy_operator_provider_up{provider="k8s-local",target="cluster"} == 1'), 30,
                 "the provider up in Prometheus")
        assert alerts("ProxyOperatorProviderDown") == []

        # The outage: every Pod list (the kubernetes provider's check) answers after its timeout.
        fake.delay_next("list", "pods", seconds=4, times=10_000)
        firing = wait_for(lambda: [a for a in alerts("ProxyOperatorProviderDown") if a["state"] == "firing"], 40,
                          "ProxyOperatorProviderDown to fire")
        assert firing[0]["labels"]["provider"] == "k8s-local" and firing[0]["labels"]["target"] == "cluster"
        assert firing[0]["labels"]["severity"] == "critical"

        fake.clear_faults()
        wait_for(lambda: alerts("ProxyOperatorProviderDown") == [], 40, "ProxyOperatorProviderDown to clear")
        # the other alerts stay quiet on a healthy stack
        quiet = ("ProxyOperatorWatcherNotLeading", "ProxyOperatorBeatNotScheduling", "ProxyOperatorNoLeaseCapacity")
        assert all(alerts(name) == [] for name in quiet), [alerts(n) for n in quiet]
    finally:
        fake.clear_faults()
        server.stop()
