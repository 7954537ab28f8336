-- Acquire a lock and mint its fencing token, in one step on one node.
--
-- KEYS[1]  the lock key                    tenure:{name}:lock
-- KEYS[2]  the fencing counter             tenure:{name}:fence  (no TTL: it is the history)
-- KEYS[3]  the warm-up marker              tenure:{name}:warm   (PX: expires when warm)
-- ARGV[1]  the owner token of this attempt
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  the proposed fencing token F (an integer below 2^53)
-- ARGV[4]  a random observation mark (an integer below 2^52), for a node without history
-- ARGV[5]  how long that mark lives, in milliseconds
--
-- Returns {status, number}:
--   { 1, F}        granted: the lock is ours and the counter is now F
--   { 0, counter}  held by another client (nothing changed)
--   {-1, counter}  free, but F is not above this node's counter: propose counter + 1
--   {-2, mark}     no counter: this node has no history for this lock (new, or it lost
--                  its data); it grants nothing until the client seeds it (seed.lua).
--                  The mark (kept in KEYS[3] until then) names this state of the node:
--                  a seed must quote it, so a seed decided from a stale observation
--                  cannot reach a node that has restarted since (its mark is gone).
--   {-3, pttl}     seeded after a data loss and still warming up for pttl ms
--
-- Why the counter must exist before a grant: a node that lost its data would otherwise
-- accept any F, and a majority that overlaps the previous one only in such nodes could
-- hand out a token smaller than one already used. See docs/fencing.md.
local counter = redis.call("GET", KEYS[2])
if not counter then
    local mark = redis.call("GET", KEYS[3])
    if not mark then
        redis.call("SET", KEYS[3], ARGV[4], "PX", ARGV[5])
        mark = ARGV[4]
    end
    return {-2, tonumber(mark)}
end
local warm = redis.call("PTTL", KEYS[3])
if warm > 0 then
    return {-3, warm}
end
counter = tonumber(counter)
if redis.call("EXISTS", KEYS[1]) == 1 then
    return {0, counter}
end
local proposal = tonumber(ARGV[3])
if proposal <= counter then
    return {-1, counter}
end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
redis.call("SET", KEYS[2], ARGV[3])
return {1, proposal}
