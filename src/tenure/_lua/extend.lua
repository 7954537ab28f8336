-- Compare-and-expire: give the lock a new TTL only if it still holds our token.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner token of the lease being extended
-- ARGV[2]  the new TTL in milliseconds
--
-- Returns 1 if extended, 0 if the key is absent or held by someone else. An expired key
-- is never re-created: PEXPIRE on a missing key does nothing.
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
