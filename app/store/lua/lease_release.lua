-- app.serving.leases.release.  ARGV: lease id, client, outcome, cooldown (ms), request id ('' = none),
-- then the ban rules of a targeted lease (app.serving.bans): the ban key's owner ('' fleet-wide,
-- '#<client>'), first cooldown (ms), cooldown cap (ms), strikes decay (ms), history (ms), refusal
-- IPs (0 = never), refusal window (ms), refusal cool-off (ms).
-- After now.lua, lease_index.lua.
-- Key names (K_*, P_*): locals from app.store.keys.lua_header(), which the loader prepends.
local id, client, outcome, cooldown, request = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local lk = P_LEASE .. id
local rk = P_RELEASED .. id
-- a targeted lease counts against the egress IP its proxy leaves through now (lease_index.lua)
follow_lease(lk, now)
local h = redis.call('HMGET', lk, 'uid', 'client', 'sessionKey', 'target', 'ident', 'realm')
if not h[1] then
  -- this very request run again (app/store/retry.py) after a first run that released the lease
  -- and whose answer was lost with its connection: the first run's answer, not a 404
  if request and request ~= '' then
    local prior = redis.call('HMGET', rk, 'request', 'answer')
    if prior[1] == request then return prior[2] end
  end
  return cjson.encode({error = 'lease_not_found'})
end
if h[2] ~= client then return cjson.encode({error = 'not_lease_owner'}) end
local zk = P_LEASES .. h[1]
local score = redis.call('ZSCORE', zk, id)
local live = score and tonumber(score) > now
redis.call('ZREM', zk, id)
redis.call('ZREM', K_LEASE_EXPIRY, h[1] .. '/' .. id)
redis.call('ZREM', held_key(client), id)
redis.call('DEL', lk)
reindex(h[1], now)
local target, ident = h[4], h[5]
if target and ident then redis.call('ZREM', P_TARGET_LEASES .. target .. '|' .. ident, id) end
-- the last live lease of a member draining out of its pool ended: only Redis knows, so wake the
-- pool (its next pass deletes the member now, not at the drain deadline)
local m = redis.call('HMGET', P_PROXY .. h[1], 'drainUntil', 'pool', 'namespace')
if m[1] and m[1] ~= '' and m[2] and m[2] ~= '' and m[3] and redis.call('ZCOUNT', zk, '(' .. now, '+inf') == 0 then
  redis.call('SADD', K_POOL_WAKE, m[3] .. '/' .. m[2])
end
local until_ms = 0
local refusing_until, banned, strikes, refused_now = 0, 0, 0, 0
local bad = outcome == 'blocked' or outcome == 'failed'
if bad and target and ident then
  -- a targeted lease: the outcome is about (egress identity, target), not the proxy for every site
  local owner = ARGV[6] or ''
  local base, cap, decay = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
  local history, refusal_ips = tonumber(ARGV[10]), tonumber(ARGV[11])
  local window, cooloff = tonumber(ARGV[12]), tonumber(ARGV[13])
  local ban_key = P_BAN .. target .. owner
  -- (refusals are counted per realm, the one the lease was granted in: app.serving.bans.realm)
  local realm = h[6] or ''
  refusing_until = tonumber(redis.call('GET', P_REFUSING .. target .. realm)) or 0
  if refusing_until <= now then refusing_until = 0 end
  if refusing_until == 0 and outcome == 'blocked' and refusal_ips > 0 then
    -- the site refusing this many different egress identities within the window refuses
    -- everyone: lift their bans, cool the target off instead
    local fk = P_REFUSALS .. target .. realm
    redis.call('ZREMRANGEBYSCORE', fk, '-inf', now - window)
    redis.call('ZADD', fk, now, ident)
    redis.call('PEXPIRE', fk, window)
    if redis.call('ZCARD', fk) >= refusal_ips then
      for _, e in ipairs(redis.call('ZRANGE', fk, 0, -1)) do
        -- (not a ban of e after all: out of its ban ratio too)
        local at = tonumber(redis.call('ZSCORE', P_IP_BAN_TIMES .. e, target))
        if at then uncount_ban(e, at) end
        redis.call('ZREM', ban_key, e)
        redis.call('ZREM', P_IP_BANS .. e, target)
        redis.call('ZREM', P_IP_BAN_TIMES .. e, target)
        redis.call('ZREM', K_BANS, e .. '|' .. target)
        redis.call('DEL', P_BAN_STRIKES .. target .. owner .. '|' .. e)
      end
      redis.call('DEL', fk)
      refusing_until = now + cooloff
      redis.call('SET', P_REFUSING .. target .. realm, refusing_until, 'PX', cooloff)
      refused_now = 1
    end
  end
  if refusing_until == 0 then
    local sk_ = P_BAN_STRIKES .. target .. owner .. '|' .. ident
    local length = base
    local standing = tonumber(redis.call('ZSCORE', ban_key, ident))
    if standing and standing > now then
      -- the pair is banned already: this lease, granted before that ban, got the same ban answer
      -- (several leases of one IP for the site): not a repeated ban, no strike; the ban's end stands
      strikes = tonumber(redis.call('GET', sk_)) or 1
      length = standing - now
    else
      strikes = redis.call('INCR', sk_)
      redis.call('PEXPIRE', sk_, decay)
      for _ = 2, math.min(strikes, 40) do
        length = length * 2
        if length >= cap then break end
      end
      if length > cap then length = cap end
    end
    until_ms = now + length
    banned = 1
    redis.call('ZADD', ban_key, 'GT', until_ms, ident)
    redis.call('ZREMRANGEBYSCORE', ban_key, '-inf', now)
    if redis.call('PTTL', ban_key) < length then redis.call('PEXPIRE', ban_key, length) end
    local ik = P_IP_BANS .. ident
    redis.call('ZADD', ik, until_ms, target)
    redis.call('ZREMRANGEBYSCORE', ik, '-inf', now - history)
    if redis.call('PTTL', ik) < length + history then redis.call('PEXPIRE', ik, length + history) end
    local tk = P_IP_BAN_TIMES .. ident
    redis.call('ZADD', tk, now, target)
    redis.call('ZREMRANGEBYSCORE', tk, '-inf', now - history)
    redis.call('PEXPIRE', tk, history)
    count_outcome(ident, 'b', now, history)
    redis.call('ZADD', K_BANS, until_ms, ident .. '|' .. target)
    redis.call('ZREMRANGEBYSCORE', K_BANS, '-inf', now)
    -- a pool member's IP banned: only Redis knows, so wake its pool (its recycle policy may
    -- replace the member now rather than at the next resync)
    if m[2] and m[2] ~= '' and m[3] then redis.call('SADD', K_POOL_WAKE, m[3] .. '/' .. m[2]) end
  end
  if h[3] and h[3] ~= '' then
    local sk = P_STICKY .. client .. ':' .. h[3]
    if redis.call('GET', sk) == h[1] then redis.call('DEL', sk) end
  end
elseif bad and cooldown > 0 then
  local ck = P_COOLDOWN .. client
  until_ms = now + cooldown
  redis.call('ZADD', ck, until_ms, h[1])
  if redis.call('PTTL', ck) < cooldown then redis.call('PEXPIRE', ck, cooldown) end
  if h[3] and h[3] ~= '' then
    local sk = P_STICKY .. client .. ':' .. h[3]
    if redis.call('GET', sk) == h[1] then redis.call('DEL', sk) end
  end
end
local answer
if target then
  answer = cjson.encode({uid = h[1], live = live and 1 or 0, cooldownUntil = until_ms, target = target,
                         ident = ident or false, banned = banned, strikes = strikes,
                         refusingUntil = refusing_until, refusedNow = refused_now})
else
  answer = cjson.encode({uid = h[1], live = live and 1 or 0, cooldownUntil = until_ms})
end
if request and request ~= '' then
  redis.call('HSET', rk, 'request', request, 'answer', answer)
  redis.call('PEXPIRE', rk, 60000)
end
return answer
