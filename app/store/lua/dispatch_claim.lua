-- app.dispatch.proxies.Enqueuer.send.  KEYS: the de-duplication mark.  ARGV: eta, ttl (ms), mode
-- ('idle': only when nothing is queued; 'earlier': also when the queued one runs more than
-- ARGV[4] seconds (default 1) after this one), and optionally ARGV[5]: a queued one due more
-- than that many seconds before this one's eta counts as lost (its message never ran).  1 = send.
local cur = redis.call('GET', KEYS[1])
local slack = tonumber(ARGV[4]) or 1
local lost_after = tonumber(ARGV[5])
if cur then
  local queued = tonumber(cur)
  local lost = lost_after ~= nil and queued < tonumber(ARGV[1]) - lost_after
  if not lost and (ARGV[3] == 'idle' or queued <= tonumber(ARGV[1]) + slack) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
