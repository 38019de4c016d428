-- app.probes.engine: record a probe's fields (and keep the lease index in step with healthy)
-- unless the proxy was withdrawn or re-addressed meanwhile.  KEYS: the serving record, the due
-- set.  ARGV: uid, next due ('' = leave), address, port, then field/value pairs.  After now.lua,
-- lease_index.lua.  A new egressIP moves the proxy's live targeted leases to it here (reindex's
-- follow_ident), so that IP's concurrency counts hold them from this write on.
local cur = redis.call('HMGET', KEYS[1], 'address', 'port')
if not cur[1] or cur[1] ~= ARGV[3] or cur[2] ~= ARGV[4] then return 0 end
if #ARGV > 4 then redis.call('HSET', KEYS[1], unpack(ARGV, 5)) end
if ARGV[2] ~= '' then redis.call('ZADD', KEYS[2], 'XX', ARGV[2], ARGV[1]) end
reindex(ARGV[1], now)
return 1
