-- app.probes.engine: note a probe's outcome for outage detection.  KEYS: the serving record,
-- the OK set, the failing set.  ARGV: uid, ok ('1'/'0'), everHealthy ('1'/'0').
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[2] == '1' then
  redis.call('SADD', KEYS[2], ARGV[1]); redis.call('SREM', KEYS[3], ARGV[1])
else
  redis.call('SREM', KEYS[2], ARGV[1])
  if ARGV[3] == '1' then redis.call('SADD', KEYS[3], ARGV[1]) else redis.call('SREM', KEYS[3], ARGV[1]) end
end
return 1
