-- Give a node without a floor (blank: never used, or it lost its data), or one whose
-- replication history changed (acquire.lua's -4: a failover, a restart), its floor, and,
-- after a data loss, a warm-up period during which it grants nothing.
--
-- KEYS[1]  this node's floor               tenure:node:floor
-- KEYS[2]  this node's warm-up marker      tenure:node:warm
-- ARGV[1]  the floor to start from: the highest floor the client saw on the other nodes
--          (0 for a node set no node of which has a floor); a node whose history changed
--          keeps its own floor if that is higher (a floor never goes down)
-- ARGV[2]  warm-up in milliseconds: 0 when every node was blank, else the client's
--          maximum TTL, so every lease this node might have granted before losing its
--          data has expired before it votes again; for a node whose history changed,
--          what is left of it since the client first heard the new history, and 1 once
--          nothing is: no marker is kept then (it would be gone within the millisecond,
--          but an acquire right behind the seed would still find it), and the node is
--          not seeded as new either
-- ARGV[3]  the retention in milliseconds (how long the floor lives without a grant)
-- ARGV[4..] the observation marks the client's decision was based on (acquire.lua put
--          one in KEYS[2] of each blank or changed node, with the node's history)
--
-- The seed records this server's replication ID as the floor's history
-- (history.lua.inc): from then on the node votes under it.
--
-- Returns 1 if seeded, 0 if the node already had a floor of its current history
-- (another client was first, or it never needed a seed), -1 if the node's mark is not
-- among ARGV[4..] under its current history: it restarted, failed over (or its mark
-- expired) after the observation, so the decision no longer applies to it and nothing
-- is written. Also -1 for a seed without a warm-up (ARGV[2] = 0) on a node whose
-- history changed: such a node never counts as new.
--@include history
local id, promoted = history()
local floor = redis.call("GET", KEYS[1])
local changed = promoted
if floor then
    local stored = redis.call("GET", replid_key(KEYS[1]))
    if stored == id or (not stored and not promoted) then
        return 0
    end
    changed = true
end
local seen = redis.call("GET", KEYS[2])
local mark = seen and string.match(seen, "^(%d+) " .. id .. "$")
local known = false
for i = 4, #ARGV do
    if mark == ARGV[i] then
        known = true
    end
end
if not known or (changed and tonumber(ARGV[2]) <= 0) then
    return -1
end
local start = ARGV[1]
if floor and tonumber(floor) > tonumber(start) then
    start = floor
end
redis.call("SET", KEYS[1], start, "PX", ARGV[3])
redis.call("SET", replid_key(KEYS[1]), id, "PX", ARGV[3])
if tonumber(ARGV[2]) > 1 then
    redis.call("SET", KEYS[2], "1", "PX", ARGV[2])
else
    redis.call("DEL", KEYS[2])
end
return 1
