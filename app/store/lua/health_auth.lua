-- app.probes.engine: copy the credentials a probe used into the proxy's credentials hash for
-- the lease scripts, or drop them when the probe had none, unless the proxy was withdrawn or
-- re-addressed meanwhile or no longer requires basic auth.  KEYS: the serving record, the
-- credentials hash.  ARGV: address, port, username ('' = none), password.
local cur = redis.call('HMGET', KEYS[1], 'address', 'port', 'authSecret')
if not cur[1] or cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then return 0 end
if ARGV[3] == '' or not cur[3] or cur[3] == '' then
  redis.call('DEL', KEYS[2])
  return 0
end
redis.call('HSET', KEYS[2], 'username', ARGV[3], 'password', ARGV[4])
return 1
