-- Acquire a lock and mint its fencing token, in one step on one node; optionally queue
-- the caller to be notified (or, in fair mode, handed the lock) when it is released.
--
-- KEYS[1]  the lock key                    tenure:{name}:lock
-- KEYS[2]  this node's floor               tenure:node:floor    (PX retention)
-- KEYS[3]  this node's warm-up marker      tenure:node:warm     (PX: expires when warm)
-- KEYS[4]  (waiting only) the wait queue   tenure:{name}:q      (see handoff.lua.inc)
-- ARGV[1]  the owner token of this attempt (in fair mode: the waiter id, ARGV[8])
-- ARGV[2]  the TTL in milliseconds
-- ARGV[3]  the proposed fencing token F (an integer below 2^53)
-- ARGV[4]  a random observation mark (an integer below 2^52), for a node without a floor
-- ARGV[5]  how long that mark lives, in milliseconds
-- ARGV[6]  the retention in milliseconds: how long the floor outlives the last grant
--          that raised it
-- ARGV[7]  (waiting only) "n": notified waiting; "f": fair (FIFO, hand-off on release);
--          "q": fair on a quorum (the same, with the tokens and queue order below)
-- ARGV[8]  (waiting only) the waiter id, stable across the attempts of one acquire
-- ARGV[9]  (waiting only) the channel the waiter's process listens on
-- ARGV[10] (waiting only) how long the waiter's place lives unless renewed, ms; "0" for a
--          non-blocking attempt (never queued)
-- ARGV[11] (waiting only) "q": the waiter's place in the queue, chosen by the client
--          (when its acquire call began) and the same on every node, so that waiters
--          queued on several nodes in different orders still line up alike on each
-- ARGV[12] (waiting only, optional) "s": ARGV[9] is a sharded channel (a Redis Cluster
--          node, 7.0 and later): the release notifies with SPUBLISH (handoff.lua.inc)
--
-- The floor is the highest fencing token this node has committed, for any lock, and the
-- only fencing history it keeps: a grant must propose a token above it, whatever the
-- lock. So a token this node grants is above every token it ever granted, and a name
-- never used before is granted exactly like an old one, with no state kept per name.
-- The floor is also the node's incarnation: a node without one has lost its data
-- (restart without persistence, flush, eviction) or has never been used, and grants
-- nothing until the client seeds it (seed.lua). See docs/fencing.md.
--
-- A floor is trusted only under the replication history it was written in (the
-- node's replication ID, stored next to the floor: history.lua.inc). A node whose
-- history changed since (a replica promoted in a failover, which may lack the last
-- grants of its master; a restart, which starts a new history even with the data on
-- disk) grants nothing until the client seeds it with a warm-up, like a node that lost
-- its data. A floor without a stored ID (written by a tenure that kept none) is taken
-- as it is, and the ID recorded, unless the node was promoted: its master may have
-- recorded one that never reached it, so that counts as a changed history too.
--
-- Returns {status, number, floor[, pttl]}; floor is this node's floor (0 when it has none):
--   { 1, F, floor}   granted: the lock is ours and the floor is now F. In fair mode
--                    also when the lock had already been handed to this waiter (one
--                    node, "f": F is the floor, at least the token the hand-off set;
--                    "q": the proposal, as for any grant, so every node of one round
--                    grants the same token); its TTL is renewed to ARGV[2] from now.
--   { 0, floor, floor}  held by another client (nothing changed); when waiting:
--                    {0, floor, floor, pttl}, the lock's PTTL, and the caller is queued
--                    (its place renewed). Not fair: a free lock reserved for a woken
--                    waiter (<queue>:next, see handoff.lua.inc) counts as held, with pttl
--                    -1: the others wait for the next release (re-checking at their
--                    fallback bound), not for the reservation's end, lest every waiter
--                    re-check at every hand-off.
--   {-1, floor, floor}  free, but F is not above the floor: propose floor + 1
--   {-2, mark, 0}    no floor: this node is blank (never used, or it lost its data); it
--                    grants nothing until the client seeds it (seed.lua). The mark (kept
--                    in KEYS[3] until then) names this state of the node: a seed must
--                    quote it, so a seed decided from a stale observation cannot reach a
--                    node that has restarted since (its mark is gone).
--   {-3, pttl, floor}  seeded after a data loss and still warming up for pttl ms
--   {-4, mark, floor}  history changed: the floor (0 if none) was written under another
--                    replication history than this server's, or the node was promoted
--                    from a replica and has no floor, or one without a stored ID
--                    (whatever its master had, it may not have received). It grants nothing until the client seeds it,
--                    always with a warm-up; the mark as for -2, valid under this history
--                    only (history.lua.inc).
--
-- Fair mode: a free lock with live waiters ahead of the caller is handed to the head of
-- the queue (the caller queues behind); newcomers never overtake the queue. ("q": with
-- the caller's proposal as the hand-off's token, so only once that is above the floor.)
--@include history
--@include handoff
--
-- Every redis.call costs the server about a microsecond on Valkey 9 (a third of that on
-- Redis 6.2), so the common case, a free lock that nobody waits for, takes six: the
-- node's three keys in one MGET, INFO, one EXISTS over the lock, its queue and its
-- reservation, then the grant's two writes and the history's PEXPIRE. Every other case
-- goes the long way below, which decides the same things one key at a time.
local node = redis.call("MGET", KEYS[2], replid_key(KEYS[2]), KEYS[3])
local floor, stored = node[1], node[2]
local id, promoted = history()
if not floor then
    local mark = observed(KEYS[3], ARGV[4], ARGV[5], id)
    if promoted then
        return {-4, mark, 0}
    end
    return {-2, mark, 0}
end
floor = tonumber(floor)
if not stored and not promoted then
    record(KEYS[2], id, ARGV[6])
elseif stored ~= id then
    return {-4, observed(KEYS[3], ARGV[4], ARGV[5], id), floor}
end
-- A floor beside a warm-up marker: the node was seeded after a data loss (seed.lua; a
-- seed without a warm-up deletes the marker, and an observation mark is only kept on a
-- blank node or one whose history changed, both answered above).
if node[3] then
    local warm = redis.call("PTTL", KEYS[3])
    if warm > 0 then
        return {-3, warm, floor}
    end
end
local retention = ARGV[6]
local mode = ARGV[7]
local proposal = tonumber(ARGV[3])
if mode and redis.call("EXISTS", KEYS[1], KEYS[4], KEYS[4] .. ":next") == 0 then
    -- Free, nobody queued, nothing reserved: what the long way decides too (no holder
    -- to renew, no head to hand over to, no place of ours to drop: a place never
    -- outlives its queue).
    if proposal <= floor then
        return {-1, floor, floor}
    end
    redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
    commit(KEYS[2], ARGV[3], retention, floor)
    return {1, proposal, proposal}
end
if not mode then
    if redis.call("EXISTS", KEYS[1]) == 1 then
        return {0, floor, floor}
    end
else
    local queue, me = KEYS[4], ARGV[8]
    local holder = redis.call("GET", KEYS[1])
    local pttl = nil
    if mode == "f" and holder == ARGV[1] then
        -- Handed to us: renew the lock, and the floor as a grant would.
        redis.call("PEXPIRE", KEYS[1], ARGV[2])
        redis.call("PEXPIRE", KEYS[2], retention)
        redis.call("PEXPIRE", replid_key(KEYS[2]), retention)
        return {1, floor, floor}
    end
    if mode == "q" and (holder == ARGV[1] or not holder) and tonumber(ARGV[3]) <= floor then
        return {-1, floor, floor}
    end
    if mode == "q" and holder == ARGV[1] then
        redis.call("PEXPIRE", KEYS[1], ARGV[2])
        local token = commit(KEYS[2], ARGV[3], retention)
        return {1, token, token}
    end
    if not holder and mode ~= "n"
        and handoff(KEYS[1], KEYS[2], queue, mode, me, ARGV[3], retention) == 1 then
        holder = true
        floor = tonumber(redis.call("GET", KEYS[2]))
    end
    if not holder and mode == "n" then
        local nxt = redis.call("GET", queue .. ":next")
        if nxt and nxt ~= me then
            holder = true
            pttl = -1
        end
    end
    if holder then
        local place = ARGV[10]
        if place ~= "0" then
            if mode == "q" then
                redis.call("ZADD", queue, "NX", ARGV[11], me)
            elseif not redis.call("ZSCORE", queue, me) then
                local tail = redis.call("ZRANGE", queue, -1, -1, "WITHSCORES")
                local ticket = 0
                if tail[2] then
                    ticket = tonumber(tail[2]) + 1
                end
                redis.call("ZADD", queue, ticket, me)
            end
            local record = ARGV[9] .. " " .. ARGV[2]
            if ARGV[12] then
                record = record .. " " .. ARGV[12]
            end
            redis.call("SET", queue .. ":" .. me, record, "PX", place)
            -- The queue outlives its longest-lived place, and no more: a queue whose
            -- waiters all died goes with their places.
            if redis.call("PTTL", queue) < tonumber(place) then
                redis.call("PEXPIRE", queue, place)
            end
        end
        return {0, floor, floor, pttl or redis.call("PTTL", KEYS[1])}
    end
end
if proposal <= floor then
    return {-1, floor, floor}
end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
commit(KEYS[2], ARGV[3], retention, floor)
if mode then
    redis.call("ZREM", KEYS[4], ARGV[8])
    redis.call("DEL", KEYS[4] .. ":" .. ARGV[8], KEYS[4] .. ":next")
end
return {1, proposal, proposal}
