"""Ban intelligence: bans per (egress IP, target), per-target concurrency, refusing targets.

A lease may name a target (:mod:`app.serving.targets`: the registrable domain of a host).  Then,
in the lease scripts (``lease_acquire.lua``, ``lease_release.lua``, ``lease_renew.lua``):

* **identity**: a proxy's identity towards a site is its egress IP (the serving record's
  ``egressIP``; a proxy whose egress IP is not known yet is an identity of its own,
  ``uid:<uid>``).  Proxies sharing an egress IP (Pods behind one node's SNAT, proxies of one VM)
  are one identity for bans and concurrency;
* **bans**: a release as ``blocked`` or ``failed`` of a lease for target T through identity E
  puts (E, T) in cooldown: no proxy of E is leased for T until it ends, and the same proxies
  stay leasable for every other target.  The cooldown is fleet-wide (every client) by default,
  per client with ``BAN_SCOPE=client``.  It grows with repeated bans of the same pair:
  ``BAN_COOLDOWN_SECONDS * 2^(strikes - 1)``, at most ``BAN_COOLDOWN_MAX_SECONDS``; the strikes
  are forgotten ``BAN_DECAY_SECONDS`` after the last ban.  A report while the pair's ban is live
  (another lease of E for T saw the same ban) is no strike and leaves the ban's end as it is;
* **concurrency**: a lease for T is never granted through an identity that already holds its
  limit of live leases for T (``TARGET_CONCURRENCY``, 1; per target pattern or pool:
  ``TARGET_CONCURRENCY_RULES``).  When bans or this limit exclude every proxy, the 503 counts
  both and its ``Retry-After`` is when the first identity frees up;
* **refusing targets**: when ``TARGET_REFUSAL_IPS`` different identities are reported
  ``blocked`` for T within ``TARGET_REFUSAL_WINDOW_SECONDS``, the site refuses everyone, not
  these IPs: their bans for T are lifted and, for ``TARGET_REFUSAL_COOLOFF_SECONDS``, leases for
  T are refused with ``429 target_refusing`` (``Retry-After``: the cool-off's end) and blocked
  reports for T ban nothing.

Everything lives in Redis with TTLs (key table: :mod:`app.store.keys`, "bans"): memory is
bounded by the live cooldowns, leases and refusal windows, not by history.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from functools import cached_property

from app.config.settings import env_number
from app.serving.targets import TargetError, registrable_domain
from app.store import keys as redis_keys

#: ``BAN_SCOPE`` values: bans for every client (``fleet``) or for the reporting client only.
SCOPES = ("fleet", "client")
#: The label every target outside the metrics' targets is counted under.
OTHER = "other"


def parse_rules(text: str, *, where: str = "TARGET_CONCURRENCY_RULES") -> tuple[tuple[str, int], ...]:
    """Parse concurrency rules: ``pattern=limit`` items separated by commas.

    A pattern is a target glob (``example.com``, ``*.example.com``: matched against the target, a
    registrable domain; a host names its site, ``www.example.com`` is ``example.com``, and
    ``*.example.com`` matches ``example.com`` too, the target of every host under it) or
    ``pool:<namespace>/<name>`` (the proxies of that ProxyPool).

    Args:
        text: e.g. ``"example.com=2, *.gov=1, pool:crawl/web=4"`` (empty: no rules).
        where: the setting's name, for the error message.
    Returns:
        ``((pattern, limit), ...)`` in the order given.
    Raises:
        ValueError: an item without ``=``, an empty pattern, a host that is not one or a limit
            that is not an integer >= 1, naming the item and ``where``.
    """
    rules = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        pattern, sep, value = item.rpartition("=")
        pattern = pattern.strip()
        if not sep or not pattern:
            raise ValueError(f"{where}: {item!r} is not pattern=limit")
        try:
            limit = int(value.strip())
        except ValueError:
            raise ValueError(f"{where}: the limit of {item!r} must be an integer >= 1") from None
        if limit < 1:
            raise ValueError(f"{where}: the limit of {item!r} must be an integer >= 1")
        if pattern.startswith("pool:") and pattern.count("/") != 1:
            raise ValueError(f"{where}: {pattern!r} must name a pool as pool:<namespace>/<name>")
        rules.append((pattern if pattern.startswith("pool:") else _site_pattern(pattern, item, where), limit))
    return tuple(rules)


def _site_pattern(pattern: str, item: str, where: str) -> str:
    """A target pattern as targets are spelled: a host, or ``*.`` and a host, names its site
    (the registrable domain: ``www.example.com`` and ``*.shop.example.com`` are ``example.com`` and
    ``*.example.com``; an internationalised name in its ASCII form); any other glob stays as
    written (lower-cased).

    Raises:
        ValueError: a host that is not one (:class:`TargetError`), naming the item and ``where``.
    """
    wild = pattern.startswith("*.")
    host = pattern[2:] if wild else pattern
    if any(c in host for c in "*?["):
        return pattern.lower()
    try:
        site = registrable_domain(host)
    except TargetError as exc:
        raise ValueError(f"{where}: {item!r}: {exc}") from None
    return "*." + site if wild else site


@dataclass(frozen=True)
class BanSettings:
    """The rules of targeted leases (seconds unless said otherwise).

    Attributes:
        scope: ``fleet`` (a ban holds for every client, default) or ``client`` (for the
            reporting client only) (``BAN_SCOPE``).
        cooldown: the first ban of an (egress IP, target) pair (``BAN_COOLDOWN_SECONDS``, 300).
        cooldown_max: the cap of a repeated ban's cooldown (``BAN_COOLDOWN_MAX_SECONDS``, 3600).
        decay: how long a pair's ban count (its strikes) outlives its last ban
            (``BAN_DECAY_SECONDS``, 3600).
        history: how long an egress IP's list of targets that banned it is kept after the ban
            ended (``BAN_HISTORY_SECONDS``, 3600): ``GET /v1/proxies``' ``bans.recent``.
        concurrency: live leases per target and egress IP (``TARGET_CONCURRENCY``, 1).
        rules: per target pattern or pool (``TARGET_CONCURRENCY_RULES``, :func:`parse_rules`);
            the first target pattern that matches wins, else the proxy's pool's rule, else
            ``concurrency``.
        refusal_ips: distinct egress IPs reported ``blocked`` for one target within
            ``refusal_window`` that make it a refusing target (``TARGET_REFUSAL_IPS``, 3; 0: never).
        refusal_window: (``TARGET_REFUSAL_WINDOW_SECONDS``, 60).
        refusal_cooloff: how long leases for a refusing target are refused
            (``TARGET_REFUSAL_COOLOFF_SECONDS``, 300).
        metric_targets: the targets the metrics name (``BAN_METRIC_TARGETS``, comma separated);
            empty: the first ``metric_top`` targets each API process sees.  Every other target is
            counted as ``other``.
        metric_top: (``BAN_METRIC_TOP_K``, 20).
    Raises:
        ValueError: a value out of range, naming it.
    """

    scope: str = "fleet"
    cooldown: int = 300
    cooldown_max: int = 3600
    decay: int = 3600
    history: int = 3600
    concurrency: int = 1
    rules: tuple[tuple[str, int], ...] = ()
    refusal_ips: int = 3
    refusal_window: int = 60
    refusal_cooloff: int = 300
    metric_targets: tuple[str, ...] = ()
    metric_top: int = 20
    _seen: set = field(default_factory=set, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"BAN_SCOPE must be one of {', '.join(SCOPES)}, got {self.scope!r}")
        if self.cooldown < 1 or self.cooldown_max < self.cooldown:
            raise ValueError(f"BAN_COOLDOWN_SECONDS ({self.cooldown}) must be >= 1 and at most "
                             f"BAN_COOLDOWN_MAX_SECONDS ({self.cooldown_max})")
        if self.concurrency < 1:
            raise ValueError(f"TARGET_CONCURRENCY must be >= 1, got {self.concurrency}")
        if min(self.decay, self.history, self.refusal_window, self.refusal_cooloff) < 1:
            raise ValueError("BAN_DECAY_SECONDS, BAN_HISTORY_SECONDS, TARGET_REFUSAL_WINDOW_SECONDS and "
                             "TARGET_REFUSAL_COOLOFF_SECONDS must be >= 1")

    @classmethod
    def from_env(cls) -> "BanSettings":
        """Read the settings from the environment (names in the attribute list).

        Raises:
            ValueError: a malformed value, naming the variable.
        """
        def num(name: str, default: int, minimum: int = 0) -> int:
            return int(env_number(name, default, minimum=minimum, integer=True))

        targets = tuple(t.strip().lower() for t in os.environ.get("BAN_METRIC_TARGETS", "").split(",") if t.strip())
        return cls(
            scope=os.environ.get("BAN_SCOPE", "fleet").strip() or "fleet",
            cooldown=num("BAN_COOLDOWN_SECONDS", cls.cooldown, 1),
            cooldown_max=num("BAN_COOLDOWN_MAX_SECONDS", cls.cooldown_max, 1),
            decay=num("BAN_DECAY_SECONDS", cls.decay, 1),
            history=num("BAN_HISTORY_SECONDS", cls.history, 1),
            concurrency=num("TARGET_CONCURRENCY", cls.concurrency, 1),
            rules=parse_rules(os.environ.get("TARGET_CONCURRENCY_RULES", "")),
            refusal_ips=num("TARGET_REFUSAL_IPS", cls.refusal_ips, 0),
            refusal_window=num("TARGET_REFUSAL_WINDOW_SECONDS", cls.refusal_window, 1),
            refusal_cooloff=num("TARGET_REFUSAL_COOLOFF_SECONDS", cls.refusal_cooloff, 1),
            metric_targets=targets,
            metric_top=num("BAN_METRIC_TOP_K", cls.metric_top, 0),
        )

    @cached_property
    def _pool_rules(self) -> str:
        pools = {p[len("pool:"):]: n for p, n in self.rules if p.startswith("pool:")}
        return json.dumps(pools) if pools else ""

    def limit_for(self, target: str) -> tuple[int, str]:
        """The concurrency limit of ``target`` for the lease script.

        Returns:
            ``(limit, pools)``: the first matching target rule's limit (or ``concurrency``), and
            ``pools``, JSON ``{"<namespace>/<name>": limit}`` of the pool rules (``""``: none),
            used for a proxy of such a pool when no target rule matched (limit then 0).
        """
        for pattern, limit in self.rules:
            if pattern.startswith("pool:"):
                continue
            # (*.example.com: every host under example.com, whose target is example.com itself)
            if fnmatch.fnmatchcase(target, pattern) or (pattern.startswith("*.") and target == pattern[2:]):
                return limit, ""
        return (0 if self._pool_rules else self.concurrency), self._pool_rules

    def metric_label(self, target: str) -> str:
        """The ``target`` label of a metric for ``target``: itself when it is one of
        ``metric_targets`` (or, without that list, one of the first ``metric_top`` targets this
        process counted), else :data:`OTHER`.  Bounded: at most ``metric_top`` + 1 values."""
        if self.metric_targets:
            return target if target in self.metric_targets else OTHER
        with self._lock:
            if target in self._seen:
                return target
            if len(self._seen) < self.metric_top:
                self._seen.add(target)
                return target
        return OTHER


@dataclass(frozen=True)
class Target:
    """The target of one lease request, as the lease script takes it.

    Attributes:
        name: the registrable domain (:func:`app.serving.targets.registrable_domain`).
        limit: live leases per egress IP for it (0: by the proxy's pool rule, ``pools``).
        pools: JSON of the pool rules (``""``: none), :meth:`BanSettings.limit_for`.
    """

    name: str
    limit: int
    pools: str = ""

    @classmethod
    def of(cls, host: str, settings: BanSettings) -> "Target":
        """The target of a request naming ``host``.

        Raises:
            TargetError: ``host`` is not a host name.
        """
        name = registrable_domain(host)
        limit, pools = settings.limit_for(name)
        return cls(name, limit, pools)


def owner(settings: BanSettings, client: str) -> str:
    """The suffix of the ban key of ``client``'s bans: ``""`` fleet-wide, ``#<client>`` per client."""
    return "" if settings.scope == "fleet" else "#" + client


def realm(settings: BanSettings, client: str, scope_lua: str) -> str:
    """The suffix of the refusal keys of ``client``: who a target's refusal is counted and
    enforced for.  A target refusing everyone is a fact about the egress IPs the reporting
    clients may use, so it holds for the clients of the same scope only (and, with
    ``BAN_SCOPE=client``, for the reporting client only): a client can never deny a target to,
    or learn a refusal of, a client of another scope.

    Args:
        settings: :class:`BanSettings` (``scope``).
        client: the client's name.
        scope_lua: its scope as the lease scripts take it (``app.serving.leases.Scope.lua``:
            ``""`` for every proxy).
    Returns:
        ``""`` for a client of every proxy under fleet-wide bans, else ``#<client>`` and/or
        ``@<digest of the scope>``.
    """
    suffix = owner(settings, client)
    if scope_lua:
        suffix += "@" + hashlib.sha256(scope_lua.encode()).hexdigest()[:16]
    return suffix


def proxy_bans(r, identities: list[str], settings: BanSettings) -> list[dict]:
    """Per-target state of egress identities, for ``GET /v1/proxies``.

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        identities: egress IPs (or ``uid:<uid>`` for a proxy whose egress IP is unknown).
        settings: :class:`BanSettings` (the history window).
    Returns:
        per identity, ``{"active": [{"target", "until"}], "recent": n}``: the targets whose
        cooldown of it is live (``until``: epoch seconds), and how many distinct targets banned
        it within the history window (live or ended less than ``history`` seconds ago).
    Raises:
        redis.RedisError: Redis unreachable.
    """
    if not identities:
        return []
    now_s, now_us = r.time()
    now_ms = now_s * 1000 + now_us // 1000
    pipe = r.pipeline(transaction=False)
    for ident in identities:
        pipe.zrangebyscore(redis_keys.ip_bans(ident), f"({now_ms}", "+inf", withscores=True)
        pipe.zcount(redis_keys.ip_bans(ident), now_ms - settings.history * 1000, "+inf")
    raw = pipe.execute()
    out = []
    for i in range(len(identities)):
        active, recent = raw[2 * i], raw[2 * i + 1]
        out.append({"active": [{"target": t, "until": until / 1000.0} for t, until in active],
                    "recent": int(recent)})
    return out


def live_cooldowns(r, now_ms: int | None = None) -> int:
    """Live (egress IP, target) cooldowns over the fleet (the metrics gauge): one ``ZCOUNT``
    whatever the number of bans (and ``TIME`` when ``now_ms`` is not given).

    Args:
        r: ``redis.Redis``.
        now_ms: the Redis clock in ms, when the caller read it already.
    Raises:
        redis.RedisError: Redis unreachable.
    """
    if now_ms is None:
        now_s, now_us = r.time()
        now_ms = now_s * 1000 + now_us // 1000
    return int(r.zcount(redis_keys.BANS, f"({now_ms}", "+inf"))


__all__ = ["BanSettings", "Target", "TargetError", "owner", "realm", "parse_rules", "proxy_bans", "live_cooldowns"]
