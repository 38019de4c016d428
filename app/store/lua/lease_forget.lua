-- app.serving.leases.queue_withdraw.  KEYS: the proxy's live leases.  ARGV: uid.  Takes its leases out of
-- the expiry index, their clients' counts and, for targeted leases, their egress identity's
-- concurrency for the target (P_TARGET_LEASES: another proxy leaving from the same IP is not
-- held back by the leases of one that is gone).
-- Key names (K_*, P_*): locals from app.store.keys.lua_header(), which the loader prepends.
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  redis.call('ZREM', K_LEASE_EXPIRY, ARGV[1] .. '/' .. id)
  local l = redis.call('HMGET', P_LEASE .. id, 'client', 'target', 'ident')
  if l[1] then redis.call('ZREM', P_CLIENT_LEASES .. l[1], id) end
  if l[2] and l[3] then redis.call('ZREM', P_TARGET_LEASES .. l[2] .. '|' .. l[3], id) end
end
return 1
