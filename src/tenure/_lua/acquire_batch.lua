-- Several acquires on one node in one script run: acquire.lua's work for each lock of the
-- batch, in order, as if each had been its own EVALSHA on the connection.
--
-- KEYS     the keys of each acquire in turn (acquire.lua's KEYS of the first, then of the
--          second...)
-- ARGV     for each acquire in turn: its number of keys, its number of arguments, then
--          those arguments (acquire.lua's ARGV)
--
-- Returns one reply per acquire, in order: acquire.lua's reply, or the error that acquire
-- raised (an error reply in the array; the others ran as they would have alone).
--
-- Why: an asyncio client sends the acquires of many tasks to a node in one write. One
-- script run for them all saves the node a command's overhead per acquire and, in the
-- common case, the costliest call (INFO, read once per run: history.lua.inc) and the
-- floor's reads and writes (read once, written once: acquire.lua.inc). The locks of
-- one batch need not share a Cluster slot, so the client batches for a plain node only.
--@include history
--@include handoff
--@include batch_node
--@include acquire
local out, node = {}, node_new()
local k, a = 1, 1
while a <= #ARGV do
    local nkeys, nargs = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    local keys, args = {}, {}
    for j = 1, nkeys do
        keys[j] = KEYS[k + j - 1]
    end
    for j = 1, nargs do
        args[j] = ARGV[a + 1 + j]
    end
    k, a = k + nkeys, a + 2 + nargs
    local ok, reply = pcall(acquire, keys, args, node)
    if not ok then
        -- What it wrote stays written, as after a failed script; the next reads again.
        node_forget(node)
    end
    if ok or type(reply) == "table" then
        -- A reply, or the error table a failed redis.call raised (Redis 7 and later).
        out[#out + 1] = reply
    else
        -- A Lua error, or on Redis 6.2 a failed redis.call's message.
        out[#out + 1] = redis.error_reply(tostring(reply))
    end
end
node_write(node)
return out
