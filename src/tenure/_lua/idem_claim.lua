-- Idempotency claim: take the key for one attempt, or say who has it.
--
-- KEYS[1]  the idempotency key   <namespace>:{<key>}
-- ARGV[1]  our claim marker: "p:" followed by a random owner id, unique per attempt
-- ARGV[2]  the claim's lease in milliseconds (a positive integer)
--
-- Returns {1, ""} when the key was free and is now ours (SET ARGV[1] PX ARGV[2]), or
-- already held our very claim (its PX renewed to ARGV[2]);
-- {2, result} when an attempt already recorded a result (the key holds "d:" .. result);
-- {3, ""} when an attempt recorded that it finished without a result (the key holds "n:");
-- {0, pttl} when another attempt holds the claim, pttl being the milliseconds left on its
-- lease. An error if the key holds anything else: a damaged key is never taken as free.
--
-- An expired claim is simply absent, so a crashed attempt is taken over once its lease
-- runs out. Checking and claiming in one script leaves no gap between them.
--
-- Our own marker already there means this is the same call run again: a client that
-- retries after a lost reply (redis-py does by default) resends it, and the first run
-- claimed the key. The marker is random per attempt, so no other attempt holds it;
-- answering "busy" would block the key for the whole lease with nobody working on it.
-- It is also how an attempt extends its claim (RedisOnce.extend): the same call, later,
-- with the new lease; an empty key is then taken back as idem_record.lua records there.
local value = redis.call("GET", KEYS[1])
if not value or value == ARGV[1] then
    redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
    return {1, ""}
end
local state = string.sub(value, 1, 2)
if state == "d:" then
    return {2, string.sub(value, 3)}
end
if state == "n:" then
    return {3, ""}
end
if state == "p:" then
    return {0, redis.call("PTTL", KEYS[1])}
end
return redis.error_reply("ERR idem_claim: " .. KEYS[1] .. " holds no idempotency state")
