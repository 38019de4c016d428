"""The ``ProxyPool`` resource and its members as plain dataclasses (no API, no Redis).

:meth:`Pool.from_dict` reads a ProxyPool as the API server returns it and applies the same
defaults as the CRD (``deploy/crd/proxypool.yaml``), so the decisions of :mod:`app.pools.plan`
do not depend on whether the server defaulted the object.  :class:`Member` is one Proxy the
pool controls, with what the serving view says about it (leasable, live leases) already
looked up by the caller.

Naming on members (written by the controller, read back by it):

* :data:`LABEL_TEMPLATE_HASH` — :func:`template_hash` of the template the member was made
  from (like a ReplicaSet's ``pod-template-hash``); a member whose label differs from the
  pool's current template is *outdated* and replaced by a rollout;
* :data:`LABEL_POOL` — the pool's name (for ``kubectl get px -l``); ownership is decided by
  the ``ownerReferences`` entry with ``controller: true``, never by labels;
* :data:`ANNOTATION_DRAINING` — RFC 3339 time until which a member leaving the pool drains
  (no new leases; live leases run out or are released); it is deleted then at the latest.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from app.serving import selectors
from app.resources import DRAINING_ANNOTATION, GROUP, MODE_MANAGED, POOL_KIND, POOL_PLURAL, VERSION, ObjectIdentity
from app.timefmt import parse_rfc3339, rfc3339
from app.config.validation import parse_duration

POOL_API_VERSION = f"{GROUP}/{VERSION}"
LABEL_TEMPLATE_HASH = "crawl.example.com/pool-template-hash"
LABEL_POOL = "crawl.example.com/pool"
ANNOTATION_DRAINING = DRAINING_ANNOTATION
#: Longest pool name: the name is the value of :data:`LABEL_POOL` on every member, and the API
#: server refuses label values longer than 63 characters (k8s.io/apimachinery ``ValidateLabels``;
#: Kubernetes docs, "Labels and Selectors": "Syntax and character set").  A ProxyPool's own name
#: may be up to 253 characters (a DNS subdomain), so the controller checks it.
MAX_POOL_NAME = 63

#: Share of ``maxAge`` a member's own age limit may be shortened by: each member is replaced
#: between ``(1 - AGE_JITTER) * maxAge`` and ``maxAge`` after its creation, at a point fixed by
#: a hash of its UID, so members created together are not all replaced together.
AGE_JITTER = 0.25
#: The shortest ``maxAge`` (seconds): a member must live long enough to become leasable and be
#: leased before it is replaced (the CRD's CEL rule says the same, deploy/crd/gen_proxypool.py).
MIN_MAX_AGE = 60
#: Most Proxies one pool may ask for (``spec.replicas``, ``spec.autoscale.minReplicas`` and
#: ``maxReplicas``): the CRD's ``maximum`` (deploy/crd/gen_proxypool.py), checked here too for an
#: object stored before the CRD had it (the API server does not re-validate stored objects).
MAX_REPLICAS = 1000
DEFAULT_MAX_SURGE = 1
DEFAULT_MAX_UNAVAILABLE = 0
DEFAULT_DRAIN_TIMEOUT = 600
DEFAULT_TARGET_UTILIZATION = 0.7
DEFAULT_SCALE_DOWN_DELAY = 300


class PoolSpecError(ValueError):
    """A ProxyPool spec the controller cannot act on; the message names the field."""

    def __init__(self, field_path: str, problem: str) -> None:
        super().__init__(f"{field_path}: {problem}")
        self.field = field_path


def parse_time(value: Any) -> float | None:
    """RFC 3339 (``2026-01-02T03:04:05Z``, fractions and offsets allowed) to epoch seconds;
    ``None`` for a missing or unreadable value."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_rfc3339(value).timestamp()
    except ValueError:
        return None


def format_time(epoch: float) -> str:
    """Epoch seconds to RFC 3339 UTC with second precision (rounded up, so a deadline written
    and read back is never earlier than the one meant)."""
    return rfc3339(math.ceil(epoch))


def _int_or_percent(path: str, value: Any, total: int, *, round_up: bool, default: int) -> int:
    """``maxSurge``/``maxUnavailable``: an integer >= 0 or ``"NN%"`` of ``total`` (Deployment's
    rounding: surge up, unavailable down)."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise PoolSpecError(path, f"must be an integer or a percentage, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise PoolSpecError(path, f"must not be negative, got {value}")
        return value
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        share = int(value[:-1]) * total / 100
        return int(math.ceil(share) if round_up else math.floor(share))
    raise PoolSpecError(path, f'must be an integer or a percentage such as "25%", got {value!r}')


def _whole(path: str, value: Any, default: int, minimum: int = 0, maximum: int | None = None) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise PoolSpecError(path, f"must be an integer, got {value!r}")
    if value < minimum:
        raise PoolSpecError(path, f"must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise PoolSpecError(path, f"must be at most {maximum} (the CRD's maximum), got {value}; no member is "
                                  "created or removed until it is lowered")
    return value


def selector_requirements(selector: Mapping | None) -> tuple[selectors.Requirement, ...]:
    """A ``metav1.LabelSelector`` (``matchLabels`` and ``matchExpressions``) as requirements.

    Raises:
        PoolSpecError: an unknown operator, or ``In``/``NotIn`` without values.
    """
    selector = selector or {}
    reqs = [selectors.Requirement(k, selectors.EQ, (str(v),))
            for k, v in sorted((selector.get("matchLabels") or {}).items())]
    ops = {"In": selectors.IN, "NotIn": selectors.NOTIN, "Exists": selectors.EXISTS,
           "DoesNotExist": selectors.NOT_EXISTS}
    for i, expr in enumerate(selector.get("matchExpressions") or ()):
        op = ops.get(str((expr or {}).get("operator")))
        if op is None:
            raise PoolSpecError(f"spec.selector.matchExpressions[{i}].operator",
                                "must be one of In, NotIn, Exists, DoesNotExist")
        values = tuple(str(v) for v in expr.get("values") or ())
        if op in (selectors.IN, selectors.NOTIN) and not values:
            raise PoolSpecError(f"spec.selector.matchExpressions[{i}].values", f"{expr['operator']} needs values")
        reqs.append(selectors.Requirement(str(expr.get("key") or ""), op, values))
    return tuple(reqs)


def selector_string(reqs: tuple[selectors.Requirement, ...]) -> str:
    """Requirements as a label-selector string (``status.selector``, what ``kubectl`` and the
    scale subresource's ``labelSelectorPath`` expect): ``app=web,tier in (a,b),!legacy``."""
    parts = []
    for r in reqs:
        if r.op == selectors.EQ:
            parts.append(f"{r.key}={r.values[0]}")
        elif r.op == selectors.NE:
            parts.append(f"{r.key}!={r.values[0]}")
        elif r.op in (selectors.IN, selectors.NOTIN):
            parts.append(f"{r.key} {r.op} ({','.join(r.values)})")
        elif r.op == selectors.EXISTS:
            parts.append(r.key)
        else:
            parts.append(f"!{r.key}")
    return ",".join(parts)


def status_selector(pool_name: str, spec: "PoolSpec") -> str:
    """``status.selector`` of a pool (what the scale subresource reports, for ``kubectl get px -l``
    and autoscalers): the label the controller puts on every member it makes,
    ``crawl.example.com/pool=<pool_name>`` (:data:`LABEL_POOL`), after the requirements of an
    explicit ``spec.selector``.

    It never follows the template: an omitted ``spec.selector`` stands for the template's current
    labels, but members made from an older template carry the older labels and stay the pool's
    until they are rolled over, so the template's labels would miss them (and would list a
    hand-made Proxy with those labels, which is never a member).  The pool label is on every
    member from its creation and on no other Proxy unless someone puts it there.  The string is
    fixed for the pool's life (its name and an explicit selector are immutable).

    Args:
        pool_name: ``metadata.name`` of the pool.
        spec: the pool's :class:`PoolSpec`.
    Returns:
        e.g. ``crawl.example.com/pool=web`` or ``app=web,!tier,crawl.example.com/pool=web``.
    """
    own = selectors.Requirement(LABEL_POOL, selectors.EQ, (pool_name,))
    reqs = tuple(r for r in spec.selector if r != own) if spec.explicit_selector else ()
    return selector_string(reqs + (own,))


def template_hash(labels: Mapping[str, str], spec: Mapping[str, Any]) -> str:
    """10 hex digits naming a template (its labels and Proxy spec, canonical JSON).

    Any change of the template's labels or spec changes it, so members made from an older
    template are found by comparing one label.  The zone a member is placed in by
    ``spec.spread`` is not part of the template and not of the hash.
    """
    blob = json.dumps({"labels": dict(labels), "spec": dict(spec)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def uid_fraction(uid: str) -> float:
    """A number in [0, 1) fixed by ``uid`` (the first 64 bits of its SHA-256)."""
    return int(hashlib.sha256(uid.encode()).hexdigest()[:16], 16) / float(1 << 64)


def age_limit(uid: str, max_age: float) -> float:
    """Seconds after its creation a member with ``uid`` is due for replacement, for a pool whose
    ``maxAge`` is ``max_age`` seconds: between ``(1 - AGE_JITTER) * max_age`` and ``max_age``,
    always the same for the same UID."""
    return max_age * (1.0 - AGE_JITTER * uid_fraction(uid))


#: Drain reason of a burned member drained in place rather than replaced: its provider gives a
#: replacement the same egress IP (:attr:`app.config.providers.ProviderConfig.replacement_keeps_ip`).
BURNED_IN_PLACE = "BurnedInPlace"


@dataclass(frozen=True)
class Recycle:
    """``spec.recycle`` of a ProxyPool: replace (or, where a replacement keeps the egress IP,
    drain in place) members whose egress IP sites ban (:mod:`app.pools.recycle`).

    Attributes:
        banned_targets: a member whose egress IP was banned by at least this many distinct
            targets (sites) within ``window`` — bans since the member was made only — is burned
            (``spec.recycle.bannedTargets``, >= 1), ``None``: not by this rule.
        max_ban_percent: a member whose targeted leases within ``window`` (at least
            ``min_leases`` of them) ended in a ban more often than this percentage is burned
            (``spec.recycle.maxBanPercent``, 1..99), ``None``: not by this rule.
        min_leases: (``spec.recycle.minLeases``, default 20).
        window: seconds (``spec.recycle.windowSeconds``, default 3600; bans and leases older
            than the API's ``BAN_HISTORY_SECONDS`` are not remembered).
    """

    banned_targets: int | None = None
    window: float = 3600.0
    max_ban_percent: int | None = None
    min_leases: int = 20

    @classmethod
    def from_dict(cls, d: Mapping | None) -> "Recycle | None":
        """Build from ``spec.recycle`` (``None`` when absent).

        Raises:
            PoolSpecError: neither ``bannedTargets`` nor ``maxBanPercent`` given, or a value out
                of range (``bannedTargets``, ``minLeases``, ``windowSeconds`` below 1,
                ``maxBanPercent`` outside 1..99: "more than 100 %" never holds), naming the field.
        """
        if not d:
            return None
        if d.get("bannedTargets") is None and d.get("maxBanPercent") is None:
            raise PoolSpecError("spec.recycle", "needs bannedTargets (distinct targets that make a member burned), "
                                                "maxBanPercent (a ban ratio over its leases) or both")
        banned = d.get("bannedTargets")
        percent = d.get("maxBanPercent")
        return cls(banned_targets=None if banned is None else _whole("spec.recycle.bannedTargets", banned, 0,
                                                                     minimum=1),
                   max_ban_percent=None if percent is None else _whole("spec.recycle.maxBanPercent", percent, 0,
                                                                       minimum=1, maximum=99),
                   min_leases=_whole("spec.recycle.minLeases", d.get("minLeases"), 20, minimum=1),
                   window=float(_whole("spec.recycle.windowSeconds", d.get("windowSeconds"), 3600, minimum=1)))


@dataclass(frozen=True)
class Autoscale:
    """``spec.autoscale``.

    Attributes:
        min_replicas / max_replicas: bounds of the member count.
        target: wanted live leases / lease capacity of the Ready members, in (0, 1].
        scale_down_delay: seconds a lower recommendation must hold before the pool shrinks
            to it (the highest recommendation of that window wins).
    """

    min_replicas: int
    max_replicas: int
    target: float = DEFAULT_TARGET_UTILIZATION
    scale_down_delay: float = DEFAULT_SCALE_DOWN_DELAY

    @classmethod
    def from_dict(cls, d: Mapping | None) -> "Autoscale | None":
        """Build from ``spec.autoscale``; ``None`` when absent.

        ``targetLeaseUtilization`` is a number in (0, 1] or a percentage string (``"70%"``).

        Raises:
            PoolSpecError: a bound or the target out of range.
        """
        if not d:
            return None
        lo = _whole("spec.autoscale.minReplicas", d.get("minReplicas"), 1, maximum=MAX_REPLICAS)
        hi = _whole("spec.autoscale.maxReplicas", d.get("maxReplicas"), max(lo, 1), minimum=1, maximum=MAX_REPLICAS)
        if hi < lo:
            raise PoolSpecError("spec.autoscale.maxReplicas", f"must not be below minReplicas ({lo}), got {hi}")
        raw = d.get("targetLeaseUtilization", DEFAULT_TARGET_UTILIZATION)
        if isinstance(raw, str) and raw.endswith("%"):
            try:
                target = float(raw[:-1]) / 100
            except ValueError:
                target = -1.0
        elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
            target = float(raw)
        else:
            target = -1.0
        if not 0 < target <= 1:
            raise PoolSpecError("spec.autoscale.targetLeaseUtilization",
                                f'must be a number in (0, 1] or a percentage such as "70%", got {raw!r}')
        delay = _whole("spec.autoscale.scaleDownDelaySeconds", d.get("scaleDownDelaySeconds"),
                       DEFAULT_SCALE_DOWN_DELAY)
        return cls(lo, hi, target, float(delay))


@dataclass(frozen=True)
class PoolSpec:
    """``spec`` of a ProxyPool with defaults applied.

    Attributes:
        replicas: members wanted (``spec.replicas``; the autoscaler's choice when
            :attr:`autoscale` is set).
        template_labels / template_spec: ``spec.template.metadata.labels`` and
            ``spec.template.spec`` (a Proxy spec; ``mode`` must be Managed).
        selector: requirements members must match (``spec.selector``; the template labels
            when absent).
        explicit_selector: whether ``spec.selector`` was given.  Only then does a member have to
            match it: a selector derived from the template follows the template, so after a
            change of its labels the members made from the older template (owned by the pool all
            the same) still count as members, outdated ones, and are rolled over.
        max_age: seconds after which a member is replaced (:func:`age_limit`), ``None``: never.
        max_surge / max_unavailable: rollout bounds, resolved against :attr:`replicas`
            (both 0 is read as ``max_surge`` 1: a rollout must be able to move).
        drain_timeout: seconds a leaving member drains at most (``spec.drain.drainTimeoutSeconds``).
        zones: ``spec.spread.zones`` (members are spread over them), ``()``: the template's
            own placement.
        autoscale: :class:`Autoscale` or ``None``.
        recycle: :class:`Recycle` or ``None`` (members are not replaced for bans).
        hash: :func:`template_hash` of the template.
        max_instance_hours_per_day: ``spec.maxInstanceHoursPerDay`` (a cost guardrail:
            :mod:`app.pools.budget`), ``None``: no budget.
        on_demand_replicas: ``spec.onDemandReplicas``: new members are on demand while fewer
            than this many are, the others Spot; ``None``: every member takes the template's capacity.
    """

    replicas: int
    template_labels: dict[str, str]
    template_spec: dict[str, Any]
    selector: tuple[selectors.Requirement, ...]
    max_age: float | None = None
    max_surge: int = DEFAULT_MAX_SURGE
    max_unavailable: int = DEFAULT_MAX_UNAVAILABLE
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    zones: tuple[str, ...] = ()
    autoscale: Autoscale | None = None
    recycle: Recycle | None = None
    hash: str = ""
    explicit_selector: bool = False
    max_instance_hours_per_day: float | None = None
    on_demand_replicas: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping | None) -> "PoolSpec":
        """Build from a ProxyPool's ``spec``.

        Raises:
            PoolSpecError: naming the field: a negative count or one over :data:`MAX_REPLICAS`, a
                template that is not Managed or whose labels the selector does not match, a bad duration or percentage.
        """
        d = d or {}
        replicas = _whole("spec.replicas", d.get("replicas"), 1, maximum=MAX_REPLICAS)
        template = d.get("template") or {}
        labels = dict((template.get("metadata") or {}).get("labels") or template.get("labels") or {})
        tspec = dict(template.get("spec") or {})
        if (tspec.get("mode") or MODE_MANAGED) != MODE_MANAGED:
            raise PoolSpecError("spec.template.spec.mode", "a pool makes Managed Proxies only")
        if not tspec.get("provider"):
            raise PoolSpecError("spec.template.spec.provider", "required")
        sel = selector_requirements(d.get("selector")) if d.get("selector") else selector_requirements(
            {"matchLabels": labels})
        if not sel:
            raise PoolSpecError("spec.selector", "empty: give the template labels or a selector")
        if not selectors.matches(sel, labels):
            raise PoolSpecError("spec.template.metadata.labels", "must match spec.selector")
        max_age = None
        if d.get("maxAge") not in (None, "", 0, "0"):
            try:
                max_age = parse_duration(d["maxAge"])
            except ValueError as exc:
                raise PoolSpecError("spec.maxAge", str(exc)) from None
            if max_age < MIN_MAX_AGE:
                raise PoolSpecError("spec.maxAge", f"{d['maxAge']!r} is shorter than the minimum of {MIN_MAX_AGE}s")
        rollout = d.get("rollout") or {}
        surge = _int_or_percent("spec.rollout.maxSurge", rollout.get("maxSurge"), replicas, round_up=True,
                                default=DEFAULT_MAX_SURGE)
        unavailable = _int_or_percent("spec.rollout.maxUnavailable", rollout.get("maxUnavailable"), replicas,
                                      round_up=False, default=DEFAULT_MAX_UNAVAILABLE)
        if surge == 0 and unavailable == 0:
            surge = 1
        drain = _whole("spec.drain.drainTimeoutSeconds", (d.get("drain") or {}).get("drainTimeoutSeconds"),
                       DEFAULT_DRAIN_TIMEOUT)
        zones = tuple(str(z) for z in (d.get("spread") or {}).get("zones") or () if z)
        if len(set(zones)) != len(zones):
            raise PoolSpecError("spec.spread.zones", "a zone is listed twice")
        budget = d.get("maxInstanceHoursPerDay")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0):
            raise PoolSpecError("spec.maxInstanceHoursPerDay",
                                f"must be a number of instance-hours >= 0, got {budget!r}")
        return cls(replicas=replicas, template_labels=labels, template_spec=tspec, selector=sel, max_age=max_age,
                   max_surge=surge, max_unavailable=unavailable, drain_timeout=float(drain), zones=zones,
                   autoscale=Autoscale.from_dict(d.get("autoscale")), recycle=Recycle.from_dict(d.get("recycle")),
                   hash=template_hash(labels, tspec),
                   explicit_selector=bool(d.get("selector")),
                   max_instance_hours_per_day=None if budget is None else float(budget),
                   on_demand_replicas=None if d.get("onDemandReplicas") is None else _whole(
                       "spec.onDemandReplicas", d.get("onDemandReplicas"), 0, maximum=MAX_REPLICAS))

    @property
    def provider(self) -> str:
        """The provider of every member (``spec.template.spec.provider``)."""
        return str(self.template_spec.get("provider") or "")

    @property
    def template_zone(self) -> str | None:
        """``spec.template.spec.placement.zone`` (used when :attr:`zones` is empty)."""
        return (self.template_spec.get("placement") or {}).get("zone") or None

    @property
    def max_leases(self) -> int:
        """Leases one member takes at once (the template's ``maxLeases``, default 5)."""
        value = self.template_spec.get("maxLeases")
        return 5 if value is None else int(value)


@dataclass(frozen=True)
class Pool(ObjectIdentity):
    """A ProxyPool as read from the API.

    Attributes:
        (identity): as :class:`app.resources.ObjectIdentity`.
        spec: :class:`PoolSpec`, or ``None`` when it is invalid (:attr:`spec_error` says why).
        spec_error: the :class:`PoolSpecError` message, ``""`` when the spec is fine.
        status: the raw ``status`` dict.
        raw: the object as received.
    """

    spec: PoolSpec | None
    spec_error: str
    status: dict[str, Any]
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def from_dict(cls, obj: Mapping) -> "Pool":
        """Build from an API object dict; an invalid spec is kept as :attr:`spec_error`, and so is
        a name longer than :data:`MAX_POOL_NAME` (no member could carry it as a label).

        Raises:
            ValueError: ``metadata.name``/``namespace``/``uid`` missing.
        """
        meta = obj.get("metadata") or {}
        identity = cls.fields(meta, "ProxyPool")
        try:
            spec, error = PoolSpec.from_dict(obj.get("spec")), ""
            if len(meta["name"]) > MAX_POOL_NAME:
                raise PoolSpecError("metadata.name", (
                    f"{len(meta['name'])} characters, at most {MAX_POOL_NAME}: the name is the value of the "
                    f"{LABEL_POOL} label on every member, and label values are limited to {MAX_POOL_NAME} "
                    f"characters; no member is created: re-create the pool under a shorter name"))
        except PoolSpecError as exc:
            spec, error = None, str(exc)
        return cls(**identity, spec=spec, spec_error=error, status=dict(obj.get("status") or {}), raw=dict(obj))

    @property
    def valid_spec(self) -> PoolSpec:
        """The :attr:`spec`, for code that acts only on a pool whose spec is valid.

        Raises:
            ValueError: the spec is invalid (the message names the pool and :attr:`spec_error`).
        """
        if self.spec is None:
            raise ValueError(f"pool {self.key} has an invalid spec: {self.spec_error}")
        return self.spec


@dataclass(frozen=True)
class Member:
    """One Proxy a pool controls, as the decisions need it.

    Attributes:
        uid / name: the Proxy.
        phase: its ``status.phase``.
        ready: phase ``Ready`` (health probes pass).
        leasable: the serving view would lease it now: published, healthy, ``maxLeases`` > 0
            and not draining.
        leases: its live leases now.
        created: ``metadata.creationTimestamp``, epoch seconds.
        template_hash: its :data:`LABEL_TEMPLATE_HASH` label (``""`` when missing).
        zone: its ``spec.placement.zone`` (``None`` when unset).
        draining_until: epoch seconds of its :data:`ANNOTATION_DRAINING`, ``None`` when it is
            not draining.
        deleting: its deletion has begun (``metadata.deletionTimestamp``).
        drain_reason: its :data:`app.resources.DRAINING_REASON_ANNOTATION` (``ScaleDown``,
            ``Outdated``; ``""`` when missing or not draining).
        serves: the serving view would lease it now but for its draining mark: published,
            healthy, ``maxLeases`` > 0, not being deleted (``leasable`` is this and not draining).
        unknown: its phase is ``Ready`` but it has no serving record (a flushed Redis, before the
            reconciler publishes it again): not leasable as far as the pass can tell, yet it may
            serve, so it does not leave freely (:func:`app.pools.plan.plan`, rule 4).
        burned: why the pool's recycle policy (:class:`Recycle`) calls it burned (the rule that
            holds, for Events and the log: :mod:`app.pools.recycle`), ``""`` when it does not.
        burned_targets: the targets that banned its egress IP within the policy's window, when
            burned (else ``()``).

    A member drained in place for its bans (drain reason :data:`BURNED_IN_PLACE`: its provider
    would give a replacement the same egress IP) is :attr:`parked`, not :attr:`draining`: it
    stays a member, takes no new leases and takes them again once it is no longer burned.
    """

    uid: str
    name: str
    phase: str = "Pending"
    ready: bool = False
    leasable: bool = False
    leases: int = 0
    created: float = 0.0
    template_hash: str = ""
    zone: str | None = None
    draining_until: float | None = None
    deleting: bool = False
    unknown: bool = False
    drain_reason: str = ""
    serves: bool = False
    burned: str = ""
    burned_targets: tuple[str, ...] = ()

    @property
    def parked(self) -> bool:
        """Whether the member is drained in place for its bans (:data:`BURNED_IN_PLACE`)."""
        return self.draining_until is not None and self.drain_reason == BURNED_IN_PLACE

    @property
    def draining(self) -> bool:
        """Whether the member is leaving the pool (marked draining, not yet deleted; a
        :attr:`parked` member is not leaving)."""
        return self.draining_until is not None and self.drain_reason != BURNED_IN_PLACE


__all__ = ["AGE_JITTER", "ANNOTATION_DRAINING", "Autoscale", "BURNED_IN_PLACE", "LABEL_POOL", "LABEL_TEMPLATE_HASH",
           "MAX_POOL_NAME",
           "Member", "POOL_API_VERSION", "POOL_KIND", "POOL_PLURAL", "Pool", "PoolSpec", "PoolSpecError", "age_limit",
           "format_time", "parse_time",
           "selector_requirements", "selector_string", "status_selector", "template_hash", "uid_fraction"]
