-- tower-rate-tier: the GCRA arithmetic of a charge on one limited band,
-- which every script runs (`redis.lua` for a decision of one band, as
-- `slots.lua` runs it for an acquire, `batch.lua` for each short
-- decision), in integer microseconds; the
-- reference is `gcra::decide` (Rust, nanoseconds).
--
-- `v` is the band's stored value: a string as read, or a number as this
-- call wrote it; anything that is not an integer below 2^53 (corruption, a
-- foreign writer, a missing key) is a fresh state. `now` is the time,
-- `tol` the tolerance (interval * burst), `inc` the increment (interval *
-- cost), all below 2^51 (the client caps them), so every sum stays exact in
-- Lua's doubles (2^53). A TAT more than one full refill ahead (a clock that
-- went back, a foreign writer) counts as now + tol, and that clamp is
-- written back whatever the outcome.
--
-- Returns the reply of the charge, the band's time used (`reset_after`)
-- after it when admitted or -(used + 1) with the state left alone when
-- denied, and the time used to write (the new TAT is now + it), or nil.
--
-- A script makes its functions again at every call, so these two are the
-- only ones the scripts share, and they refer to nothing outside
-- themselves.
--
-- `stored_time` reads a band's stored value: the number when it is an
-- integer from 0 below 2^53, else nil (a fresh state).
local function stored_time(v)
  local t = tonumber(v)
  if t == nil or t ~= t or t < 0 or t >= 9007199254740992 or t ~= math.floor(t) then
    return nil
  end
  return t
end

local function charge_band(v, now, tol, inc)
  local tat = stored_time(v)
  local used, clamped = 0, false
  if tat ~= nil and tat > now then
    used = tat - now
    if used > tol then
      used, clamped = tol, true
    end
  end
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
