"""The serving record's one schema (app/serving/records.py): what is stored, field by field, and
that the writers (publish, refresh, the health engine) and the readers (engine, API) agree."""

from __future__ import annotations

from app.serving import leases, view as serving
from app.probes import engine
from app.probes.probe import ProbeResult
from app.probes.state import HealthState
from app.resources import Proxy
from app.serving.records import HEALTH, HEALTH_DEFAULTS, IDENTITY, ServingRecord, fields_of, load, load_all


def _proxy(**spec) -> Proxy:
    return Proxy.from_dict({
        "metadata": {"namespace": "ns", "name": "p", "uid": "uid-1", "generation": 4, "labels": {"b": "2", "a": "1"}},
        "spec": {"mode": "External", "endpoint": {"host": "192.0.2.7", "port": 3128}, "maxLeases": 2,
                 "healthCheck": {"url": "http://origin.test/h", "intervalSeconds": 7}, **spec},
    })


def test_health_defaults_are_what_every_release_wrote():
    assert HEALTH_DEFAULTS == {
        "health": "unknown", "healthy": "0", "successes": "0", "failures": "0", "everHealthy": "0",
        "lastReason": "", "lastMessage": "", "lastStatus": "", "latencyMs": "", "lastProbe": "",
        "lastProbeTime": "", "egressIP": "", "egressAt": "", "egressError": "", "statusKey": "",
        "failed": "0", "lastVerdictReason": "", "lastVerdictMessage": "",
    }
    assert serving.HEALTH_DEFAULTS is HEALTH_DEFAULTS


def test_encodings():
    rec = ServingRecord(uid="u", port=3128, generation=3, labels={"b": "2", "a": "1"}, max_leases=5, healthy=True,
                        latency_ms=12.345, last_status=None, running_since=1700000000.25, egress_at=None,
                        health_check={"url": "http://x/", "expectedStatus": 204})
    stored = rec.to_redis()
    assert {k: stored[k] for k in ("uid", "port", "generation", "labels", "maxLeases", "healthy", "latencyMs",
                                   "lastStatus", "runningSince", "egressAt", "healthCheck", "health")} == {
        "uid": "u", "port": "3128", "generation": "3", "labels": '{"a": "1", "b": "2"}', "maxLeases": "5",
        "healthy": "1", "latencyMs": "12.3", "lastStatus": "", "runningSince": "1700000000.25", "egressAt": "",
        "healthCheck": '{"expectedStatus": 204, "url": "http://x/"}', "health": "unknown"}
    assert set(stored) == {*ServingRecord().to_redis(IDENTITY), *HEALTH_DEFAULTS, "runningSince"}
    assert fields_of(status_key="k", last_status=407) == {"statusKey": "k", "lastStatus": "407"}


def test_round_trip():
    rec = ServingRecord(uid="u", namespace="ns", name="n", generation=2, provider="kvm", zone="z", mode="Managed",
                        address="10.0.0.1", port=3128, labels={"x": "y"}, max_leases=3, phase="Ready",
                        auth_secret="n-proxy-auth", health_check={"url": "http://o/"}, health="healthy",
                        healthy=True, successes=2, failures=0, ever_healthy=True, running_since=1.5,
                        last_probe=2.25, last_probe_time="1970-01-01T00:00:02Z", latency_ms=3.5,
                        last_reason="ProbeSucceeded", last_message="ok", last_status=204,
                        last_verdict_reason="ProbeSucceeded", egress_ip="203.0.113.9", egress_at=2.25, status_key="True|ProbeSucceeded|Ready|203.0.113.9")
    assert ServingRecord.from_redis(rec.to_redis()) == rec
    assert ServingRecord.of(rec) is rec


def test_a_malformed_or_partial_record_reads_with_defaults():
    rec = ServingRecord.from_redis({"port": "x", "maxLeases": "many", "labels": "[1]", "healthCheck": "{",
                                    "health": "", "latencyMs": "fast", "lastStatus": "", "runningSince": "soon"})
    assert (rec.port, rec.max_leases, rec.labels, rec.health_check, rec.health, rec.latency_ms, rec.last_status,
            rec.running_since) == (0, 0, {}, {}, "unknown", None, None, None)
    assert ServingRecord.from_redis({}) == ServingRecord()


def test_publish_and_refresh_write_what_the_record_reads(redis_client):
    proxy = _proxy()
    serving.publish(redis_client, proxy, address="192.0.2.7", port=3128, phase="Running")
    raw = serving.get(redis_client, proxy.uid)
    rec = ServingRecord.from_redis(raw)
    assert (rec.uid, rec.namespace, rec.name, rec.generation, rec.mode, rec.address, rec.port, rec.labels,
            rec.max_leases, rec.phase, rec.auth_secret) == (
        "uid-1", "ns", "p", 4, "External", "192.0.2.7", 3128, {"a": "1", "b": "2"}, 2, "Running", "")
    assert rec.health_check["url"] == "http://origin.test/h" and rec.health_check["intervalSeconds"] == 7
    assert rec.running_since is not None and not rec.healthy
    assert raw["labels"] == '{"a": "1", "b": "2"}'  # as every release wrote it
    assert load(redis_client, [proxy.uid, "nope"]) == {proxy.uid: rec} and load_all(redis_client) == {proxy.uid: rec}

    changed = Proxy.from_dict({**proxy.raw, "spec": {**proxy.raw["spec"], "maxLeases": 0}})
    assert serving.refresh(redis_client, changed)
    assert ServingRecord.from_redis(serving.get(redis_client, proxy.uid)).max_leases == 0
    assert not redis_client.sismember("po:draining", proxy.uid)  # not healthy yet: unhealthy
    assert redis_client.sismember("po:unhealthy", proxy.uid)
    serving.withdraw(redis_client, proxy.uid)
    assert not serving.refresh(redis_client, changed)  # never resurrects a withdrawn record
    assert serving.get(redis_client, proxy.uid) is None


def test_load_reads_only_the_fields_asked_for(redis_client):
    proxy = _proxy()
    serving.publish(redis_client, proxy, address="192.0.2.7", port=3128, phase="Running")
    whole = load(redis_client, [proxy.uid])[proxy.uid]
    some = load(redis_client, [proxy.uid, "nope"], engine.PROBED_FIELDS)
    assert list(some) == [proxy.uid]  # an unpublished uid is left out, as with the whole hash
    rec = some[proxy.uid]
    for attr in engine.PROBED_FIELDS:
        assert getattr(rec, attr) == getattr(whole, attr), attr
    assert rec.labels == {} and rec.max_leases == 0 and rec.phase == ""  # not read: defaults


def test_the_engine_writes_health_through_the_schema():
    state = HealthState(health="healthy", successes=2, ever_healthy=True, reason="ProbeSucceeded", message="ok",
                        egress_ip="203.0.113.9")
    result = ProbeResult(uid="u", ok=True, reason="ProbeSucceeded", message="ok", status=204, latency_ms=4.25,
                         started=1700000000.5, egress_ip="203.0.113.9")
    fields = engine.record_fields(state, result, phase="Ready")
    assert fields == {
        "health": "healthy", "healthy": "1", "successes": "2", "failures": "0", "everHealthy": "1", "failed": "0",
        "lastVerdictReason": "ProbeSucceeded", "lastVerdictMessage": "ok", "lastReason": "ProbeSucceeded",
        "lastMessage": "ok", "lastStatus": "204", "latencyMs": "4.2", "lastProbe": "1700000000.5",
        "lastProbeTime": fields["lastProbeTime"], "egressIP": "203.0.113.9", "egressError": "",
        "egressAt": "1700000000.5", "phase": "Ready"}
    back = engine.state_of(fields, now=5.0)
    assert (back.health, back.successes, back.ever_healthy, back.reason, back.egress_ip, back.running_since) == (
        "healthy", 2, True, "ProbeSucceeded", "203.0.113.9", 5.0)
    assert set(fields) - {"phase"} <= {*HEALTH_DEFAULTS}
    assert len(HEALTH) == len(HEALTH_DEFAULTS)


def test_the_api_filters_typed_records():
    rec = ServingRecord(provider="kvm", zone="z1", namespace="ns", labels={"tier": "a"})
    assert leases.Filters(provider="kvm", zone="z1").matches(rec)
    assert not leases.Filters(namespace="other").matches(rec)
