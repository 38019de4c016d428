"""The serving record: the Redis hash of a leasable proxy (:func:`app.store.keys.proxy`), typed.

:class:`ServingRecord` is the one definition of its fields, their Redis names and how each is
encoded.  The reconciler writes the identity fields (:func:`app.serving.view.publish`), the health
engine reads the record and writes the health fields (:mod:`app.probes.engine`), and the API
reads it for ``GET /v1/proxies`` (:func:`app.serving.leases.discover`); all of them go through
:meth:`ServingRecord.from_redis`, :meth:`ServingRecord.to_redis` and :func:`fields_of`.  The
lease scripts (``app/store/lua/lease_*.lua``) read ``healthy maxLeases provider zone namespace
labels authSecret address port egressIP name pool drainUntil`` by these names.

Reading never fails: a record written by an older version, by a test or by hand reads with
defaults for what is missing or malformed (as the lease scripts read it: a ``maxLeases`` that
is not a number is 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from app.store import keys as redis_keys

# How a field is encoded in the hash.
_STR, _INT, _OPT_INT, _FLOAT, _MS, _BOOL, _JSON = "str", "int", "opt_int", "float", "ms", "bool", "json"


@dataclass(frozen=True)
class ServingRecord:
    """A proxy as the serving view records it.

    Identity, written by :func:`app.serving.view.publish` (and :func:`app.serving.view.refresh` for
    ``labels max_leases health_check generation pool drain_until``; :func:`app.serving.view.set_draining`
    for ``drain_until``; :func:`app.serving.view.leave_pool` for ``pool drain_until``):

    Attributes:
        uid / namespace / name / generation: the Proxy (``uid namespace name generation``).
        provider / zone / mode: its placement (``provider zone mode``; ``""`` when unset).
        address / port: its endpoint (``address port``).
        labels: the Proxy's labels (``labels``, a JSON object).
        max_leases: live leases it may hold at once, 0 = draining (``maxLeases``).
        phase: the phase last written to its status (``phase``).
        auth_secret: name of its basic-auth Secret, ``""`` when it requires no credentials
            (``authSecret``; the credentials themselves are in :func:`app.store.keys.auth`).
        health_check: ``spec.healthCheck`` with defaults applied (``healthCheck``, a JSON object:
            ``url expectedStatus intervalSeconds timeoutSeconds failureThreshold
            successThreshold rateLimited``).
        pool: the ProxyPool the Proxy is a member of (``pool``: the name of its controller
            ownerReference; ``""`` for none), what the ``pool`` filter of the API matches.
        drain_until: epoch milliseconds (Redis clock) until which the proxy drains, leaving its
            pool (``drainUntil``; ``None`` = not draining, stored as ``""``): it takes no new
            lease, its live leases stay valid, renewals are capped at this time.

    Health, written by the health engine (:data:`HEALTH` are reset when the endpoint changes):

    Attributes:
        health: ``unknown``, ``healthy`` or ``unhealthy`` (``health``).
        healthy: whether a lease may go to it (``healthy``, ``"1"``/``"0"``: the flag the lease
            scripts read).
        successes / failures: consecutive probe results (``successes failures``).
        ever_healthy: healthy at least once with this endpoint (``everHealthy``).
        failed: went Failed, not healthy by the provisioning deadline (``failed``).
        running_since: epoch seconds it was published with this endpoint (``runningSince``).
        last_probe / last_probe_time: when the last probe started, epoch seconds and RFC 3339
            (``lastProbe lastProbeTime``).
        latency_ms: the last probe's latency (``latencyMs``, one decimal).
        last_reason / last_message / last_status: of the last probe (``lastReason lastMessage
            lastStatus``; the status ``None`` when there was no HTTP answer).
        last_verdict_reason / last_verdict_message: of the current verdict
            (``lastVerdictReason lastVerdictMessage``).
        egress_ip / egress_at / egress_error: the learnt egress IP, when it was learnt (epoch
            seconds), the last error learning it (``egressIP egressAt egressError``).
        status_key: what the Proxy status last said (``statusKey``: status is written on change).

    Optional times and numbers are ``None`` when unknown (stored as ``""``).
    """

    uid: str = ""
    namespace: str = ""
    name: str = ""
    generation: int = 0
    provider: str = ""
    zone: str = ""
    mode: str = ""
    address: str = ""
    port: int = 0
    labels: dict = field(default_factory=dict)
    max_leases: int = 0
    phase: str = ""
    auth_secret: str = ""
    health_check: dict = field(default_factory=dict)
    pool: str = ""
    drain_until: int | None = None
    health: str = "unknown"
    healthy: bool = False
    successes: int = 0
    failures: int = 0
    ever_healthy: bool = False
    failed: bool = False
    running_since: float | None = None
    last_probe: float | None = None
    last_probe_time: str = ""
    latency_ms: float | None = None
    last_reason: str = ""
    last_message: str = ""
    last_status: int | None = None
    last_verdict_reason: str = ""
    last_verdict_message: str = ""
    egress_ip: str = ""
    egress_at: float | None = None
    egress_error: str = ""
    status_key: str = ""

    @classmethod
    def from_redis(cls, raw: Mapping[str, str]) -> "ServingRecord":
        """Read a record from its hash (``HGETALL``, ``decode_responses=True``); never raises."""
        values = {}
        for attr, (name, kind) in _FIELDS.items():
            value = raw.get(name)
            if value is not None:
                values[attr] = _decode(kind, value)
        if not values.get("health"):
            values.pop("health", None)
        return cls(**values)

    @classmethod
    def of(cls, record: "ServingRecord | Mapping[str, str]") -> "ServingRecord":
        """``record`` itself, or read from a raw hash (for callers that hold either)."""
        return record if isinstance(record, ServingRecord) else cls.from_redis(record)

    def to_redis(self, attrs: Iterable[str] | None = None) -> dict[str, str]:
        """Return the hash fields of ``attrs`` (attribute names; default: every field)."""
        return fields_of(**{attr: getattr(self, attr) for attr in (_FIELDS if attrs is None else attrs)})


#: attribute -> (hash field, encoding): the schema.
_FIELDS: dict[str, tuple[str, str]] = {
    "uid": ("uid", _STR), "namespace": ("namespace", _STR), "name": ("name", _STR),
    "generation": ("generation", _INT), "provider": ("provider", _STR), "zone": ("zone", _STR),
    "mode": ("mode", _STR), "address": ("address", _STR), "port": ("port", _INT), "labels": ("labels", _JSON),
    "max_leases": ("maxLeases", _INT), "phase": ("phase", _STR), "auth_secret": ("authSecret", _STR),
    "health_check": ("healthCheck", _JSON), "pool": ("pool", _STR), "drain_until": ("drainUntil", _OPT_INT),
    "health": ("health", _STR), "healthy": ("healthy", _BOOL), "successes": ("successes", _INT),
    "failures": ("failures", _INT), "ever_healthy": ("everHealthy", _BOOL), "failed": ("failed", _BOOL),
    "running_since": ("runningSince", _FLOAT), "last_probe": ("lastProbe", _FLOAT),
    "last_probe_time": ("lastProbeTime", _STR), "latency_ms": ("latencyMs", _MS),
    "last_reason": ("lastReason", _STR), "last_message": ("lastMessage", _STR),
    "last_status": ("lastStatus", _OPT_INT), "last_verdict_reason": ("lastVerdictReason", _STR),
    "last_verdict_message": ("lastVerdictMessage", _STR), "egress_ip": ("egressIP", _STR),
    "egress_at": ("egressAt", _FLOAT), "egress_error": ("egressError", _STR), "status_key": ("statusKey", _STR),
}

#: The identity fields :func:`app.serving.view.publish` writes.
IDENTITY = ("uid", "namespace", "name", "generation", "provider", "zone", "mode", "address", "port", "labels",
            "max_leases", "phase", "auth_secret", "health_check", "pool", "drain_until")
#: The health fields a fresh (or re-addressed) record starts with, as :data:`HEALTH_DEFAULTS`.
HEALTH = ("health", "healthy", "successes", "failures", "ever_healthy", "last_reason", "last_message",
          "last_status", "latency_ms", "last_probe", "last_probe_time", "egress_ip", "egress_at", "egress_error",
          "status_key", "failed", "last_verdict_reason", "last_verdict_message")


def _decode(kind: str, value: str) -> Any:
    if kind == _STR:
        return value
    if kind == _BOOL:
        return value == "1"
    if kind == _JSON:
        try:
            doc = json.loads(value or "{}")
        except ValueError:
            return {}
        return doc if isinstance(doc, dict) else {}
    try:
        if kind == _INT:
            return int(value) if value != "" else 0
        if kind == _OPT_INT:
            return int(value) if value != "" else None
        return float(value) if value != "" else None  # _FLOAT, _MS
    except ValueError:
        return 0 if kind == _INT else None


def _encode(kind: str, value: Any) -> str:
    if kind == _STR:
        return value
    if kind == _BOOL:
        return "1" if value else "0"
    if kind == _JSON:
        return json.dumps(value, sort_keys=True)
    if value is None:
        return ""
    if kind == _FLOAT:
        return repr(value)
    if kind == _MS:
        return f"{value:.1f}"
    return str(int(value))  # _INT, _OPT_INT


def fields_of(**values: Any) -> dict[str, str]:
    """Encode some fields by attribute name: ``fields_of(running_since=t)`` → ``{"runningSince": repr(t)}``.

    Raises:
        KeyError: not a field of :class:`ServingRecord`.
    """
    out = {}
    for attr, value in values.items():
        name, kind = _FIELDS[attr]
        out[name] = _encode(kind, value)
    return out


#: Health fields a fresh (or re-addressed) record starts with.
HEALTH_DEFAULTS: dict[str, str] = ServingRecord().to_redis(HEALTH)


def read(r, uids: list[str], attrs: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
    """Return ``{uid: raw hash}`` for those of ``uids`` that are published (one round trip).

    ``attrs``: only these fields (attribute names of :class:`ServingRecord`, read with ``HMGET``;
    the others are left out of the hash); ``None``: the whole hash.
    """
    pipe = r.pipeline(transaction=False)
    if attrs is None:
        for uid in uids:
            pipe.hgetall(redis_keys.proxy(uid))
        return {uid: data for uid, data in zip(uids, pipe.execute(), strict=True) if data}
    names = [_FIELDS[attr][0] for attr in attrs]
    for uid in uids:
        pipe.hmget(redis_keys.proxy(uid), names)
    out = {}
    for uid, values in zip(uids, pipe.execute(), strict=True):
        data = {name: value for name, value in zip(names, values, strict=True) if value is not None}
        if data:
            out[uid] = data
    return out


def load(r, uids: list[str], attrs: Iterable[str] | None = None) -> dict[str, ServingRecord]:
    """Return ``{uid: record}`` for those of ``uids`` that are published (one round trip).

    ``attrs``: read only these fields (see :func:`read`); the others keep their defaults.
    """
    return {uid: ServingRecord.from_redis(raw) for uid, raw in read(r, uids, attrs).items()}


def load_all(r) -> dict[str, ServingRecord]:
    """Return ``{uid: record}`` for every published proxy (two round trips)."""
    return load(r, sorted(r.smembers(redis_keys.PROXIES)))
