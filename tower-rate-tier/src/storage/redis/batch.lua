-- tower-rate-tier: many decisions in one call, in order, each one exactly
-- the decision `redis.lua` makes (its code is the function `decide` above,
-- called with the decision's own keys and arguments).
--
-- KEYS      every decision's keys, one decision after the other.
-- ARGV[1]   the contract, "trt-batch-1"; any other value is refused.
-- ARGV[2]   the number of decisions.
-- then per decision: its key count n, its mode ("c" or "r"), its time in
--           microseconds or "" for the server's TIME (read once per call,
--           whatever the number of decisions), and 3n band arguments, as
--           for `redis.lua`.
--
-- Reply: one element per decision, in order: `redis.lua`'s reply, or a
-- string with the error of that decision alone (a bad key, a command the
-- ACL denies): one decision's failure never fails the others.

if ARGV[1] ~= "trt-batch-1" then
  return redis.error_reply("ERR tower-rate-tier: unknown batch contract")
end
local count = tonumber(ARGV[2])
if count == nil or count < 1 then
  return redis.error_reply("ERR tower-rate-tier: bad batch arguments")
end

local server_time = nil
local function server_now()
  if server_time == nil then
    if redis.replicate_commands then
      redis.replicate_commands()
    end
    local t = redis.call("TIME")
    server_time = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return server_time
end

local out = {}
-- one decision's keys and arguments; the tables are reused from one
-- decision to the next (`decide` keeps no reference to them)
local keys, argv, width = {}, {}, 0
local k, a = 1, 3
for i = 1, count do
  local n = tonumber(ARGV[a])
  if n == nil or n < 1 or a + 2 + 3 * n > #ARGV or k + n - 1 > #KEYS then
    return redis.error_reply("ERR tower-rate-tier: bad batch arguments")
  end
  local now = ARGV[a + 2]
  if now == "" then
    now = server_now()
  end
  for j = n + 1, width do
    keys[j] = nil
    argv[2 + 3 * j - 2], argv[2 + 3 * j - 1], argv[2 + 3 * j] = nil, nil, nil
  end
  width = n
  argv[1], argv[2] = ARGV[a + 1], now
  for j = 1, n do
    keys[j] = KEYS[k + j - 1]
  end
  for j = 1, 3 * n do
    argv[2 + j] = ARGV[a + 2 + j]
  end
  local ok, reply = pcall(decide, keys, argv)
  if not ok then
    if type(reply) == "table" and reply.err ~= nil then
      reply = tostring(reply.err)
    else
      reply = "ERR " .. tostring(reply)
    end
  elseif type(reply) == "table" and reply.err ~= nil then
    reply = tostring(reply.err)
  end
  out[i] = reply
  k, a = k + n, a + 3 + 3 * n
end
return out
