-- app.probes.schedule: hand out slow-lane slots.  KEYS: the slots (digest -> expiry), the turns
-- (digest -> last grant).  ARGV: now, expiry of a granted slot, most slots, then the digests of
-- the namespaces that have slow proxies due.  Expired slots are dropped; a namespace holding a
-- slot gets none; the others are served longest-waiting first (never served: first of all)
-- while slots are free.  Returns the granted digests.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local free = tonumber(ARGV[3]) - redis.call('ZCARD', KEYS[1])
local waiting = {}
for i = 4, #ARGV do
  if free > 0 and not redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    waiting[#waiting + 1] = {ARGV[i], tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '0'), i}
  end
end
table.sort(waiting, function(a, b) if a[2] ~= b[2] then return a[2] < b[2] end return a[3] < b[3] end)
local granted = {}
for i = 1, math.min(free, #waiting) do
  local digest = waiting[i][1]
  redis.call('ZADD', KEYS[1], ARGV[2], digest)
  redis.call('HSET', KEYS[2], digest, ARGV[1])
  granted[#granted + 1] = digest
end
return granted
