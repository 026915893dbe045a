-- tower-rate-tier: one GCRA decision over every band of a tier, atomically.
--
-- The reference is `gcra::decide` / `gcra::refund` (Rust, nanoseconds); this
-- script is the same arithmetic in integer microseconds. It runs after
-- `gcra.lua`, whose `charge_band` decides a charge of one limited band, and
-- `each.lua`, whose `decide_each` decides a call of mode "e".
--
-- KEYS[i]   the TAT of band i: integer microseconds since the Unix epoch, as
--           a decimal string, written with string.format("%d") (exact below
--           2^63, where Lua's own tostring is not; cheaper than the server's
--           own conversion of a number argument). All keys of one call share
--           one hash tag, so Redis Cluster accepts the call.
-- ARGV[1]   "c" (check: charge all bands or none), "r" (refund), or "e"
--           (an amount per band: see `each.lua`, whose arguments follow
--           the band triples).
-- ARGV[2]   now in microseconds since the Unix epoch, or "" to read the
--           server's TIME (the default: every instance shares one clock).
-- ARGV[3i], ARGV[3i+1], ARGV[3i+2] (i = 1..n)
--           band i's emission interval, tolerance (interval * burst) and
--           increment (interval * cost), in microseconds; interval 0 is an
--           unlimited band (never stored). The client keeps every value below
--           2^51, so all sums here stay exact in Lua's doubles (2^53).
--
-- Reply: { allowed, now, then per band: remaining, reset_after_us,
--          retry_after_us } with remaining -1 for an unlimited band; for a
--          refund, allowed is 1 and each band's state is the one after it.
--
-- Effects: a check that admits writes each charged band with SET .. PX
-- (expiry = time until the new TAT, rounded up, plus 1 ms); a denied check
-- writes nothing. A refund moves the TAT back (SET .. PX) or deletes the key
-- when the band is full again. Every write carries an expiry.
--
-- A stored value that is not a non-negative integer (corruption, a foreign
-- writer, a key of another type: MGET reads it as nil) is a fresh state and
-- is overwritten by the next admitted charge. A TAT more than one full refill
-- ahead (a clock that went back, a foreign writer) is clamped to
-- now + tolerance, and the clamp is written back whatever the outcome (also
-- for a denied request or a peek), so the lock-out never exceeds one refill.

local n = #KEYS
local width = 3
if ARGV[1] == "e" then
  width = 5
end
if n == 0 or #ARGV ~= 2 + width * n then
  return redis.error_reply("ERR tower-rate-tier: bad script arguments")
end

local EXACT = 9007199254740992 -- 2^53
local floor, ceil, tonumber, format = math.floor, math.ceil, tonumber, string.format

local now
if ARGV[2] == "" then
  -- Redis 7 replicates effects by default; older servers need this before
  -- a write that follows TIME.
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end
if now == nil or now ~= now or now < 0 or now >= EXACT then
  return redis.error_reply("ERR tower-rate-tier: bad time")
end

if ARGV[1] == "e" then
  return decide_each(KEYS, ARGV, now)
end

-- One limited band (the common case): `charge_band`, the same arithmetic
-- as below, without tables.
if n == 1 and ARGV[1] == "c" and ARGV[3] ~= "0" then
  local interval, tol, inc = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  if interval == nil or tol == nil or inc == nil or interval < 1 or tol < interval or inc < 0 then
    return redis.error_reply("ERR tower-rate-tier: bad band arguments")
  end
  -- a key of another type makes GET fail: pcall gives a table, a fresh
  -- state; any other failure (a command the ACL denies) is the reply, never
  -- a fresh state (that would admit every request)
  local tat = redis.pcall("GET", KEYS[1])
  if type(tat) == "table" and type(tat.err) == "string" and not string.find(tat.err, "WRONGTYPE", 1, true) then
    return tat
  end
  local reply, write = charge_band(tat, now, tol, inc)
  if write ~= nil then
    redis.call("SET", KEYS[1], format("%d", now + write), "PX", format("%d", ceil(write / 1000) + 1))
  end
  local used, retry, allowed = reply, 0, 1
  if reply < 0 then
    used = -reply - 1
    retry, allowed = used + inc - tol, 0
  end
  local left = tol - used
  local remaining = floor(left / interval)
  if remaining * interval > left then
    remaining = remaining - 1
  end
  return { allowed, now, remaining, used, retry }
end

-- Stored TATs; a missing key, a malformed value or a key of another type
-- (MGET reads it as nil) is nil, a fresh state.
local stored = redis.call("MGET", unpack(KEYS))

local refund = ARGV[1] == "r"
local allowed = 1
-- per band: interval, tolerance, increment, used, charged, clamped
local bands = {}
for i = 1, n do
  local b = 3 * i
  local interval, tol, inc = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  if interval == nil or tol == nil or inc == nil or interval < 0 or tol < interval or inc < 0 then
    return redis.error_reply("ERR tower-rate-tier: bad band arguments")
  end
  local tat = stored_time(stored[i])
  local used, clamped = 0, false
  if interval > 0 and tat ~= nil and tat > now then
    if tat > now + tol then
      used, clamped = tol, true
    else
      used = tat - now
    end
  end
  local charged = used + inc
  if interval > 0 and charged > tol then
    allowed = 0
  end
  bands[i] = { interval, tol, inc, used, charged, clamped, tat }
end

if refund then
  local out = { 1, now }
  for i = 1, n do
    local band = bands[i]
    local interval, tol, tat = band[1], band[2], band[7]
    local k = 3 * i
    if interval == 0 then
      out[k], out[k + 1], out[k + 2] = -1, 0, 0
    else
      local used = 0
      if tat ~= nil then
        local back = tat
        if back > now + tol then
          back = now + tol
        end
        back = back - band[3]
        if back > now then
          redis.call("SET", KEYS[i], format("%d", back), "PX", format("%d", ceil((back - now) / 1000) + 1))
          used = back - now
        else
          redis.call("DEL", KEYS[i])
        end
      end
      local left = tol - used
      local remaining = floor(left / interval)
      if remaining * interval > left then
        remaining = remaining - 1
      end
      out[k], out[k + 1], out[k + 2] = remaining, used, 0
    end
  end
  return out
end

local out = { allowed, now }
for i = 1, n do
  local band = bands[i]
  local interval, tol, inc, used, charged, clamped = band[1], band[2], band[3], band[4], band[5], band[6]
  local k = 3 * i
  if interval == 0 then
    out[k], out[k + 1], out[k + 2] = -1, 0, 0
  else
    local retry = 0
    local write = nil
    local left
    if allowed == 1 then
      -- charged (or, for a peek, the clamp written back)
      if inc > 0 or clamped then
        write = charged
      end
      left = tol - charged
      used = charged
    else
      -- denied: nothing charged; every band reports its unchanged state,
      -- with the wait when it is one that denies, and writes back its clamp
      if clamped then
        write = tol
      end
      if charged > tol then
        retry = charged - tol
      end
      left = tol - used
    end
    if write ~= nil then
      redis.call("SET", KEYS[i], format("%d", now + write), "PX", format("%d", ceil(write / 1000) + 1))
    end
    -- floor(left / interval), immune to the rounding of the division
    local remaining = floor(left / interval)
    if remaining * interval > left then
      remaining = remaining - 1
    end
    out[k], out[k + 1], out[k + 2] = remaining, used, retry
  end
end
return out
