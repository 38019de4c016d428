-- app.serving.leases.acquire.  KEYS: the index (K_LOAD), the full set (K_FULL).  ARGV: client, lease id,
-- ttl (ms), filters (JSON), sessionKey ('' = none), sticky ttl (s), record grace (ms), the
-- client's lease limit ('' = none), the client's scope (app.serving.leases.Scope.lua: '' = every proxy,
-- else {ns = {<namespace> = true}, pools = {<namespace>/<pool> = true}}), the target ('' = none: a
-- registrable domain, app.serving.bans), the ban key's owner ('' fleet-wide, '#<client>'), the
-- target's concurrency limit per egress identity (0: by the pool rules), the pool rules (JSON
-- {<namespace>/<pool> = limit}, '' = none), the refusal realm (app.serving.bans.realm: whose refusals of
-- the target this client shares), the ban history (ms: how long the identity's lease and ban counts
-- are kept, app.store.keys.ip_outcomes).  After the limits (expire_batch, index_page, expire_backlog,
-- explain_limit),
-- now.lua and lease_index.lua.  Returns the lease or the error as JSON.
-- Key names (K_*, P_*): locals from app.store.keys.lua_header(), which the loader prepends.
local client, lease_id, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local session = ARGV[5]
local target = ARGV[10]
if target == '' then target = nil end
-- the answer of a granted lease (its proxy's address and credentials read now)
local function granted(uid, used, exp, lease_ttl, sticky)
  local h = redis.call('HMGET', P_PROXY .. uid, 'address', 'port', 'egressIP', 'namespace', 'name',
                       'provider', 'zone', 'maxLeases', 'authSecret')
  local auth = {false, false}
  if h[9] and h[9] ~= '' then auth = redis.call('HMGET', P_AUTH .. uid, 'username', 'password') end
  return cjson.encode({uid = uid, used = used, expiresAt = exp, ttl = lease_ttl, address = h[1],
                       port = h[2], egressIP = h[3], namespace = h[4], name = h[5], provider = h[6],
                       zone = h[7], maxLeases = h[8], sticky = sticky, username = auth[1], password = auth[2],
                       target = target or false})
end
-- the lease id is new for each request: a lease under it already is this request's own, granted
-- by a first run whose answer was lost with its connection (app/store/retry.py runs the command
-- once more): answer it again instead of granting a second lease
if redis.call('HGET', P_LEASE .. lease_id, 'client') == client then
  local prior = redis.call('HMGET', P_LEASE .. lease_id, 'uid', 'client', 'ttl', 'expiresAt', 'sticky')
  return granted(prior[1], redis.call('ZCOUNT', P_LEASES .. prior[1], '(' .. now, '+inf'), tonumber(prior[4]),
                 tonumber(prior[3]), tonumber(prior[5]) or 0)
end
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
-- a target refusing everyone (app.serving.bans): no fresh egress IP is spent on it until its
-- cool-off ends
local ban_key, target_limit, pool_limits, realm = nil, 0, nil, ARGV[14] or ''
if target then
  local refusing = tonumber(redis.call('GET', P_REFUSING .. target .. realm))
  if refusing and refusing > now then
    return cjson.encode({error = 'target_refusing', target = target, untilMs = refusing, now = now})
  end
  ban_key = P_BAN .. target .. ARGV[11]
  target_limit = tonumber(ARGV[12]) or 0
  if ARGV[13] and ARGV[13] ~= '' then pool_limits = cjson.decode(ARGV[13]) end
end
local f = cjson.decode(ARGV[4])
-- the client's scope: the proxies it may lease at all; the filters only narrow it
local scope = nil
if ARGV[9] and ARGV[9] ~= '' then scope = cjson.decode(ARGV[9]) end
local function in_scope(namespace, pool)
  if not scope or scope.ns[namespace] == true then return true end
  return type(namespace) == 'string' and type(pool) == 'string' and pool ~= ''
      and scope.pools[namespace .. '/' .. pool] == true
end
local cool = P_COOLDOWN .. client
redis.call('ZREMRANGEBYSCORE', cool, '-inf', now)
local cooling_any = redis.call('EXISTS', cool) == 1
local sel = f.selector or {}
-- the values of in/notin as a set, once per request (not once per proxy read)
for _, req in ipairs(sel) do
  local set = {}
  for _, x in ipairs(req[3]) do set[x] = true end
  req[4] = set
end
local stats = {cooling = 0, full = 0, unhealthy = 0, draining = 0, nocreds = 0, inscope = 0, banned = 0, busy = 0}
-- (targeted: when the first banned or busy egress identity frees up, ms; 0 = none seen)
local next_free = 0
local function freed_at(t)
  if t and (next_free == 0 or t < next_free) then next_free = t end
end

-- leases that expired since the last request leave the index and their client's count (at
-- most limit of them); returns how many were swept
local function sweep(limit)
  local due = redis.call('ZRANGEBYSCORE', K_LEASE_EXPIRY, '-inf', now, 'LIMIT', 0, limit)
  local expired_on = {}
  for _, member in ipairs(due) do
    redis.call('ZREM', K_LEASE_EXPIRY, member)
    local uid, id = string.match(member, '^(.*)/([^/]*)$')
    if uid then
      expired_on[uid] = true
      local owner = redis.call('HGET', P_LEASE .. id, 'client')
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

local function fits(provider, zone, namespace, labels, pool)
  return in_scope(namespace, pool) and (not f.provider or provider == f.provider) and (not f.zone or zone == f.zone)
      and (not f.namespace or namespace == f.namespace) and (not f.pool or pool == f.pool)
      and labels_ok(labels)
end

-- returns live lease count and maxLeases when uid is eligible, else nil.  With count, tallies
-- why a proxy is not (the 503 message).  In the index scan, a uid found not leasable or full
-- is noted in stale and re-indexed after the scan (not during it: that would shift the pages).
-- A proxy that requires basic auth is eligible only once the health engine has copied its
-- credentials (P_AUTH .. uid), so the lease can carry them.  A draining proxy (drainUntil set:
-- leaving its pool) takes no new lease.
local stale = {}
local function check(uid, count, in_index)
  local h = redis.call('HMGET', P_PROXY .. uid, 'healthy', 'maxLeases', 'provider', 'zone', 'namespace',
                       'labels', 'authSecret', 'pool', 'drainUntil', 'egressIP')
  local max = tonumber(h[2]) or 0
  if count and scope and in_scope(h[5], h[8]) then stats.inscope = stats.inscope + 1 end
  if h[1] ~= '1' or max ~= max or max <= 0 or (h[9] and h[9] ~= '') then
    if in_index then stale[#stale + 1] = uid end
    return nil
  end
  if not fits(h[3], h[4], h[5], h[6], h[8]) then return nil end
  if cooling_any and redis.call('ZSCORE', cool, uid) then
    if count then stats.cooling = stats.cooling + 1 end
    return nil
  end
  if h[7] and h[7] ~= '' and redis.call('EXISTS', P_AUTH .. uid) == 0 then
    if count then stats.nocreds = stats.nocreds + 1 end
    return nil
  end
  -- a target: the proxy's egress identity must not be banned for it nor at its concurrency limit
  local ident = nil
  if target then
    -- (its live leases follow a changed egress IP before that IP's count is read)
    ident = follow_ident(uid, h[10], redis.call('GET', P_TARGET_IDENT .. uid), now)
    local banned = tonumber(redis.call('ZSCORE', ban_key, ident))
    if banned and banned > now then
      if count then
        stats.banned = stats.banned + 1
        freed_at(banned)
      end
      return nil
    end
    local limit = target_limit
    if limit <= 0 then
      limit = 1
      if pool_limits and h[8] and h[8] ~= '' then limit = tonumber(pool_limits[h[5] .. '/' .. h[8]]) or 1 end
    end
    local tk = P_TARGET_LEASES .. target .. '|' .. ident
    if redis.call('ZCOUNT', tk, '(' .. now, '+inf') >= limit then
      if count then
        stats.busy = stats.busy + 1
        local first = redis.call('ZRANGEBYSCORE', tk, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
        freed_at(tonumber(first[2]))
      end
      return nil
    end
  end
  local lk = P_LEASES .. uid
  redis.call('ZREMRANGEBYSCORE', lk, '-inf', now)
  local used = redis.call('ZCARD', lk)
  if used >= max then
    if count then stats.full = stats.full + 1 end
    if in_index then stale[#stale + 1] = uid end
    return nil
  end
  return used, max, ident
end

local chosen, chosen_used, chosen_max, sticky, chosen_ident = nil, nil, nil, 0, nil
local sticky_key = nil
if session ~= '' then
  sticky_key = P_STICKY .. client .. ':' .. session
  local bound = redis.call('GET', sticky_key)
  if bound then
    local used, max, ident = check(bound, false, false)
    if used then chosen, chosen_used, chosen_max, sticky, chosen_ident = bound, used, max, 1, ident end
  end
end
-- the index holds only proxies with free capacity, least loaded first
local function scan(count)
  local page, start = index_page, 0
  while true do
    local uids = redis.call('ZRANGE', KEYS[1], start, start + page - 1)
    for _, uid in ipairs(uids) do
      local used, max, ident = check(uid, count, true)
      if used then return uid, used, max, ident end
    end
    if #uids < page then return nil end
    start = start + page
  end
end
if not chosen then
  chosen, chosen_used, chosen_max, chosen_ident = scan(false)
  if not chosen then
    -- More leases expired than one request sweeps: finish the sweep, so the proxies they
    -- free are back in the index.  Then read the index again (short: only proxies with room
    -- that this request cannot use), counting why each one does not fit.
    if swept == expire_batch then sweep(expire_backlog) end
    for _, uid in ipairs(stale) do reindex(uid, now) end
    stale = {}
    chosen, chosen_used, chosen_max, chosen_ident = scan(true)
  end
end
for _, uid in ipairs(stale) do reindex(uid, now) end
-- a pool filter naming no pool the controller registered (K_POOLS) in the client's scope: not a
-- lack of proxies but a wrong name (a pool outside the scope answers the same as a missing one)
if not chosen and f.pool then
  local known = false
  if f.namespace then
    known = redis.call('HEXISTS', K_POOLS, f.namespace .. '/' .. f.pool) == 1 and in_scope(f.namespace, f.pool)
  elseif not string.find(f.pool, '/', 1, true) then
    local first = redis.call('HGET', K_POOLS, f.pool)
    known = first ~= false and in_scope(first, f.pool)
    if not known then
      -- ('<name>' names one namespace, or none once that pool is gone: every '<ns>/<name>' is read,
      -- as many as there are pools, on this refused request only)
      for _, key in ipairs(redis.call('HKEYS', K_POOLS)) do
        local slash = string.find(key, '/', 1, true)
        if slash and string.sub(key, slash + 1) == f.pool and in_scope(string.sub(key, 1, slash - 1), f.pool) then
          known = true
          break
        end
      end
    end
  end
  if not known then return cjson.encode({error = 'pool_not_found'}) end
end
if not chosen then
  -- Why nothing fits, for the 503: every published proxy is in one of the index (KEYS[1], scanned
  -- above: cooling down or awaiting credentials), KEYS[2] (full), K_UNHEALTHY, K_DRAINING.  Without
  -- filters only the sizes of the last three and this client's cooldowns are read; with
  -- filters, the placement and labels of their members, explain_limit of them at most (SSCAN
  -- pages, shared among the sets by size, so a big fleet's 503 stays a bounded read): the rest
  -- are 'unexamined'.
  -- (a scoped client's request is read as a filtered one: its counts cover its scope only)
  local filtered = f.provider or f.zone or f.namespace or f.pool or #sel > 0 or scope ~= nil
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
    stats.unhealthy = redis.call('SCARD', K_UNHEALTHY)
    stats.draining = redis.call('SCARD', K_DRAINING)
  else
    local function matches(uid)
      local h = redis.call('HMGET', P_PROXY .. uid, 'provider', 'zone', 'namespace', 'labels', 'pool')
      if scope and in_scope(h[3], h[5]) then stats.inscope = stats.inscope + 1 end
      return fits(h[1], h[2], h[3], h[4], h[5])
    end
    local sets = {KEYS[2], K_UNHEALTHY, K_DRAINING}
    local sizes = {redis.call('SCARD', sets[1]), redis.call('SCARD', sets[2]), redis.call('SCARD', sets[3])}
    local total = sizes[1] + sizes[2] + sizes[3]
    -- members read per set: all of them when the three sets hold explain_limit or fewer, else
    -- explain_limit shared in proportion to the sets' sizes (so every reason is sampled,
    -- whichever set is the biggest), the rounding's remainder to sets with members left
    local budgets = {sizes[1], sizes[2], sizes[3]}
    if total > explain_limit then
      local left = explain_limit
      for i = 1, 3 do
        budgets[i] = math.floor(explain_limit * sizes[i] / total)
        left = left - budgets[i]
      end
      for i = 1, 3 do
        local more = math.min(left, sizes[i] - budgets[i])
        budgets[i], left = budgets[i] + more, left - more
      end
    end
    local examined = 0
    -- calls count(uid) for the members of sets[i] that match the filters, budgets[i] at most
    -- (under the limit every member, exactly once: SMEMBERS; SSCAN may repeat one)
    local function each(i, count)
      if total <= explain_limit then
        for _, uid in ipairs(redis.call('SMEMBERS', sets[i])) do
          if matches(uid) then count(uid) end
        end
        examined = examined + sizes[i]
        return
      end
      local budget = budgets[i]
      local seen, cursor = 0, '0'
      repeat
        local page = redis.call('SSCAN', sets[i], cursor, 'COUNT', 100)
        cursor = page[1]
        for _, uid in ipairs(page[2]) do
          if seen >= budget then break end
          seen = seen + 1
          if matches(uid) then count(uid) end
        end
      until cursor == '0' or seen >= budget
      examined = examined + seen
    end
    each(1, function(uid)
      if cooling_any and redis.call('ZSCORE', cool, uid) then
        stats.cooling = stats.cooling + 1
      else
        stats.full = stats.full + 1
      end
    end)
    each(2, function() stats.unhealthy = stats.unhealthy + 1 end)
    each(3, function() stats.draining = stats.draining + 1 end)
    -- (SSCAN may repeat a member while a set rehashes: never below 0)
    stats.unexamined = math.max(0, total - examined)
  end
  -- a request for a pool the controller registered counts as demand for it (one INCR; the
  -- autoscaler reads and resets the count: app.pools.demand)
  if f.pool then
    local pk = nil
    if f.namespace then
      if redis.call('HEXISTS', K_POOLS, f.namespace .. '/' .. f.pool) == 1 then pk = f.namespace .. '/' .. f.pool end
    elseif not string.find(f.pool, '/', 1, true) then
      -- (a '/' would hit a '<ns>/<name>' entry, whose value is '1', not a namespace)
      if scope then
        -- a scoped client means a pool of its scope: the one registered pool of that name in it
        -- (K_POOLS' '<name>' entry names the first namespace to register it, maybe another team's)
        local candidates, n = {}, 0
        for key in pairs(scope.pools) do
          local slash = string.find(key, '/', 1, true)
          if slash and string.sub(key, slash + 1) == f.pool then candidates[key] = true end
        end
        for ns in pairs(scope.ns) do candidates[ns .. '/' .. f.pool] = true end
        for key in pairs(candidates) do
          if redis.call('HEXISTS', K_POOLS, key) == 1 then pk, n = key, n + 1 end
        end
        if n ~= 1 then pk = nil end
      end
      if not pk then
        local ns = redis.call('HGET', K_POOLS, f.pool)
        if ns then pk = ns .. '/' .. f.pool end
      end
    end
    -- (never for a pool outside the client's scope: its demand would scale another team's pool)
    if pk then
      local slash = string.find(pk, '/', 1, true)
      if in_scope(string.sub(pk, 1, slash - 1), string.sub(pk, slash + 1)) then
        redis.call('INCR', P_POOL_DEMAND .. pk)
      end
    end
  end
  -- a scoped client hears only of its scope: the proxies in it that were read; of those not
  -- examined it learns only that there were some (their number would tell other teams' fleet)
  local published = redis.call('SCARD', K_PROXIES)
  local partial = 0
  if scope then
    published = stats.inscope
    if (stats.unexamined or 0) > 0 then partial, stats.unexamined = 1, 0 end
  end
  return cjson.encode({error = 'no_proxy_available', published = published, scoped = scope and 1 or 0,
                       partial = partial,
                       filtered = filtered and 1 or 0, unhealthy = stats.unhealthy, draining = stats.draining,
                       full = stats.full, cooling = stats.cooling, nocreds = stats.nocreds,
                       unexamined = stats.unexamined or 0, target = target or false, banned = stats.banned,
                       busy = stats.busy, limit = target_limit, nextFree = next_free, now = now})
end
local exp = now + ttl
redis.call('ZADD', P_LEASES .. chosen, exp, lease_id)
redis.call('ZADD', K_LEASE_EXPIRY, exp, chosen .. '/' .. lease_id)
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
local lk = P_LEASE .. lease_id
redis.call('HSET', lk, 'uid', chosen, 'client', client, 'ttl', ttl, 'expiresAt', exp,
           'createdAt', now, 'sessionKey', session, 'sticky', sticky)
if target then
  -- the lease counts against its egress identity's concurrency for the target; the release
  -- reads both to ban the pair
  local tk = P_TARGET_LEASES .. target .. '|' .. chosen_ident
  redis.call('ZREMRANGEBYSCORE', tk, '-inf', now)
  redis.call('ZADD', tk, exp, lease_id)
  if redis.call('PTTL', tk) < ttl then redis.call('PEXPIRE', tk, ttl) end
  redis.call('HSET', lk, 'target', target, 'ident', chosen_ident, 'realm', realm)
  redis.call('SET', P_TARGET_IDENT .. chosen, chosen_ident)
  count_outcome(chosen_ident, 'l', now, tonumber(ARGV[15]) or 3600000)
end
redis.call('PEXPIREAT', lk, exp + tonumber(ARGV[7]))
if sticky_key then redis.call('SET', sticky_key, chosen, 'EX', tonumber(ARGV[6])) end
return granted(chosen, used_now, exp, ttl, sticky)
