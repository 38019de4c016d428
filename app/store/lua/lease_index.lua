-- The lease index (app.serving.leases).  reindex(uid, now) drops the proxy's expired leases and puts it
-- in K_LOAD with its load as score, in K_FULL when it is at maxLeases, in K_UNHEALTHY /
-- K_DRAINING when it is not leasable (draining: maxLeases 0, or a drainUntil mark: leaving its
-- pool), or in none when its record is gone; returns its live leases (0 when not leasable).  Included by every script that changes a record's healthy or
-- maxLeases or a proxy's leases, after now.lua.  held_key(client): the client's live leases.
-- Key names (K_*, P_*): locals from app.store.keys.lua_header(), which the loader prepends.

-- count_outcome(ident, kind, now, history): one more targeted lease ('l') or ban ('b') of egress identity
-- ident in this minute's bucket of P_IP_OUTCOMES (app.store.keys.ip_outcomes).  The first count of a
-- bucket renews the key's TTL (history, ms, and a bucket) and, once the hash holds more than two
-- windows of buckets of both kinds, drops those older than history: at most 4 x history /
-- OUTCOME_BUCKET_MS + 3 fields.  history nil (a script that does not know
-- BAN_HISTORY_SECONDS): no trimming, and a TTL of an hour and a bucket only on a key that has none.
local function count_outcome(ident, kind, now, history)
  local key = P_IP_OUTCOMES .. ident
  local bucket = math.floor(now / OUTCOME_BUCKET_MS)
  if not history then
    redis.call('HINCRBY', key, kind .. bucket, 1)
    if redis.call('PTTL', key) < 0 then redis.call('PEXPIRE', key, 3600000 + OUTCOME_BUCKET_MS) end
  elseif redis.call('HINCRBY', key, kind .. bucket, 1) == 1 then
    local span = math.ceil(history / OUTCOME_BUCKET_MS)
    -- (trimmed only once the hash outgrows two windows of buckets: a lightly used IP, which
    -- starts a bucket with nearly every lease, is not read whole at each of them)
    if redis.call('HLEN', key) > 4 * span + 2 then
      local oldest = bucket - span
      for _, f in ipairs(redis.call('HKEYS', key)) do
        local b = tonumber(string.sub(f, 2))
        if not b or b < oldest then redis.call('HDEL', key, f) end
      end
    end
    redis.call('PEXPIRE', key, history + OUTCOME_BUCKET_MS)
  end
end

-- uncount_ban(ident, at): take back one ban of ident counted at time at (ms) by count_outcome.
local function uncount_ban(ident, at)
  local key = P_IP_OUTCOMES .. ident
  local f = 'b' .. math.floor(at / OUTCOME_BUCKET_MS)
  local n = tonumber(redis.call('HGET', key, f))
  if n and n > 1 then redis.call('HINCRBY', key, f, -1) elseif n then redis.call('HDEL', key, f) end
end

-- follow_ident(uid, egress, recorded, now): a proxy's targeted leases count against its egress identity
-- (app.serving.bans); recorded (P_TARGET_IDENT .. uid, false: none) is the identity they were
-- counted under, egress its 'egressIP' now.  When the egress IP changed under live leases, they move
-- to the new identity's concurrency counts (and bans of their release follow): the leases leave
-- through the new IP.  Returns the identity now.
local function follow_ident(uid, egress, recorded, now)
  local ident = egress
  if not ident or ident == '' then ident = 'uid:' .. uid end
  if not recorded or recorded == ident then return ident end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', P_LEASES .. uid, '(' .. now, '+inf')) do
    local l = redis.call('HMGET', P_LEASE .. id, 'target', 'ident')
    if l[1] and l[2] == recorded then
      local old_key = P_TARGET_LEASES .. l[1] .. '|' .. recorded
      local exp = tonumber(redis.call('ZSCORE', old_key, id))
      redis.call('ZREM', old_key, id)
      if exp and exp > now then
        local new_key = P_TARGET_LEASES .. l[1] .. '|' .. ident
        redis.call('ZADD', new_key, exp, id)
        if redis.call('PTTL', new_key) < exp - now then redis.call('PEXPIRE', new_key, exp - now) end
        -- its release may ban the new identity: the lease counts there too (ban ratio)
        count_outcome(ident, 'l', now, nil)
      end
      redis.call('HSET', P_LEASE .. id, 'ident', ident)
    end
  end
  redis.call('SET', P_TARGET_IDENT .. uid, ident)
  return ident
end

-- follow_lease(lk, now): follow_ident for the proxy of the lease record lk (P_LEASE .. id), before a
-- renewal or release reads which identity the lease counts under; nothing when the lease, its
-- proxy's record or its recorded identity is gone.
local function follow_lease(lk, now)
  local uid = redis.call('HGET', lk, 'uid')
  if not uid then return end
  local px = redis.call('HMGET', P_PROXY .. uid, 'uid', 'egressIP')
  local recorded = px[1] and redis.call('GET', P_TARGET_IDENT .. uid)
  if recorded then follow_ident(uid, px[2], recorded, now) end
end

local function reindex(uid, now)
  local h = redis.call('HMGET', P_PROXY .. uid, 'healthy', 'maxLeases', 'uid', 'drainUntil', 'egressIP')
  -- (a record that is gone keeps nothing: its targeted leases were ended with it)
  if h[3] then
    local recorded = redis.call('GET', P_TARGET_IDENT .. uid)
    if recorded then follow_ident(uid, h[5], recorded, now) end
  end
  local max = tonumber(h[2]) or 0
  if h[1] ~= '1' or max ~= max or max <= 0 or (h[4] and h[4] ~= '') then
    redis.call('ZREM', K_LOAD, uid)
    redis.call('SREM', K_FULL, uid)
    if not h[3] then
      redis.call('SREM', K_UNHEALTHY, uid)
      redis.call('SREM', K_DRAINING, uid)
    elseif h[1] ~= '1' then
      redis.call('SADD', K_UNHEALTHY, uid)
      redis.call('SREM', K_DRAINING, uid)
    else
      redis.call('SREM', K_UNHEALTHY, uid)
      redis.call('SADD', K_DRAINING, uid)
    end
    return 0
  end
  redis.call('SREM', K_UNHEALTHY, uid)
  redis.call('SREM', K_DRAINING, uid)
  local lk = P_LEASES .. uid
  redis.call('ZREMRANGEBYSCORE', lk, '-inf', now)
  local used = redis.call('ZCARD', lk)
  if used >= max then
    redis.call('ZREM', K_LOAD, uid)
    redis.call('SADD', K_FULL, uid)
  else
    redis.call('ZADD', K_LOAD, used + used / max / 2, uid)
    redis.call('SREM', K_FULL, uid)
  end
  return used
end

local function held_key(name) return P_CLIENT_LEASES .. name end

