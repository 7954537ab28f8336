-- Give a node without a floor (blank: never used, or it lost its data) its floor, and,
-- after a data loss, a warm-up period during which it grants nothing.
--
-- KEYS[1]  this node's floor               tenure:node:floor
-- KEYS[2]  this node's warm-up marker      tenure:node:warm
-- ARGV[1]  the floor to start from: the highest floor the client saw on the other nodes
--          (0 for a node set no node of which has a floor)
-- ARGV[2]  warm-up in milliseconds: 0 when every node was blank, else the client's
--          maximum TTL, so every lease this node might have granted before losing its
--          data has expired before it votes again
-- ARGV[3]  the retention in milliseconds (how long the floor lives without a grant)
-- ARGV[4..] the observation marks the client's decision was based on (acquire.lua put
--          one in KEYS[2] of each blank node)
--
-- Returns 1 if seeded, 0 if the node already had a floor (another client was first),
-- -1 if the node's mark is not among ARGV[4..]: it restarted (or its mark expired) after
-- the observation, so the decision no longer applies to it and nothing is written.
if redis.call("EXISTS", KEYS[1]) == 1 then
    return 0
end
local mark = redis.call("GET", KEYS[2])
local known = false
for i = 4, #ARGV do
    if mark == ARGV[i] then
        known = true
    end
end
if not known then
    return -1
end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[3])
if tonumber(ARGV[2]) > 0 then
    redis.call("SET", KEYS[2], "1", "PX", ARGV[2])
else
    redis.call("DEL", KEYS[2])
end
return 1
