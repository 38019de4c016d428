-- app.proxy.gc.record_shard.  KEYS: the sweep's hash.  ARGV: shard, its listing (JSON), shards, ttl (ms).
-- Returns every shard's listing to the shard that completes the set (and deletes it), else false.
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if redis.call('HLEN', KEYS[1]) == tonumber(ARGV[3]) then
  local all = redis.call('HGETALL', KEYS[1])
  redis.call('DEL', KEYS[1])
  return all
end
return false
