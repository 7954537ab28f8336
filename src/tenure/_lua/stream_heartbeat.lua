-- Stream workers' heartbeat: drop the expired workers, then add or remove one.
--
-- KEYS[1]  the registry of live workers   <prefix>:<group>:workers  (sorted set, scored by the
--          instant each worker's entry expires, in ms on the server's clock)
-- ARGV[1]  the worker's name
-- ARGV[2]  its heartbeat TTL in ms: > 0 adds (or refreshes) it, 0 removes it
--
-- Returns the names of the live workers, ARGV[1] included unless it was removed.
-- Expiry is on the server's clock (TIME), so the workers' clocks need not agree.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
local ttl = tonumber(ARGV[2])
if ttl > 0 then
    redis.call("ZADD", KEYS[1], now + ttl, ARGV[1])
else
    redis.call("ZREM", KEYS[1], ARGV[1])
end
return redis.call("ZRANGE", KEYS[1], 0, -1)
