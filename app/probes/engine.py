"""One probe batch end to end: read the serving view, probe concurrently, apply thresholds,
record every result in Redis, write status changes to Kubernetes.

:func:`probe_batch` is what the ``health.probe_batch`` task runs; it reaches Kubernetes only
through the :class:`app.kube.gateway.KubeGateway` it is given (status writes through
:func:`app.probes.status.write_verdict`, the one status writer's).

Per batch: one Redis round trip reads the records, the probes run on the process's probe
threads (kept from batch to batch), and the results are applied as they arrive (results that
arrive together share the round trips): one pipelined round trip notes each outcome for outage
detection, one records the results and reschedules each proxy (only if it is still published
with the same endpoint: a withdrawn or re-addressed proxy is never resurrected by a late
result) — a group of successes only, a steady fleet's usual case, does both in one round
trip — and the status writes of the proxies whose verdict changed start at once on their own
pool (see :mod:`app.probes.state`).  A slow proxy delays only itself.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Callable, Literal, Mapping, overload

from app.store import keys as redis_keys

from app.serving import view as serving
from app.probes import metrics
from app.probes import probe as p
from app.probes.credentials import RefreshableCredentials
from app.probes.origin import DOWN, OriginControl
from app.probes.settings import HealthSettings
from app.probes.state import HEALTHY, HealthState, Thresholds, Verdict, advance, verdict
from app.probes.status import write_verdict
from app.kube.gateway import KubeGateway
from app.lazy import per_process
from app.store.lua import Lua
from app.resources import DEFAULT_HEALTH_URL, FAILED, MODE_MANAGED
from app.serving.records import ServingRecord, fields_of, load
from app.timefmt import rfc3339

log = logging.getLogger(__name__)

#: Longest probe, seconds: the CRD's maximum of ``healthCheck.timeoutSeconds`` (deploy/crd/proxy.yaml).
MAX_TIMEOUT_SECONDS = 60

#: ``credentials(record) -> (user, password) | None`` for proxies with basic auth.
Credentials = Callable[[ServingRecord], "tuple[str, str] | None"]
#: A serving record, typed or as its raw hash.
Record = ServingRecord | Mapping[str, str]

#: Recorded as ``lastReason`` (and counted) for a failed probe while its health URL's origin
#: was down (:mod:`app.probes.origin`): the proxy was not judged.
ORIGIN_DOWN = "OriginDown"

#: The serving-record fields a probe batch reads (:func:`app.serving.records.load`): the endpoint,
#: the health check, the health state, what the status last said, and who the Proxy is (status
#: writes, credentials).  Half the record: the rest (labels, leases, the last probe's details)
#: is written here but never read back, and parsing it was a fifth of a steady sweep's CPU.
PROBED_FIELDS = ("uid", "namespace", "name", "mode", "address", "port", "auth_secret", "health_check", "health",
                 "successes", "failures", "ever_healthy", "failed", "running_since", "last_verdict_reason",
                 "last_verdict_message", "egress_ip", "egress_at", "status_key")

_NOTE = Lua("health_note")
_RECORD = Lua("now", "lease_index", "health_record")
_AUTH = Lua("health_auth")


def _pairs(fields: dict[str, str]) -> list[str]:
    """``{field: value}`` as the flat ``field value ...`` list the record script takes."""
    out: list[str] = []
    for name, value in fields.items():
        out += [name, value]
    return out


def _endpoint(rec: ServingRecord) -> list[str]:
    """``[address, port]`` as stored: the record scripts write only while they are unchanged."""
    stored = rec.to_redis(("address", "port"))
    return [stored["address"], stored["port"]]


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
        deferred: fast-lane probes cut at ``HEALTH_SLOW_SECONDS`` without an answer, not judged
            and due again at once for the slow lane (:mod:`app.probes.schedule`).
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
    deferred: int = 0


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


def state_of(record: Record, now: float) -> HealthState:
    """Read the :class:`HealthState` stored in a serving record (``runningSince`` unknown: ``now``)."""
    rec = ServingRecord.of(record)
    return HealthState(
        health=rec.health,
        successes=rec.successes,
        failures=rec.failures,
        ever_healthy=rec.ever_healthy,
        reason=rec.last_verdict_reason,
        message=rec.last_verdict_message,
        egress_ip=rec.egress_ip,
        running_since=now if rec.running_since is None else rec.running_since,
        failed=rec.failed,
    )


def thresholds_of(record: Record) -> Thresholds:
    """Return the record's ``healthCheck`` thresholds."""
    hc = ServingRecord.of(record).health_check
    return Thresholds(success=max(1, _int(str(hc.get("successThreshold", "")), 1)),
                      failure=max(1, _int(str(hc.get("failureThreshold", "")), 3)))


def judged(result: p.ProbeResult, record: Record) -> p.ProbeResult:
    """``result`` as the Proxy's ``healthCheck`` judges it.

    A ``RateLimited`` answer (429) counts as a success (the proxy reached the origin; its
    egress IP is rate limited) unless ``healthCheck.rateLimited`` is ``Withdraw``; the reason
    stays ``RateLimited`` either way.
    """
    if result.reason == p.RATE_LIMITED and not result.ok and \
            ServingRecord.of(record).health_check.get("rateLimited") != "Withdraw":
        return replace(result, ok=True)
    return result


def capped_timeout(hc: Mapping) -> float:
    """``healthCheck.timeoutSeconds`` (default 10) capped as the CRD does: at most
    :data:`MAX_TIMEOUT_SECONDS` and below ``intervalSeconds`` (default 30).

    A record written straight into Redis is capped here too: a timeout that is not below its
    interval becomes ``interval - 1`` (half the interval below 2 s), so one probe always ends
    before the next one of the same proxy is due.
    """
    interval = max(1, _int(str(hc.get("intervalSeconds", "")), 30))
    timeout = float(min(MAX_TIMEOUT_SECONDS, max(1, _int(str(hc.get("timeoutSeconds", "")), 10))))
    if timeout >= interval:
        timeout = float(interval - 1) if interval >= 2 else interval / 2
    return timeout


def target_of(uid: str, record: Record, settings: HealthSettings, *, now: float,
              credentials: Credentials | None = None) -> p.ProbeTarget | None:
    """Build the probe target of a record; ``None`` when it has no usable endpoint."""
    rec = ServingRecord.of(record)
    address, port = rec.address, rec.port
    if not address or not 0 < port < 65536:
        return None
    hc = rec.health_check
    url = str(hc.get("url") or "")
    if not url or url == DEFAULT_HEALTH_URL:  # the CRD's default: the installation may point it elsewhere
        url = settings.default_url
    egress_at = rec.egress_at or 0.0
    want_egress = bool(settings.echo_url) and (
        not rec.egress_ip or rec.health != HEALTHY
        or now - egress_at >= settings.egress_refresh)
    return p.ProbeTarget(
        uid=uid, host=address, port=port, url=url,
        expected_status=_int(str(hc.get("expectedStatus", "")), 204),
        timeout=capped_timeout(hc),
        want_egress=want_egress, credentials=credentials(rec) if credentials else None,
        # Only the operator's own proxies skip PROBE_EXTERNAL_DENIED_RANGES; a record that does
        # not say Managed counts as External (the safe side).
        external=rec.mode != MODE_MANAGED)


def record_fields(state: HealthState, result: p.ProbeResult, *, phase: str | None) -> dict[str, str]:
    """Return the serving-record fields (as stored) for ``state`` after ``result``."""
    values = dict(
        health=state.health, healthy=state.healthy, successes=state.successes, failures=state.failures,
        ever_healthy=state.ever_healthy, failed=state.failed,
        last_verdict_reason=state.reason, last_verdict_message=state.message,
        last_reason=result.reason, last_message=result.message, last_status=result.status,
        latency_ms=result.latency_ms, last_probe=result.started, last_probe_time=rfc3339(result.started),
        egress_ip=state.egress_ip, egress_error=result.egress_error or "",
    )
    if result.egress_ip:
        values["egress_at"] = result.started
    if phase:
        values["phase"] = phase
    return fields_of(**values)


def _queue_notes(pipe, results: list[p.ProbeResult], recs: dict[str, ServingRecord]) -> None:
    """Queue on ``pipe`` the noting of each outcome in the OK / failing sets (outage detection)."""
    for res in results:
        ever = recs[res.uid].ever_healthy
        _NOTE(pipe, [redis_keys.proxy(res.uid), redis_keys.HEALTH_OK, redis_keys.HEALTH_FAILING],
              [res.uid, "1" if res.ok else "0", "1" if ever else "0"])


def _note(r, results: list[p.ProbeResult], recs: dict[str, ServingRecord]) -> tuple[int, int]:
    """Note each outcome in the OK / failing sets; return the sizes of both afterwards."""
    pipe = r.pipeline(transaction=False)
    _queue_notes(pipe, results, recs)
    pipe.scard(redis_keys.HEALTH_OK)
    pipe.scard(redis_keys.HEALTH_FAILING)
    out = pipe.execute()
    return out[-2], out[-1]


def _outage(r, results: list[p.ProbeResult], ok_count: int, failing_count: int, settings: HealthSettings,
            batch: "_Batch") -> bool:
    """Return whether a probe-side outage is in progress after ``results``; log and export changes
    (at most one "continues" line per batch)."""
    any_failed = any(not res.ok for res in results)
    outage = any_failed and ok_count == 0 and failing_count >= settings.outage_min_proxies
    if outage:
        if r.set(redis_keys.HEALTH_OUTAGE, repr(time.time()), nx=True):
            log.critical("health: PROBE-SIDE OUTAGE: every probe of every proxy is failing "
                         "(%d once-healthy proxies failing, none succeeding); no proxy is marked "
                         "Unhealthy or Failed until probes succeed again", failing_count)
        elif not batch.outage_logged:
            log.error("health: probe-side outage continues: %d proxies failing, none succeeding",
                      failing_count)
        batch.outage_logged = True
        metrics.PROBE_OUTAGE.set(1)
    else:
        _no_outage(r, ok_count)
    return outage


def _no_outage(r, ok_count: int, *, flagged: bool = True) -> None:
    """No probe-side outage after the results just noted: end one that was flagged (log once) and
    export 0.  ``flagged``: whether the outage key may exist (``False``: known absent, no call)."""
    if ok_count and flagged and r.delete(redis_keys.HEALTH_OUTAGE):
        log.warning("health: probe-side outage over: %d proxies answer probes again", ok_count)
    metrics.PROBE_OUTAGE.set(0)


@per_process
def _probe_pools() -> tuple[dict[int, ThreadPoolExecutor], threading.Lock]:
    """This process's probe thread pools by size, and the lock that guards them."""
    return {}, threading.Lock()


def _probe_pool(size: int) -> ThreadPoolExecutor:
    """Return this process's pool of ``size`` probe threads, kept across batches.

    Args:
        size: the most probes in flight at once (``settings.concurrency``).
    Returns:
        the same executor for every call with this ``size`` in this process.
    """
    # Kept because a prefork child runs one batch after another, and starting and joining the
    # threads for every batch cost a seventh of a steady sweep's CPU (docs/performance.md).
    pools, lock = _probe_pools()
    with lock:
        pool = pools.get(size)
        if pool is None:
            pool = pools[size] = ThreadPoolExecutor(max_workers=size, thread_name_prefix="probe")
        return pool


class _Batch:
    """State one :func:`probe_batch` call shares between its threads: the report (counters the
    status-write threads touch are updated under :attr:`lock`) and the status-write pool."""

    def __init__(self, r, settings: HealthSettings, kube: KubeGateway, events: bool = False) -> None:
        self.r, self.settings, self.kube, self.events = r, settings, kube, events
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
            written = write_verdict(self.kube, uid=uid, namespace=rec.namespace,
                                    name=rec.name, v=v, last_probe=res.started,
                                    latency_ms=res.latency_ms, events=self.events)
        except Exception as exc:  # noqa: BLE001 - retried on the next probe
            with self.lock:
                report.status_errors += 1
            metrics.STATUS_WRITES.labels("error").inc()
            log.warning("health: status write for %s/%s failed, retrying on the next probe: %s",
                        rec.namespace, rec.name, exc)
            return
        metrics.STATUS_WRITES.labels("written" if written else "skipped").inc()
        with self.lock:
            if written:
                report.status_written += 1
        try:
            # Written, or skipped because the object is gone or not in a probed phase: either way
            # this verdict is settled; the next change of verdict writes again.
            _RECORD(self.r, [redis_keys.proxy(uid), redis_keys.HEALTH_DUE],
                    [uid, "", *_endpoint(rec), *_pairs(fields_of(status_key=v.key()))])
            if v.phase == FAILED:
                # out of the serving view (the reconciler re-publishes on a new generation)
                serving.withdraw(self.r, uid)
                with self.lock:
                    report.went_failed += 1
        except Exception as exc:  # noqa: BLE001 - the verdict is written again on the next probe
            log.warning("health: recording the status write of %s/%s failed: %s",
                        rec.namespace, rec.name, type(exc).__name__)


def probe_batch(r, uids: list[str], settings: HealthSettings, *, kube: KubeGateway,
                credentials: Credentials | None = None, events: bool = False,
                clock: Callable[[], float] = time.time, fast_lane: bool = False) -> BatchReport:
    """Probe the published proxies ``uids`` and apply each result as soon as it is known.

    The probes run concurrently (``settings.concurrency``).  Results are recorded in Redis and
    changed verdicts written to the Proxy status as they arrive (several that arrive together
    share one round trip), so one slow proxy never holds back the others' results
    (docs/security.md, "probe capacity").  One exception keeps outage detection whole: while
    every result of the batch so far is a failure and the proxies still in flight may be the
    only ones that succeeded before, the failures wait for the rest of the batch (or its first success), so that a
    probe-side outage is recognised before anything is marked Unhealthy.  Every endpoint and
    health URL is checked against ``settings``' destination policy first (a denied one fails
    with reason ``DestinationDenied``, nothing sent).

    A failure is held against its proxy only once the health URL's origin is known to be up:
    unless a probe of the same URL already succeeded in this batch, a direct control request
    (:mod:`app.probes.origin`) asks the origin itself, and while it is down the failed proxies
    keep their state (lastReason ``OriginDown``), whatever the threshold or batch size.  A
    ``429`` is ``RateLimited`` (:func:`judged`), and its ``Retry-After`` postpones that proxy's
    next probe.

    In the fast lane (``fast_lane``, :mod:`app.probes.schedule`) a probe whose timeout is longer
    than ``settings.slow_seconds`` gets only that long; one that times out there is not judged
    (state, counters and status unchanged; ``lastReason`` ``Timeout`` with a message saying so,
    ``latencyMs`` at least the cut) and is due again at once, so the next sweep puts it in the
    slow lane, where it gets its own timeout.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        uids: Proxy uids (unpublished ones are skipped).
        settings: :class:`HealthSettings`.
        kube: the gateway the Proxy status is read and written through (the worker's does not
            record its writes for the watcher's de-duplication: :mod:`app.kube.status_writer`).
        credentials: basic-auth credentials per record, for proxies that need them (called on
            the probe threads).
        events: record a Kubernetes Event when a status write moves the phase (Ready,
            Unhealthy, Failed by the provisioning deadline; :func:`app.probes.status.event_for`).
        clock: epoch-seconds clock.
        fast_lane: cut probes at ``settings.slow_seconds`` as described above (the
            ``health.probe_batch`` task's fast-lane batches); ``False``: every probe gets its
            own timeout.
    Returns:
        a :class:`BatchReport`.
    Raises:
        ValueError: ``settings`` holds a probe range that does not parse.
        redis.RedisError: Redis failed while results were recorded.
    """
    batch = _Batch(r, settings, kube, events)
    report = batch.report
    recs = load(r, list(dict.fromkeys(uids)), PROBED_FIELDS)
    if not recs:
        return report
    policy = settings.destination_policy()
    now = clock()

    def run(uid: str, rec: ServingRecord) -> tuple[p.ProbeTarget, p.ProbeResult] | None:
        target = target_of(uid, rec, settings, now=now, credentials=credentials)
        if target is None:
            log.warning("health: %s/%s has no usable endpoint in the serving view; not probed",
                        rec.namespace, rec.name)
            return None
        if fast_lane and target.timeout > settings.slow_seconds:
            target = replace(target, timeout=float(settings.slow_seconds))
        res = p.probe(target, echo_url=settings.echo_url, ca_bundle=settings.ca_bundle, policy=policy)
        if res.reason == p.PROXY_AUTH_REQUIRED and rec.auth_secret:
            return _rotation(r, target, res, rec, credentials, settings, policy)
        return target, res

    origins = OriginControl(r, policy, ca_bundle=settings.ca_bundle, clock=clock)
    ok_urls: dict[tuple[str, int], float] = {}  # URLs whose probes succeeded in this batch -> a timeout
    pool = _probe_pool(max(1, settings.concurrency))
    in_flight: set = set()
    try:
        in_flight = {pool.submit(run, uid, rec) for uid, rec in recs.items()}
        held: list[tuple[p.ProbeTarget, p.ProbeResult]] = []
        seen_success = False
        while in_flight:
            done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
            arrived = [(t, judged(res, recs[res.uid])) for t, res in
                       (item for item in (f.result() for f in done) if item is not None)]
            if fast_lane:
                arrived, cut = _split_cut(arrived, recs, settings)
                if cut:
                    report.deferred += len(cut)
                    _defer(batch, cut, recs, clock())
            for t, res in arrived:
                if res.ok:
                    ok_urls[(t.url, t.expected_status)] = t.timeout
            arrived, parked = _split_origin_down(origins, arrived, ok_urls)
            if parked:
                report.origin_down += len(parked)
                _apply(batch, parked, recs, False, clock(), origin_down=True)
            if not arrived and (in_flight or not held):
                continue  # (the last probe parked or deferred: the held failures are decided below)
            if not held and all(res.ok for _, res in arrived):
                # Successes only (a steady fleet's every result): no outage can be in progress
                # after them, so they are noted and recorded in one round trip.
                seen_success = True
                ok_count, flagged = _apply(batch, arrived, recs, False, clock(), note=True)
                _no_outage(r, ok_count, flagged=flagged)
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
        for future in in_flight:  # only after an error: nothing of this batch runs on afterwards
            future.cancel()
        wait(in_flight)
        batch.close()
    return report


def _rotation(r, target: p.ProbeTarget, res: p.ProbeResult, rec: ServingRecord, credentials: Credentials | None,
              settings: HealthSettings, policy) -> tuple[p.ProbeTarget, p.ProbeResult]:
    """After a 407, probe again with the other credentials a password rotation leaves around.

    The candidates are the Secret read again past the cache (the proxy may already know the new
    password) and the pair of the last probe that passed, kept in :func:`app.store.keys.auth`
    (it may still know only the old one); the first pair the proxy accepts wins.  Only a
    record whose own credentials were granted (verified against its Proxy) is retried, and
    credentials never appear in a message.

    Args:
        r: Redis client.
        target: the probe that got the 407.
        res: its result.
        rec: the proxy's serving record.
        credentials: the credentials reader, or ``None``.
        settings: the engine's settings.
        policy: the destination policy every probe is checked against.
    Returns:
        ``(target, result)`` of the pair that counts: the first accepted, else the original.
    """
    if target.credentials is None:
        # The record was not verified against its Proxy (app.probes.credentials): no other
        # credentials go to its address either.
        return target, res
    tried = {target.credentials}
    candidates: list[tuple[tuple[str, str] | None, str]] = []
    if isinstance(credentials, RefreshableCredentials):
        candidates.append((credentials.fresh(rec), ""))
    try:
        last = r.hgetall(redis_keys.auth(target.uid))
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


def _split_cut(arrived: list[tuple[p.ProbeTarget, p.ProbeResult]], recs: dict[str, ServingRecord],
               settings: HealthSettings) -> tuple[list, list]:
    """Split fast-lane results into those to judge and the timeouts of probes cut at
    ``settings.slow_seconds`` (their own timeout was longer: not judged here)."""
    judge: list[tuple[p.ProbeTarget, p.ProbeResult]] = []
    cut: list[tuple[p.ProbeTarget, p.ProbeResult]] = []
    for item in arrived:
        res = item[1]
        was_cut = capped_timeout(recs[res.uid].health_check) > settings.slow_seconds
        (cut if res.reason == p.TIMEOUT and was_cut else judge).append(item)
    return judge, cut


def _defer(batch: _Batch, cut: list[tuple[p.ProbeTarget, p.ProbeResult]], recs: dict[str, ServingRecord],
           now: float) -> None:
    """Record cut fast-lane probes without judging them and make them due at ``now`` (one round
    trip): the sweep sees a latency of at least the cut and gives them to the slow lane."""
    floor_ms = batch.settings.slow_seconds * 1000
    pipe = batch.r.pipeline(transaction=False)
    for _target, res in cut:
        rec = recs[res.uid]
        fields = fields_of(last_reason=res.reason, latency_ms=max(res.latency_ms, floor_ms),
                           last_message=f"no answer within the fast lane's {batch.settings.slow_seconds:g} s "
                                        f"(HEALTH_SLOW_SECONDS): not judged, probed again in the slow lane "
                                        f"with its own timeout ({capped_timeout(rec.health_check):g} s)",
                           last_status=res.status, last_probe=res.started, last_probe_time=rfc3339(res.started))
        _RECORD(pipe, [redis_keys.proxy(res.uid), redis_keys.HEALTH_DUE],
                [res.uid, repr(now), *_endpoint(rec), *_pairs(fields)])
        metrics.PROBE_RESULTS.labels("Deferred").inc()
    pipe.execute()


def _split_origin_down(origins: OriginControl, arrived: list[tuple[p.ProbeTarget, p.ProbeResult]],
                       ok_urls: dict) -> tuple[list, list]:
    """Split ``arrived`` into results to judge and failures to park because their health URL's
    origin is down (one control request per URL, see :mod:`app.probes.origin`)."""
    judge: list[tuple[p.ProbeTarget, p.ProbeResult]] = []
    parked: list[tuple[p.ProbeTarget, p.ProbeResult]] = []
    verdicts: dict[tuple[str, int], bool] = {}
    for item in arrived:
        target, res = item
        key = (target.url, target.expected_status)
        if res.ok or res.reason == p.DESTINATION_DENIED or key in ok_urls:
            judge.append(item)
            continue
        if key not in verdicts:
            since = min(r.started for t, r in arrived if (t.url, t.expected_status) == key and not r.ok)
            control = origins.verdict(target.url, target.expected_status, timeout=target.timeout, failed_since=since)
            verdicts[key] = control.state == DOWN
            if verdicts[key]:
                log.warning("health: health origin is down (%s); failed probes through proxies are not held "
                            "against them", control.message)
        (parked if verdicts[key] else judge).append(item)
    return judge, parked


@overload
def _apply(batch: _Batch, arrived: list[tuple[p.ProbeTarget, p.ProbeResult]], recs: dict[str, ServingRecord],
           outage: bool, now: float, *, origin_down: bool = ..., note: Literal[True]) -> tuple[int, bool]: ...


@overload
def _apply(batch: _Batch, arrived: list[tuple[p.ProbeTarget, p.ProbeResult]], recs: dict[str, ServingRecord],
           outage: bool, now: float, *, origin_down: bool = ..., note: bool = ...) -> tuple[int, bool] | None: ...


def _apply(batch: _Batch, arrived: list[tuple[p.ProbeTarget, p.ProbeResult]], recs: dict[str, ServingRecord],
           outage: bool, now: float, *, origin_down: bool = False, note: bool = False) -> tuple[int, bool] | None:
    """Record ``arrived`` results in the serving view (one round trip) and queue the status
    writes of the verdicts that changed.

    Args:
        batch: the batch's shared state.
        arrived: ``(target, result)`` pairs.
        recs: the serving records of the batch, by UID.
        outage: a probe-side outage is in progress (passed to :func:`app.probes.state.advance`).
        now: epoch seconds.
        origin_down: the results are failures while their health URL's origin was down; they
            are recorded (``lastReason`` ``OriginDown``) but change nothing about the proxy's state.
        note: also note the outcomes for outage detection first (as :func:`_note`), in the same
            round trip.
    Returns:
        with ``note``: the size of the OK set afterwards and whether the outage key exists;
        else ``None``.
    """
    r, settings, report = batch.r, batch.settings, batch.report
    pending: list[tuple[str, ServingRecord, Verdict, p.ProbeResult, int]] = []  # ..., its ZCOUNT's place
    pipe = r.pipeline(transaction=False)
    pipe_scripts: list[Lua | str] = []  # which script (or command) each queued command runs
    if note:
        _queue_notes(pipe, [res for _, res in arrived], recs)
        pipe.scard(redis_keys.HEALTH_OK)
        pipe.exists(redis_keys.HEALTH_OUTAGE)
        pipe_scripts += [_NOTE] * len(arrived) + ["ok", "outage"]
    for target, res in arrived:
        rec = recs[res.uid]
        if rec.auth_secret:
            # before the record that may make it healthy: a leasable proxy that requires
            # basic auth always has its credentials for the lease response
            user, password = target.credentials or ("", "")
            _AUTH(pipe, [redis_keys.proxy(res.uid), redis_keys.auth(res.uid)],
                  [*_endpoint(rec), user, password])
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
        before = state_of(rec, now)  # runningSince unknown: now, and written below
        if origin_down:
            after = before  # the proxy was not judged: no counter, threshold or verdict moves
        else:
            after = advance(before, res, thresholds_of(rec), now=now, deadline=settings.provision_deadline,
                            outage=outage)
        v = verdict(after)
        phase = v.phase if v.phase and v.phase != FAILED else None
        fields = record_fields(after, res, phase=phase)
        if rec.running_since is None:
            fields.update(fields_of(running_since=before.running_since))
        interval = max(1, _int(str(rec.health_check.get("intervalSeconds", "")), 30))
        # A 429's Retry-After postpones this proxy's next probe (never brings it forward).
        wait_for = max(float(interval), min(res.retry_after or 0.0, p.MAX_RETRY_AFTER))
        next_due = "" if after.failed else repr(res.started + wait_for)
        args = [res.uid, next_due, *_endpoint(rec), *_pairs(fields)]
        _RECORD(pipe, [redis_keys.proxy(res.uid), redis_keys.HEALTH_DUE], args)
        pipe_scripts.append(_RECORD)
        if v.healthy is not None:
            # the targets that banned its egress IP (status.bannedTargets), in the same round trip
            ident = after.egress_ip or f"uid:{res.uid}"
            pipe.zcount(redis_keys.ip_bans(ident), int((now - settings.ban_history) * 1000), "+inf")
            pipe_scripts.append("banned")
            pending.append((res.uid, rec, v, res, len(pipe_scripts) - 1))
    out = pipe.execute()
    applied = [ok for ok, script in zip(out, pipe_scripts, strict=True) if script is _RECORD]
    report.probed += len(arrived)
    live = {res.uid for (_, res), ok in zip(arrived, applied, strict=True) if ok}
    for uid, rec, v, res, at in pending:
        v = replace(v, banned_targets=int(out[at]))
        if uid in live and v.key() != rec.status_key:
            batch.submit_status((uid, rec, v, res))
    if note:
        return out[pipe_scripts.index("ok")], bool(out[pipe_scripts.index("outage")])
    return None
