-- Stream read: one batch of a partition's entries, for its owner only.
--
-- KEYS[1]  the partition's stream   <prefix>:{<p>}
-- KEYS[2]  its owner key            <prefix>:{<p>}:owner:<group>
-- ARGV[1]  the reader's fencing token (the owner's, or it is refused)
-- ARGV[2]  the consumer group
-- ARGV[3]  the consumer (the worker's name)
-- ARGV[4]  the most entries to return
-- ARGV[5]  the XAUTOCLAIM cursor, or "" to read new entries
--
-- Returns {"stale"} when ARGV[1] is not the token the owner key holds. Otherwise
-- {kind, next cursor, entries, skipped}: kind "claim" (XAUTOCLAIM from the cursor with
-- idle time 0, the next cursor being its reply's) or "new" (XREADGROUP >, next cursor
-- ""); skipped counts the pending entries that were deleted from the stream and are
-- acknowledged here.
--
-- Asked for new entries while ARGV[3] has entries pending, it claims from "0-0" instead
-- (kind "claim"), as a rewind does. The worker acknowledges every batch it was handed,
-- or rewinds, or drops the partition, so its pending list is empty when it asks for new
-- entries; anything there was delivered by a read whose reply it never saw (a timeout,
-- a client's silent retry). Reading past those entries would hand out newer entries of
-- the same keys first, so a read run twice delivers the same batch twice instead.
if redis.call("GET", KEYS[2]) ~= ARGV[1] then
    return {"stale"}
end
local cursor = ARGV[5]
if cursor == "" then
    if #redis.call("XPENDING", KEYS[1], ARGV[2], "-", "+", 1, ARGV[3]) == 0 then
        local reply = redis.call("XREADGROUP", "GROUP", ARGV[2], ARGV[3], "COUNT", ARGV[4],
                                 "STREAMS", KEYS[1], ">")
        if not reply then
            return {"new", "", {}, 0}
        end
        return {"new", "", reply[1][2], 0}
    end
    cursor = "0-0"
end
local reply = redis.call("XAUTOCLAIM", KEYS[1], ARGV[2], ARGV[3], 0, cursor,
                         "COUNT", ARGV[4])
local live, skipped, pending = {}, 0, nil
for i, entry in ipairs(reply[2]) do
    if entry then
        live[#live + 1] = entry
    else
        -- Before Redis 7 an entry deleted from the stream while pending comes back as
        -- nil, without its id, and stays pending for ever. XPENDING over the range just
        -- scanned lists the same ids in the same order: acknowledge the i-th.
        pending = pending or redis.call("XPENDING", KEYS[1], ARGV[2], cursor, "+", #reply[2])
        redis.call("XACK", KEYS[1], ARGV[2], pending[i][1])
        skipped = skipped + 1
    end
end
return {"claim", reply[1], live, skipped}
