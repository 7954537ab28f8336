-- Idempotency record: store an attempt's result, only if its claim was not taken over.
--
-- KEYS[1]  the idempotency key   <namespace>:{<key>}
-- ARGV[1]  the attempt's claim marker ("p:" .. owner id)
-- ARGV[2]  the record: "d:" followed by the encoded result, or "n:" (no result)
-- ARGV[3]  how long to keep the record, in milliseconds (a positive integer)
--
-- Returns {1, ""} when the record was stored (SET ARGV[2] PX ARGV[3]); {0, value} when
-- the key holds another attempt's claim or record (value is what it holds): our lease
-- ran out and someone took the key over, so the effect may have happened twice.
--
-- An absent key (our lease ran out, nobody took over) is recorded too: no other attempt
-- holds it, and recording stops later duplicates from running the effect again.
local value = redis.call("GET", KEYS[1])
if value and value ~= ARGV[1] then
    return {0, value}
end
redis.call("SET", KEYS[1], ARGV[2], "PX", ARGV[3])
return {1, ""}
