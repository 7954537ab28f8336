-- The ACL probe of `tenure check`: try commands for real, report each one's answer.
--
-- KEYS[1]  the probe key         tenure:{check}:probe
-- KEYS[2]  the probe wait queue  tenure:{check}:probe:q
-- ARGV     the calls, one after another, each as (count, command, args...): count is
--          the number of words that follow it
--
-- Returns one entry per call, in order: "OK", or the error it met. An ACL refusal is an
-- error reply that redis.pcall catches (in 6.2 and 7 alike), which is why every call is
-- made with redis.pcall and not redis.call: one refusal must not end the probe. The probe
-- keys are deleted at the end, whatever the calls did.
local out, i = {}, 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local reply = redis.pcall(unpack(ARGV, i + 1, i + n))
  if type(reply) == "table" and reply.err then
    out[#out + 1] = reply.err
  else
    out[#out + 1] = "OK"
  end
  i = i + n + 1
end
redis.pcall("DEL", unpack(KEYS))
return out
