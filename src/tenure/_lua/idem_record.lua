-- Idempotency record: store an attempt's result, only if its claim was not taken over.
--
-- KEYS[1]  the idempotency key   <namespace>:{<key>}
-- KEYS[2]  its receipt           <namespace>:{<key>}:receipt (same hash slot as KEYS[1])
-- ARGV[1]  the attempt's claim marker ("p:" .. owner id)
-- ARGV[2]  the record: "d:" followed by the encoded result, or "n:" (no result)
-- ARGV[3]  how long to keep the record, in milliseconds (a positive integer)
-- ARGV[4]  how long to keep the receipt, in milliseconds: the claim's lease, or ARGV[3]
--          if that is shorter
--
-- Returns {1, ""} when the record was stored (SET KEYS[1] ARGV[2] PX ARGV[3], and
-- SET KEYS[2] ARGV[1] PX ARGV[4]), or was stored by an earlier run of this very call (the
-- key holds ARGV[2] and the receipt ARGV[1]); {0, value} when the key holds another
-- attempt's claim or record (value is what it holds): our lease ran out and someone took
-- the key over, so the effect may have happened twice.
--
-- An absent key (our lease ran out, and nobody took over, or whoever did left nothing:
-- it failed and released, or crashed and its lease ran out too) is recorded too: no
-- other attempt holds it, and recording stops later duplicates from running the effect
-- again. A takeover that left nothing cannot be seen here, and is not reported.
--
-- The receipt says which attempt wrote the record. A client that retries after a lost
-- reply (redis-py does by default) runs this call again, and finds the record its first
-- run stored in place of its claim. The record alone cannot tell that apart from another
-- attempt's: one that took over after our lease ran out may have recorded the same value
-- ("n:" for every attempt that records None), and that must still be reported. The
-- receipt holds our marker, random per attempt, so it is ours only if our record landed.
-- It outlives no record it vouches for (ARGV[4] <= ARGV[3]: nobody can write the key
-- before our record is gone), and a client retries for seconds, well within a lease; a
-- retry later than the receipt gets {0, value}, a false alarm, never a missed one.
local value = redis.call("GET", KEYS[1])
if value == ARGV[2] and redis.call("GET", KEYS[2]) == ARGV[1] then
    return {1, ""}
end
if value and value ~= ARGV[1] then
    return {0, value}
end
redis.call("SET", KEYS[1], ARGV[2], "PX", ARGV[3])
redis.call("SET", KEYS[2], ARGV[1], "PX", ARGV[4])
return {1, ""}
