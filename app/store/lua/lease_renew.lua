-- app.serving.leases.renew.  ARGV: lease id, client, ttl (ms, '' = the lease's last), record grace (ms),
-- sticky ttl (s), the client's lease limit ('' = none), the client's scope (app.serving.leases.Scope.lua,
-- '' = every proxy).  After now.lua, lease_index.lua.
-- Key names (K_*, P_*): locals from app.store.keys.lua_header(), which the loader prepends.
local id, client = ARGV[1], ARGV[2]
local lk = P_LEASE .. id
-- a targeted lease counts against the egress IP its proxy leaves through now (lease_index.lua)
follow_lease(lk, now)
local h = redis.call('HMGET', lk, 'uid', 'client', 'ttl', 'sessionKey', 'target', 'ident')
-- a targeted lease's place in its egress identity's concurrency count (app.serving.bans)
local tk = nil
if h[5] and h[6] then tk = P_TARGET_LEASES .. h[5] .. '|' .. h[6] end
if not h[1] then return cjson.encode({error = 'lease_not_found'}) end
if h[2] ~= client then return cjson.encode({error = 'not_lease_owner'}) end
local zk = P_LEASES .. h[1]
local member = h[1] .. '/' .. id
local p = redis.call('HMGET', P_PROXY .. h[1], 'healthy', 'maxLeases', 'address', 'port', 'egressIP',
                     'namespace', 'name', 'provider', 'zone', 'authSecret', 'drainUntil', 'pool')
local held = held_key(client)
-- leaving its pool (drainUntil): renewals run up to that time, not past it; less than a second
-- before it (a renewal would be capped to a TTL of 0 s) or after it, the lease ends
local drain_until = tonumber(p[11])
-- the client's scope (narrowed since the lease was granted: the proxy is no longer its to use)
local in_scope = true
if ARGV[7] and ARGV[7] ~= '' then
  local scope = cjson.decode(ARGV[7])
  in_scope = scope.ns[p[6]] == true or (type(p[6]) == 'string' and type(p[12]) == 'string' and p[12] ~= ''
                                        and scope.pools[p[6] .. '/' .. p[12]] == true)
end
if p[1] ~= '1' or (tonumber(p[2]) or 0) <= 0 or (drain_until and drain_until - now < 1000) or not in_scope then
  -- unhealthy, drained (maxLeases 0), at its pool's drain deadline, withdrawn or out of the
  -- client's scope: the lease ends
  redis.call('ZREM', zk, id)
  redis.call('ZREM', K_LEASE_EXPIRY, member)
  redis.call('ZREM', held, id)
  redis.call('DEL', lk)
  if tk then redis.call('ZREM', tk, id) end
  reindex(h[1], now)
  -- a draining member's last live lease ended here: wake its pool (as a release does)
  if drain_until and p[12] and p[12] ~= '' and p[6] and redis.call('ZCOUNT', zk, '(' .. now, '+inf') == 0 then
    redis.call('SADD', K_POOL_WAKE, p[6] .. '/' .. p[12])
  end
  return cjson.encode({error = 'proxy_unavailable'})
end
local score = redis.call('ZSCORE', zk, id)
if not score or tonumber(score) <= now then
  redis.call('ZREM', zk, id)
  redis.call('ZREM', K_LEASE_EXPIRY, member)
  redis.call('ZREM', held, id)
  if tk then redis.call('ZREM', tk, id) end
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
if drain_until and exp > drain_until then
  exp = drain_until
  ttl = exp - now
end
redis.call('ZADD', zk, 'XX', exp, id)
redis.call('ZADD', K_LEASE_EXPIRY, exp, member)
redis.call('ZADD', held, exp, id)
if redis.call('PTTL', held) < ttl then redis.call('PEXPIRE', held, ttl) end
if tk then
  redis.call('ZADD', tk, exp, id)
  if redis.call('PTTL', tk) < ttl then redis.call('PEXPIRE', tk, ttl) end
end
redis.call('HSET', lk, 'expiresAt', exp, 'ttl', ttl)
redis.call('PEXPIREAT', lk, exp + tonumber(ARGV[4]))
if h[4] and h[4] ~= '' then
  local sk = P_STICKY .. client .. ':' .. h[4]
  if redis.call('GET', sk) == h[1] then redis.call('EXPIRE', sk, tonumber(ARGV[5])) end
end
local used = reindex(h[1], now)
local auth = {false, false}
if p[10] and p[10] ~= '' then auth = redis.call('HMGET', P_AUTH .. h[1], 'username', 'password') end
return cjson.encode({uid = h[1], used = used, expiresAt = exp, ttl = ttl,
                     address = p[3], port = p[4], egressIP = p[5], namespace = p[6], name = p[7],
                     provider = p[8], zone = p[9], maxLeases = p[2], sticky = 0, sessionKey = h[4],
                     username = auth[1], password = auth[2]})
