"""Origin outages, rate-limited health URLs and the health engine's Events: real Squids, real origins, real
Redis, the Kubernetes API fake.

* An outage of the health URL's origin is told from failing proxies by a direct control
  request before any proxy is marked down: 6 healthy proxies, origin down, probes in batches
  of 1, 2 or 6 with ``failureThreshold: 1``: nobody changes state; a proxy that is really
  broken while the origin is up still goes Unhealthy.
* ``429`` is ``RateLimited``: 10 of 25 proxies rate limited stay leasable over three sweeps,
  their next probe waits for ``Retry-After``, the results are counted by reason;
  ``rateLimited: Withdraw`` withdraws.
* Ready, Unhealthy (with the probe reason) and Failed by the provisioning deadline each emit
  one Kubernetes Event.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client as k8s
from prometheus_client import REGISTRY

from app.serving import view as serving
from app.store import keys as redis_keys
from app.probes import engine
from app.probes import probe as p
from tests.health.conftest import NET
from tests.health.fleet import start_squid
from tests.health.servers import OriginServer, free_port

pytestmark = pytest.mark.timeout(90)

OUTAGE_ORIGIN = NET.host(5)


@pytest.fixture(scope="module")
def shared_squid():
    proc = start_squid(NET.host(8))
    yield proc
    proc.stop()


def phases(fleet, names) -> list[str]:
    return [fleet.read("default", n).phase for n in names]


def conds(proxy) -> dict:
    return {c["type"]: c for c in proxy.status.get("conditions") or ()}


@pytest.mark.parametrize("batch", [1, 2, 6])
def test_an_origin_outage_marks_no_proxy_down_whatever_the_batch_size(fake, fleet, settings, shared_squid, squids,
                                                                      next_address, batch):
    port = free_port(OUTAGE_ORIGIN)
    origin = OriginServer(OUTAGE_ORIGIN, port, keep_alive=False).start()
    url = origin.url("/generate_204")
    names = [f"o{batch}-{i}" for i in range(6)]
    pxs = [fleet.external(n, shared_squid.address, shared_squid.port, health={"url": url, "failureThreshold": 1})
           for n in names]
    broken_squid = squids(start_squid(next_address()))
    broken = fleet.external(f"broken{batch}", broken_squid.address, broken_squid.port,
                            health={"url": url, "failureThreshold": 1})

    def sweep(proxies):
        reports = [fleet.probe(proxies[i:i + batch], settings) for i in range(0, len(proxies), batch)]
        return reports

    sweep(pxs + [broken])
    assert phases(fleet, names + [broken.name]) == ["Ready"] * 7

    origin.stop()
    writes_before = fake.request_count("patch", "proxies/status")
    for _ in range(2):  # two sweeps: with failureThreshold 1, one counted failure would do it
        reports = sweep(pxs)
        assert sum(r.origin_down for r in reports) == 6 and sum(r.status_written for r in reports) == 0
    assert phases(fleet, names) == ["Ready"] * 6
    assert fake.request_count("patch", "proxies/status") == writes_before
    for px in pxs:
        rec = serving.get(fleet.r, px.uid)
        assert (rec["healthy"], rec["lastReason"], rec["failures"]) == ("1", engine.ORIGIN_DOWN, "0")

    origin = OriginServer(OUTAGE_ORIGIN, port, keep_alive=False).start()  # the origin is back
    try:
        sweep(pxs)
        assert phases(fleet, names) == ["Ready"] * 6
        # A proxy that is really broken while the origin is up is still marked down at once.
        broken_squid.stop()
        [report] = [fleet.probe([broken], settings)]
        assert report.origin_down == 0
        assert fleet.read("default", broken.name).phase == "Unhealthy"
    finally:
        origin.stop()


def test_rate_limited_proxies_stay_leasable_and_wait_for_retry_after(fleet, settings, shared_squid, origin):
    ok_url, limited_url = origin.url("/generate_204"), origin.url("/ratelimit/120")
    limited = [fleet.external(f"rl-{i}", shared_squid.address, shared_squid.port, health={"url": limited_url})
               for i in range(10)]
    fine = [fleet.external(f"ok-{i}", shared_squid.address, shared_squid.port, health={"url": ok_url})
            for i in range(15)]
    before = REGISTRY.get_sample_value("proxy_operator_probe_results_total", {"reason": p.RATE_LIMITED}) or 0
    # The limited ones first, alone: they become Ready on a 429 (the proxy works).
    fleet.probe(limited, settings)
    for _sweep in range(3):
        started = time.time()
        report = fleet.probe(limited + fine, settings)
        assert report.probed == 25 and report.failed == 0
    assert REGISTRY.get_sample_value("proxy_operator_probe_results_total",
                                     {"reason": p.RATE_LIMITED}) == before + 40
    for px in limited:
        read = fleet.read("default", px.name)
        c = conds(read)
        assert read.phase == "Ready"
        assert (c["Healthy"]["status"], c["Healthy"]["reason"]) == ("True", p.RATE_LIMITED)
        assert "Retry-After 120s" in c["Healthy"]["message"]
        rec = serving.get(fleet.r, px.uid)
        assert rec["healthy"] == "1"
        # Retry-After (120 s) postpones the next probe beyond intervalSeconds (3 s).
        assert fleet.r.zscore(redis_keys.HEALTH_DUE, px.uid) >= started + 119
    for px in fine:
        assert fleet.read("default", px.name).phase == "Ready"
        assert fleet.r.zscore(redis_keys.HEALTH_DUE, px.uid) < time.time() + 5


def test_rate_limited_withdraws_when_the_proxy_says_so(fleet, settings, shared_squid, origin):
    px = fleet.external("rl-withdraw", shared_squid.address, shared_squid.port,
                        health={"url": origin.url("/generate_204"), "rateLimited": "Withdraw", "failureThreshold": 1})
    fleet.probe([px], settings)
    assert fleet.read("default", px.name).phase == "Ready"
    serving_rec = fleet.r.hget(redis_keys.proxy(px.uid), "healthCheck")
    assert '"rateLimited": "Withdraw"' in serving_rec
    # The same Proxy's URL now answers 429 (spec change: the serving view follows it).
    body = {"spec": {"healthCheck": {"url": origin.url("/ratelimit/5")}}}
    fleet.custom.patch_namespaced_custom_object("crawl.example.com", "v1alpha1", "default", "proxies",
                                                px.name, body)
    serving.refresh(fleet.r, fleet.read("default", px.name))
    fleet.probe([px], settings)
    read = fleet.read("default", px.name)
    assert read.phase == "Unhealthy" and conds(read)["Healthy"]["reason"] == p.RATE_LIMITED
    assert serving.get(fleet.r, px.uid)["healthy"] == "0"


def test_ready_unhealthy_and_deadline_each_emit_one_event(fleet, settings, squids, next_address):
    sq = squids(start_squid(next_address()))
    px = fleet.external("ev", sq.address, sq.port, health={"failureThreshold": 1})
    fleet.probe([px], settings, events=True)
    fleet.probe([px], settings, events=True)  # still Ready: no second Event
    sq.stop()
    fleet.probe([px], settings, events=True)
    fleet.probe([px], settings, events=True)  # still Unhealthy: none either
    dead = fleet.external("ev-dead", NET.host(4), free_port(NET.host(4)))
    fleet.probe([dead], settings, events=True)
    fleet.probe([dead], settings, events=True, clock=lambda: time.time() + settings.provision_deadline + 1)

    events = k8s.CoreV1Api(fleet.kube.client).list_namespaced_event("default").items
    # (the reconciler's create step emitted "Running" for each: not the health engine's)
    story = [(e.involved_object.name, e.type, e.reason) for e in events
             if e.involved_object.name in ("ev", "ev-dead") and e.reason != "Running"]
    assert sorted(story) == sorted([("ev", "Normal", "Ready"), ("ev", "Warning", "Unhealthy"),
                                    ("ev-dead", "Warning", "ProvisioningDeadlineExceeded")])
    unhealthy = next(e for e in events if e.reason == "Unhealthy")
    assert unhealthy.message.startswith(p.CONNECTION_REFUSED + ":")
    assert unhealthy.involved_object.uid == px.uid
