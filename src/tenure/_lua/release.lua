-- Compare-and-delete: remove the lock only if it still holds our token; then, for a
-- lock with waiters, leave the queue and wake the next waiter (fair: hand the lock to
-- it; see handoff.lua.inc). Also what a waiter that gives up sends (dequeue).
--
-- KEYS[1]  the lock key
-- KEYS[2]  (waiting only) this node's floor (see acquire.lua)
-- KEYS[3]  (waiting only) the wait queue
-- ARGV[1]  the owner token of the lease being released (its waiter id, when waiting)
-- ARGV[2]  (waiting only) "n": wake the head of the queue; "f" or "q": hand the lock to it
-- ARGV[3]  (waiting only) "n": how long the lock stays reserved for the woken head, ms;
--          "q": the fencing token of the hand-off (see handoff.lua.inc)
-- ARGV[4]  (waiting only) the retention in milliseconds, for a hand-off's floor
-- ARGV[5]  (waiting only) the fencing token of the lease being released; "0" for a
--          cleanup or a waiter giving up (no lease)
-- ARGV[6]  (waiting only, optional) "c": the cleanup of a failed attempt: the caller
--          keeps its place in the queue, and if it heads the queue the lock is left free
--          here (it is the one a hand-off would go to)
--
-- Returns 1 if the key held our token and was deleted, 0 otherwise (absent, expired,
-- or held by someone else: their lock is left alone).
--
-- A lease's release that finds no key of ours raises this node's floor to the lease's
-- token, if the floor is lower. The lease's acquire may still be on its way to this node:
-- a round is decided at the first majority, and the release can go out on another
-- connection (the blocking client's threads share a pool of them), which a node may run
-- first. That acquire proposes the lease's token, so once the floor is not below it, it
-- is refused ("too low") instead of taking the lock for a whole TTL after its release.
-- Raising a floor is always safe (tokens only have to be above it); a node without one
-- is left blank (the floor is its incarnation, see acquire.lua), and a blank node
-- grants nothing anyway.
--
-- Waiting mode, whether or not the key was ours here: the caller leaves the queue (an
-- attempt that found this node held queued it here, even if a majority elsewhere then
-- granted it the lock) and drops a reservation made for it; then, if the lock is free
-- and reserved for nobody, the next waiter is woken or, fair, handed the lock. So a
-- fair hand-off that crossed a waiter's give-up is passed on, not left to expire.
--@include handoff
local released = 0
if redis.call("GET", KEYS[1]) == ARGV[1] then
    redis.call("DEL", KEYS[1])
    released = 1
end
if ARGV[2] then
    local queue, me = KEYS[3], ARGV[1]
    local reserved = queue .. ":next"
    local cleanup = ARGV[6] == "c"
    local fencing = tonumber(ARGV[5])
    if released == 0 and fencing > 0 then
        local floor = redis.call("GET", KEYS[2])
        if floor and tonumber(floor) < fencing then
            commit(KEYS[2], ARGV[5], ARGV[4], tonumber(floor))
        end
    end
    -- Nobody queued and nothing reserved (the common case): no place of ours to drop (a
    -- place never outlives its queue) and nobody to pass the lock on to. One EXISTS
    -- instead of the five calls below that would find the same.
    if redis.call("EXISTS", queue, reserved) == 0 then
        return released
    end
    if not cleanup then
        redis.call("ZREM", queue, me)
        redis.call("DEL", queue .. ":" .. me)
        if redis.call("GET", reserved) == me then
            redis.call("DEL", reserved)
        end
    end
    if redis.call("EXISTS", KEYS[1], reserved) == 0 then
        handoff(KEYS[1], KEYS[2], queue, ARGV[2], cleanup and me or "", ARGV[3], ARGV[4])
    end
end
return released
