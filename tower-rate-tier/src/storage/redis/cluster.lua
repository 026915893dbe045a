#!lua flags=allow-cross-slot-keys
-- tower-rate-tier: the batch script on a Redis Cluster node. The decisions
-- of one call live in many slots of this node, which a call cannot declare
-- as its keys (Redis refuses declared keys of different slots with
-- CROSSSLOT), so the keys come as arguments, and the flag above lets the
-- script reach keys of several slots. It needs Redis 7.0 or later (or
-- Valkey): older servers do not read the first line and refuse the script.
--
-- ARGV[1]   the number of keys, k
-- ARGV[2 .. k + 1]
--           the keys, as `batch.lua` takes them in KEYS
-- then      `batch.lua`'s arguments, from its contract on
--
-- A key this node does not serve (its slot moved, or is moving and the key
-- is not here) fails the decision that names it, with Redis's own error
-- ("... non local key ..."), and only that decision: its caller sends it
-- again alone, to the node the slot map names. Stored values are read key
-- by key (MGET refuses keys of several slots even here).

local k = tonumber(ARGV[1])
if k == nil or k < 0 or k + 1 > #ARGV then
  return redis.error_reply("ERR tower-rate-tier: bad batch arguments")
end
local KEYS, ARGV, given = {}, {}, ARGV
for i = 1, k do
  KEYS[i] = given[i + 1]
end
for i = k + 2, #given do
  ARGV[i - k - 1] = given[i]
end
local read_one_by_one = true
