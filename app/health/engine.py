"""One probe batch end to end: read the serving view, probe concurrently, apply thresholds,
record every result in Redis, write status changes to Kubernetes (SPEC §6).

:func:`probe_batch` is what the ``health.probe_batch`` task runs; it takes the Kubernetes read
and patch functions as arguments so it runs against any API (the real one, the test fake).

Per batch: one Redis round trip reads the records, the probes run on a thread pool, one
pipelined round trip notes each outcome for outage detection, one records the results and
reschedules each proxy (only if it is still published with the same endpoint: a withdrawn or
re-addressed proxy is never resurrected by a late result), then status writes run for the
proxies whose verdict changed (see :mod:`app.health.state`).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable

from app import serving
from app.health import metrics
from app.health import probe as p
from app.health.settings import HealthSettings
from app.health.state import HEALTHY, UNKNOWN, HealthState, Thresholds, Verdict, advance, verdict
from app.health.status import GetProxy, PatchStatus, rfc3339, write_status
from app.resources import DEFAULT_HEALTH_URL, FAILED

log = logging.getLogger(__name__)

OUTAGE_KEY = "po:health:outage"

#: ``credentials(record) -> (user, password) | None`` for proxies with basic auth.
Credentials = Callable[[dict], "tuple[str, str] | None"]

_NOTE = serving.Lua("""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[2] == '1' then
  redis.call('SADD', KEYS[2], ARGV[1]); redis.call('SREM', KEYS[3], ARGV[1])
else
  redis.call('SREM', KEYS[2], ARGV[1])
  if ARGV[3] == '1' then redis.call('SADD', KEYS[3], ARGV[1]) else redis.call('SREM', KEYS[3], ARGV[1]) end
end
return 1
""")

# Records a probe's fields (and keeps the lease index in step with ``healthy``) unless the
# proxy was withdrawn or re-addressed meanwhile.
_RECORD = serving.Lua(serving.NOW_LUA + serving.REINDEX_LUA + """
local cur = redis.call('HMGET', KEYS[1], 'address', 'port')
if not cur[1] or cur[1] ~= ARGV[3] or cur[2] ~= ARGV[4] then return 0 end
if #ARGV > 4 then redis.call('HSET', KEYS[1], unpack(ARGV, 5)) end
if ARGV[2] ~= '' then redis.call('ZADD', KEYS[2], 'XX', ARGV[2], ARGV[1]) end
reindex(ARGV[1], now)
return 1
""")


@dataclass
class BatchReport:
    """What one batch did (counts only: safe to return from a task).

    Attributes:
        probed / succeeded / failed: probes run and their outcomes.
        status_written / status_errors: Proxy status writes done and failed.
        went_failed: proxies moved to Failed (and withdrawn).
        outage: whether a probe-side outage was in progress.
        reasons: failure count per reason.
    """

    probed: int = 0
    succeeded: int = 0
    failed: int = 0
    status_written: int = 0
    status_errors: int = 0
    went_failed: int = 0
    outage: bool = False
    reasons: dict[str, int] = field(default_factory=dict)


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


def _float(value: str | None, default: float) -> float:
    try:
        return float(value) if value not in (None, "") else default
    except ValueError:
        return default


def state_of(record: dict[str, str], now: float) -> HealthState:
    """Read the :class:`HealthState` stored in a serving-view record."""
    return HealthState(
        health=record.get("health") or UNKNOWN,
        successes=_int(record.get("successes"), 0),
        failures=_int(record.get("failures"), 0),
        ever_healthy=record.get("everHealthy") == "1",
        reason=record.get("lastVerdictReason") or "",
        message=record.get("lastVerdictMessage") or "",
        egress_ip=record.get("egressIP") or "",
        running_since=_float(record.get("runningSince"), now),
        failed=record.get("failed") == "1",
    )


def thresholds_of(record: dict[str, str]) -> Thresholds:
    """Return the record's ``healthCheck`` thresholds."""
    hc = serving.health_check_of(record)
    return Thresholds(success=max(1, _int(str(hc.get("successThreshold", "")), 1)),
                      failure=max(1, _int(str(hc.get("failureThreshold", "")), 3)))


def target_of(uid: str, record: dict[str, str], settings: HealthSettings, now: float,
              credentials: Credentials | None = None) -> p.ProbeTarget | None:
    """Build the probe target of a record; ``None`` when it has no usable endpoint."""
    address, port = record.get("address"), _int(record.get("port"), 0)
    if not address or not 0 < port < 65536:
        return None
    hc = serving.health_check_of(record)
    egress_at = _float(record.get("egressAt"), 0.0)
    want_egress = bool(settings.echo_url) and (
        not record.get("egressIP") or record.get("health") != HEALTHY
        or now - egress_at >= settings.egress_refresh)
    return p.ProbeTarget(
        uid=uid, host=address, port=port, url=str(hc.get("url") or DEFAULT_HEALTH_URL),
        expected_status=_int(str(hc.get("expectedStatus", "")), 204),
        timeout=float(max(1, _int(str(hc.get("timeoutSeconds", "")), 10))),
        want_egress=want_egress, credentials=credentials(record) if credentials else None)


def record_fields(state: HealthState, result: p.ProbeResult, *, phase: str | None) -> dict[str, str]:
    """Return the serving-view fields for ``state`` after ``result``."""
    fields = {
        "health": state.health, "healthy": "1" if state.healthy else "0",
        "successes": str(state.successes), "failures": str(state.failures),
        "everHealthy": "1" if state.ever_healthy else "0", "failed": "1" if state.failed else "0",
        "lastVerdictReason": state.reason, "lastVerdictMessage": state.message,
        "lastReason": result.reason, "lastMessage": result.message,
        "lastStatus": "" if result.status is None else str(result.status),
        "latencyMs": f"{result.latency_ms:.1f}", "lastProbe": repr(result.started),
        "lastProbeTime": rfc3339(result.started), "egressIP": state.egress_ip,
        "egressError": result.egress_error or "",
    }
    if result.egress_ip:
        fields["egressAt"] = repr(result.started)
    if phase:
        fields["phase"] = phase
    return fields


def _note_outcomes(r, results: list[p.ProbeResult], recs: dict[str, dict], settings: HealthSettings) -> bool:
    """Note each outcome; return whether a probe-side outage is in progress."""
    pipe = r.pipeline(transaction=False)
    for res in results:
        ever = recs[res.uid].get("everHealthy") == "1"
        _NOTE(pipe, [serving.proxy_key(res.uid), serving.OK_KEY, serving.FAILING_KEY],
              [res.uid, "1" if res.ok else "0", "1" if ever else "0"])
    pipe.scard(serving.OK_KEY)
    pipe.scard(serving.FAILING_KEY)
    out = pipe.execute()
    ok_count, failing_count = out[-2], out[-1]
    any_failed = any(not res.ok for res in results)
    outage = any_failed and ok_count == 0 and failing_count >= settings.outage_min_proxies
    if outage:
        if r.set(OUTAGE_KEY, repr(time.time()), nx=True):
            log.critical("health: PROBE-SIDE OUTAGE: every probe of every proxy is failing "
                         "(%d once-healthy proxies failing, none succeeding); no proxy is marked "
                         "Unhealthy or Failed until probes succeed again", failing_count)
        else:
            log.error("health: probe-side outage continues: %d proxies failing, none succeeding",
                      failing_count)
        metrics.PROBE_OUTAGE.set(1)
    else:
        if ok_count and r.delete(OUTAGE_KEY):
            log.warning("health: probe-side outage over: %d proxies answer probes again", ok_count)
        metrics.PROBE_OUTAGE.set(0)
    return outage


def probe_batch(r, uids: list[str], settings: HealthSettings, *, get_proxy: GetProxy,
                patch_status: PatchStatus, credentials: Credentials | None = None,
                clock: Callable[[], float] = time.time) -> BatchReport:
    """Probe the published proxies ``uids`` and apply the results.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        uids: Proxy uids (unpublished ones are skipped).
        settings: :class:`HealthSettings`.
        get_proxy: ``(namespace, name) -> dict | None`` (:func:`app.kube.get_proxy`).
        patch_status: ``(namespace, name, status, resource_version) -> ...`` (:func:`app.kube.patch_proxy_status`).
        credentials: basic-auth credentials per record, for proxies that need them.
        clock: epoch-seconds clock.
    Returns:
        a :class:`BatchReport`.
    """
    report = BatchReport()
    recs = serving.records(r, list(dict.fromkeys(uids)))
    now = clock()
    targets = []
    for uid, rec in recs.items():
        target = target_of(uid, rec, settings, now, credentials)
        if target is None:
            log.warning("health: %s/%s has no usable endpoint in the serving view; not probed",
                        rec.get("namespace"), rec.get("name"))
            continue
        targets.append(target)
    results = p.probe_many(targets, concurrency=settings.concurrency, echo_url=settings.echo_url,
                           ca_bundle=settings.ca_bundle)
    if not results:
        return report
    report.outage = _note_outcomes(r, results, recs, settings)

    now = clock()
    pending: list[tuple[str, dict, Verdict, p.ProbeResult]] = []
    pipe = r.pipeline(transaction=False)
    for res in results:
        rec = recs[res.uid]
        metrics.PROBE_LATENCY.labels("ok" if res.ok else "failed").observe(res.latency_ms / 1000)
        if res.ok:
            report.succeeded += 1
        else:
            report.failed += 1
            report.reasons[res.reason] = report.reasons.get(res.reason, 0) + 1
            metrics.PROBE_FAILURES.labels(res.reason).inc()
        before = state_of(rec, now)
        if "runningSince" not in rec:
            before = replace(before, running_since=now)
        after = advance(before, res, thresholds_of(rec), now=now, deadline=settings.provision_deadline,
                        outage=report.outage)
        v = verdict(after)
        phase = v.phase if v.phase and v.phase != FAILED else None
        fields = record_fields(after, res, phase=phase)
        if "runningSince" not in rec:
            fields["runningSince"] = repr(before.running_since)
        interval = max(1, _int(str(serving.health_check_of(rec).get("intervalSeconds", "")), 30))
        next_due = "" if after.failed else repr(res.started + interval)
        args = [res.uid, next_due, rec.get("address", ""), rec.get("port", "")]
        for k, val in fields.items():
            args += [k, val]
        _RECORD(pipe, [serving.proxy_key(res.uid), serving.DUE_KEY], args)
        if v.key() != (rec.get("statusKey") or ""):
            pending.append((res.uid, rec, v, res))
    applied = pipe.execute()
    report.probed = len(results)
    live = {res.uid for res, ok in zip(results, applied) if ok}
    pending = [item for item in pending if item[0] in live]
    if pending:
        _write_statuses(r, pending, get_proxy, patch_status, settings, report)
    return report


def _write_statuses(r, pending, get_proxy, patch_status, settings: HealthSettings, report: BatchReport) -> None:
    def one(item):
        uid, rec, v, res = item
        try:
            written = write_status(get_proxy, patch_status, uid=uid, namespace=rec.get("namespace", ""),
                                   name=rec.get("name", ""), v=v, last_probe=res.started,
                                   latency_ms=res.latency_ms)
            return item, written, None
        except Exception as exc:  # noqa: BLE001 - retried on the next probe
            return item, False, exc

    workers = max(1, min(settings.status_concurrency, len(pending)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="health-status") as pool:
        outcomes = list(pool.map(one, pending))
    pipe = r.pipeline(transaction=False)
    withdraw: list[str] = []  # Failed: out of the serving view (the reconciler re-publishes on a new generation)
    for (uid, rec, v, res), written, exc in outcomes:
        if exc is not None:
            report.status_errors += 1
            metrics.STATUS_WRITES.labels("error").inc()
            log.warning("health: status write for %s/%s failed, retrying on the next probe: %s",
                        rec.get("namespace"), rec.get("name"), exc)
            continue
        metrics.STATUS_WRITES.labels("written" if written else "skipped").inc()
        if written:
            report.status_written += 1
        # Written, or skipped because the object is gone or not in a probed phase: either way
        # this verdict is settled; the next change of verdict writes again.
        _RECORD(pipe, [serving.proxy_key(uid), serving.DUE_KEY],
                [uid, "", rec.get("address", ""), rec.get("port", ""), "statusKey", v.key()])
        if v.phase == FAILED:
            withdraw.append(uid)
    pipe.execute()
    for uid in withdraw:
        serving.withdraw(r, uid)
        report.went_failed += 1
