-- tower-rate-tier: one GCRA decision over every band of a tier, atomically.
--
-- The reference is `gcra::decide` / `gcra::refund` (Rust, nanoseconds); this
-- script is the same arithmetic in integer microseconds.
--
-- KEYS[i]   the TAT of band i: integer microseconds since the Unix epoch, as
--           a decimal string. All keys of one call share one hash tag, so
--           Redis Cluster accepts the call.
-- ARGV[1]   "c" (check: charge all bands or none) or "r" (refund).
-- ARGV[2]   now in microseconds since the Unix epoch, or "" to read the
--           server's TIME (the default: every instance shares one clock).
-- ARGV[3i], ARGV[3i+1], ARGV[3i+2] (i = 1..n)
--           band i's emission interval, tolerance (interval * burst) and
--           increment (interval * cost), in microseconds; interval 0 is an
--           unlimited band (never stored). The client keeps every value below
--           2^51, so all sums here stay exact in Lua's doubles (2^53).
--
-- Reply (check): { allowed, now, then per band: remaining, reset_after_us,
--                  retry_after_us } with remaining -1 for an unlimited band.
-- Reply (refund): { 1, now }
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
if n == 0 or #ARGV ~= 2 + 3 * n then
  return redis.error_reply("ERR tower-rate-tier: bad script arguments")
end

local EXACT = 9007199254740992 -- 2^53

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

local function fmt(x)
  return string.format("%.0f", x)
end

-- floor(a / b) for exact non-negative integers, immune to the rounding of
-- the double division.
local function div(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  end
  return q
end

-- The stored TAT, or nil for a fresh (missing or malformed) state.
local function tat_of(v)
  local t = tonumber(v)
  if t == nil or t ~= t or t < 0 or t >= EXACT or t ~= math.floor(t) then
    return nil
  end
  return t
end

local function band(i)
  local b = 3 * i
  return tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
end

local stored = redis.call("MGET", unpack(KEYS))

if ARGV[1] == "r" then
  for i = 1, n do
    local interval, tol, inc = band(i)
    local tat = tat_of(stored[i])
    if interval and interval > 0 and tol and inc and tat then
      local back = math.min(tat, now + tol) - inc
      if back > now then
        redis.call("SET", KEYS[i], fmt(back), "PX", fmt(math.ceil((back - now) / 1000) + 1))
      else
        redis.call("DEL", KEYS[i])
      end
    end
  end
  return { 1, now }
end

local allowed = 1
local used = {}
local charged = {}
local clamped = {}
for i = 1, n do
  local interval, tol, inc = band(i)
  if interval == nil or tol == nil or inc == nil or interval < 0 or tol < interval or inc < 0 then
    return redis.error_reply("ERR tower-rate-tier: bad band arguments")
  end
  if interval > 0 then
    local base = now
    local tat = tat_of(stored[i])
    if tat ~= nil and tat > now then
      base = math.min(tat, now + tol)
      clamped[i] = tat > now + tol
    end
    used[i] = base - now
    charged[i] = used[i] + inc
    if charged[i] > tol then
      allowed = 0
    end
  end
end

local out = { allowed, now }
for i = 1, n do
  local interval, tol, inc = band(i)
  local k = 3 * i
  if interval == 0 then
    out[k], out[k + 1], out[k + 2] = -1, 0, 0
  elseif allowed == 1 then
    -- charged (or, for a peek, the clamp written back)
    local c = charged[i]
    if inc > 0 or clamped[i] then
      redis.call("SET", KEYS[i], fmt(now + c), "PX", fmt(math.ceil(c / 1000) + 1))
    end
    out[k], out[k + 1], out[k + 2] = div(tol - c, interval), c, 0
  else
    -- denied: nothing charged; a band reports its unchanged state, with the
    -- wait when it is one that denies, and writes back its clamp if any
    if clamped[i] then
      redis.call("SET", KEYS[i], fmt(now + tol), "PX", fmt(math.ceil(tol / 1000) + 1))
    end
    local retry = 0
    if charged[i] > tol then
      retry = charged[i] - tol
    end
    out[k], out[k + 1], out[k + 2] = div(tol - used[i], interval), used[i], retry
  end
end
return out
