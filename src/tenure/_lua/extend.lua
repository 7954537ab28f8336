-- Compare-and-expire: give the lock a new TTL only if it still holds our token.
--
-- KEYS[1]  the lock key
-- KEYS[2]  (optional) this node's floor (see acquire.lua)
-- ARGV[1]  the owner token of the lease being extended
-- ARGV[2]  the new TTL in milliseconds
-- ARGV[3]  (with KEYS[2]) the retention in milliseconds
--
-- Returns 1 if extended, 0 if the key is absent or held by someone else. An expired key
-- is never re-created: PEXPIRE on a missing key does nothing.
--
-- An extension also keeps the floor, and its stored replication ID, for another
-- retention: a node whose only activity is one lease kept alive for longer than the
-- retention must not forget its floor (it would then look like a node that lost its
-- data, and sit out a warm-up). A floor without a stored ID gets one, as acquire.lua
-- records it (history.lua.inc; the only case that reads INFO here), unless the node
-- was promoted (acquire.lua then answers "history changed" until it is seeded).
--
-- A node whose replication history changed is not refused here: the answer is about
-- our own key, which carries our token, so a node that holds it holds a grant of ours
-- under its current history, and nobody else can hold the lock there meanwhile. What a
-- changed history forbids is new grants, and acquire.lua refuses those until the node
-- has been seeded and warmed up.
--@include history
if redis.call("GET", KEYS[1]) == ARGV[1] then
    if KEYS[2] then
        local floor = redis.call("PEXPIRE", KEYS[2], ARGV[3])
        if redis.call("PEXPIRE", replid_key(KEYS[2]), ARGV[3]) == 0 and floor == 1 then
            local id, promoted = history()
            if not promoted then
                record(KEYS[2], id, ARGV[3])
            end
        end
    end
    return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
