"""One probe batch end to end: read the serving view, probe concurrently, apply thresholds,
record every result in Redis, write status changes to Kubernetes.

:func:`probe_batch` is what the ``health.probe_batch`` task runs; it takes the Kubernetes read
and patch functions as arguments so it runs against any API (the real one, the test fake).

Per batch: one Redis round trip reads the records, the probes run on a thread pool, and the
results are applied as they arrive (results that arrive together share the round trips): one
pipelined round trip notes each outcome for outage detection, one records the results and
reschedules each proxy (only if it is still published with the same endpoint: a withdrawn or
re-addressed proxy is never resurrected by a late result), and the status writes of the
proxies whose verdict changed start at once on their own pool (see :mod:`app.health.state`).
A slow proxy delays only itself.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Callable

from app import serving
from app.health import metrics
from app.health import probe as p
from app.health.origin import DOWN, OriginControl
from app.health.settings import HealthSettings
from app.health.state import HEALTHY, UNKNOWN, HealthState, Thresholds, Verdict, advance, verdict
from app.health.status import GetProxy, PatchStatus, RecordEvent, rfc3339, write_status
from app.resources import DEFAULT_HEALTH_URL, FAILED

log = logging.getLogger(__name__)

OUTAGE_KEY = "po:health:outage"

#: Longest probe, seconds: the CRD's maximum of ``healthCheck.timeoutSeconds`` (deploy/crd/proxy.yaml).
MAX_TIMEOUT_SECONDS = 60

#: ``credentials(record) -> (user, password) | None`` for proxies with basic auth.
Credentials = Callable[[dict], "tuple[str, str] | None"]

#: Recorded as ``lastReason`` (and counted) for a failed probe while its health URL's origin
#: was down (:mod:`app.health.origin`): the proxy was not judged.
ORIGIN_DOWN = "OriginDown"

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


# Copies the credentials a probe used into ``po:auth:<uid>`` for the lease scripts (see
# app.serving), or drops them when the probe had none, unless the proxy was withdrawn or
# re-addressed meanwhile or no longer requires basic auth.
_AUTH = serving.Lua("""
local cur = redis.call('HMGET', KEYS[1], 'address', 'port', 'authSecret')
if not cur[1] or cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then return 0 end
if ARGV[3] == '' or not cur[3] or cur[3] == '' then
  redis.call('DEL', KEYS[2])
  return 0
end
redis.call('HSET', KEYS[2], 'username', ARGV[3], 'password', ARGV[4])
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
        origin_down: failed probes not held against their proxy because the health URL's
            origin itself was down (a direct control request failed).
        reasons: failure count per reason.
    """

    probed: int = 0
    succeeded: int = 0
    failed: int = 0
    status_written: int = 0
    status_errors: int = 0
    went_failed: int = 0
    outage: bool = False
    origin_down: int = 0
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


def judged(result: p.ProbeResult, record: dict[str, str]) -> p.ProbeResult:
    """``result`` as the Proxy's ``healthCheck`` judges it.

    A ``RateLimited`` answer (429) counts as a success (the proxy reached the origin; its
    egress IP is rate limited) unless ``healthCheck.rateLimited`` is ``Withdraw``; the reason
    stays ``RateLimited`` either way.
    """
    if result.reason == p.RATE_LIMITED and not result.ok and \
            serving.health_check_of(record).get("rateLimited") != "Withdraw":
        return replace(result, ok=True)
    return result


def target_of(uid: str, record: dict[str, str], settings: HealthSettings, now: float,
              credentials: Credentials | None = None) -> p.ProbeTarget | None:
    """Build the probe target of a record; ``None`` when it has no usable endpoint."""
    address, port = record.get("address"), _int(record.get("port"), 0)
    if not address or not 0 < port < 65536:
        return None
    hc = serving.health_check_of(record)
    url = str(hc.get("url") or "")
    if not url or url == DEFAULT_HEALTH_URL:  # the CRD's default: the installation may point it elsewhere
        url = settings.default_url
    egress_at = _float(record.get("egressAt"), 0.0)
    want_egress = bool(settings.echo_url) and (
        not record.get("egressIP") or record.get("health") != HEALTHY
        or now - egress_at >= settings.egress_refresh)
    return p.ProbeTarget(
        uid=uid, host=address, port=port, url=url,
        expected_status=_int(str(hc.get("expectedStatus", "")), 204),
        # the CRD caps timeoutSeconds; a record written straight into Redis is capped here too
        timeout=float(min(MAX_TIMEOUT_SECONDS, max(1, _int(str(hc.get("timeoutSeconds", "")), 10)))),
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


def _note(r, results: list[p.ProbeResult], recs: dict[str, dict]) -> tuple[int, int]:
    """Note each outcome in the OK / failing sets; return the sizes of both afterwards."""
    pipe = r.pipeline(transaction=False)
    for res in results:
        ever = recs[res.uid].get("everHealthy") == "1"
        _NOTE(pipe, [serving.proxy_key(res.uid), serving.OK_KEY, serving.FAILING_KEY],
              [res.uid, "1" if res.ok else "0", "1" if ever else "0"])
    pipe.scard(serving.OK_KEY)
    pipe.scard(serving.FAILING_KEY)
    out = pipe.execute()
    return out[-2], out[-1]


def _outage(r, results: list[p.ProbeResult], ok_count: int, failing_count: int, settings: HealthSettings,
            batch: "_Batch") -> bool:
    """Return whether a probe-side outage is in progress after ``results``; log and export changes
    (at most one "continues" line per batch)."""
    any_failed = any(not res.ok for res in results)
    outage = any_failed and ok_count == 0 and failing_count >= settings.outage_min_proxies
    if outage:
        if r.set(OUTAGE_KEY, repr(time.time()), nx=True):
            log.critical("health: PROBE-SIDE OUTAGE: every probe of every proxy is failing "
                         "(%d once-healthy proxies failing, none succeeding); no proxy is marked "
                         "Unhealthy or Failed until probes succeed again", failing_count)
        elif not batch.outage_logged:
            log.error("health: probe-side outage continues: %d proxies failing, none succeeding",
                      failing_count)
        batch.outage_logged = True
        metrics.PROBE_OUTAGE.set(1)
    else:
        if ok_count and r.delete(OUTAGE_KEY):
            log.warning("health: probe-side outage over: %d proxies answer probes again", ok_count)
        metrics.PROBE_OUTAGE.set(0)
    return outage


class _Batch:
    """State one :func:`probe_batch` call shares between its threads: the report (counters the
    status-write threads touch are updated under :attr:`lock`) and the status-write pool."""

    def __init__(self, r, settings: HealthSettings, get_proxy: GetProxy, patch_status: PatchStatus,
                 record_event: RecordEvent | None = None) -> None:
        self.r, self.settings, self.get_proxy, self.patch_status = r, settings, get_proxy, patch_status
        self.record_event = record_event
        self.report = BatchReport()
        self.lock = threading.Lock()
        self.outage_logged = False
        self._status_pool: ThreadPoolExecutor | None = None

    def submit_status(self, item: tuple) -> None:
        """Write one changed verdict to the Proxy status on the status pool, at once."""
        if self._status_pool is None:
            self._status_pool = ThreadPoolExecutor(max_workers=max(1, self.settings.status_concurrency),
                                                   thread_name_prefix="health-status")
        self._status_pool.submit(self._write_status, item)

    def close(self) -> None:
        """Wait for the status writes still running."""
        if self._status_pool is not None:
            self._status_pool.shutdown(wait=True)

    def _write_status(self, item: tuple) -> None:
        uid, rec, v, res = item
        report = self.report
        try:
            written = write_status(self.get_proxy, self.patch_status, uid=uid, namespace=rec.get("namespace", ""),
                                   name=rec.get("name", ""), v=v, last_probe=res.started,
                                   latency_ms=res.latency_ms, record_event=self.record_event)
        except Exception as exc:  # noqa: BLE001 - retried on the next probe
            with self.lock:
                report.status_errors += 1
            metrics.STATUS_WRITES.labels("error").inc()
            log.warning("health: status write for %s/%s failed, retrying on the next probe: %s",
                        rec.get("namespace"), rec.get("name"), exc)
            return
        metrics.STATUS_WRITES.labels("written" if written else "skipped").inc()
        with self.lock:
            if written:
                report.status_written += 1
        try:
            # Written, or skipped because the object is gone or not in a probed phase: either way
            # this verdict is settled; the next change of verdict writes again.
            _RECORD(self.r, [serving.proxy_key(uid), serving.DUE_KEY],
                    [uid, "", rec.get("address", ""), rec.get("port", ""), "statusKey", v.key()])
            if v.phase == FAILED:
                # out of the serving view (the reconciler re-publishes on a new generation)
                serving.withdraw(self.r, uid)
                with self.lock:
                    report.went_failed += 1
        except Exception as exc:  # noqa: BLE001 - the verdict is written again on the next probe
            log.warning("health: recording the status write of %s/%s failed: %s",
                        rec.get("namespace"), rec.get("name"), type(exc).__name__)


def probe_batch(r, uids: list[str], settings: HealthSettings, *, get_proxy: GetProxy,
                patch_status: PatchStatus, credentials: Credentials | None = None,
                record_event: RecordEvent | None = None, clock: Callable[[], float] = time.time) -> BatchReport:
    """Probe the published proxies ``uids`` and apply each result as soon as it is known.

    The probes run concurrently (``settings.concurrency``).  Results are recorded in Redis and
    changed verdicts written to the Proxy status as they arrive (several that arrive together
    share one round trip), so one slow proxy never holds back the others' results (issue 10,
    item 5).  One exception keeps outage detection whole: while every result of the batch so
    far is a failure and the proxies still in flight may be the only ones that succeeded
    before, the failures wait for the rest of the batch (or its first success), so that a
    probe-side outage is recognised before anything is marked Unhealthy.  Every endpoint and
    health URL is checked against ``settings``' destination policy first (a denied one fails
    with reason ``DestinationDenied``, nothing sent).

    A failure is held against its proxy only once the health URL's origin is known to be up:
    unless a probe of the same URL already succeeded in this batch, a direct control request
    (:mod:`app.health.origin`) asks the origin itself, and while it is down the failed proxies
    keep their state (lastReason ``OriginDown``), whatever the threshold or batch size.  A
    ``429`` is ``RateLimited`` (:func:`judged`), and its ``Retry-After`` postpones that proxy's
    next probe.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        uids: Proxy uids (unpublished ones are skipped).
        settings: :class:`HealthSettings`.
        get_proxy: ``(namespace, name) -> dict | None`` (:func:`app.kube.get_proxy`).
        patch_status: ``(namespace, name, status, resource_version) -> ...`` (:func:`app.kube.patch_proxy_status`).
        credentials: basic-auth credentials per record, for proxies that need them (called on
            the probe threads).
        record_event: ``(proxy, type, reason, message)`` creating a Kubernetes Event
            (:meth:`app.kube.Kube.record_event`) when a status write moves the phase (Ready,
            Unhealthy, Failed by the provisioning deadline); ``None``: no Events.
        clock: epoch-seconds clock.
    Returns:
        a :class:`BatchReport`.
    Raises:
        ValueError: ``settings`` holds a probe range that does not parse.
        redis.RedisError: Redis failed while results were recorded.
    """
    batch = _Batch(r, settings, get_proxy, patch_status, record_event)
    report = batch.report
    recs = serving.records(r, list(dict.fromkeys(uids)))
    if not recs:
        return report
    policy = settings.destination_policy()
    now = clock()

    def run(uid: str, rec: dict) -> tuple[p.ProbeTarget, p.ProbeResult] | None:
        target = target_of(uid, rec, settings, now, credentials)
        if target is None:
            log.warning("health: %s/%s has no usable endpoint in the serving view; not probed",
                        rec.get("namespace"), rec.get("name"))
            return None
        res = p.probe(target, echo_url=settings.echo_url, ca_bundle=settings.ca_bundle, policy=policy)
        if res.reason == p.PROXY_AUTH_REQUIRED and rec.get("authSecret"):
            return _rotation(r, target, res, rec, credentials, settings, policy)
        return target, res

    origins = OriginControl(r, policy, settings.ca_bundle, clock)
    ok_urls: dict[tuple[str, int], float] = {}  # URLs whose probes succeeded in this batch -> a timeout
    pool = ThreadPoolExecutor(max_workers=max(1, min(settings.concurrency, len(recs))), thread_name_prefix="probe")
    try:
        in_flight = {pool.submit(run, uid, rec) for uid, rec in recs.items()}
        held: list[tuple[p.ProbeTarget, p.ProbeResult]] = []
        seen_success = False
        while in_flight:
            done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
            arrived = [(t, judged(res, recs[res.uid])) for t, res in
                       (item for item in (f.result() for f in done) if item is not None)]
            for t, res in arrived:
                if res.ok:
                    ok_urls[(t.url, t.expected_status)] = t.timeout
            arrived, parked = _split_origin_down(origins, arrived, ok_urls)
            if parked:
                report.origin_down += len(parked)
                _apply(batch, parked, recs, False, clock(), origin_down=True)
            if not arrived:
                continue
            ok_count, failing_count = _note(r, [res for _, res in arrived], recs)
            seen_success = seen_success or any(res.ok for _, res in arrived)
            held += arrived
            # Decide now unless this could still turn out to be a probe-side outage: no success
            # in the batch yet, and the OK set may hold only proxies whose probes are in flight.
            if seen_success or not in_flight or ok_count > len(in_flight):
                outage = _outage(r, [res for _, res in held], ok_count, failing_count, settings, batch)
                report.outage = report.outage or outage
                _apply(batch, held, recs, outage, clock())
                held = []
        for (url, expected), timeout in ok_urls.items():
            origins.refresh(url, expected, timeout)
    finally:
        pool.shutdown(wait=True)
        batch.close()
    return report


def _rotation(r, target: p.ProbeTarget, res: p.ProbeResult, rec: dict, credentials: Credentials | None,
              settings: HealthSettings, policy) -> tuple[p.ProbeTarget, p.ProbeResult]:
    """After a 407: try the other credentials a password rotation leaves around, so a proxy is
    never withdrawn because of its own rotation.

    The proxy may already know a password the probe's cached copy of the Secret does not (the
    Secret is read again, past the cache), or may still know only the previous one (the
    kubelet has not updated the Pod's file yet, a KVM or GCE instance keeps its htpasswd
    until it is replaced): the credentials of the last probe that passed, kept in
    ``po:auth:<uid>``.  The first pair the proxy accepts wins; its result (and the pair, which
    the lease answer hands out) is what counts.  Only a record whose own credentials were
    granted (verified against its Proxy) is retried.  Credentials never appear in a message.
    """
    if target.credentials is None:
        # The record was not verified against its Proxy (app.health.credentials): no other
        # credentials go to its address either.
        return target, res
    tried = {target.credentials}
    candidates: list[tuple[tuple[str, str] | None, str]] = []
    fresh = getattr(credentials, "fresh", None)
    if fresh is not None:
        candidates.append((fresh(rec), ""))
    try:
        last = r.hgetall(serving.auth_key(target.uid))
    except Exception:  # noqa: BLE001 - the first answer stands
        last = {}
    if last.get("username") and last.get("password") is not None:
        candidates.append(((last["username"], last["password"]),
                           "; the proxy accepts only the previous password so far (a rotation is on its way)"))
    for creds, note in candidates:
        if creds is None or creds in tried:
            continue
        tried.add(creds)
        other = replace(target, credentials=creds)
        again = p.probe(other, echo_url=settings.echo_url, ca_bundle=settings.ca_bundle, policy=policy)
        if again.reason != p.PROXY_AUTH_REQUIRED:
            return other, replace(again, message=again.message + note) if note and again.ok else again
    return target, res


def _split_origin_down(origins: OriginControl, arrived: list[tuple[p.ProbeTarget, p.ProbeResult]],
                       ok_urls: dict) -> tuple[list, list]:
    """Split ``arrived`` into results to judge and failures to park because their health URL's
    origin is down (one control request per URL, see :mod:`app.health.origin`)."""
    judge, parked = [], []
    verdicts: dict[tuple[str, int], bool] = {}
    for item in arrived:
        target, res = item
        key = (target.url, target.expected_status)
        if res.ok or res.reason == p.DESTINATION_DENIED or key in ok_urls:
            judge.append(item)
            continue
        if key not in verdicts:
            since = min(r.started for t, r in arrived if (t.url, t.expected_status) == key and not r.ok)
            control = origins.verdict(target.url, target.expected_status, target.timeout, since)
            verdicts[key] = control.state == DOWN
            if verdicts[key]:
                log.warning("health: health origin is down (%s); failed probes through proxies are not held "
                            "against them", control.message)
        (parked if verdicts[key] else judge).append(item)
    return judge, parked


def _apply(batch: _Batch, arrived: list[tuple[p.ProbeTarget, p.ProbeResult]], recs: dict[str, dict],
           outage: bool, now: float, *, origin_down: bool = False) -> None:
    """Record ``arrived`` results in the serving view (one round trip) and queue the status
    writes of the verdicts that changed.

    ``origin_down``: the results are failures while their health URL's origin was down; they
    are recorded (``lastReason`` ``OriginDown``) but change nothing about the proxy's state.
    """
    r, settings, report = batch.r, batch.settings, batch.report
    pending: list[tuple[str, dict, Verdict, p.ProbeResult]] = []
    pipe = r.pipeline(transaction=False)
    pipe_scripts: list[serving.Lua] = []  # which script each queued command runs
    for target, res in arrived:
        rec = recs[res.uid]
        if rec.get("authSecret"):
            # before the record that may make it healthy: a leasable proxy that requires
            # basic auth always has its credentials for the lease response
            user, password = target.credentials or ("", "")
            _AUTH(pipe, [serving.proxy_key(res.uid), serving.auth_key(res.uid)],
                  [rec.get("address", ""), rec.get("port", ""), user, password])
            pipe_scripts.append(_AUTH)
        metrics.PROBE_LATENCY.labels("ok" if res.ok else "failed").observe(res.latency_ms / 1000)
        if origin_down:
            res = replace(res, reason=ORIGIN_DOWN,
                          message=f"not judged: the health URL's origin is down ({res.message})")
        metrics.PROBE_RESULTS.labels(res.reason).inc()
        if res.ok:
            report.succeeded += 1
        else:
            report.failed += 1
            report.reasons[res.reason] = report.reasons.get(res.reason, 0) + 1
            metrics.PROBE_FAILURES.labels(res.reason).inc()
        before = state_of(rec, now)
        if "runningSince" not in rec:
            before = replace(before, running_since=now)
        if origin_down:
            after = before  # the proxy was not judged: no counter, threshold or verdict moves
        else:
            after = advance(before, res, thresholds_of(rec), now=now, deadline=settings.provision_deadline,
                            outage=outage)
        v = verdict(after)
        phase = v.phase if v.phase and v.phase != FAILED else None
        fields = record_fields(after, res, phase=phase)
        if "runningSince" not in rec:
            fields["runningSince"] = repr(before.running_since)
        interval = max(1, _int(str(serving.health_check_of(rec).get("intervalSeconds", "")), 30))
        # A 429's Retry-After postpones this proxy's next probe (never brings it forward).
        wait_for = max(float(interval), min(res.retry_after or 0.0, p.MAX_RETRY_AFTER))
        next_due = "" if after.failed else repr(res.started + wait_for)
        args = [res.uid, next_due, rec.get("address", ""), rec.get("port", "")]
        for k, val in fields.items():
            args += [k, val]
        _RECORD(pipe, [serving.proxy_key(res.uid), serving.DUE_KEY], args)
        pipe_scripts.append(_RECORD)
        if v.key() != (rec.get("statusKey") or ""):
            pending.append((res.uid, rec, v, res))
    applied = [ok for ok, script in zip(pipe.execute(), pipe_scripts) if script is _RECORD]
    report.probed += len(arrived)
    live = {res.uid for (_, res), ok in zip(arrived, applied) if ok}
    for item in pending:
        if item[0] in live:
            batch.submit_status(item)
