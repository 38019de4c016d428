"""Leases: selection and reservation of proxies for crawlers, atomic in Redis.

Selection and reservation run in one Lua script (``EVALSHA``), so under any concurrency no
proxy ever holds more than ``maxLeases`` live leases, and no client more than its own
``maxLeases`` of the tokens file (:class:`api.tokens.Client`).  The script:

0. when the client has a lease limit, counts its live leases
   (:func:`app.store.keys.client_leases`, expired ones dropped first) and refuses with
   ``client_lease_limit`` at the limit, before anything else;
1. drops this client's expired cooldowns, and ends leases that expired since the last
   request (up to :data:`EXPIRE_BATCH` per request; the rest on the next ones), so the lease
   index counts only live leases;
2. if a ``sessionKey`` is given and this client's session is bound to a proxy that is still
   eligible, takes it (sticky session);
3. otherwise reads the lease index (:data:`app.store.keys.LOAD`: the leasable proxies
   with free capacity, fewest live leases first, ties: the lower ``used/maxLeases``) from the
   least-loaded end, and takes the first eligible proxy.  Eligible = healthy (``healthy``
   flag of the serving view), ``maxLeases`` > 0, not draining out of its pool (``drainUntil``
   unset), matching the filters (provider, zone, namespace, pool, label selector), not
   cooling down for this client, and — after purging its
   expired leases — fewer live leases than ``maxLeases``.  A request therefore reads a few
   proxies, not the whole fleet (further only past proxies that are filtered out or cooling
   down for this client).  A proxy that requires basic auth (``authSecret``) is eligible once
   its credentials are in :func:`app.store.keys.auth`.  When none fits, it
   finishes sweeping expired leases if more than :data:`EXPIRE_BATCH` were due (up to
   :data:`EXPIRE_BACKLOG`) and reads the index again, then says why each published proxy was
   excluded (the 503 message): unhealthy or not yet probed (:data:`~app.store.keys.UNHEALTHY`),
   draining (:data:`~app.store.keys.DRAINING`), at ``maxLeases`` (:data:`~app.store.keys.FULL`),
   cooling down for this client, awaiting its credentials, or filtered out.  Without filters
   it reads only the sizes of those sets; with filters, the placement and labels of their
   members, :data:`EXPLAIN_LIMIT` of them at most (the others counted as not examined).  A
   request with a ``pool`` filter for a pool the controller registered
   (:data:`app.store.keys.POOLS`) adds one to that pool's demand count
   (:func:`app.store.keys.pool_demand`: one ``INCR``, nothing else written for the pool); one
   for a pool no entry of which is in the client's scope is refused as ``pool_not_found``
   instead;
4. reserves: adds the lease to the proxy's sorted set of live leases, to the client's and to
   the expiry index, writes the lease record, (re)binds the session, and moves the proxy in
   the index.  The answer carries the proxy's credentials when it requires them.

The lease index is this module's too: every published uid is in exactly one of
:data:`~app.store.keys.LOAD` (leasable with room, scored by load ``used + used / maxLeases / 2``:
live leases first, then the fill ratio), :data:`~app.store.keys.FULL`,
:data:`~app.store.keys.UNHEALTHY` and :data:`~app.store.keys.DRAINING`, so a lease request reads
the least-loaded proxies first instead of scanning the fleet, and its 503 counts why each
proxy was excluded from set sizes alone.  ``reindex`` (``app/store/lua/lease_index.lua``) is what
moves a uid between them; the lease scripts, :func:`reindex`, :func:`queue_reindex` and
:func:`queue_withdraw` (for :mod:`app.serving.view`) and the health engine's record script run it.

Keys (names, types, TTLs and owners in :mod:`app.store.keys`, docs/redis.md), besides the
serving view of :mod:`app.serving.view`: each proxy's live leases (:func:`app.store.keys.proxy_leases`),
the expiry index of every live lease (:data:`app.store.keys.LEASE_EXPIRY`, so expired ones leave
the index without a scan), the lease records (:func:`app.store.keys.lease`, kept
``record_grace`` seconds past expiry so a late renew says "expired" and a late release can
still report an outcome), each client's live leases (:func:`app.store.keys.client_leases`, for
its ``maxLeases``: kept for every client, so a limit added to the tokens file counts the leases
already held; a lease leaves it when it is released, ended by a renewal, taken out by the
expiry sweep or its proxy withdrawn), the clients' cooldowns (:func:`app.store.keys.cooldown`)
and sticky sessions (:func:`app.store.keys.sticky`).

All times come from the Redis server's clock (``TIME``), so several API processes agree.
The scripts touch keys derived from the arguments (per proxy, per lease), which is fine on a
single Redis (the deployment here) but not on Redis Cluster.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from functools import cached_property
from urllib.parse import quote

import orjson

from app.store import keys as redis_keys
from app.store.lua import Lua
from app.serving.selectors import Requirement, as_lua, matches
from app.serving.records import ServingRecord, load_all
from app.serving.bans import BanSettings, Target, owner as ban_owner, proxy_bans, realm as ban_realm
from app.config.settings import env_number
from app.timefmt import rfc3339

OUTCOMES = ("ok", "blocked", "failed")
#: Error codes raised as :class:`LeaseError` (the API maps them to HTTP statuses).
NO_PROXY_AVAILABLE = "no_proxy_available"
LEASE_NOT_FOUND = "lease_not_found"
NOT_LEASE_OWNER = "not_lease_owner"
LEASE_EXPIRED = "lease_expired"
PROXY_UNAVAILABLE = "proxy_unavailable"
CLIENT_LEASE_LIMIT = "client_lease_limit"
POOL_NOT_FOUND = "pool_not_found"
TARGET_REFUSING = "target_refusing"

#: Expired leases one request takes out of the lease index at most (the rest: next requests).
EXPIRE_BATCH = 100
#: Expired leases a request that found no room sweeps at most before it reads the index again
#: (beyond this many due at once, a full proxy freed by an unswept expiry can be counted full
#: in one 503; the next requests sweep the rest).
EXPIRE_BACKLOG = 10_000
#: Proxies one page of the lease index holds (the script reads pages until one fits).
INDEX_PAGE = 32

#: Not-leasable proxies (full, unhealthy, draining) whose placement and labels a filtered
#: ``no_proxy_available`` reads at most to say why each was excluded; the others are counted as
#: not examined, so one 503 of a big fleet stays a bounded read in Redis (which runs the script
#: alone: every other lease waits for it).
EXPLAIN_LIMIT = 1_000

#: The module's limits, written into the lease script (fewer arguments to send per request).
_LIMITS = (f"local expire_batch, index_page, expire_backlog, explain_limit = {EXPIRE_BATCH}, {INDEX_PAGE}, "
           f"{EXPIRE_BACKLOG}, {EXPLAIN_LIMIT}\n")

_ACQUIRE = Lua("now", "lease_index", "lease_acquire", prelude=_LIMITS)
_RENEW = Lua("now", "lease_index", "lease_renew")
_RELEASE = Lua("now", "lease_index", "lease_release")
#: The index keys the lease script takes as KEYS.
_INDEX_KEYS = [redis_keys.LOAD, redis_keys.FULL]


# -- the lease index ------------------------------------------------------------------------------

_REINDEX = Lua("now", "lease_index", "lease_reindex")
_FORGET = Lua("lease_forget")


def reindex(r, uid: str) -> int:
    """Bring ``uid``'s place in the lease index in step with its serving record.

    Only for code that writes ``healthy`` or ``maxLeases`` itself (the product's writers do it
    atomically).  Atomic; a missing record takes the uid out of the index.

    Returns:
        the proxy's live leases, 0 when it is not leasable.
    """
    return int(_REINDEX(r, [], [uid]))


def reindex_all(r) -> int:
    """Rebuild the lease index entry of every published proxy (idempotent, atomic per proxy).

    The API runs it when it starts, so an index that predates a proxy's record (an upgrade,
    a restored Redis) is whole before the first lease.

    Returns:
        how many proxies the index holds (leasable, with free capacity).
    Raises:
        redis.RedisError: Redis unreachable.
    """
    # Members of the index whose record is gone (written by an older version that did not
    # know one of its sets) are taken out as well.
    uids = sorted(r.smembers(redis_keys.PROXIES) | r.smembers(redis_keys.FULL)
                  | set(r.zrange(redis_keys.LOAD, 0, -1))
                  | r.smembers(redis_keys.UNHEALTHY) | r.smembers(redis_keys.DRAINING))
    pipe = r.pipeline(transaction=False)
    for uid in uids:
        _REINDEX(pipe, [], [uid])
    pipe.execute()
    return int(r.zcard(redis_keys.LOAD))


def queue_reindex(pipe, uid: str) -> None:
    """Queue :func:`reindex` of ``uid`` on the pipeline ``pipe`` (in the same transaction as the
    record write that calls for it, :func:`app.serving.view.publish`)."""
    _REINDEX(pipe, [], [uid])


def queue_withdraw(pipe, uid: str) -> None:
    """Queue on the pipeline ``pipe`` the end of ``uid``'s place in the lease index and of its live
    leases: out of the expiry index, their clients' counts and the index's sets
    (:func:`app.serving.view.withdraw`, in its transaction)."""
    _FORGET(pipe, [redis_keys.proxy_leases(uid)], [uid])
    pipe.delete(redis_keys.proxy_leases(uid), redis_keys.target_ident(uid))
    pipe.zrem(redis_keys.LOAD, uid)
    pipe.srem(redis_keys.FULL, uid)
    pipe.srem(redis_keys.UNHEALTHY, uid)
    pipe.srem(redis_keys.DRAINING, uid)


class LeaseError(Exception):
    """A lease operation that cannot be done.

    Attributes:
        code: stable error code (:data:`NO_PROXY_AVAILABLE`, :data:`LEASE_NOT_FOUND`,
            :data:`NOT_LEASE_OWNER`, :data:`LEASE_EXPIRED`, :data:`PROXY_UNAVAILABLE`,
            :data:`CLIENT_LEASE_LIMIT`, :data:`POOL_NOT_FOUND`, :data:`TARGET_REFUSING`).
        message: human-readable explanation.
        retry_after: whole seconds after which the same request may succeed without anything
            else changing (:data:`CLIENT_LEASE_LIMIT` of an acquire: until the client's
            earliest lease expires; :data:`TARGET_REFUSING`: until the target's cool-off ends;
            a targeted :data:`NO_PROXY_AVAILABLE`: until the first banned or busy egress IP
            frees up), else ``None``.
        target: the target of a refused targeted request, else ``None``.
        limited: for a targeted :data:`NO_PROXY_AVAILABLE`, how many egress IPs were banned for the
            target and how many at its concurrency limit (``{"banned": n, "busy": n}``), else ``None``.
    """

    def __init__(self, code: str, message: str, retry_after: int | None = None, *, target: str | None = None,
                 limited: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after = code, message, retry_after
        self.target, self.limited = target, limited


@dataclass(frozen=True)
class LeaseSettings:
    """Lease rules (seconds).

    Attributes:
        default_ttl: TTL when a request names none (``LEASE_DEFAULT_TTL``, 300).
        max_ttl: largest TTL a request may ask for (``LEASE_MAX_TTL``, 3600).
        cooldown: how long a proxy released as ``blocked``/``failed`` is not leased to that
            client again (``LEASE_COOLDOWN_SECONDS``, 600; 0 = no cooldown).
        sticky_ttl: how long a session stays bound to its proxy after its last use
            (``LEASE_STICKY_TTL``, 3600).
        record_grace: how long a lease record outlives its expiry (``LEASE_RECORD_GRACE``, 600).
    Raises:
        ValueError: ``default_ttl`` > ``max_ttl`` or a value below its minimum.
    """

    default_ttl: int = 300
    max_ttl: int = 3600
    cooldown: int = 600
    sticky_ttl: int = 3600
    record_grace: int = 600

    def __post_init__(self) -> None:
        if not 1 <= self.default_ttl <= self.max_ttl:
            raise ValueError(f"lease default TTL {self.default_ttl}s must be between 1 and the maximum "
                             f"TTL {self.max_ttl}s")
        if self.cooldown < 0 or self.sticky_ttl < 1 or self.record_grace < 1:
            raise ValueError("lease cooldown must be >= 0, sticky TTL and record grace >= 1")

    @classmethod
    def from_env(cls) -> "LeaseSettings":
        """Read the settings from the environment (names in the attribute list)."""
        return cls(
            default_ttl=int(env_number("LEASE_DEFAULT_TTL", cls.default_ttl, minimum=1, integer=True)),
            max_ttl=int(env_number("LEASE_MAX_TTL", cls.max_ttl, minimum=1, integer=True)),
            cooldown=int(env_number("LEASE_COOLDOWN_SECONDS", cls.cooldown, minimum=0, integer=True)),
            sticky_ttl=int(env_number("LEASE_STICKY_TTL", cls.sticky_ttl, minimum=1, integer=True)),
            record_grace=int(env_number("LEASE_RECORD_GRACE", cls.record_grace, minimum=1, integer=True)),
        )


@dataclass(frozen=True)
class Filters:
    """Which proxies a request accepts (``None`` = any).

    Attributes:
        provider / zone / namespace: exact matches.
        selector: label requirements (:func:`app.serving.selectors.parse`).
        pool: the name of the ProxyPool the proxy is a member of (its serving record's ``pool``).
            A ``no_proxy_available`` for a pool the controller registered counts as demand for
            it (:mod:`app.pools.demand`).
    """

    provider: str | None = None
    zone: str | None = None
    namespace: str | None = None
    selector: tuple[Requirement, ...] = field(default_factory=tuple)
    pool: str | None = None

    def to_json(self) -> str:
        """Encode for the lease script (no filters, most requests: encoded once)."""
        return _ANY_JSON if self == _ANY else self._encode()

    def _encode(self) -> str:
        doc: dict = {"selector": as_lua(self.selector)}
        for key in ("provider", "zone", "namespace", "pool"):
            value = getattr(self, key)
            if value is not None:
                doc[key] = value
        return json.dumps(doc)

    def matches(self, record: ServingRecord) -> bool:
        """Whether a serving-view record passes the filters (same rules as the script)."""
        if self.provider is not None and record.provider != self.provider:
            return False
        if self.zone is not None and record.zone != self.zone:
            return False
        if self.namespace is not None and record.namespace != self.namespace:
            return False
        if self.pool is not None and record.pool != self.pool:
            return False
        return matches(self.selector, record.labels)


@dataclass(frozen=True)
class Scope:
    """Which proxies a client may see and lease: the operator's trust boundary (tokens file).

    A proxy is in scope when its namespace is in ``namespaces`` or its ProxyPool, as
    ``"<namespace>/<name>"``, is in ``pools`` (either suffices).  ``"*"`` in ``namespaces``
    puts every proxy in scope.  Request filters only narrow a scope: a ``pool`` or ``namespace``
    filter never reaches past it.

    Attributes:
        namespaces: namespaces whose proxies are in scope (``"*"``: every namespace).
        pools: ``"<namespace>/<name>"`` of ProxyPools whose members are in scope.
    """

    namespaces: frozenset[str] = frozenset()
    pools: frozenset[str] = frozenset()

    @cached_property
    def everything(self) -> bool:
        """Whether every proxy is in scope."""
        return "*" in self.namespaces

    def allows(self, namespace: str, pool: str) -> bool:
        """Whether a proxy of ``namespace``, member of the pool named ``pool`` (``""``: none), is
        in scope."""
        return (self.everything or namespace in self.namespaces
                or (pool != "" and f"{namespace}/{pool}" in self.pools))

    @cached_property
    def lua(self) -> str:
        """Encoded for the lease scripts (once per scope): ``""`` for everything, else
        ``{"ns": {<namespace>: true}, "pools": {<namespace>/<name>: true}}`` (sets as tables:
        one lookup per proxy read)."""
        if self.everything:
            return ""
        return json.dumps({"ns": {n: True for n in sorted(self.namespaces)},
                           "pools": {p: True for p in sorted(self.pools)}})


#: Every proxy: the scope of a client when no tokens file restricts it (library callers, tests).
EVERYTHING = Scope(frozenset({"*"}))

#: No filters, and their :meth:`Filters.to_json`.
_ANY = Filters()
_ANY_JSON = _ANY._encode()


@dataclass(frozen=True)
class Lease:
    """A granted (or renewed) lease.

    Attributes:
        id: lease id (32 hex digits).
        uid / namespace / name / provider / zone: the proxy.
        host / port: where to send requests.
        egress_ip: the proxy's egress IP, if known.
        expires_at: epoch seconds (Redis clock).
        ttl: seconds the lease was granted or renewed for.
        used / max_leases: the proxy's live leases (this one included) and its maximum.
        session_key: the sticky session, if any.
        target: the target (registrable domain) the lease is for, if any.
        sticky: whether the session's existing proxy was reused.
        username / password: the proxy's basic-auth credentials when it requires them, else
            ``None`` (left out of ``repr``: never log them).
    """

    id: str
    uid: str
    namespace: str
    name: str
    provider: str
    zone: str
    host: str
    port: int
    egress_ip: str | None
    expires_at: float
    ttl: int
    used: int
    max_leases: int
    session_key: str | None = None
    sticky: bool = False
    target: str | None = None
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    @property
    def proxy_url(self) -> str:
        """``http://host:port`` (IPv6 hosts in brackets), with the credentials when the proxy
        requires them: ``http://user:pa%24s@host:port``, each part percent-encoded (RFC 3986:
        everything but letters, digits and ``-._~``), as HTTP clients expect in a proxy URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.username is None:
            return f"http://{host}:{self.port}"
        return f"http://{quote(self.username, safe='')}:{quote(self.password or '', safe='')}@{host}:{self.port}"

    def expires_rfc3339(self) -> str:
        """Expiry as RFC 3339 UTC with milliseconds."""
        return rfc3339(self.expires_at, millis=True)


def _str(value) -> str:
    return value if isinstance(value, str) else ""


def _lease(lease_id: str, doc: dict, session_key: str | None) -> Lease:
    return Lease(
        id=lease_id, uid=doc["uid"], namespace=_str(doc.get("namespace")), name=_str(doc.get("name")),
        provider=_str(doc.get("provider")), zone=_str(doc.get("zone")), host=_str(doc.get("address")),
        port=int(_str(doc.get("port")) or 0), egress_ip=_str(doc.get("egressIP")) or None,
        expires_at=int(doc["expiresAt"]) / 1000.0, ttl=int(doc["ttl"]) // 1000, used=int(doc["used"]),
        max_leases=int(_str(doc.get("maxLeases")) or 0), session_key=session_key or None,
        sticky=bool(doc.get("sticky")), target=_str(doc.get("target")) or None,
        username=doc["username"] if isinstance(doc.get("username"), str) else None,
        password=_str(doc.get("password")) if isinstance(doc.get("username"), str) else None,
    )


def new_lease_id() -> str:
    """Return a fresh random lease id (32 hex digits)."""
    return secrets.token_hex(16)


def _limit(value: int | None) -> str:
    """A client's lease limit as the scripts take it (``""`` = none)."""
    return "" if value is None else str(int(value))


def client_limit_message(client: str, counts: dict) -> str:
    """The message of a ``client_lease_limit`` error, from the lease script's counts.

    Args:
        client: the client's name (never its token).
        counts: ``held`` (the client's live leases, counting the renewed one) and ``max`` (its
            ``maxLeases``); ``renew`` is 1 for a refused renewal, whose ``expiresAt`` (ms) it
            keeps.
    Returns:
        e.g. ``"client 'crawler-a' holds 3 live leases, its limit (maxLeases in the tokens
        file) is 3: release a lease or wait for one to expire"``.
    """
    held, limit = int(counts.get("held") or 0), int(counts.get("max") or 0)
    if counts.get("renew"):
        until = rfc3339(int(counts.get("expiresAt") or 0) / 1000.0)
        return (f"client {client!r} holds {held} live leases, more than its limit (maxLeases in the tokens file) "
                f"of {limit}: this lease is not renewed and ends at its expiry, "
                f"{until}; release leases to get back under the limit")
    if limit == 0:
        return f"client {client!r} may hold no leases (maxLeases 0 in the tokens file)"
    return (f"client {client!r} holds {held} live leases, its limit (maxLeases in the tokens file) is {limit}: "
            "release a lease or wait for one to expire")


def acquire(r, client: str, filters: Filters, *, ttl: int, settings: LeaseSettings,
            session_key: str | None = None, client_max_leases: int | None = None,
            scope: Scope = EVERYTHING, target: Target | None = None,
            bans: BanSettings | None = None) -> Lease:
    """Pick an eligible proxy and reserve a lease on it for ``client`` (atomic).

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        client: the authenticated client's name.
        filters: which proxies qualify.
        ttl: lease TTL in seconds (the caller checked it against ``settings.max_ttl``).
        settings: :class:`LeaseSettings`.
        session_key: sticky-session key, or ``None``.
        client_max_leases: live leases ``client`` may hold at once (its ``maxLeases`` in the
            tokens file), ``None`` for no limit.  Counted in the same script as the lease, so
            concurrent requests never take the client past it.
        scope: the proxies ``client`` may lease at all (:class:`Scope`); the filters narrow it,
            a sticky session outside it is not honoured, and the 503's counts cover only it.
        target: the site the lease is for (:class:`app.serving.bans.Target`), or ``None``: then
            no proxy whose egress IP is banned for it or holds its concurrency limit of live
            leases for it is chosen, and the lease counts towards that limit.
        bans: the ban rules (:class:`app.serving.bans.BanSettings`; default: its defaults), for
            the scope of the bans a targeted request honours.
    Returns:
        the :class:`Lease`, with the proxy's credentials when it requires basic auth.
    Raises:
        LeaseError: ``client_lease_limit`` (the client holds ``client_max_leases`` live leases;
            ``retry_after``: seconds until the earliest of them expires, ``None`` when the
            limit is 0), checked first; ``no_proxy_available``, the message counting the
            published proxies and why each was excluded (:func:`no_proxy_message`);
            ``pool_not_found`` when nothing fits and ``filters.pool`` names no ProxyPool the
            controller registered (:data:`app.store.keys.POOLS`) in ``scope`` (of
            ``filters.namespace`` when given; a pool outside the scope is refused alike), while a
            registered pool without a proxy to lease stays ``no_proxy_available``;
            ``target_refusing`` when ``target`` refuses everyone (cool-off, ``retry_after``).
    """
    lease_id = new_lease_id()
    args = [client, lease_id, int(ttl) * 1000, filters.to_json(), session_key or "", settings.sticky_ttl,
            settings.record_grace * 1000, _limit(client_max_leases), scope.lua]
    if target is not None:
        b = bans or _BANS
        args += [target.name, ban_owner(b, client), target.limit, target.pools, ban_realm(b, client, scope.lua),
                 b.history * 1000]
    raw = _ACQUIRE(r, _INDEX_KEYS, args)
    doc = orjson.loads(raw)  # the script's cjson answer
    if "error" in doc:
        if doc["error"] == TARGET_REFUSING:
            cooloff = max(1, -(-(int(doc["untilMs"]) - int(doc["now"])) // 1000))
            raise LeaseError(TARGET_REFUSING, target_refusing_message(doc["target"], cooloff), cooloff,
                             target=doc["target"])
        if doc["error"] == CLIENT_LEASE_LIMIT:
            wait: int | None = None
            if int(doc.get("held") or 0) > 0:
                wait = max(1, -(-(int(doc["nextExpiry"]) - int(doc["now"])) // 1000))
            raise LeaseError(CLIENT_LEASE_LIMIT, client_limit_message(client, doc), wait)
        if doc["error"] == POOL_NOT_FOUND:
            raise LeaseError(POOL_NOT_FOUND, pool_not_found_message(filters))
        if target is not None:
            frees: int | None = None
            if int(doc.get("nextFree") or 0) > 0:
                frees = max(1, -(-(int(doc["nextFree"]) - int(doc["now"])) // 1000))
            raise LeaseError(NO_PROXY_AVAILABLE, no_proxy_message(doc), frees, target=target.name,
                             limited={"banned": int(doc.get("banned") or 0), "busy": int(doc.get("busy") or 0)})
        raise LeaseError(NO_PROXY_AVAILABLE, no_proxy_message(doc))
    return _lease(lease_id, doc, session_key)


_BANS = BanSettings()


def target_refusing_message(target: str, wait: int) -> str:
    """The message of a ``target_refusing`` error.

    Args:
        target: the target (registrable domain).
        wait: seconds until its cool-off ends.
    Returns:
        e.g. ``"target 'example.com' refuses every egress IP (TARGET_REFUSAL_IPS different IPs
        reported blocked within TARGET_REFUSAL_WINDOW_SECONDS): no proxy is spent on it for
        another 120 s"``.
    """
    return (f"target {target!r} refuses every egress IP (TARGET_REFUSAL_IPS different IPs reported blocked "
            f"within TARGET_REFUSAL_WINDOW_SECONDS): no proxy is spent on it for another {wait} s")


def pool_not_found_message(filters: Filters) -> str:
    """The message of a ``pool_not_found`` error: the pool (and namespace) the request named.

    Returns:
        e.g. ``"no ProxyPool 'web' in namespace 'crawl' (pool, namespace): check the name, or wait
        until the controller has reconciled a new pool"``.
    """
    where = f" in namespace {filters.namespace!r}" if filters.namespace is not None else ""
    fields = "pool, namespace" if filters.namespace is not None else "pool"
    return (f"no ProxyPool {filters.pool!r}{where} ({fields}): check the name, or wait until the controller "
            "has reconciled a new pool")


def no_proxy_message(counts: dict) -> str:
    """The message of a ``no_proxy_available`` error, from the lease script's counts.

    Args:
        counts: ``published`` (proxies in the serving view; for a scoped client, ``scoped`` 1,
            those of its scope), ``filtered`` (1 when the request had filters or a scope), and of
            the proxies the filters let through, why each was excluded:
            ``unhealthy`` (unhealthy or not yet probed), ``draining`` (``maxLeases`` 0, or
            leaving its pool),
            ``full`` (at ``maxLeases``), ``cooling`` (cooling down for this client), ``nocreds``
            (requires basic auth, credentials not copied yet); ``unexamined``: full, unhealthy
            or draining proxies a filtered request did not read (past :data:`EXPLAIN_LIMIT`);
            ``partial``: 1 when a scoped client's request left some unread (their number, which
            would describe other teams' fleet, is not given); for a targeted request ``target``,
            ``banned`` (egress IP in cooldown for it), ``busy`` (egress IP at its concurrency
            limit) and ``limit`` (that limit, 0: by pool).
    Returns:
        e.g. ``"no proxy can be leased now: 3 published; excluded: 1 unhealthy or not yet
        probed, 0 draining (maxLeases 0 or leaving a pool), 2 at maxLeases, 0 cooling down for
        this client, 0 filtered out"``, ending with ``", 40 not examined (a filtered request
        reads 1000 unavailable proxies at most)"`` when some were not read.
    """
    reasons = {k: int(counts.get(k) or 0)
               for k in ("unhealthy", "draining", "full", "cooling", "nocreds", "banned", "busy")}
    published = int(counts.get("published") or 0)
    unexamined = int(counts.get("unexamined") or 0)
    # Every published proxy is in exactly one of the lease index's sets, so what the filters
    # let through adds up to the published count; the rest was filtered out (or not examined).
    filtered_out = max(0, published - sum(reasons.values()) - unexamined) if counts.get("filtered") else 0
    where = " in this client's scope" if counts.get("scoped") else ""
    text = (f"no proxy can be leased now: {published} published{where}; excluded: "
            f"{reasons['unhealthy']} unhealthy or not yet probed, "
            f"{reasons['draining']} draining (maxLeases 0 or leaving a pool), "
            f"{reasons['full']} at maxLeases, {reasons['cooling']} cooling down for this client, "
            f"{filtered_out} filtered out")
    if counts.get("target"):
        limit = int(counts.get("limit") or 0)
        per = f"{limit} live lease{'s' if limit != 1 else ''}" if limit else "its pool's limit of live leases"
        text += (f", {reasons['banned']} with an egress IP banned by {counts['target']} (cooling down for it), "
                 f"{reasons['busy']} with an egress IP at {counts['target']}'s concurrency limit ({per} per egress IP)")
    if reasons["nocreds"]:
        text += f", {reasons['nocreds']} awaiting their basic-auth credentials (copied at the next probe)"
    if unexamined:
        text += (f", {unexamined} not examined (a filtered request reads {EXPLAIN_LIMIT} unavailable "
                 f"proxies at most)")
    if counts.get("partial"):
        text += (f", and some not examined (a filtered request reads {EXPLAIN_LIMIT} unavailable proxies at "
                 "most: the count above is a lower bound)")
    return text


_MESSAGES = {
    LEASE_NOT_FOUND: "no such lease (never granted, released, or forgotten after expiry)",
    NOT_LEASE_OWNER: "this lease belongs to another client",
    LEASE_EXPIRED: "the lease expired; ask for a new one",
    PROXY_UNAVAILABLE: "the lease's proxy is no longer healthy or leasable; the lease was ended",
}


def renew(r, client: str, lease_id: str, *, ttl: int | None, settings: LeaseSettings,
          client_max_leases: int | None = None, scope: Scope = EVERYTHING) -> Lease:
    """Extend a live lease of ``client`` to ``ttl`` seconds from now (default: its last TTL).

    Args:
        r: ``redis.Redis`` (``decode_responses=True``).
        client: the authenticated client's name.
        lease_id: the lease (32 hex digits).
        ttl: new TTL in seconds (checked by the caller), ``None`` for the lease's last TTL.
        settings: :class:`LeaseSettings`.
        client_max_leases: the client's ``maxLeases`` (tokens file), ``None`` for no limit.  A
            client holding more live leases than that (its limit was lowered) gets no renewal:
            renewals never keep it above its limit.
        scope: the proxies ``client`` may lease (:class:`Scope`); a lease whose proxy is no
            longer in it (the tokens file narrowed the scope) ends: ``proxy_unavailable``.
    A lease on a proxy draining out of its pool (``drainUntil``) is renewed up to that time at
    most (``Lease.ttl`` and ``expires_at`` say how long it really runs; ``ttl`` is never 0);
    from one second before it on the renewal ends the lease: ``proxy_unavailable``.

    Returns:
        the renewed :class:`Lease`.
    Raises:
        LeaseError: ``lease_not_found``, ``not_lease_owner``, ``lease_expired``,
            ``proxy_unavailable`` (the proxy turned unhealthy or was drained; the lease ends) or
            ``client_lease_limit`` (over the limit; the lease is left to run out at its expiry).
    """
    raw = _RENEW(r, [], [lease_id, client, "" if ttl is None else int(ttl) * 1000,
                         settings.record_grace * 1000, settings.sticky_ttl, _limit(client_max_leases),
                         scope.lua])
    doc = orjson.loads(raw)  # the script's cjson answer
    if "error" in doc:
        if doc["error"] == CLIENT_LEASE_LIMIT:
            raise LeaseError(CLIENT_LEASE_LIMIT, client_limit_message(client, doc))
        raise LeaseError(doc["error"], _MESSAGES[doc["error"]])
    return _lease(lease_id, doc, _str(doc.get("sessionKey")))


@dataclass(frozen=True)
class Release:
    """The result of a release.

    Attributes:
        uid: the proxy.
        live: whether the lease was still live.
        cooldown_until: end of the cooldown started (epoch seconds; of the (egress IP, target)
            pair for a targeted lease), ``None`` for none.
        target: the lease's target, ``None`` for an untargeted lease.
        banned: whether the release banned the pair (egress IP, target).
        strikes: that pair's ban count (the cooldown doubles with each), 0 when not banned.
        refusing_until: end of the target's cool-off as a target refusing everyone (epoch
            seconds), ``None`` when it is not refusing.
        refused_now: whether this very release found the target refusing everyone.
    """

    uid: str
    live: bool
    cooldown_until: float | None
    target: str | None = None
    banned: bool = False
    strikes: int = 0
    refusing_until: float | None = None
    refused_now: bool = False


def release(r, client: str, lease_id: str, *, outcome: str, settings: LeaseSettings,
            bans: BanSettings | None = None) -> Release:
    """End a lease of ``client``; ``blocked``/``failed`` start a cooldown of its proxy for this
    client, or, for a lease with a target, of its egress IP for that target (fleet-wide by
    default; :mod:`app.serving.bans`, whose rules ``bans`` gives: default its defaults).

    A lease that already expired (but is still remembered) can be released, so its outcome
    still counts.

    Raises:
        ValueError: ``outcome`` not in :data:`OUTCOMES`.
        LeaseError: ``lease_not_found`` or ``not_lease_owner``.
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}")
    # a request id: the same release run again after its answer was lost gets that answer
    b = bans or _BANS
    raw = _RELEASE(r, [], [lease_id, client, outcome, settings.cooldown * 1000, secrets.token_hex(8),
                           ban_owner(b, client), b.cooldown * 1000, b.cooldown_max * 1000, b.decay * 1000,
                           b.history * 1000, b.refusal_ips, b.refusal_window * 1000, b.refusal_cooloff * 1000])
    doc = orjson.loads(raw)  # the script's cjson answer
    if "error" in doc:
        raise LeaseError(doc["error"], _MESSAGES[doc["error"]])
    until = int(doc["cooldownUntil"])
    refusing = int(doc.get("refusingUntil") or 0)
    return Release(doc["uid"], bool(doc["live"]), until / 1000.0 if until else None,
                   target=_str(doc.get("target")) or None, banned=bool(doc.get("banned")),
                   strikes=int(doc.get("strikes") or 0), refusing_until=refusing / 1000.0 if refusing else None,
                   refused_now=bool(doc.get("refusedNow")))


def discover(r, filters: Filters, healthy: bool | None = None, scope: Scope = EVERYTHING,
             bans: BanSettings | None = None) -> list[dict]:
    """Return the published proxies in ``scope`` passing ``filters`` (and ``healthy``, when not
    ``None``).

    Each item: ``namespace name address port provider zone egressIP labels pool draining`` plus
    ``health {healthy state reason lastProbeTime latencyMs}``, ``leases {used max}``
    (live leases counted without modifying anything) and ``bans {active: [{target, until}],
    recent}``: the targets whose ban of the proxy's egress IP is live (``until``: RFC 3339), and
    how many distinct targets banned it within ``bans.history`` seconds
    (:func:`app.serving.bans.proxy_bans`).  ``pool`` is the ProxyPool the proxy is a
    member of (``None``: none), ``draining`` whether it is leaving it (no new leases).  Sorted
    by namespace and name.
    """
    recs = load_all(r)
    chosen = [(uid, rec) for uid, rec in recs.items()
              if scope.allows(rec.namespace, rec.pool) and filters.matches(rec)
              and (healthy is None or rec.healthy == healthy)]
    if not chosen:
        return []
    now_s, now_us = r.time()
    now_ms = now_s * 1000 + now_us // 1000
    pipe = r.pipeline(transaction=False)
    for uid, _ in chosen:
        pipe.zcount(redis_keys.proxy_leases(uid), f"({now_ms}", "+inf")
    counts = pipe.execute()
    idents = [rec.egress_ip or f"uid:{uid}" for uid, rec in chosen]
    per_ip = proxy_bans(r, idents, bans or _BANS)
    out = []
    for (_uid, rec), used, banned in zip(chosen, counts, per_ip, strict=True):
        out.append({
            "namespace": rec.namespace, "name": rec.name, "address": rec.address, "port": rec.port,
            "provider": rec.provider or None, "zone": rec.zone or None,
            "egressIP": rec.egress_ip or None, "labels": rec.labels,
            "pool": rec.pool or None, "draining": rec.drain_until is not None,
            "health": {
                "healthy": rec.healthy, "state": rec.health, "reason": rec.last_reason or None,
                "lastProbeTime": rec.last_probe_time or None, "latencyMs": rec.latency_ms,
            },
            "leases": {"used": int(used), "max": rec.max_leases},
            "bans": {"active": [{"target": b["target"], "until": rfc3339(b["until"], millis=True)}
                                for b in banned["active"]],
                     "recent": banned["recent"]},
        })
    out.sort(key=lambda item: (item["namespace"], item["name"]))
    return out


def live_counts(r, uids: list[str]) -> dict[str, int]:
    """Return ``{uid: live leases}`` for ``uids`` (unexpired members of each proxy's lease set,
    counted without modifying anything; 0 for an unknown uid).  One round trip plus ``TIME``.

    Raises:
        redis.RedisError: Redis unreachable.
    """
    if not uids:
        return {}
    now_s, now_us = r.time()
    now_ms = now_s * 1000 + now_us // 1000
    pipe = r.pipeline(transaction=False)
    for uid in uids:
        pipe.zcount(redis_keys.proxy_leases(uid), f"({now_ms}", "+inf")
    return {uid: int(n) for uid, n in zip(uids, pipe.execute(), strict=True)}


def live_leases(r, now_ms: int | None = None) -> int:
    """Return the number of live leases over all published proxies (for the metrics gauge).

    Two Redis commands whatever the fleet's size (``TIME``, then ``ZCOUNT`` of the expiry
    index :data:`app.store.keys.LEASE_EXPIRY`, which holds every live lease: granted, renewed, released and
    withdrawn leases keep it in step), so a ``/metrics`` scrape costs the same with 10 or
    10,000 proxies.  ``now_ms``: the Redis clock in ms when the caller read it already (then
    one command).

    Raises:
        redis.RedisError: Redis unreachable.
    """
    if now_ms is None:
        now_s, now_us = r.time()
        now_ms = now_s * 1000 + now_us // 1000
    return int(r.zcount(redis_keys.LEASE_EXPIRY, f"({now_ms}", "+inf"))
