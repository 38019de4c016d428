"""Provider health checks and the ``ProviderHealth`` objects that publish them (SPEC §2).

One cluster-scoped ``ProviderHealth`` per configured provider, written only by the operator:
created with an ``app.kubernetes.io/managed-by`` label when missing, then status merge
patches.  A target's ``lastTransitionTime`` survives rounds in which its readiness does not
flip.  Checks call the *unwrapped* providers, so they never count as provider requests.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time

from kubernetes import client as k8s

from app import conditions
from app.providers.base import TargetVerdict
from app.resources import GROUP, VERSION
from prometheus_client import Gauge

log = logging.getLogger(__name__)

PLURAL = "providerhealths"
KIND = "ProviderHealth"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"

UP = Gauge("proxy_operator_provider_up", "1 when the provider target passed its last check.",
           ["provider", "target"], multiprocess_mode="livemax")
CHECK_DURATION = Gauge("proxy_operator_provider_check_duration_seconds", "Duration of the last check round.",
                       ["provider", "target"], multiprocess_mode="livemax")
CHECK_TIMESTAMP = Gauge("proxy_operator_provider_check_timestamp_seconds", "Unix time of the last check.",
                        ["provider", "target"], multiprocess_mode="livemax")


def check(provider, name: str, timeout: float) -> list[TargetVerdict]:
    """Run ``provider.check()`` under ``timeout`` seconds; never raises.

    A provider without ``check`` reports one ready target ``"provider"`` (nothing to check);
    a timeout or an exception becomes one not-ready verdict.
    """
    fn = getattr(provider, "check", None)
    if fn is None:
        return [TargetVerdict("provider", True, "NoCheck", "provider has no health check")]
    pool = cf.ThreadPoolExecutor(max_workers=1)
    start = time.monotonic()
    try:
        verdicts = list(pool.submit(fn).result(timeout=timeout))
    except cf.TimeoutError:
        verdicts = [TargetVerdict("provider", False, "CheckTimeout", f"check took longer than {timeout:g}s")]
    except Exception as exc:  # noqa: BLE001 - check() must never fail as a whole
        verdicts = [TargetVerdict("provider", False, "CheckFailed", f"{type(exc).__name__}: {exc}")]
    finally:
        pool.shutdown(wait=False)
    elapsed = time.monotonic() - start
    for v in verdicts:
        UP.labels(name, v.name).set(1 if v.ready else 0)
        CHECK_DURATION.labels(name, v.name).set(elapsed)
        CHECK_TIMESTAMP.labels(name, v.name).set(time.time())
    return verdicts


def status_for(verdicts: list[TargetVerdict], previous: dict | None, generation: int = 1,
               now: str | None = None) -> dict:
    """Build the ProviderHealth ``status`` from ``verdicts``, keeping unchanged transition times.

    Returns:
        ``{"conditions": [Ready], "targets": [...], "readyTargets": n, "totalTargets": m}``.
    """
    now = now or conditions.now_rfc3339()
    old = {t.get("name"): t for t in (previous or {}).get("targets") or ()}
    targets = []
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
        "AllTargetsReady" if all_ready else "TargetsNotReady",
        "all targets ready" if all_ready else "not ready: " + ", ".join(down), generation, now)
    return {"conditions": cond, "targets": targets, "readyTargets": ready, "totalTargets": len(targets)}


class ProviderHealthWriter:
    """Creates, updates and prunes ``ProviderHealth`` objects.

    Args:
        client: a :class:`kubernetes.client.ApiClient`.
    """

    def __init__(self, client: k8s.ApiClient) -> None:
        self.api = k8s.CustomObjectsApi(client)

    def publish(self, name: str, verdicts: list[TargetVerdict]) -> dict:
        """Write ``verdicts`` as the status of ProviderHealth ``name`` (creating it when missing)."""
        try:
            obj = self.api.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                    "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: "proxy-operator"}}}
            obj = self.api.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
        previous = obj.get("status") or {}
        status = status_for(verdicts, previous, int(obj["metadata"].get("generation") or 1))
        for t in status["targets"]:
            was = next((p for p in previous.get("targets") or () if p.get("name") == t["name"]), None)
            if was is not None and was.get("ready") != t["ready"]:
                log.warning("provider %s target %s %s: %s %s", name, t["name"],
                            "came back" if t["ready"] else "went down", t["reason"], t["message"])
        return self.api.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, name, {"status": status})

    def prune(self, configured: list[str], checks_enabled: set[str]) -> list[str]:
        """Delete ProviderHealth objects of providers not configured or with checks off.

        Returns:
            the names deleted.
        """
        listed = self.api.list_cluster_custom_object(GROUP, VERSION, PLURAL,
                                                     label_selector=f"{MANAGED_BY_LABEL}=proxy-operator")
        deleted = []
        for item in listed.get("items") or ():
            name = item["metadata"]["name"]
            if name not in configured or name not in checks_enabled:
                try:
                    self.api.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
                    deleted.append(name)
                except k8s.ApiException as exc:
                    if exc.status != 404:
                        raise
        return deleted


def record_target(redis, provider: str, verdict: TargetVerdict, targets: list[str], stale_after: float,
                  now: float | None = None) -> list[TargetVerdict]:
    """Store one target's verdict (a per-host check on its own queue) and return every target's.

    Targets whose last verdict is older than ``stale_after`` seconds (or that never reported:
    no worker serves that host's queue) are reported not ready with reason ``CheckStale``.

    Args:
        redis: ``redis.Redis`` (decode_responses=True).
        provider: provider name.
        verdict: the fresh verdict.
        targets: every target name configured, in order.
    """
    import json

    now = time.time() if now is None else now
    key = f"po:phealth:{provider}"
    redis.hset(key, verdict.name, json.dumps({"at": now, "ready": verdict.ready, "reason": verdict.reason,
                                              "message": verdict.message, "details": verdict.details}))
    stored = redis.hgetall(key)
    out = []
    for name in targets:
        raw = stored.get(name)
        if raw is None:
            out.append(TargetVerdict(name, False, "CheckStale", "no check result yet (is its worker running?)"))
            continue
        d = json.loads(raw)
        if now - d["at"] > stale_after:
            out.append(TargetVerdict(name, False, "CheckStale",
                                     f"last check {now - d['at']:.0f}s ago (is its worker running?)"))
        else:
            out.append(TargetVerdict(name, d["ready"], d["reason"], d["message"], d["details"]))
    return out


def check_target(fn, provider: str, target: str, timeout: float) -> TargetVerdict:
    """Run ``fn() -> TargetVerdict`` for one target under ``timeout``; never raises; updates the gauges."""
    class _One:
        def check(self):
            return [fn()]

    [verdict] = check(_One(), provider, timeout)
    if verdict.name == "provider":  # timeout / failure verdicts are named generically
        verdict = TargetVerdict(target, verdict.ready, verdict.reason, verdict.message, verdict.details)
    return verdict
