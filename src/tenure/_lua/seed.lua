-- Give a node without history for a lock its fencing counter (and, after a data loss,
-- a warm-up period during which it grants nothing).
--
-- KEYS[1]  the fencing counter             tenure:{name}:fence
-- KEYS[2]  the warm-up marker              tenure:{name}:warm
-- ARGV[1]  the counter to start from: the highest counter the client saw on the other
--          nodes (0 for a lock no node has seen)
-- ARGV[2]  warm-up in milliseconds: 0 for a lock no node has seen, else the client's
--          maximum TTL, so every lease this node might have granted before losing its
--          data has expired before it votes again
--
-- Returns 1 if seeded, 0 if the node already had a counter (another client was first).
if redis.call("EXISTS", KEYS[1]) == 1 then
    return 0
end
redis.call("SET", KEYS[1], ARGV[1])
if tonumber(ARGV[2]) > 0 then
    redis.call("SET", KEYS[2], "1", "PX", ARGV[2])
end
return 1
