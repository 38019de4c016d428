-- app.pools.demand.take.  KEYS: the pool's demand count, its read-time key.  After now.lua.
-- Returns {refused requests counted since the last take, ms since then (-1: unknown)}, and
-- resets both: the count to nothing, the read time to now.
local n = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
redis.call('DEL', KEYS[1])
local last = tonumber(redis.call('GET', KEYS[2]) or '')
redis.call('SET', KEYS[2], now)
if last then return {n, now - last} end
return {n, -1}
