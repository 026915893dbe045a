-- tower-rate-tier: one decision with an amount per band (`Op::Each`),
-- atomically; `redis.lua` hands a call of mode "e" to `decide_each`. The
-- reference is `storage::decide_bands` over `gcra::decide_within`,
-- `gcra::require`, `gcra::force` and `gcra::refund` (Rust, nanoseconds);
-- this is the same arithmetic in integer microseconds.
--
-- keys      the bands' keys, as for `redis.lua`.
-- argv[3i], argv[3i+1], argv[3i+2] (i = 1..n)
--           band i's interval, tolerance and increment (interval * units;
--           one interval for a requirement), as for `redis.lua`
-- argv[3n+2i+1], argv[3n+2i+2]
--           band i's amount ("c" charge, "q" require, "f" force, "r"
--           refund) and debt bound (interval * the units it may owe).
-- now       the time, checked by `redis.lua`.
--
-- A band's TAT is clamped at now + tolerance + debt (a clock that went
-- back, a foreign writer), and that clamp is written back whatever the
-- outcome. The decision is admitted when every charge fits (a charge of 0,
-- a peek, always does) and every requirement holds (one interval fits);
-- a forced band takes its increment up to the bound and reports the whole
-- intervals beyond it as forgiven. Refused: nothing is written but the
-- clamps, no band is forced or refunded, and each band reports its state
-- unchanged (the wait, for a band that refused).
--
-- Reply: { allowed, now, per band: remaining, used, retry_after, then per
-- band: forgiven }, times in microseconds, remaining -1 for an unlimited
-- band. `used` beyond the tolerance is the band's debt.
local function decide_each(keys, argv, now)
  local n = #keys
  local floor, ceil, format = math.floor, math.ceil, string.format
  local stored = redis.call("MGET", unpack(keys))
  local allowed = 1
  local bands = {}
  for i = 1, n do
    local b, d = 3 * i, 3 * n + 2 * i + 1
    local interval, tol, inc = tonumber(argv[b]), tonumber(argv[b + 1]), tonumber(argv[b + 2])
    local kind, room = argv[d], tonumber(argv[d + 1])
    if interval == nil or tol == nil or inc == nil or room == nil or interval < 0 or tol < interval
      or inc < 0 or room < 0 or (kind ~= "c" and kind ~= "q" and kind ~= "f" and kind ~= "r") then
      return redis.error_reply("ERR tower-rate-tier: bad band arguments")
    end
    local tat = stored_time(stored[i])
    local bound = tol + room
    local used, clamped = 0, false
    if interval > 0 and tat ~= nil and tat > now then
      if tat > now + bound then
        used, clamped = bound, true
      else
        used = tat - now
      end
    end
    -- the use after an admission, the wait of a refusal, units forgiven
    local after, retry, forgiven = used, 0, 0
    if interval > 0 then
      if kind == "c" and inc > 0 or kind == "q" then
        if used + inc > tol then
          retry, allowed = used + inc - tol, 0
        elseif kind == "c" then
          after = used + inc
        end
      elseif kind == "f" then
        after = used + inc
        if after > bound then
          forgiven = floor((after - bound) / interval)
          after = bound
        end
      end
    end
    bands[i] = { interval, tol, kind, bound, used, clamped, after, retry, forgiven, tat, inc }
  end
  local out = { allowed, now }
  for i = 1, n do
    local band = bands[i]
    local interval, tol, kind, bound, used, clamped = band[1], band[2], band[3], band[4], band[5], band[6]
    local k = 3 * i
    if interval == 0 then
      out[k], out[k + 1], out[k + 2], out[3 * n + 2 + i] = -1, 0, 0, 0
    else
      local after, retry, forgiven = used, band[8], 0
      local write = nil
      if clamped then
        write = now + bound
      end
      if allowed == 1 and kind == "r" then
        if band[10] ~= nil then
          local back = now + used - band[11]
          if back > now then
            write = back
            after = back - now
          else
            write = false
            after = 0
          end
        end
      elseif allowed == 1 then
        after, forgiven = band[7], band[9]
        if after > used then
          write = now + after
        end
      end
      if write == false then
        redis.call("DEL", keys[i])
      elseif write ~= nil then
        redis.call("SET", keys[i], format("%d", write), "PX", format("%d", ceil((write - now) / 1000) + 1))
      end
      local remaining = 0
      if after <= tol then
        local left = tol - after
        remaining = floor(left / interval)
        if remaining * interval > left then
          remaining = remaining - 1
        end
      end
      if allowed == 1 then
        retry = 0
      end
      out[k], out[k + 1], out[k + 2], out[3 * n + 2 + i] = remaining, after, retry, forgiven
    end
  end
  return out
end
