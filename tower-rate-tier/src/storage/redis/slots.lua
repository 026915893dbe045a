-- tower-rate-tier: a concurrency limit's slots, and the admission that
-- takes one. A key's slots are one sorted set, a member per slot in use
-- (its lease id) scored by the time its lease ends (microseconds). It runs
-- after `gcra.lua` and `redis.lua`, the latter wrapped as the function
-- `decide`, which charges the rate bands of an acquire.
--
-- KEYS[1]      the key's slot set
-- KEYS[2..]    the TATs of the n rate bands an acquire charges (none for a
--              release, or for a tier without a rate limit); every key of
--              the call is under the key's one hash tag
-- ARGV[1]      "a" (acquire) or "r" (release)
-- ARGV[2]      now in microseconds, or "" for the server's TIME
-- ARGV[3]      the lease id (the member)
-- ARGV[4]      the limit (acquire)
-- ARGV[5]      the lease in microseconds (acquire)
-- ARGV[6..]    per band: interval, tolerance, increment, as for `redis.lua`;
--              for an admission with an amount per band (mode "e" of
--              `redis.lua`), then per band: amount and debt bound
--
-- Reply: {slot, slots in use after, decision}. slot is 1 when a slot was
-- taken (or, for a release, given back), 0 when none was free, -1 when a
-- band denied. decision is `redis.lua`'s reply for the bands ({allowed,
-- now, then per band: remaining, reset_after_us, retry_after_us}); it has
-- no band when no band was decided (a release, no bands). With no slot
-- free it is the bands' answer to a requirement (mode "e", `allowed` 0):
-- which of them would refuse too, and their waits.
--
-- An acquire is all or nothing: with no slot free it charges no band; with
-- one free it decides the bands as `redis.lua` does (one time for both),
-- and takes the slot only when every band admits. A failure of the bands'
-- decision (its error reply) is the reply, with no slot taken.
local nbands = #KEYS - 1
local band_mode = "c"
if nbands > 0 and #ARGV == 5 + 5 * nbands then
  band_mode = "e"
elseif nbands < 0 or #ARGV ~= 5 + 3 * nbands then
  return redis.error_reply("ERR tower-rate-tier: bad slot arguments")
end
local now
if ARGV[2] == "" then
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end
if now == nil or now ~= now or now < 0 or now >= 9007199254740992 then
  return redis.error_reply("ERR tower-rate-tier: bad time")
end
local key = KEYS[1]
-- leases that have passed are slots free again (an instance that died,
-- a release that failed)
redis.call("ZREMRANGEBYSCORE", key, "-inf", now)
if ARGV[1] == "r" then
  redis.call("ZREM", key, ARGV[3])
  return {1, redis.call("ZCARD", key), {1, now}}
end
local limit = tonumber(ARGV[4])
local lease = tonumber(ARGV[5])
if limit == nil or lease == nil or lease < 1 then
  return redis.error_reply("ERR tower-rate-tier: bad slot arguments")
end
local in_use = redis.call("ZCARD", key)
local band_keys = {}
for i = 1, nbands do
  band_keys[i] = KEYS[i + 1]
end
if in_use >= limit then
  -- No slot: no band is charged. The bands only say whether they would
  -- refuse too (each that charges is required: one interval, its debt
  -- bound kept; a charge of 0 is peeked), written nothing but the clamps,
  -- so that the refusal waits for them as well.
  if nbands == 0 then
    return {0, in_use, {0, now}}
  end
  local spans, kinds = {}, {}
  for i = 1, nbands do
    local b = 6 + 3 * (i - 1)
    local kind, debt = "c", "0"
    if band_mode == "e" then
      local d = 6 + 3 * nbands + 2 * (i - 1)
      kind, debt = ARGV[d], ARGV[d + 1]
    end
    local inc = "0"
    if kind == "q" or (kind == "c" and tonumber(ARGV[b + 2]) ~= 0) then
      kind, inc = "q", ARGV[b]
    else
      kind = "c"
    end
    spans[#spans + 1] = ARGV[b]
    spans[#spans + 1] = ARGV[b + 1]
    spans[#spans + 1] = inc
    kinds[#kinds + 1] = kind
    kinds[#kinds + 1] = debt
  end
  local asked = {"e", string.format("%d", now)}
  for _, v in ipairs(spans) do
    asked[#asked + 1] = v
  end
  for _, v in ipairs(kinds) do
    asked[#asked + 1] = v
  end
  local said = decide(band_keys, asked)
  if said.err ~= nil then
    return said
  end
  said[1] = 0
  return {0, in_use, said}
end
local decision = {1, now}
if nbands > 0 then
  local band_args = {band_mode, string.format("%d", now)}
  for i = 6, #ARGV do
    band_args[#band_args + 1] = ARGV[i]
  end
  decision = decide(band_keys, band_args)
  if decision.err ~= nil then
    return decision
  end
  if decision[1] ~= 1 then
    return {-1, in_use, decision}
  end
end
redis.call("ZADD", key, now + lease, ARGV[3])
-- the set lives as long as its longest lease (instances with another
-- lease may share it)
local last = redis.call("ZRANGE", key, -1, -1, "WITHSCORES")
redis.call("PEXPIRE", key, math.ceil((tonumber(last[2]) - now) / 1000) + 1)
return {1, in_use + 1, decision}
