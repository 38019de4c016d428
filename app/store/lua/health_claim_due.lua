-- app.probes.schedule.claim_due.  KEYS: the due set.  ARGV: now, limit, claimed until.  Returns
-- the claimed uids, most overdue first.
local uids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, uid in ipairs(uids) do
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], uid)
end
return uids
