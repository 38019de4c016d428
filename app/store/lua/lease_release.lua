-- app.serving.leases.release.  ARGV: lease id, client, outcome, cooldown (ms), request id ('' = none).
-- After now.lua, lease_index.lua.
-- Key names (K_*, P_*): locals from app.store.keys.lua_header(), which the loader prepends.
local id, client, outcome, cooldown, request = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local lk = P_LEASE .. id
local rk = P_RELEASED .. id
local h = redis.call('HMGET', lk, 'uid', 'client', 'sessionKey')
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
-- the last live lease of a member draining out of its pool ended: only Redis knows, so wake the
-- pool (its next pass deletes the member now, not at the drain deadline)
local m = redis.call('HMGET', P_PROXY .. h[1], 'drainUntil', 'pool', 'namespace')
if m[1] and m[1] ~= '' and m[2] and m[2] ~= '' and m[3] and redis.call('ZCOUNT', zk, '(' .. now, '+inf') == 0 then
  redis.call('SADD', K_POOL_WAKE, m[3] .. '/' .. m[2])
end
local until_ms = 0
if (outcome == 'blocked' or outcome == 'failed') and cooldown > 0 then
  local ck = P_COOLDOWN .. client
  until_ms = now + cooldown
  redis.call('ZADD', ck, until_ms, h[1])
  if redis.call('PTTL', ck) < cooldown then redis.call('PEXPIRE', ck, cooldown) end
  if h[3] and h[3] ~= '' then
    local sk = P_STICKY .. client .. ':' .. h[3]
    if redis.call('GET', sk) == h[1] then redis.call('DEL', sk) end
  end
end
local answer = cjson.encode({uid = h[1], live = live and 1 or 0, cooldownUntil = until_ms})
if request and request ~= '' then
  redis.call('HSET', rk, 'request', request, 'answer', answer)
  redis.call('PEXPIRE', rk, 60000)
end
return answer
