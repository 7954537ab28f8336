-- A waiter leaves the queue (it gave up, timed out or was cancelled).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fencing counter
-- KEYS[3]  the wait queue
-- ARGV[1]  the waiter id
-- ARGV[2]  "n" (notified waiting) or "f" (fair)
--
-- In fair mode the lock may have been handed to this waiter meanwhile (the hand-off and
-- the give-up crossed): it is passed on to the next waiter rather than left to expire.
-- If the lock is free, the next waiter is woken (or handed it): this waiter may have
-- consumed the wake-up meant to let someone in.
--
-- Returns 1 if the lock had been handed to this waiter and was passed on, else 0.
--@include handoff
local fair = ARGV[2] == "f"
redis.call("ZREM", KEYS[3], ARGV[1])
redis.call("DEL", KEYS[3] .. ":" .. ARGV[1])
local holder = redis.call("GET", KEYS[1])
local passed = 0
if fair and holder == ARGV[1] then
    redis.call("DEL", KEYS[1])
    holder = false
    passed = 1
end
if not holder then
    handoff(KEYS[1], KEYS[2], KEYS[3], fair, "")
end
return passed
