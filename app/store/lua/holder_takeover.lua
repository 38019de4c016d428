-- app.store.holders.HolderLock.  KEYS: the lock, the heartbeat of the holder its token names.
-- ARGV: the token read, the new token, the lock timeout (ms).  Takes the lock when it still holds
-- that token and the holder's heartbeat is gone; returns 1 when taken, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
