-- Idempotency release: give up an attempt's claim, only if it still holds the key.
--
-- KEYS[1]  the idempotency key   <namespace>:{<key>}
-- ARGV[1]  the attempt's claim marker ("p:" .. owner id)
--
-- Returns 1 if the key held our claim and was deleted (a retry may claim it at once),
-- 0 otherwise: another attempt's claim or a record is left alone.
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("DEL", KEYS[1])
end
return 0
