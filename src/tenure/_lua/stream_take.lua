-- Stream take-over: a partition's new owner fences its stream and makes sure the
-- consumer group exists.
--
-- KEYS[1]  the partition's stream   <prefix>:{<p>}
-- KEYS[2]  its owner key            <prefix>:{<p>}:owner:<group>  (the owning lease's token)
-- ARGV[1]  the new owner's fencing token (a decimal integer)
-- ARGV[2]  the consumer group
--
-- Returns 1 when the stream is now ARGV[1]'s: its token is recorded and the group exists
-- (created at "0", so entries appended before any worker existed count too); 0 when a
-- newer token is already recorded and nothing is changed; the error of XGROUP CREATE if
-- it failed for another reason than an existing group.
local stored = redis.call("GET", KEYS[2])
if stored and tonumber(stored) > tonumber(ARGV[1]) then
    return 0
end
local made = redis.pcall("XGROUP", "CREATE", KEYS[1], ARGV[2], "0", "MKSTREAM")
if type(made) == "table" and made.err and not string.find(made.err, "BUSYGROUP", 1, true) then
    return made
end
redis.call("SET", KEYS[2], ARGV[1])
return 1
