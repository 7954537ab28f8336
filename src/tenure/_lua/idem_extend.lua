-- Idempotency extend: give our claim a new lease, only if no other attempt has the key.
--
-- KEYS[1]  the idempotency key   <namespace>:{<key>}
-- ARGV[1]  the attempt's claim marker ("p:" .. owner id)
-- ARGV[2]  the new lease in milliseconds, counted from now (a positive integer)
--
-- Returns {1, ""} when the key held our claim (its PX is now ARGV[2]) or nothing (our
-- lease had run out and nobody took the key: it holds our claim again, with ARGV[2]);
-- {0, value} when it holds another attempt's claim ("p:" ..) or a record ("d:" .., "n:"):
-- left alone. An error if the key holds anything else, as idem_claim.lua says.
--
-- An empty key is taken back for the reason idem_record.lua stores a record there: what
-- the key holds now is all a script can see, and nobody else is at work on it.
local value = redis.call("GET", KEYS[1])
if not value or value == ARGV[1] then
    redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
    return {1, ""}
end
local state = string.sub(value, 1, 2)
if state == "p:" or state == "d:" or state == "n:" then
    return {0, value}
end
return redis.error_reply("ERR idem_extend: " .. KEYS[1] .. " holds no idempotency state")
