-- app.dispatch.proxies.OwnWrites.observe.  KEYS: own writes, busy mark, parked events.  ARGV:
-- resourceVersion, ttl (ms).  Returns 'skip', 'deferred' or 'send'.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 'skip' end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return 'deferred'
end
return 'send'
