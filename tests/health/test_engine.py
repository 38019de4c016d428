"""The health engine end to end: External Proxies in the API fake pointing at real Squids,
real Redis, probes through the Squids, status written through the real kubernetes client."""

from __future__ import annotations

import logging
import time

import pytest
from prometheus_client import REGISTRY

from app.serving import view as serving
from app.squid import conf as squid_conf
from app.probes import schedule
from app.probes import probe as p
from tests.health.conftest import NET
from tests.health.fleet import start_squid
from tests.health.servers import Blackhole, free_port
from devcluster.squid import SquidProcess, loopback_policy

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def steady_squid():
    """A Squid that stays up for the tests that never stop it."""
    proc = start_squid(NET.host(9))
    yield proc
    proc.stop()


def conds(proxy):
    return {c["type"]: c for c in proxy.status.get("conditions") or ()}


def status_patches(fake) -> int:
    return fake.request_count("patch", "proxies/status")


def test_healthy_after_the_success_threshold_with_egress_ip(fleet, settings, steady_squid):
    sq = steady_squid
    px = fleet.external("a", sq.address, sq.port, health={"successThreshold": 2})
    assert px.phase == "Running"

    fleet.probe([px], settings)
    rec = serving.get(fleet.r, px.uid)
    assert (rec["health"], rec["healthy"], rec["successes"]) == ("unknown", "0", "1")
    assert rec["egressIP"] == sq.address and rec["lastReason"] == p.OK and float(rec["latencyMs"]) > 0
    read = fleet.read("default", "a")
    assert read.phase == "Running" and "Healthy" not in conds(read)

    report = fleet.probe([px], settings)
    assert report.status_written == 1
    read = fleet.read("default", "a")
    c = conds(read)
    assert read.phase == "Ready"
    assert (c["Healthy"]["status"], c["Healthy"]["reason"]) == ("True", p.OK)
    assert c["Ready"]["status"] == "True"
    assert c["Healthy"]["observedGeneration"] == read.generation
    assert c["Provisioned"]["status"] == "True"  # the reconciler's condition is kept
    assert read.status["egressIP"] == sq.address
    assert read.status["lastProbeTime"].endswith("Z") and read.status["lastProbeLatencyMs"] >= 0
    rec = serving.get(fleet.r, px.uid)
    assert (rec["health"], rec["healthy"], rec["phase"]) == ("healthy", "1", "Ready")


def test_unhealthy_after_the_failure_threshold_and_back(fleet, settings, squids, next_address):
    sq = squids(start_squid(next_address()))
    px = fleet.external("b", sq.address, sq.port, health={"failureThreshold": 2})
    fleet.probe([px], settings)
    assert fleet.read("default", "b").phase == "Ready"
    ready_since = conds(fleet.read("default", "b"))["Healthy"]["lastTransitionTime"]

    sq.stop()
    fleet.probe([px], settings)
    assert fleet.read("default", "b").phase == "Ready"  # one failure < threshold
    assert serving.get(fleet.r, px.uid)["healthy"] == "1"
    fleet.probe([px], settings)
    read = fleet.read("default", "b")
    c = conds(read)
    assert read.phase == "Unhealthy"
    assert (c["Healthy"]["status"], c["Healthy"]["reason"]) == ("False", p.CONNECTION_REFUSED)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", p.CONNECTION_REFUSED)
    assert c["Healthy"]["lastTransitionTime"] >= ready_since
    rec = serving.get(fleet.r, px.uid)
    assert (rec["healthy"], rec["lastReason"]) == ("0", p.CONNECTION_REFUSED)

    squids(start_again(sq))
    fleet.probe([px], settings)
    read = fleet.read("default", "b")
    assert read.phase == "Ready" and conds(read)["Healthy"]["status"] == "True"
    assert serving.get(fleet.r, px.uid)["healthy"] == "1"


def start_again(stopped: SquidProcess) -> SquidProcess:
    """Start a fresh Squid on a stopped one's address and port (the same policy)."""
    policy = loopback_policy(squid_conf.SquidPolicy(extra=(f"tcp_outgoing_address {stopped.address}",)))
    return SquidProcess(stopped.address, stopped.port, squid_conf.render(stopped.port, policy)).start()


def test_status_is_written_on_transitions_only(fake, fleet, settings, steady_squid):
    sq = steady_squid
    px = fleet.external("c", sq.address, sq.port)
    fleet.probe([px], settings)
    after_ready = status_patches(fake)
    for _ in range(4):
        fleet.probe([px], settings)
    assert status_patches(fake) == after_ready
    assert int(serving.get(fleet.r, px.uid)["successes"]) == 5  # every probe reached Redis


def test_a_new_reason_updates_the_condition_but_not_its_transition_time(fleet, settings):
    hole = Blackhole(NET.host(4))
    px = fleet.external("d", hole.address, hole.port, health={"timeoutSeconds": 1})
    fleet.probe([px], settings)
    first = conds(fleet.read("default", "d"))["Healthy"]
    assert (first["status"], first["reason"]) == ("False", p.TIMEOUT)
    assert fleet.read("default", "d").phase == "Running"  # never healthy: phase stays
    hole.stop()  # now nothing listens: refused
    time.sleep(1.1)
    fleet.probe([px], settings)
    second = conds(fleet.read("default", "d"))["Healthy"]
    assert (second["status"], second["reason"]) == ("False", p.CONNECTION_REFUSED)
    assert second["lastTransitionTime"] == first["lastTransitionTime"]


def test_never_healthy_goes_failed_after_the_provisioning_deadline(fleet, settings):
    port = free_port(NET.host(4))
    px = fleet.external("e", NET.host(4), port)
    report = fleet.probe([px], settings)
    assert report.went_failed == 0
    report = fleet.probe([px], settings, clock=lambda: time.time() + settings.provision_deadline + 1)
    assert report.went_failed == 1
    read = fleet.read("default", "e")
    c = conds(read)
    assert read.phase == "Failed"
    assert c["Healthy"]["reason"] == p.CONNECTION_REFUSED and "not healthy within" in c["Healthy"]["message"]
    assert serving.get(fleet.r, px.uid) is None  # withdrawn: never leased, never probed again
    assert px.uid not in {u for b in schedule.sweep(fleet.r, settings, now=time.time() + 10_000) for u in b}


def test_probe_side_outage_marks_nothing_unhealthy(fleet, settings, squids, next_address, caplog):
    procs = [squids(start_squid(next_address())) for _ in range(3)]
    pxs = [fleet.external(f"o{i}", s.address, s.port) for i, s in enumerate(procs)]
    fleet.probe(pxs, settings)
    assert all(fleet.read("default", f"o{i}").phase == "Ready" for i in range(3))

    for s in procs:
        s.stop()
    caplog.set_level(logging.ERROR, logger="app.probes.engine")
    report = fleet.probe(pxs, settings)
    assert report.outage and report.failed == 3 and report.status_written == 0
    assert REGISTRY.get_sample_value("proxy_operator_probe_outage") == 1
    assert any(r.levelno == logging.CRITICAL and "OUTAGE" in r.getMessage() for r in caplog.records)
    assert all(fleet.read("default", f"o{i}").phase == "Ready" for i in range(3))
    assert all(serving.get(fleet.r, px.uid)["healthy"] == "1" for px in pxs)

    squids(start_again(procs[0]))
    report = fleet.probe(pxs, settings)
    assert not report.outage
    assert REGISTRY.get_sample_value("proxy_operator_probe_outage") == 0
    phases = [fleet.read("default", f"o{i}").phase for i in range(3)]
    assert phases == ["Ready", "Unhealthy", "Unhealthy"]


def test_failure_reasons_are_counted_in_the_metric(fleet, settings):
    before = REGISTRY.get_sample_value("proxy_operator_probe_failures_total", {"reason": p.CONNECTION_REFUSED}) or 0
    px = fleet.external("m", NET.host(4), free_port(NET.host(4)))
    fleet.probe([px], settings)
    after = REGISTRY.get_sample_value("proxy_operator_probe_failures_total", {"reason": p.CONNECTION_REFUSED})
    assert after == before + 1


def test_sweep_claims_due_proxies_once_in_batches(fleet, settings, steady_squid):
    sq = steady_squid
    pxs = [fleet.external(f"s{i}", sq.address, sq.port, health={"intervalSeconds": 30}) for i in range(5)]
    small = type(settings)(**{**settings.__dict__, "batch_size": 2})
    batches = schedule.sweep(fleet.r, small)
    assert sorted(len(b) for b in batches) == [1, 2, 2]
    assert sorted(u for b in batches for u in b) == sorted(px.uid for px in pxs)
    assert schedule.sweep(fleet.r, small) == []  # claimed: not enqueued twice

    for b in batches:
        fleet.probe(b, small)
    now = time.time()
    assert schedule.sweep(fleet.r, small, now=now + 20) == []  # interval 30 s not over
    due = schedule.sweep(fleet.r, small, now=now + 31)
    assert sorted(u for b in due for u in b) == sorted(px.uid for px in pxs)

    serving.withdraw(fleet.r, pxs[0].uid)
    assert pxs[0].uid not in {u for b in schedule.sweep(fleet.r, small, now=now + 10_000) for u in b}


def test_a_withdrawn_or_readdressed_proxy_is_not_resurrected(fleet, settings, steady_squid):
    sq = steady_squid
    px = fleet.external("w", sq.address, sq.port)
    serving.withdraw(fleet.r, px.uid)
    report = fleet.probe([px], settings)
    assert report.probed == 0 and serving.get(fleet.r, px.uid) is None

    px2 = fleet.external("w2", sq.address, sq.port)

    def republish_meanwhile(record):
        # The reconciler replaces the instance while this probe is in flight: a new address.
        serving.publish(fleet.r, px2, address=NET.host(250), port=sq.port, phase="Running")
        return None

    report = fleet.probe([px2], settings, credentials=republish_meanwhile)
    assert report.probed == 1 and report.succeeded == 1
    rec = serving.get(fleet.r, px2.uid)
    assert rec["address"] == NET.host(250)
    assert (rec["health"], rec["healthy"], rec["successes"]) == ("unknown", "0", "0")  # old result not applied


def test_batches_share_the_processs_probe_threads(fleet, settings, steady_squid):
    import threading

    sq = steady_squid
    proxies = [fleet.external(f"t{i}", sq.address, sq.port) for i in range(3)]
    fleet.probe(proxies, settings)
    started = {t.ident for t in threading.enumerate() if t.name.startswith("probe")}
    assert started
    report = fleet.probe(proxies, settings)
    assert report.succeeded == 3
    # the second batch ran on the threads the first one started: none more, none joined
    assert {t.ident for t in threading.enumerate() if t.name.startswith("probe")} == started
