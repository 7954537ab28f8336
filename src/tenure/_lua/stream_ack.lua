-- Stream acknowledgement: acknowledge entries of a partition, for its owner only.
--
-- KEYS[1]  the partition's stream   <prefix>:{<p>}
-- KEYS[2]  its owner key            <prefix>:{<p>}:owner:<group>
-- ARGV[1]  the acknowledger's fencing token (the owner's, or it is refused)
-- ARGV[2]  the consumer group
-- ARGV[3]  and on: the entry ids
--
-- Returns the number of entries acknowledged (XACK's reply), or -1 when ARGV[1] is not
-- the token the owner key holds (nothing is acknowledged).
if redis.call("GET", KEYS[2]) ~= ARGV[1] then
    return -1
end
return redis.call("XACK", KEYS[1], ARGV[2], unpack(ARGV, 3))
