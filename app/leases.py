"""Leases: selection and reservation of proxies for crawlers, atomic in Redis.

Selection and reservation run in one Lua script (``EVALSHA``), so under any concurrency no
proxy ever holds more than ``maxLeases`` live leases, and no client more than its own
``maxLeases`` of the tokens file (:class:`app.tokens.Client`).  The script:

0. when the client has a lease limit, counts its live leases (``po:client-leases:<client>``,
   expired ones dropped first) and refuses with ``client_lease_limit`` at the limit, before
   anything else;
1. drops this client's expired cooldowns, and ends leases that expired since the last
   request (up to :data:`EXPIRE_BATCH` per request; the rest on the next ones), so the lease
   index counts only live leases;
2. if a ``sessionKey`` is given and this client's session is bound to a proxy that is still
   eligible, takes it (sticky session);
3. otherwise reads the lease index (``po:load`` of :mod:`app.serving`: the leasable proxies
   with free capacity, fewest live leases first, ties: the lower ``used/maxLeases``) from the
   least-loaded end, and takes the first eligible proxy.  Eligible = healthy (``healthy``
   flag of the serving view), ``maxLeases`` > 0, matching the filters (provider, zone,
   namespace, label selector), not cooling down for this client, and — after purging its
   expired leases — fewer live leases than ``maxLeases``.  A request therefore reads a few
   proxies, not the whole fleet (further only past proxies that are filtered out or cooling
   down for this client).  A proxy that requires basic auth (``authSecret``) is eligible once
   its credentials are in ``po:auth:<uid>`` (:mod:`app.serving`).  When none fits, it
   finishes sweeping expired leases if more than :data:`EXPIRE_BATCH` were due (up to
   :data:`EXPIRE_BACKLOG`) and reads the index again, then says why each published proxy was
   excluded (the 503 message): unhealthy or not yet probed (``po:unhealthy``), draining
   (``po:draining``), at ``maxLeases`` (``po:full``), cooling down for this client, awaiting
   its credentials, or filtered out.  Without filters it reads only the sizes of those sets;
   with filters, the placement and labels of their members;
4. reserves: adds the lease to the proxy's sorted set of live leases, to the client's and to
   the expiry index, writes the lease record, (re)binds the session, and moves the proxy in
   the index.  The answer carries the proxy's credentials when it requires them.

Keys (besides the serving view of :mod:`app.serving`):

* ``po:leases:<uid>`` — sorted set lease id → expiry (ms since the epoch, Redis clock);
* ``po:lease-expiry`` — sorted set ``<uid>/<lease id>`` → expiry (ms): every live lease, so
  expired ones leave the index without a scan;
* ``po:lease:<id>`` — hash ``uid client ttl expiresAt createdAt sessionKey``, kept
  ``record_grace`` seconds past expiry so a late renew says "expired" and a late release can
  still report an outcome;
* ``po:client-leases:<client>`` — sorted set lease id → expiry (ms): the client's live leases,
  for its ``maxLeases``.  Kept for every client (so a limit added to the tokens file counts
  the leases already held); a lease leaves it when it is released, ended by a renewal
  (``proxy_unavailable``, ``lease_expired``), taken out by the expiry sweep, or its proxy is
  withdrawn (:func:`app.serving.withdraw`); entries past their expiry are dropped before every
  count, and the key expires with its last lease;
* ``po:cooldown:<client>`` — sorted set uid → end of the cooldown (ms);
* ``po:sticky:<client>:<sessionKey>`` — the uid a session is bound to (expires after
  ``sticky_ttl`` seconds without use).

All times come from the Redis server's clock (``TIME``), so several API processes agree.
The scripts touch keys derived from the arguments (per proxy, per lease), which is fine on a
single Redis (the deployment here) but not on Redis Cluster.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import quote

from app import serving
from app.selectors import Requirement, as_lua, matches
from app.settings import env_number

OUTCOMES = ("ok", "blocked", "failed")
#: Error codes raised as :class:`LeaseError` (the API maps them to HTTP statuses).
NO_PROXY_AVAILABLE = "no_proxy_available"
LEASE_NOT_FOUND = "lease_not_found"
NOT_LEASE_OWNER = "not_lease_owner"
LEASE_EXPIRED = "lease_expired"
PROXY_UNAVAILABLE = "proxy_unavailable"
CLIENT_LEASE_LIMIT = "client_lease_limit"

#: Expired leases one request takes out of the lease index at most (the rest: next requests).
EXPIRE_BATCH = 100
#: Expired leases a request that found no room sweeps at most before it reads the index again
#: (beyond this many due at once, a full proxy freed by an unswept expiry can be counted full
#: in one 503; the next requests sweep the rest).
EXPIRE_BACKLOG = 10_000
#: Proxies one page of the lease index holds (the script reads pages until one fits).
INDEX_PAGE = 32
#: Sorted set ``<uid>/<lease id>`` -> expiry (ms) of every live lease.
EXPIRY_KEY = "po:lease-expiry"

_PRELUDE = serving.NOW_LUA + serving.REINDEX_LUA
#: The module's limits, written into the lease script (fewer arguments to send per request).
_LIMITS = (f"local expire_batch, index_page, expire_backlog = {EXPIRE_BATCH}, {INDEX_PAGE}, "
           f"{EXPIRE_BACKLOG}\n")

#: Lua: the key of a client's live leases (lease id -> expiry, ms).
_HELD_LUA = """
local function held_key(name) return 'po:client-leases:' .. name end
"""

_ACQUIRE = serving.Lua(_PRELUDE + _HELD_LUA + _LIMITS + """
local client, lease_id, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local session = ARGV[5]
-- the client's own limit (ARGV[8], '' = none) comes first: at it, nothing else is read
local held = held_key(client)
local client_max = tonumber(ARGV[8])
if client_max then
  -- (without a limit the count is only written: the sweep and the key's expiry keep it short)
  redis.call('ZREMRANGEBYSCORE', held, '-inf', now)
  local count = redis.call('ZCARD', held)
  if count >= client_max then
    local first = redis.call('ZRANGE', held, 0, 0, 'WITHSCORES')
    return cjson.encode({error = 'client_lease_limit', held = count, max = client_max,
                         nextExpiry = tonumber(first[2]) or 0, now = now})
  end
end
local f = cjson.decode(ARGV[4])
local cool = 'po:cooldown:' .. client
redis.call('ZREMRANGEBYSCORE', cool, '-inf', now)
local cooling_any = redis.call('EXISTS', cool) == 1
local sel = f.selector or {}
-- the values of in/notin as a set, once per request (not once per proxy read)
for _, req in ipairs(sel) do
  local set = {}
  for _, x in ipairs(req[3]) do set[x] = true end
  req[4] = set
end
local stats = {cooling = 0, full = 0, unhealthy = 0, draining = 0, nocreds = 0}

-- leases that expired since the last request leave the index and their client's count (at
-- most limit of them); returns how many were swept
local function sweep(limit)
  local due = redis.call('ZRANGEBYSCORE', 'po:lease-expiry', '-inf', now, 'LIMIT', 0, limit)
  local expired_on = {}
  for _, member in ipairs(due) do
    redis.call('ZREM', 'po:lease-expiry', member)
    local uid, id = string.match(member, '^(.*)/([^/]*)$')
    if uid then
      expired_on[uid] = true
      local owner = redis.call('HGET', 'po:lease:' .. id, 'client')
      if owner then redis.call('ZREM', held_key(owner), id) end
    end
  end
  for uid in pairs(expired_on) do reindex(uid, now) end
  return #due
end
local swept = sweep(expire_batch)

local function labels_ok(raw)
  if #sel == 0 then return true end
  local ok, labels = pcall(cjson.decode, raw or '{}')
  if not ok or type(labels) ~= 'table' then labels = {} end
  for _, req in ipairs(sel) do
    local key, op, vals = req[1], req[2], req[3]
    local v = labels[key]
    if type(v) ~= 'string' then v = nil end
    if op == '=' then
      if v ~= vals[1] then return false end
    elseif op == '!=' then
      if v ~= nil and v == vals[1] then return false end
    elseif op == 'in' or op == 'notin' then
      local found = v ~= nil and req[4][v] == true
      if op == 'in' and not found then return false end
      if op == 'notin' and found then return false end
    elseif op == 'exists' then
      if v == nil then return false end
    elseif op == '!exists' then
      if v ~= nil then return false end
    else
      return false
    end
  end
  return true
end

local function fits(provider, zone, namespace, labels)
  return (not f.provider or provider == f.provider) and (not f.zone or zone == f.zone)
      and (not f.namespace or namespace == f.namespace) and labels_ok(labels)
end

-- returns live lease count and maxLeases when uid is eligible, else nil.  With count, tallies
-- why a proxy is not (the 503 message).  In the index scan, a uid found not leasable or full
-- is noted in stale and re-indexed after the scan (not during it: that would shift the pages).
-- A proxy that requires basic auth is eligible only once the health engine has copied its
-- credentials (po:auth:<uid>), so the lease can carry them.
local stale = {}
local function check(uid, count, in_index)
  local h = redis.call('HMGET', 'po:proxy:' .. uid, 'healthy', 'maxLeases', 'provider', 'zone', 'namespace',
                       'labels', 'authSecret')
  local max = tonumber(h[2]) or 0
  if h[1] ~= '1' or max ~= max or max <= 0 then
    if in_index then stale[#stale + 1] = uid end
    return nil
  end
  if not fits(h[3], h[4], h[5], h[6]) then return nil end
  if cooling_any and redis.call('ZSCORE', cool, uid) then
    if count then stats.cooling = stats.cooling + 1 end
    return nil
  end
  if h[7] and h[7] ~= '' and redis.call('EXISTS', 'po:auth:' .. uid) == 0 then
    if count then stats.nocreds = stats.nocreds + 1 end
    return nil
  end
  local lk = 'po:leases:' .. uid
  redis.call('ZREMRANGEBYSCORE', lk, '-inf', now)
  local used = redis.call('ZCARD', lk)
  if used >= max then
    if count then stats.full = stats.full + 1 end
    if in_index then stale[#stale + 1] = uid end
    return nil
  end
  return used, max
end

local chosen, chosen_used, chosen_max, sticky = nil, nil, nil, 0
local sticky_key = nil
if session ~= '' then
  sticky_key = 'po:sticky:' .. client .. ':' .. session
  local bound = redis.call('GET', sticky_key)
  if bound then
    local used, max = check(bound, false, false)
    if used then chosen, chosen_used, chosen_max, sticky = bound, used, max, 1 end
  end
end
-- the index holds only proxies with free capacity, least loaded first
local function scan(count)
  local page, start = index_page, 0
  while true do
    local uids = redis.call('ZRANGE', KEYS[1], start, start + page - 1)
    for _, uid in ipairs(uids) do
      local used, max = check(uid, count, true)
      if used then return uid, used, max end
    end
    if #uids < page then return nil end
    start = start + page
  end
end
if not chosen then
  chosen, chosen_used, chosen_max = scan(false)
  if not chosen then
    -- More leases expired than one request sweeps: finish the sweep, so the proxies they
    -- free are back in the index.  Then read the index again (short: only proxies with room
    -- that this request cannot use), counting why each one does not fit.
    if swept == expire_batch then sweep(expire_backlog) end
    for _, uid in ipairs(stale) do reindex(uid, now) end
    stale = {}
    chosen, chosen_used, chosen_max = scan(true)
  end
end
for _, uid in ipairs(stale) do reindex(uid, now) end
if not chosen then
  -- Why nothing fits, for the 503: every published proxy is in one of po:load (scanned above:
  -- cooling down or awaiting credentials), po:full, po:unhealthy, po:draining.  Without
  -- filters only the sizes of the last three and this client's cooldowns are read; with
  -- filters, each of their members' placement and labels.
  local filtered = f.provider or f.zone or f.namespace or #sel > 0
  if not filtered then
    local full = redis.call('SCARD', KEYS[2])
    local cooling_full = 0
    if cooling_any then
      for _, uid in ipairs(redis.call('ZRANGE', cool, 0, -1)) do
        if redis.call('SISMEMBER', KEYS[2], uid) == 1 then cooling_full = cooling_full + 1 end
      end
    end
    stats.cooling = stats.cooling + cooling_full
    stats.full = stats.full + full - cooling_full
    stats.unhealthy = redis.call('SCARD', 'po:unhealthy')
    stats.draining = redis.call('SCARD', 'po:draining')
  else
    local function matches(uid)
      local h = redis.call('HMGET', 'po:proxy:' .. uid, 'provider', 'zone', 'namespace', 'labels')
      return fits(h[1], h[2], h[3], h[4])
    end
    for _, uid in ipairs(redis.call('SMEMBERS', KEYS[2])) do
      if matches(uid) then
        if cooling_any and redis.call('ZSCORE', cool, uid) then
          stats.cooling = stats.cooling + 1
        else
          stats.full = stats.full + 1
        end
      end
    end
    for _, uid in ipairs(redis.call('SMEMBERS', 'po:unhealthy')) do
      if matches(uid) then stats.unhealthy = stats.unhealthy + 1 end
    end
    for _, uid in ipairs(redis.call('SMEMBERS', 'po:draining')) do
      if matches(uid) then stats.draining = stats.draining + 1 end
    end
  end
  return cjson.encode({error = 'no_proxy_available', published = redis.call('SCARD', 'po:proxies'),
                       filtered = filtered and 1 or 0, unhealthy = stats.unhealthy, draining = stats.draining,
                       full = stats.full, cooling = stats.cooling, nocreds = stats.nocreds})
end
local exp = now + ttl
redis.call('ZADD', 'po:leases:' .. chosen, exp, lease_id)
redis.call('ZADD', 'po:lease-expiry', exp, chosen .. '/' .. lease_id)
redis.call('ZADD', held, exp, lease_id)
if redis.call('PTTL', held) < ttl then redis.call('PEXPIRE', held, ttl) end
local used_now = chosen_used + 1
if used_now >= chosen_max then
  redis.call('ZREM', KEYS[1], chosen)
  redis.call('SADD', KEYS[2], chosen)
else
  redis.call('ZADD', KEYS[1], used_now + used_now / chosen_max / 2, chosen)
  redis.call('SREM', KEYS[2], chosen)
end
local lk = 'po:lease:' .. lease_id
redis.call('HSET', lk, 'uid', chosen, 'client', client, 'ttl', ttl, 'expiresAt', exp,
           'createdAt', now, 'sessionKey', session)
redis.call('PEXPIREAT', lk, exp + tonumber(ARGV[7]))
if sticky_key then redis.call('SET', sticky_key, chosen, 'EX', tonumber(ARGV[6])) end
local h = redis.call('HMGET', 'po:proxy:' .. chosen, 'address', 'port', 'egressIP', 'namespace', 'name',
                     'provider', 'zone', 'maxLeases', 'authSecret')
local auth = {false, false}
if h[9] and h[9] ~= '' then auth = redis.call('HMGET', 'po:auth:' .. chosen, 'username', 'password') end
return cjson.encode({uid = chosen, used = used_now, expiresAt = exp, ttl = ttl, address = h[1],
                     port = h[2], egressIP = h[3], namespace = h[4], name = h[5], provider = h[6],
                     zone = h[7], maxLeases = h[8], sticky = sticky, username = auth[1], password = auth[2]})
""")

_RENEW = serving.Lua(_PRELUDE + _HELD_LUA + """
local id, client = ARGV[1], ARGV[2]
local lk = 'po:lease:' .. id
local h = redis.call('HMGET', lk, 'uid', 'client', 'ttl', 'sessionKey')
if not h[1] then return cjson.encode({error = 'lease_not_found'}) end
if h[2] ~= client then return cjson.encode({error = 'not_lease_owner'}) end
local zk = 'po:leases:' .. h[1]
local member = h[1] .. '/' .. id
local p = redis.call('HMGET', 'po:proxy:' .. h[1], 'healthy', 'maxLeases', 'address', 'port', 'egressIP',
                     'namespace', 'name', 'provider', 'zone', 'authSecret')
local held = held_key(client)
if p[1] ~= '1' or (tonumber(p[2]) or 0) <= 0 then
  -- unhealthy, drained (maxLeases 0) or withdrawn: the lease ends
  redis.call('ZREM', zk, id)
  redis.call('ZREM', 'po:lease-expiry', member)
  redis.call('ZREM', held, id)
  redis.call('DEL', lk)
  reindex(h[1], now)
  return cjson.encode({error = 'proxy_unavailable'})
end
local score = redis.call('ZSCORE', zk, id)
if not score or tonumber(score) <= now then
  redis.call('ZREM', zk, id)
  redis.call('ZREM', 'po:lease-expiry', member)
  redis.call('ZREM', held, id)
  reindex(h[1], now)
  return cjson.encode({error = 'lease_expired'})
end
-- over the client's own limit (lowered since, or leases from before limits were counted):
-- no renewal, the lease runs out at its expiry
local client_max = tonumber(ARGV[6])
if client_max then
  redis.call('ZREMRANGEBYSCORE', held, '-inf', now)
  local count = redis.call('ZCARD', held)
  if not redis.call('ZSCORE', held, id) then count = count + 1 end
  if count > client_max then
    return cjson.encode({error = 'client_lease_limit', held = count, max = client_max, renew = 1,
                         expiresAt = tonumber(score)})
  end
end
local ttl = tonumber(ARGV[3]) or tonumber(h[3])
local exp = now + ttl
redis.call('ZADD', zk, 'XX', exp, id)
redis.call('ZADD', 'po:lease-expiry', exp, member)
redis.call('ZADD', held, exp, id)
if redis.call('PTTL', held) < ttl then redis.call('PEXPIRE', held, ttl) end
redis.call('HSET', lk, 'expiresAt', exp, 'ttl', ttl)
redis.call('PEXPIREAT', lk, exp + tonumber(ARGV[4]))
if h[4] and h[4] ~= '' then
  local sk = 'po:sticky:' .. client .. ':' .. h[4]
  if redis.call('GET', sk) == h[1] then redis.call('EXPIRE', sk, tonumber(ARGV[5])) end
end
local used = reindex(h[1], now)
local auth = {false, false}
if p[10] and p[10] ~= '' then auth = redis.call('HMGET', 'po:auth:' .. h[1], 'username', 'password') end
return cjson.encode({uid = h[1], used = used, expiresAt = exp, ttl = ttl,
                     address = p[3], port = p[4], egressIP = p[5], namespace = p[6], name = p[7],
                     provider = p[8], zone = p[9], maxLeases = p[2], sticky = 0, sessionKey = h[4],
                     username = auth[1], password = auth[2]})
""")

_RELEASE = serving.Lua(_PRELUDE + _HELD_LUA + """
local id, client, outcome, cooldown = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local lk = 'po:lease:' .. id
local h = redis.call('HMGET', lk, 'uid', 'client', 'sessionKey')
if not h[1] then return cjson.encode({error = 'lease_not_found'}) end
if h[2] ~= client then return cjson.encode({error = 'not_lease_owner'}) end
local zk = 'po:leases:' .. h[1]
local score = redis.call('ZSCORE', zk, id)
local live = score and tonumber(score) > now
redis.call('ZREM', zk, id)
redis.call('ZREM', 'po:lease-expiry', h[1] .. '/' .. id)
redis.call('ZREM', held_key(client), id)
redis.call('DEL', lk)
reindex(h[1], now)
local until_ms = 0
if (outcome == 'blocked' or outcome == 'failed') and cooldown > 0 then
  local ck = 'po:cooldown:' .. client
  until_ms = now + cooldown
  redis.call('ZADD', ck, until_ms, h[1])
  if redis.call('PTTL', ck) < cooldown then redis.call('PEXPIRE', ck, cooldown) end
  if h[3] and h[3] ~= '' then
    local sk = 'po:sticky:' .. client .. ':' .. h[3]
    if redis.call('GET', sk) == h[1] then redis.call('DEL', sk) end
  end
end
return cjson.encode({uid = h[1], live = live and 1 or 0, cooldownUntil = until_ms})
""")


class LeaseError(Exception):
    """A lease operation that cannot be done.

    Attributes:
        code: stable error code (:data:`NO_PROXY_AVAILABLE`, :data:`LEASE_NOT_FOUND`,
            :data:`NOT_LEASE_OWNER`, :data:`LEASE_EXPIRED`, :data:`PROXY_UNAVAILABLE`,
            :data:`CLIENT_LEASE_LIMIT`).
        message: human-readable explanation.
        retry_after: whole seconds after which the same request may succeed without anything
            else changing (:data:`CLIENT_LEASE_LIMIT` of an acquire: until the client's
            earliest lease expires), else ``None``.
    """

    def __init__(self, code: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after = code, message, retry_after


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
        selector: label requirements (:func:`app.selectors.parse`).
    """

    provider: str | None = None
    zone: str | None = None
    namespace: str | None = None
    selector: tuple[Requirement, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        """Encode for the lease script."""
        doc: dict = {"selector": as_lua(self.selector)}
        for key in ("provider", "zone", "namespace"):
            value = getattr(self, key)
            if value is not None:
                doc[key] = value
        return json.dumps(doc)

    def matches(self, record: dict[str, str]) -> bool:
        """Whether a serving-view record passes the filters (same rules as the script)."""
        if self.provider is not None and record.get("provider", "") != self.provider:
            return False
        if self.zone is not None and record.get("zone", "") != self.zone:
            return False
        if self.namespace is not None and record.get("namespace", "") != self.namespace:
            return False
        return matches(self.selector, serving.labels_of(record))


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
        dt = datetime.fromtimestamp(self.expires_at, timezone.utc)
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _str(value) -> str:
    return value if isinstance(value, str) else ""


def _lease(lease_id: str, doc: dict, session_key: str | None) -> Lease:
    return Lease(
        id=lease_id, uid=doc["uid"], namespace=_str(doc.get("namespace")), name=_str(doc.get("name")),
        provider=_str(doc.get("provider")), zone=_str(doc.get("zone")), host=_str(doc.get("address")),
        port=int(_str(doc.get("port")) or 0), egress_ip=_str(doc.get("egressIP")) or None,
        expires_at=int(doc["expiresAt"]) / 1000.0, ttl=int(doc["ttl"]) // 1000, used=int(doc["used"]),
        max_leases=int(_str(doc.get("maxLeases")) or 0), session_key=session_key or None,
        sticky=bool(doc.get("sticky")),
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
        until = datetime.fromtimestamp(int(counts.get("expiresAt") or 0) / 1000.0, timezone.utc)
        return (f"client {client!r} holds {held} live leases, more than its limit (maxLeases in the tokens file) "
                f"of {limit}: this lease is not renewed and ends at its expiry, "
                f"{until.strftime('%Y-%m-%dT%H:%M:%SZ')}; release leases to get back under the limit")
    if limit == 0:
        return f"client {client!r} may hold no leases (maxLeases 0 in the tokens file)"
    return (f"client {client!r} holds {held} live leases, its limit (maxLeases in the tokens file) is {limit}: "
            "release a lease or wait for one to expire")


def acquire(r, client: str, filters: Filters, ttl: int, settings: LeaseSettings,
            session_key: str | None = None, client_max_leases: int | None = None) -> Lease:
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
    Returns:
        the :class:`Lease`, with the proxy's credentials when it requires basic auth.
    Raises:
        LeaseError: ``client_lease_limit`` (the client holds ``client_max_leases`` live leases;
            ``retry_after``: seconds until the earliest of them expires, ``None`` when the
            limit is 0), checked first; ``no_proxy_available``, the message counting the
            published proxies and why each was excluded (:func:`no_proxy_message`).
    """
    lease_id = new_lease_id()
    raw = _ACQUIRE(r, [serving.LOAD_KEY, serving.FULL_KEY], [
        client, lease_id, int(ttl) * 1000, filters.to_json(), session_key or "", settings.sticky_ttl,
        settings.record_grace * 1000, _limit(client_max_leases)])
    doc = json.loads(raw)
    if "error" in doc:
        if doc["error"] == CLIENT_LEASE_LIMIT:
            wait = None
            if int(doc.get("held") or 0) > 0:
                wait = max(1, -(-(int(doc["nextExpiry"]) - int(doc["now"])) // 1000))
            raise LeaseError(CLIENT_LEASE_LIMIT, client_limit_message(client, doc), wait)
        raise LeaseError(NO_PROXY_AVAILABLE, no_proxy_message(doc))
    return _lease(lease_id, doc, session_key)


def no_proxy_message(counts: dict) -> str:
    """The message of a ``no_proxy_available`` error, from the lease script's counts.

    Args:
        counts: ``published`` (proxies in the serving view), ``filtered`` (1 when the request
            had filters), and of the proxies the filters let through, why each was excluded:
            ``unhealthy`` (unhealthy or not yet probed), ``draining`` (``maxLeases`` 0),
            ``full`` (at ``maxLeases``), ``cooling`` (cooling down for this client), ``nocreds``
            (requires basic auth, credentials not copied yet).
    Returns:
        e.g. ``"no proxy can be leased now: 3 published; excluded: 1 unhealthy or not yet
        probed, 0 draining (maxLeases 0), 2 at maxLeases, 0 cooling down for this client,
        0 filtered out"``.
    """
    reasons = {k: int(counts.get(k) or 0) for k in ("unhealthy", "draining", "full", "cooling", "nocreds")}
    published = int(counts.get("published") or 0)
    # Every published proxy is in exactly one of the lease index's sets, so what the filters
    # let through adds up to the published count; the rest was filtered out.
    filtered_out = max(0, published - sum(reasons.values())) if counts.get("filtered") else 0
    text = (f"no proxy can be leased now: {published} published; excluded: "
            f"{reasons['unhealthy']} unhealthy or not yet probed, {reasons['draining']} draining (maxLeases 0), "
            f"{reasons['full']} at maxLeases, {reasons['cooling']} cooling down for this client, "
            f"{filtered_out} filtered out")
    if reasons["nocreds"]:
        text += f", {reasons['nocreds']} awaiting their basic-auth credentials (copied at the next probe)"
    return text


_MESSAGES = {
    LEASE_NOT_FOUND: "no such lease (never granted, released, or forgotten after expiry)",
    NOT_LEASE_OWNER: "this lease belongs to another client",
    LEASE_EXPIRED: "the lease expired; ask for a new one",
    PROXY_UNAVAILABLE: "the lease's proxy is no longer healthy or leasable; the lease was ended",
}


def renew(r, client: str, lease_id: str, ttl: int | None, settings: LeaseSettings,
          client_max_leases: int | None = None) -> Lease:
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
    Returns:
        the renewed :class:`Lease`.
    Raises:
        LeaseError: ``lease_not_found``, ``not_lease_owner``, ``lease_expired``,
            ``proxy_unavailable`` (the proxy turned unhealthy or was drained; the lease ends) or
            ``client_lease_limit`` (over the limit; the lease is left to run out at its expiry).
    """
    raw = _RENEW(r, [], [lease_id, client, "" if ttl is None else int(ttl) * 1000,
                         settings.record_grace * 1000, settings.sticky_ttl, _limit(client_max_leases)])
    doc = json.loads(raw)
    if "error" in doc:
        if doc["error"] == CLIENT_LEASE_LIMIT:
            raise LeaseError(CLIENT_LEASE_LIMIT, client_limit_message(client, doc))
        raise LeaseError(doc["error"], _MESSAGES[doc["error"]])
    return _lease(lease_id, doc, _str(doc.get("sessionKey")))


@dataclass(frozen=True)
class Release:
    """The result of a release: whether the lease was still live, and any cooldown started
    (``cooldown_until`` epoch seconds, ``None`` for none)."""

    uid: str
    live: bool
    cooldown_until: float | None


def release(r, client: str, lease_id: str, outcome: str, settings: LeaseSettings) -> Release:
    """End a lease of ``client``; ``blocked``/``failed`` start a cooldown of its proxy for this client.

    A lease that already expired (but is still remembered) can be released, so its outcome
    still counts.

    Raises:
        ValueError: ``outcome`` not in :data:`OUTCOMES`.
        LeaseError: ``lease_not_found`` or ``not_lease_owner``.
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}")
    raw = _RELEASE(r, [], [lease_id, client, outcome, settings.cooldown * 1000])
    doc = json.loads(raw)
    if "error" in doc:
        raise LeaseError(doc["error"], _MESSAGES[doc["error"]])
    until = int(doc["cooldownUntil"])
    return Release(doc["uid"], bool(doc["live"]), until / 1000.0 if until else None)


def discover(r, filters: Filters, healthy: bool | None = None) -> list[dict]:
    """Return the published proxies passing ``filters`` (and ``healthy``, when not ``None``).

    Each item: ``namespace name address port provider zone egressIP labels`` plus
    ``health {healthy state reason lastProbeTime latencyMs}`` and ``leases {used max}``
    (live leases counted without modifying anything).  Sorted by namespace and name.
    """
    recs = serving.all_records(r)
    chosen = [(uid, rec) for uid, rec in recs.items()
              if filters.matches(rec) and (healthy is None or (rec.get("healthy") == "1") == healthy)]
    if not chosen:
        return []
    now_s, now_us = r.time()
    now_ms = now_s * 1000 + now_us // 1000
    pipe = r.pipeline(transaction=False)
    for uid, _ in chosen:
        pipe.zcount(serving.leases_key(uid), f"({now_ms}", "+inf")
    counts = pipe.execute()
    out = []
    for (uid, rec), used in zip(chosen, counts):
        latency = rec.get("latencyMs")
        out.append({
            "namespace": rec.get("namespace", ""), "name": rec.get("name", ""),
            "address": rec.get("address", ""), "port": int(rec.get("port") or 0),
            "provider": rec.get("provider") or None, "zone": rec.get("zone") or None,
            "egressIP": rec.get("egressIP") or None, "labels": serving.labels_of(rec),
            "health": {
                "healthy": rec.get("healthy") == "1", "state": rec.get("health") or "unknown",
                "reason": rec.get("lastReason") or None, "lastProbeTime": rec.get("lastProbeTime") or None,
                "latencyMs": float(latency) if latency else None,
            },
            "leases": {"used": int(used), "max": int(rec.get("maxLeases") or 0)},
        })
    out.sort(key=lambda item: (item["namespace"], item["name"]))
    return out


def live_leases(r) -> int:
    """Return the number of live leases over all published proxies (for the metrics gauge).

    Two Redis commands whatever the fleet's size (``TIME``, then ``ZCOUNT`` of the expiry
    index ``po:lease-expiry``, which holds every live lease: granted, renewed, released and
    withdrawn leases keep it in step), so a ``/metrics`` scrape costs the same with 10 or
    10,000 proxies.

    Raises:
        redis.RedisError: Redis unreachable.
    """
    now_s, now_us = r.time()
    now_ms = now_s * 1000 + now_us // 1000
    return int(r.zcount(EXPIRY_KEY, f"({now_ms}", "+inf"))
