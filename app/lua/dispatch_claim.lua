-- app.dispatch.Enqueuer.send.  KEYS: the de-duplication mark.  ARGV: eta, ttl (ms), mode
-- ('idle': only when nothing is queued; 'earlier': also when the queued one runs more than
-- ARGV[4] seconds (default 1) after this one).  1 = send.
local cur = redis.call('GET', KEYS[1])
local slack = tonumber(ARGV[4]) or 1
if cur and (ARGV[3] == 'idle' or tonumber(cur) <= tonumber(ARGV[1]) + slack) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
