"""Provider health checks, the one snapshot of their verdicts, and the ``ProviderHealth`` objects.

Every check round records its verdicts in Redis, one hash per provider
(:func:`app.store.keys.provider_health`: field = target name, value = JSON ``{at, ready, reason,
message, details, duration}``; :func:`record_round` for a provider checked as a whole, :func:`record_target`
for one KVM host checked on its own queue).  That hash is the single snapshot everything else
reads, so no two processes can tell different stories:

* the ``ProviderHealth`` object's status: written after every round by the task that checked
  (:meth:`ProviderHealthWriter.publish`), and by the watcher's :class:`StaleSweeper` when a
  target goes silent (its checker dead, its queue unserved);
* the ``proxy_operator_provider_*`` gauges, computed at scrape time from the snapshot by
  :class:`ProviderHealthCollector` (exported by beat), not from per-process state: under
  prefork one child's 1 and another's 0 can no longer combine into a lie, and a check that
  timed out reads 0 under the target's own name.

A target whose last verdict is older than :data:`STALE_INTERVALS` check intervals (or check
timeouts, whichever is longer) is not ready, reason ``CheckStale``, whoever was meant to check
it.  A configured target that never reported is ``CheckPending`` until that much time has passed
since the provider's snapshot was first read (:func:`app.store.keys.provider_health_since`,
shared by every reader so they all agree), then ``CheckStale`` too.

One cluster-scoped ``ProviderHealth`` per configured provider, written only by the operator:
created with an ``app.kubernetes.io/managed-by`` label when missing, then status merge
patches.  A target's ``lastTransitionTime`` survives rounds in which its readiness does not
flip.  Checks call the *unwrapped* providers, so they never count as provider requests.
Messages and reasons come from the providers (never secrets); nothing here logs a spec.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from prometheus_client.core import GaugeMetricFamily

from app.kube import conditions

from app.store import keys as redis_keys
from app.providers.base import CheckableProvider, TargetVerdict
from app.kube.gateway import KubeGateway, ProviderHealthObject
from app.config.provider_types import CheckTargets
from app.resources import PROVIDER_HEALTH_KIND, PROVIDER_HEALTH_PLURAL
from app.timefmt import rfc3339

log = logging.getLogger(__name__)

PLURAL = PROVIDER_HEALTH_PLURAL
KIND = PROVIDER_HEALTH_KIND
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"

#: A target with no verdict for this many check intervals is ``CheckStale``.
STALE_INTERVALS = 3
#: Name of the one target reported for a provider with no target known yet.
GENERIC_TARGET = "provider"
CHECK_PENDING = "CheckPending"
CHECK_STALE = "CheckStale"
CHECK_TIMEOUT = "CheckTimeout"
CHECK_FAILED = "CheckFailed"


def snapshot_key(provider: str) -> str:
    """Return the Redis key of ``provider``'s snapshot hash."""
    return redis_keys.provider_health(provider)


def stale_after(pc) -> float:
    """Seconds after which a target's verdict is stale: :data:`STALE_INTERVALS` x the longer of
    ``checkInterval`` and ``checkTimeout`` of provider config ``pc``."""
    return STALE_INTERVALS * max(float(pc.check_interval or 0), float(pc.check_timeout or 0))


def expected_targets(pc) -> list[str]:
    """The targets a provider's checks report on, known from its config before any check.

    Each type's settings declare them (:class:`app.config.provider_types.CheckTargets`): kvm every
    configured host (``providers.check_host`` per host), kubernetes ``"cluster"``, gcp the
    project (the names the providers' ``check()`` use).  Knowing them up front lets a round
    that timed out as a whole, or a provider that never reported, show under the real target
    names.  Settings that declare none: none (whatever the check reports).
    """
    return list(pc.settings.check_targets()) if isinstance(pc.settings, CheckTargets) else []


@dataclass(frozen=True)
class TargetState:
    """One target as the snapshot shows it.

    Attributes:
        verdict: the verdict to publish (a stale or pending target's says so).
        at: epoch seconds of the last verdict, ``None`` if it never reported.
        duration: seconds the check that produced it took (``None`` if never).
        stale: whether the last verdict is too old (or missing for too long).
    """

    verdict: TargetVerdict
    at: float | None
    duration: float | None
    stale: bool


# -- running checks ---------------------------------------------------------------------------
def run_check(provider, timeout: float) -> tuple[list[TargetVerdict], float, bool]:
    """Run ``provider.check()`` under ``timeout`` seconds; never raises.

    Returns:
        ``(verdicts, elapsed_seconds, failed_as_a_whole)``.  A provider without ``check``
        reports one ready target ``"provider"`` (nothing to check; a provider has a check when
        it declares :class:`~app.providers.base.CheckableProvider`); a timeout or an exception
        becomes one not-ready verdict named ``"provider"`` with reason ``CheckTimeout`` or
        ``CheckFailed`` and ``failed_as_a_whole`` true (:func:`record_round` then applies it
        to every target the provider has reported before).
    """
    if not isinstance(provider, CheckableProvider):
        return [TargetVerdict(GENERIC_TARGET, True, "NoCheck", "provider has no health check")], 0.0, False
    pool = cf.ThreadPoolExecutor(max_workers=1)
    start = time.monotonic()
    failed = False
    try:
        verdicts = list(pool.submit(provider.check).result(timeout=timeout))
    except cf.TimeoutError:
        verdicts, failed = [TargetVerdict(GENERIC_TARGET, False, CHECK_TIMEOUT,
                                          f"check took longer than {timeout:g}s")], True
    except Exception as exc:  # noqa: BLE001 - check() must never fail as a whole
        verdicts, failed = [TargetVerdict(GENERIC_TARGET, False, CHECK_FAILED, f"{type(exc).__name__}: {exc}")], True
    finally:
        pool.shutdown(wait=False)
    return verdicts, time.monotonic() - start, failed


def check(provider, name: str, timeout: float) -> list[TargetVerdict]:
    """Run ``provider.check()`` under ``timeout`` seconds and return its verdicts; never raises.

    ``name`` is the provider's name (kept for callers; nothing is recorded here: see
    :func:`run_check` and :func:`record_round`).
    """
    return run_check(provider, timeout)[0]


def check_one(fn: Callable[[], TargetVerdict], target: str, timeout: float) -> tuple[TargetVerdict, float]:
    """Run ``fn() -> TargetVerdict`` for one target under ``timeout``; never raises.

    Returns:
        ``(verdict, elapsed_seconds)``; a timeout or an exception is a not-ready verdict named
        ``target`` (never the generic name: the target that timed out is the one that reads 0).
    """
    class _One:
        def check(self):
            return [fn()]

    [verdict], elapsed, _ = run_check(_One(), timeout)
    if verdict.name != target:
        verdict = TargetVerdict(target, verdict.ready, verdict.reason, verdict.message, verdict.details)
    return verdict, elapsed


# -- the snapshot -----------------------------------------------------------------------------
def _encode(v: TargetVerdict, at: float, duration: float) -> str:
    return json.dumps({"at": at, "ready": v.ready, "reason": v.reason, "message": v.message[:1024],
                       "details": dict(v.details), "duration": round(duration, 6)})


def record_round(r, provider: str, verdicts: list[TargetVerdict], *, elapsed: float, failed: bool = False,
                 targets: Iterable[str] = (), now: float | None = None) -> None:
    """Replace ``provider``'s snapshot with one whole round's verdicts.

    When the round ``failed`` as a whole (timeout, exception), its single verdict is written
    for every target of the provider (``targets`` and those it reported before), under each
    target's own name, so each of them reads not ready; with none known it is recorded under
    ``"provider"``.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        provider: provider name.
        verdicts: the round's verdicts.
        elapsed: seconds the round took.
        failed: whether the round failed as a whole (:func:`run_check`).
        targets: the provider's targets known from its config (:func:`expected_targets`).
        now: epoch seconds (default: now).
    Raises:
        redis.RedisError: Redis is unreachable.
    """
    now = time.time() if now is None else now
    key = snapshot_key(provider)
    if failed and verdicts:
        known = list(dict.fromkeys([*targets, *(t for t in r.hkeys(key) if t != GENERIC_TARGET)]))
        if known:
            v = verdicts[0]
            verdicts = [TargetVerdict(t, False, v.reason, v.message) for t in known]
    pipe = r.pipeline(transaction=True)
    pipe.delete(key)
    if verdicts:
        pipe.hset(key, mapping={v.name: _encode(v, now, elapsed) for v in verdicts})
    pipe.execute()


def record_target(r, provider: str, verdict: TargetVerdict, *, elapsed: float, now: float | None = None) -> None:
    """Store one target's verdict (a KVM host checked on its own queue) in ``provider``'s snapshot.

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    now = time.time() if now is None else now
    r.hset(snapshot_key(provider), verdict.name, _encode(verdict, now, elapsed))


def read_snapshot(r, pc, *, now: float | None = None) -> list[TargetState]:
    """Return every target of provider config ``pc`` as the snapshot shows it, staleness applied.

    Targets: the configured KVM hosts (a host no longer configured is left out), else whatever
    the provider reported; with nothing known, one ``"provider"`` target.  A verdict older than
    :func:`stale_after` is replaced by a ``CheckStale`` one; a target that never reported is
    ``CheckPending`` until :func:`stale_after` seconds after the snapshot was first read (kept
    in Redis, so every reader agrees), then ``CheckStale``.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        pc: the provider's :class:`app.config.providers.ProviderConfig`.
        now: epoch seconds (default: now).
    Raises:
        redis.RedisError: Redis is unreachable.
    """
    now = time.time() if now is None else now
    limit = stale_after(pc)
    pipe = r.pipeline(transaction=False)
    pipe.set(redis_keys.provider_health_since(pc.name), repr(now), nx=True)
    pipe.get(redis_keys.provider_health_since(pc.name))
    pipe.hgetall(snapshot_key(pc.name))
    _, since_raw, stored = pipe.execute()
    try:
        since = float(since_raw)
    except (TypeError, ValueError):
        since = now
    expected = expected_targets(pc)
    names = expected or [n for n in sorted(stored) if n != GENERIC_TARGET or len(stored) == 1] or [GENERIC_TARGET]
    out = []
    for name in names:
        raw = stored.get(name)
        d = None
        if raw is not None:
            try:
                d = json.loads(raw)
            except ValueError:
                d = None
        if d is None:
            waited = now - since
            if waited > limit:
                out.append(TargetState(TargetVerdict(name, False, CHECK_STALE,
                                                     f"no check result for {waited:.0f}s (is its worker running?)"),
                                       None, None, True))
            else:
                out.append(TargetState(TargetVerdict(name, False, CHECK_PENDING, "no check result yet"),
                                       None, None, False))
            continue
        at = float(d.get("at") or 0)
        if now - at > limit:
            out.append(TargetState(TargetVerdict(name, False, CHECK_STALE,
                                                 f"last check {now - at:.0f}s ago (is its worker running?)"),
                                   at, d.get("duration"), True))
            continue
        out.append(TargetState(TargetVerdict(name, bool(d.get("ready")), str(d.get("reason") or ""),
                                             str(d.get("message") or ""), dict(d.get("details") or {})),
                               at, d.get("duration"), False))
    return out


# -- ProviderHealth objects -------------------------------------------------------------------
def status_for(verdicts: list[TargetVerdict], previous: dict | None, *, generation: int = 1,
               now: str | None = None) -> dict:
    """Build the ProviderHealth ``status`` from ``verdicts``, keeping unchanged transition times.

    Returns:
        ``{"conditions": [Ready], "targets": [...], "readyTargets": n, "totalTargets": m}``.
    """
    now = now or rfc3339()
    old = {t.get("name"): t for t in (previous or {}).get("targets") or ()}
    targets: list[dict[str, Any]] = []
    for v in verdicts:
        prev = old.get(v.name)
        ltt = prev.get("lastTransitionTime") if prev and prev.get("ready") == v.ready else now
        targets.append({"name": v.name, "ready": v.ready, "reason": v.reason, "message": v.message[:1024],
                        "lastTransitionTime": ltt, "details": dict(v.details)})
    ready = sum(1 for t in targets if t["ready"])
    all_ready = bool(targets) and ready == len(targets)
    down = [t["name"] for t in targets if not t["ready"]]
    cond = conditions.set_condition(
        (previous or {}).get("conditions"), "Ready", "True" if all_ready else "False",
        reason="AllTargetsReady" if all_ready else "TargetsNotReady",
        message="all targets ready" if all_ready else "not ready: " + ", ".join(down), generation=generation, now=now)
    return {"conditions": cond, "targets": targets, "readyTargets": ready, "totalTargets": len(targets)}


def _summary(targets: Iterable[dict] | None) -> dict[str, tuple[bool, str]]:
    return {str(t.get("name")): (bool(t.get("ready")), t.get("reason") or "") for t in targets or ()}


class ProviderHealthWriter:
    """Creates, updates and prunes ``ProviderHealth`` objects.

    Args:
        kube: the :class:`app.kube.gateway.KubeGateway` the objects are read and written through.
    """

    def __init__(self, kube: KubeGateway) -> None:
        self.kube = kube

    def publish(self, name: str, verdicts: list[TargetVerdict], *,
                only_if_changed: bool = False) -> ProviderHealthObject | None:
        """Write ``verdicts`` as the status of ProviderHealth ``name`` (creating it when missing).

        Every target that went down, came back, or changed its reason while down is logged
        (warning when it went down or its reason changed, info when it came back), once, by the
        writer that made the change.

        Args:
            only_if_changed: write only when a target's readiness or reason, or the set of
                targets, differs from what the object shows (the stale sweep).
        Returns:
            the patched object, or ``None`` when nothing needed writing.
        Raises:
            kubernetes.client.ApiException: the API refused a read or a write.
        """
        obj = self.kube.get_provider_health(name)
        if obj is None:
            obj = self.kube.create_provider_health(name, {MANAGED_BY_LABEL: "proxy-operator"})
        previous = obj.status
        before = _summary(previous.get("targets"))
        after = {v.name: (v.ready, v.reason) for v in verdicts}
        if only_if_changed and before == after:
            return None
        status = status_for(verdicts, previous, generation=obj.generation)
        for t in status["targets"]:
            was = before.get(t["name"])
            if was is None:
                continue
            if was[0] != t["ready"]:
                log.log(logging.INFO if t["ready"] else logging.WARNING, "provider %s target %s %s: %s %s", name,
                        t["name"], "came back" if t["ready"] else "went down", t["reason"], t["message"])
            elif not t["ready"] and was[1] != t["reason"]:
                log.warning("provider %s target %s still down, reason changed %s -> %s: %s", name, t["name"],
                            was[1], t["reason"], t["message"])
        return self.kube.patch_provider_health_status(name, status)

    def prune(self, configured: list[str], checks_enabled: set[str]) -> list[str]:
        """Delete ProviderHealth objects of providers not configured or with checks off.

        Returns:
            the names deleted.
        """
        deleted = []
        for item in self.kube.list_provider_health(f"{MANAGED_BY_LABEL}=proxy-operator"):
            if item.name not in configured or item.name not in checks_enabled:
                if self.kube.delete_provider_health(item.name):
                    deleted.append(item.name)
        return deleted


def publish_snapshot(r, writer: ProviderHealthWriter, pc, *, only_if_changed: bool = False) -> list[TargetState]:
    """Read ``pc``'s snapshot (:func:`read_snapshot`) and write it to its ProviderHealth.

    Returns:
        the target states written (or found unchanged).
    Raises:
        redis.RedisError / kubernetes.client.ApiException: Redis or the API failed.
    """
    states = read_snapshot(r, pc)
    writer.publish(pc.name, [s.verdict for s in states], only_if_changed=only_if_changed)
    return states


class StaleSweeper:
    """Marks silent targets ``CheckStale`` on the ProviderHealth objects, whoever was meant to check them.

    The check tasks publish after every round they run; when nothing runs them (the health
    worker or a KVM host's worker is dead, beat is down) nobody would touch the object again and
    its last verdict would stand forever.  The watcher's leader runs :meth:`run`: every
    ``period`` seconds it reads each checked provider's snapshot and writes the object only when
    a target's readiness or reason changed (in practice: went stale).

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        writer: a :class:`ProviderHealthWriter`.
        configs: the providers config entries (those with ``check_interval`` 0 are skipped).
        period: seconds between sweeps (default: half the shortest check interval, at least 5).
    """

    def __init__(self, r, writer: ProviderHealthWriter, configs, *, period: float | None = None) -> None:
        self.r, self.writer = r, writer
        self.configs = [pc for pc in configs if pc.check_interval]
        shortest = min((pc.check_interval for pc in self.configs), default=60.0)
        self.period = period if period is not None else max(5.0, shortest / 2)

    def sweep_once(self) -> int:
        """One sweep; return how many objects were written.  Never raises (failures are logged)."""
        written = 0
        for pc in self.configs:
            try:
                states = read_snapshot(self.r, pc)
                if self.writer.publish(pc.name, [s.verdict for s in states], only_if_changed=True) is not None:
                    written += 1
            except Exception as exc:  # noqa: BLE001 - the next sweep tries again
                log.warning("provider %s: stale sweep failed: %s", pc.name, type(exc).__name__)
        return written

    def run(self, stop: threading.Event) -> None:
        """Sweep every :attr:`period` seconds until ``stop`` is set (first sweep after one period)."""
        while not stop.wait(self.period):
            self.sweep_once()


# -- metrics ----------------------------------------------------------------------------------
class ProviderHealthCollector:
    """prometheus-client collector of the provider-health gauges, read from the snapshot at scrape time.

    Exposes, for every target of every provider with checks on (labels ``provider``, ``target``):
    ``proxy_operator_provider_up`` (1 ready, 0 not ready, stale or pending),
    ``proxy_operator_provider_check_stale`` (1 when the verdict is ``CheckStale``),
    ``proxy_operator_provider_check_duration_seconds`` (the last check's duration) and
    ``proxy_operator_provider_check_timestamp_seconds`` (Unix time of the last verdict).
    A scrape while Redis is unreachable exposes none of them (the scrape itself succeeds).
    Custom collectors: https://prometheus.github.io/client_python/collector/custom/

    Args:
        redis_factory: ``() -> redis.Redis`` (``decode_responses=True``), called per scrape
            until it returns a client, which is then reused.
        configs: the providers config entries.
        clock: epoch-seconds clock.
    """

    def __init__(self, redis_factory: Callable[[], object], configs, clock: Callable[[], float] = time.time) -> None:
        self.redis_factory, self.clock = redis_factory, clock
        self.configs = [pc for pc in configs if pc.check_interval]
        self._r: Any = None

    def describe(self):
        """Nothing to describe up front (no Redis read when registered)."""
        return []

    def collect(self):
        """Yield the four gauge families (see the class docstring)."""
        labels = ["provider", "target"]
        up = GaugeMetricFamily("proxy_operator_provider_up",
                               "1 when the provider target passed its last check and that check is fresh.",
                               labels=labels)
        stale = GaugeMetricFamily("proxy_operator_provider_check_stale",
                                  f"1 when the target has had no verdict for {STALE_INTERVALS} check intervals.",
                                  labels=labels)
        duration = GaugeMetricFamily("proxy_operator_provider_check_duration_seconds",
                                     "Duration of the target's last check, seconds.", labels=labels)
        stamp = GaugeMetricFamily("proxy_operator_provider_check_timestamp_seconds",
                                  "Unix time of the target's last verdict.", labels=labels)
        now = self.clock()
        try:
            if self._r is None:
                self._r = self.redis_factory()
            for pc in self.configs:
                for s in read_snapshot(self._r, pc, now=now):
                    key = [pc.name, s.verdict.name]
                    up.add_metric(key, 1.0 if s.verdict.ready else 0.0)
                    stale.add_metric(key, 1.0 if s.stale else 0.0)
                    if s.duration is not None:
                        duration.add_metric(key, float(s.duration))
                    if s.at is not None:
                        stamp.add_metric(key, s.at)
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail because Redis is down
            log.warning("cannot read provider health for /metrics: %s", type(exc).__name__)
            return
        yield from (up, stale, duration, stamp)
