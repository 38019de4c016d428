-- app.dispatch.proxies.OwnWrites.finish.  KEYS: own writes, busy mark, parked events.  ARGV: ttl (ms),
-- then the resourceVersions the task wrote.  Returns how many parked events were not ours.
for i = 2, #ARGV do redis.call('SADD', KEYS[1], ARGV[i]) end
if #ARGV > 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
redis.call('DEL', KEYS[2])
local parked = redis.call('SMEMBERS', KEYS[3])
redis.call('DEL', KEYS[3])
local real = 0
for _, rv in ipairs(parked) do
  if redis.call('SISMEMBER', KEYS[1], rv) == 0 then real = real + 1 end
end
return real
