-- app.probes.schedule.claim_lanes.  KEYS: the due set.  ARGV: now, limit, claimed until.  Claims
-- as health_claim_due.lua does and returns, for each claimed uid (most overdue first), the
-- triple uid, namespace, latencyMs of its last probe ('' when none) of its serving record.
local uids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, uid in ipairs(uids) do
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], uid)
  local rec = redis.call('HMGET', P_PROXY .. uid, 'namespace', 'latencyMs')
  out[#out + 1] = uid
  out[#out + 1] = rec[1] or ''
  out[#out + 1] = rec[2] or ''
end
return out
