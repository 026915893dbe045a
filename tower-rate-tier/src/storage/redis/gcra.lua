-- tower-rate-tier: what both scripts (`redis.lua`, `batch.lua`) share,
-- ahead of either: the time of a decision and the GCRA arithmetic of one
-- band, in integer microseconds (the reference is `gcra::decide`, in Rust).
--
-- Every value handed in stays below 2^51 (the client caps durations), so
-- all sums here stay exact in Lua's doubles (2^53). The functions are few
-- on purpose: each one is made again at every call of a script.

local EXACT = 9007199254740992 -- 2^53
local floor, ceil, tonumber, format = math.floor, math.ceil, tonumber, string.format

-- The time argument `arg` in microseconds, "" for the server's TIME; nil
-- for anything that is not a time.
local function time_arg(arg)
  local now
  if arg == "" then
    -- Redis 7 replicates effects by default; older servers need this
    -- before a write that follows TIME.
    if redis.replicate_commands then
      redis.replicate_commands()
    end
    local t = redis.call("TIME")
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  else
    now = tonumber(arg)
  end
  if now == nil or now ~= now or now < 0 or now >= EXACT then
    return nil
  end
  return now
end

-- A limited band's arguments (interval, tolerance, increment) as numbers,
-- or nil for arguments that make no band.
local function limited_band(interval, tol, inc)
  interval, tol, inc = tonumber(interval), tonumber(tol), tonumber(inc)
  if interval == nil or tol == nil or inc == nil or interval < 1 or tol < interval or inc < 0 then
    return nil
  end
  return interval, tol, inc
end

-- The time used at `now` of a band with tolerance `tol` whose stored value
-- is `v`, whether its TAT was clamped, and the TAT.
--
-- `v` is a string as read or a number as this call wrote it; anything else,
-- or a value that is not an integer below 2^53 (corruption, a foreign
-- writer, a missing key), is a fresh state (TAT nil). A TAT more than one
-- full refill ahead (a clock that went back, a foreign writer) counts as
-- now + tol, and the caller writes that clamp back whatever the outcome.
local function used_of(v, now, tol)
  local tat = v
  if type(tat) == "string" then
    tat = tonumber(tat)
  elseif type(tat) ~= "number" then
    tat = nil
  end
  if tat == nil or tat ~= tat or tat < 0 or tat >= EXACT or tat ~= floor(tat) then
    return 0, false, nil
  end
  if tat <= now then
    return 0, false, tat
  end
  if tat > now + tol then
    return tol, true, tat
  end
  return tat - now, false, tat
end

-- A charge of `inc` on one limited band (tolerance `tol`) whose stored
-- value is `v` (see `used_of`).
--
-- Returns the reply of the charge: the band's time used (`reset_after`)
-- after it when admitted, -(used + 1) with the state left alone when
-- denied; and the time used to write (the new TAT is now + it), or nil.
local function charge_band(v, now, tol, inc)
  local used, clamped = used_of(v, now, tol)
  local charged = used + inc
  if charged <= tol then
    if inc > 0 or clamped then
      return charged, charged
    end
    return charged, nil
  end
  if clamped then
    return -used - 1, tol
  end
  return -used - 1, nil
end

-- The stored value of `key` for `charge_band`: a key of another type makes
-- GET fail, a fresh state (nil); any other failure (a command the ACL
-- denies) is returned as the second value, the reply, never a fresh state
-- (that would admit every request).
local function read_band(key)
  local v = redis.pcall("GET", key)
  if type(v) == "table" then
    if type(v.err) == "string" and not string.find(v.err, "WRONGTYPE", 1, true) then
      return nil, v
    end
    return nil
  end
  return v
end

-- Writes the TAT now + used of `key` with `call` (redis.call or
-- redis.pcall), with an expiry of the time until the band is full again
-- plus 1 ms. Numbers go as strings written by format("%d") (exact below
-- 2^63, where Lua's own tostring is not; cheaper than the server's own
-- conversion of a number argument).
local function write_band(call, key, now, used)
  return call("SET", key, format("%d", now + used), "PX", format("%d", ceil(used / 1000) + 1))
end
