-- app.serving.leases.queue_withdraw.  KEYS: the proxy's live leases.  ARGV: uid.  Takes its leases out of
-- the expiry index and their clients' counts.
-- Key names (K_*, P_*): locals from app.store.keys.lua_header(), which the loader prepends.
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  redis.call('ZREM', K_LEASE_EXPIRY, ARGV[1] .. '/' .. id)
  local owner = redis.call('HGET', P_LEASE .. id, 'client')
  if owner then redis.call('ZREM', P_CLIENT_LEASES .. owner, id) end
end
return 1
