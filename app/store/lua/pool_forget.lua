-- app.pools.demand.forget.  KEYS: the pool's demand count, its read-time key.  ARGV: namespace,
-- name.  Takes the pool out of K_POOLS (its '<name>' entry only when it points at this
-- namespace) and deletes its count.
-- Key names (K_*, P_*): locals from app.store.keys.lua_header(), which the loader prepends.
redis.call('HDEL', K_POOLS, ARGV[1] .. '/' .. ARGV[2])
if redis.call('HGET', K_POOLS, ARGV[2]) == ARGV[1] then redis.call('HDEL', K_POOLS, ARGV[2]) end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
