-- app.serving.view.refresh.  KEYS: the serving record.  ARGV: uid, then field/value pairs to write.
-- Writes only while the record exists (a concurrent withdraw is never undone).  After now.lua,
-- lease_index.lua.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
reindex(ARGV[1], now)
return 1
