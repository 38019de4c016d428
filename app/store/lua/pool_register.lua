-- app.pools.demand.register.  KEYS: the pool's demand read-time key.  ARGV: namespace, name.
-- After now.lua.  Registers the pool in K_POOLS ('<namespace>/<name>' -> 1, and '<name>' ->
-- namespace unless another namespace's pool of that name came first), so the lease script counts
-- refused requests for it; starts the demand window now unless it has begun.
-- Key names (K_*, P_*): locals from app.store.keys.lua_header(), which the loader prepends.
redis.call('HSET', K_POOLS, ARGV[1] .. '/' .. ARGV[2], '1')
redis.call('HSETNX', K_POOLS, ARGV[2], ARGV[1])
redis.call('SET', KEYS[1], now, 'NX')
return 1
