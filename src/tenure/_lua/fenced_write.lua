-- Fenced write: store a value only if its fencing token is not older than the highest seen.
--
-- KEYS[1]  the value key   <namespace>:{<resource>}:value
-- KEYS[2]  the token key   <namespace>:{<resource>}:token  (the highest token accepted)
-- ARGV[1]  the writer's fencing token: a decimal integer in [0, 2^53)
-- ARGV[2]  the value to store
--
-- Returns {1, highest} when the value was stored (highest is then ARGV[1]), or
-- {0, highest} when ARGV[1] < highest: the writer's lease was superseded and nothing is
-- written. An equal token is the same lease writing again and is accepted. An error
-- if the token key holds something other than a number.
--
-- Tokens are compared as Lua numbers (doubles): exact below 2^53, which the client
-- checks before sending. Both keys share the {<resource>} hash tag, so the check and the
-- two writes happen in one slot, atomically.
local token = tonumber(ARGV[1])
local stored = redis.call("GET", KEYS[2])
if stored then
    local highest = tonumber(stored)
    if highest == nil then
        -- Never treat a damaged token key as "no token seen": that would admit anyone.
        return redis.error_reply("ERR fenced_write: " .. KEYS[2] .. " holds no number")
    end
    if token < highest then
        return {0, highest}
    end
end
redis.call("SET", KEYS[1], ARGV[2])
redis.call("SET", KEYS[2], ARGV[1])
return {1, token}
