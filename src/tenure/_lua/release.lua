-- Compare-and-delete: remove the lock only if it still holds our token; then wake the
-- next waiter, or in fair mode hand the lock to it (see _handoff.lua).
--
-- KEYS[1]  the lock key
-- KEYS[2]  (waiting only) the fencing counter
-- KEYS[3]  (waiting only) the wait queue
-- ARGV[1]  the owner token of the lease being released
-- ARGV[2]  (waiting only) "n": wake the head of the queue; "f": hand the lock to it
--
-- Returns 1 if the key held our token and was deleted, 0 otherwise (absent, expired,
-- or held by someone else: their lock is left alone, and nobody is woken).
--@include handoff
if redis.call("GET", KEYS[1]) == ARGV[1] then
    redis.call("DEL", KEYS[1])
    if ARGV[2] then
        handoff(KEYS[1], KEYS[2], KEYS[3], ARGV[2] == "f", "")
    end
    return 1
end
return 0
