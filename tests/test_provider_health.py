"""ProviderHealth objects: created with the managed-by label, status merge patches, stable
transition times, pruning of providers no longer configured."""

from __future__ import annotations

from kubernetes import client as k8s

from app.config.providers import ProviderConfig
from app.kube.gateway import KubernetesGateway
from app.providers.checks import PLURAL, ProviderHealthWriter, check, status_for
from app.providers.base import TargetVerdict
from app.providers.kubernetes.config import KubernetesSettings
from app.providers.kubernetes.provider import KubernetesProvider
from app.resources import GROUP, VERSION


def read(api, name):
    return k8s.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, PLURAL, name)


def test_publish_creates_labelled_object_and_keeps_transition_times(fake):
    api = fake.api_client()
    writer = ProviderHealthWriter(KubernetesGateway(api))
    writer.publish("kvm-lab", [TargetVerdict("lab1", True, "Ready", details={"freeBytes": "100"}),
                               TargetVerdict("lab2", False, "DialFailed", "TCP: connection refused")])
    obj = read(api, "kvm-lab")
    assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "proxy-operator"
    status = obj["status"]
    assert status["readyTargets"] == 1 and status["totalTargets"] == 2
    assert status["conditions"][0]["status"] == "False" and "lab2" in status["conditions"][0]["message"]
    first = {t["name"]: t["lastTransitionTime"] for t in status["targets"]}

    # Next round: lab1 still ready (time kept), lab2 flips (time moves).
    before = status_for([TargetVerdict("lab1", True, "Ready"), TargetVerdict("lab2", True, "Ready")],
                        status, now="2099-01-01T00:00:00Z")
    assert before["targets"][0]["lastTransitionTime"] == first["lab1"]
    assert before["targets"][1]["lastTransitionTime"] == "2099-01-01T00:00:00Z"
    writer.publish("kvm-lab", [TargetVerdict("lab1", True, "Ready"), TargetVerdict("lab2", True, "Ready")])
    status = read(api, "kvm-lab")["status"]
    assert status["readyTargets"] == 2 and status["conditions"][0]["status"] == "True"
    assert {t["name"]: t["lastTransitionTime"] for t in status["targets"]}["lab1"] == first["lab1"]


def test_prune_removes_unconfigured_and_unchecked_providers(fake):
    api = fake.api_client()
    writer = ProviderHealthWriter(KubernetesGateway(api))
    for name in ("keep", "gone", "checks-off"):
        writer.publish(name, [TargetVerdict("t", True, "Ready")])
    assert sorted(writer.prune(["keep", "checks-off"], {"keep"})) == ["checks-off", "gone"]
    names = [o["metadata"]["name"] for o in
             k8s.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]]
    assert names == ["keep"]


def test_kubernetes_check_reports_ready_and_forbidden(fake):
    api = fake.api_client()
    provider = KubernetesProvider(ProviderConfig("k8s", "kubernetes", 60, 15, KubernetesSettings()), client=api)
    [verdict] = check(provider, "k8s", timeout=5)
    assert verdict.ready and verdict.name == "cluster"
    fake.fail_next("list", "pods", code=403, reason="Forbidden")
    [verdict] = check(provider, "k8s", timeout=5)
    assert not verdict.ready and verdict.reason == "Forbidden"


def test_a_check_that_hangs_or_raises_becomes_one_not_ready_verdict():
    import threading

    class Hanging:
        def check(self):
            threading.Event().wait(5)

    class Broken:
        def check(self):
            raise RuntimeError("boom")

    [v] = check(Hanging(), "slow", timeout=0.2)
    assert not v.ready and v.reason == "CheckTimeout"
    [v] = check(Broken(), "broken", timeout=1)
    assert not v.ready and v.reason == "CheckFailed" and "boom" in v.message


# -- one snapshot, staleness, reason changes ------------------------------------------------------
import logging  # noqa: E402
import threading  # noqa: E402
import dataclasses  # noqa: E402

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from app.providers import checks as ph  # noqa: E402
from app.wiring import parse_config  # noqa: E402


def kvm_config(name="kvm-lab", hosts=("lab1", "lab2"), interval=60.0, timeout=15.0):
    """A kvm provider's config entry, parsed as the operator parses it (nothing is dialled)."""
    [pc] = parse_config({"providers": [{"name": name, "type": "kvm", "kvm": {
        "ssh": {"user": "u", "keyFile": "/nonexistent/key", "knownHostsFile": "/nonexistent/known_hosts"},
        "hosts": [{"name": h, "address": "127.0.0.1"} for h in hosts]}}]}, "<provider-health-test>").providers
    return dataclasses.replace(pc, check_interval=interval, check_timeout=timeout)


def scrape(collector) -> dict[tuple, float]:
    """Run a real exposition of ``collector`` and parse it back: {(metric, provider, target): value}."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    out = {}
    for family in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in family.samples:
            out[(s.name, s.labels.get("provider"), s.labels.get("target"))] = s.value
    return out


def test_a_host_check_that_times_out_reads_zero_under_the_hosts_own_name(redis_client):
    pc = kvm_config()
    for host in ("lab1", "lab2"):
        verdict, elapsed = ph.check_one(lambda h=host: TargetVerdict(h, True, "Ready"), host, timeout=5)
        ph.record_target(redis_client, pc.name, verdict, elapsed=elapsed)
    collector = ph.ProviderHealthCollector(lambda: redis_client, [pc])
    assert scrape(collector)[("proxy_operator_provider_up", "kvm-lab", "lab1")] == 1

    gate = threading.Event()
    verdict, elapsed = ph.check_one(lambda: gate.wait(5) or TargetVerdict("lab1", True, "Ready"), "lab1", timeout=0.2)
    gate.set()
    assert (verdict.name, verdict.ready, verdict.reason) == ("lab1", False, ph.CHECK_TIMEOUT)
    ph.record_target(redis_client, pc.name, verdict, elapsed=elapsed)
    values = scrape(collector)
    assert values[("proxy_operator_provider_up", "kvm-lab", "lab1")] == 0
    assert values[("proxy_operator_provider_up", "kvm-lab", "lab2")] == 1
    assert values[("proxy_operator_provider_check_duration_seconds", "kvm-lab", "lab1")] >= 0.2
    assert not any(target == "provider" for (_, _, target) in values)  # no generic stand-in target


def test_a_whole_round_that_times_out_marks_every_target_of_the_provider(redis_client):
    [pc] = parse_config({"providers": [{"name": "k8s", "type": "kubernetes", "checkTimeout": "1s"}]},
                        "<provider-health-test>").providers
    assert ph.expected_targets(pc) == ["cluster"]

    class Hanging:
        def check(self):
            threading.Event().wait(3)

    verdicts, elapsed, failed = ph.run_check(Hanging(), timeout=0.2)
    assert failed
    ph.record_round(redis_client, pc.name, verdicts, elapsed=elapsed, failed=failed, targets=ph.expected_targets(pc))
    [state] = ph.read_snapshot(redis_client, pc)
    assert (state.verdict.name, state.verdict.ready, state.verdict.reason) == ("cluster", False, ph.CHECK_TIMEOUT)


def test_silent_targets_go_check_stale_after_three_intervals(redis_client):
    pc = kvm_config(interval=10.0, timeout=5.0)
    t0 = 1_000_000.0
    ph.record_target(redis_client, pc.name, TargetVerdict("lab1", True, "Ready"), elapsed=0.1, now=t0)
    states = {s.verdict.name: s for s in ph.read_snapshot(redis_client, pc, now=t0 + 1)}
    assert states["lab1"].verdict.ready and not states["lab1"].stale
    # lab2 never reported: pending, not yet stale (its worker may still be starting)
    assert (states["lab2"].verdict.reason, states["lab2"].stale) == (ph.CHECK_PENDING, False)

    states = {s.verdict.name: s for s in ph.read_snapshot(redis_client, pc, now=t0 + 32)}
    assert (states["lab1"].verdict.ready, states["lab1"].verdict.reason, states["lab1"].stale) == \
        (False, ph.CHECK_STALE, True)
    assert (states["lab2"].verdict.reason, states["lab2"].stale) == (ph.CHECK_STALE, True)
    values = scrape(ph.ProviderHealthCollector(lambda: redis_client, [pc], clock=lambda: t0 + 32))
    assert values[("proxy_operator_provider_up", "kvm-lab", "lab1")] == 0
    assert values[("proxy_operator_provider_check_stale", "kvm-lab", "lab1")] == 1
    assert values[("proxy_operator_provider_check_timestamp_seconds", "kvm-lab", "lab1")] == t0


def test_reason_changes_are_logged_as_well_as_up_and_down(fake, caplog):
    writer = ProviderHealthWriter(KubernetesGateway(fake.api_client()))
    caplog.set_level(logging.INFO, logger="app.providers.checks")
    writer.publish("kvm-lab", [TargetVerdict("lab1", True, "Ready")])
    writer.publish("kvm-lab", [TargetVerdict("lab1", False, "DialFailed", "TCP: connection refused")])
    writer.publish("kvm-lab", [TargetVerdict("lab1", False, ph.CHECK_STALE, "last check 31s ago")])
    writer.publish("kvm-lab", [TargetVerdict("lab1", True, "Ready")])
    lines = [r.getMessage() for r in caplog.records if r.name == "app.providers.checks"]
    assert any("lab1 went down: DialFailed" in m for m in lines)
    assert any("lab1 still down, reason changed DialFailed -> CheckStale" in m for m in lines)
    assert any("lab1 came back: Ready" in m for m in lines)


def test_the_stale_sweep_writes_only_when_something_changed(fake, redis_client):
    pc = kvm_config(interval=10.0, timeout=5.0)
    writer = ProviderHealthWriter(KubernetesGateway(fake.api_client()))
    sweeper = ph.StaleSweeper(redis_client, writer, [pc])
    now = __import__("time").time()
    for host in ("lab1", "lab2"):
        ph.record_target(redis_client, pc.name, TargetVerdict(host, True, "Ready"), elapsed=0.1, now=now)
    assert sweeper.sweep_once() == 1  # the object did not exist yet
    assert sweeper.sweep_once() == 0  # nothing changed: no write
    ph.record_target(redis_client, pc.name, TargetVerdict("lab2", True, "Ready"), elapsed=0.1, now=now - 60)
    assert sweeper.sweep_once() == 1
    targets = {t["name"]: t for t in read(fake.api_client(), "kvm-lab")["status"]["targets"]}
    assert targets["lab1"]["ready"] and not targets["lab2"]["ready"]
    assert targets["lab2"]["reason"] == ph.CHECK_STALE
