-- Defines now: ms since the epoch by the Redis server's clock (TIME), so every process agrees.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
