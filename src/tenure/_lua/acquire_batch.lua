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
--@include batch
local node = node_new()
local out = batch(function(keys, args)
    return acquire(keys, args, node)
end, function()
    -- What it wrote stays written, as after a failed script; the next reads again.
    node_forget(node)
end)
node_write(node)
return out
