-- Compare-and-delete: remove the lock only if it still holds our token.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner token of the lease being released
--
-- Returns 1 if the key held our token and was deleted, 0 otherwise (absent, expired,
-- or held by someone else: their lock is left alone).
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("DEL", KEYS[1])
end
return 0
