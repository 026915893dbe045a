-- tower-rate-tier: many decisions in one call, in order, each one exactly
-- the decision `redis.lua` makes. It runs after `gcra.lua` (`charge_band`)
-- and `redis.lua`, the latter wrapped as the function `decide`.
--
-- KEYS      every decision's keys, one decision after the other.
-- ARGV[1]   the contract, "trt-batch-3"; any other value is refused.
-- ARGV[2]   the number of decisions.
-- ARGV[3]   the time of the short decisions (below), in microseconds, or ""
--           for the server's TIME.
-- ARGV[4]   m, the number of band triples the short decisions name,
--           followed by the m triples (interval, tolerance, increment, as
--           for `redis.lua`).
-- then per decision, either
--   short:  "s<j>": a charge of the one limited band of triple j (1-based)
--           at the time in ARGV[3], decided here with `charge_band`, as
--           `redis.lua` decides it;
--   full:   its key count n, its mode ("c", "r" or "e"), its time in
--           microseconds or "" for the server's TIME, and its band
--           arguments as `redis.lua` takes them (3n; 5n for mode "e": the
--           triples, then each band's amount and debt bound), run through
--           `decide` with the decision's own keys and arguments.
-- The server's TIME is read once per call, whatever the number of
-- decisions.
--
-- Reply: one element per decision, in order, then, when there were short
-- decisions, their time. A full decision's element is `redis.lua`'s reply;
-- a short decision's is the band's time used (`reset_after`, in
-- microseconds) after the decision when admitted, or -(used + 1), the
-- state it left alone, when denied: its caller derives the rest from the
-- triple as `redis.lua` does. Either is a string with the error of that
-- decision alone (a bad key, a command the ACL denies): one decision's
-- failure never fails the others.
--
-- The stored values of short decisions come from one MGET of every key of
-- the call; a key this call has written since is taken from the table
-- `written` (a key asked for twice in one batch), and a key that a full
-- decision may have written is read again. When the MGET fails (an ACL
-- that denies one key, say) each short decision reads its own key with
-- GET, as `redis.lua` does, so a failure stays that decision's; so does
-- the script on a Cluster node, whose keys span slots (`cluster.lua`).

if ARGV[1] ~= "trt-batch-3" then
  return redis.error_reply("ERR tower-rate-tier: unknown batch contract")
end
local count, m = tonumber(ARGV[2]), tonumber(ARGV[4])
local nargs, nkeys = #ARGV, #KEYS
if count == nil or count < 1 or m == nil or m < 0 or 4 + 3 * m > nargs then
  return redis.error_reply("ERR tower-rate-tier: bad batch arguments")
end

local tonumber, type, tostring, format, ceil = tonumber, type, tostring, string.format, math.ceil

-- The server's TIME, read once per call.
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

-- The triples by name ("s1", ...): { tolerance, increment }, or false for
-- arguments `redis.lua` refuses.
local triples = {}
for j = 1, m do
  local b = 2 + 3 * j
  local interval, tol, inc = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local bad = interval == nil or tol == nil or inc == nil or interval < 1 or tol < interval or inc < 0
  triples["s" .. j] = not bad and { tol, inc }
end

-- The short decisions' time, read when the first one needs it (false: not
-- a time).
local now = nil
local function short_now()
  if now == nil then
    if ARGV[3] == "" then
      now = server_now()
    else
      now = tonumber(ARGV[3])
      if now == nil or now ~= now or now < 0 or now >= 9007199254740992 then
        now = false
      end
    end
  end
  return now
end

-- The stored values of every key, by position in KEYS (false: missing or
-- not a string), read when the first short decision needs them; false when
-- they could not be read together.
local stored = nil
local function read_all()
  stored = {}
  for first = 1, nkeys, 512 do
    local last = first + 511
    if last > nkeys then
      last = nkeys
    end
    local values = redis.pcall("MGET", unpack(KEYS, first, last))
    if type(values) ~= "table" or values.err ~= nil then
      return false
    end
    for j = 1, last - first + 1 do
      stored[first + j - 1] = values[j]
    end
  end
  return true
end
-- nil until the first short decision reads; false: key by key (keys of
-- several slots, see `cluster.lua`)
local read_together = nil
if read_one_by_one then
  read_together = false
end
-- key -> its TAT as this call wrote it (a number), or false: written by a
-- full decision, or a write failed: to be read again
local written = {}

-- A short decision on `key` (position `k` in KEYS) with triple `band`: its
-- reply element.
local function charge(key, k, band)
  if band == false then
    return "ERR tower-rate-tier: bad band arguments"
  end
  local now = short_now()
  if not now then
    return "ERR tower-rate-tier: bad time"
  end
  if read_together == nil then
    read_together = read_all()
  end
  local tat = written[key]
  if tat == nil and read_together then
    tat = stored[k]
  elseif not tat then
    -- as in `redis.lua`: a key of another type is a fresh state, any other
    -- failure is this decision's error
    tat = redis.pcall("GET", key)
    if type(tat) == "table" and type(tat.err) == "string" and not string.find(tat.err, "WRONGTYPE", 1, true) then
      return tostring(tat.err)
    end
  end
  local reply, write = charge_band(tat, now, band[1], band[2])
  if write ~= nil then
    local set = redis.pcall("SET", key, format("%d", now + write), "PX", format("%d", ceil(write / 1000) + 1))
    if type(set) == "table" and set.err ~= nil then
      written[key] = false
      return tostring(set.err)
    end
    written[key] = now + write
  end
  return reply
end

local out = {}
-- one full decision's keys and arguments for `decide`; the tables are
-- reused from one decision to the next (`decide` keeps no reference to
-- them); `nk` and `na` are the lengths the last one left
local keys, argv, nk, na = {}, {}, 0, 0
local k, a = 1, 5 + 3 * m
for i = 1, count do
  local tag = ARGV[a]
  local band = triples[tag]
  if band ~= nil then
    if k > nkeys then
      return redis.error_reply("ERR tower-rate-tier: bad batch arguments")
    end
    out[i] = charge(KEYS[k], k, band)
    k, a = k + 1, a + 1
  else
    local n = tonumber(tag)
    -- band arguments per key: a triple, and for mode "e" an amount and a
    -- debt bound too
    local width = 3
    if ARGV[a + 1] == "e" then
      width = 5
    end
    if n == nil or n < 1 or a + 2 + width * n > nargs or k + n - 1 > nkeys then
      return redis.error_reply("ERR tower-rate-tier: bad batch arguments")
    end
    local t = ARGV[a + 2]
    if t == "" then
      t = server_now()
    end
    for j = n + 1, nk do
      keys[j] = nil
    end
    for j = 3 + width * n, na do
      argv[j] = nil
    end
    nk, na = n, 2 + width * n
    argv[1], argv[2] = ARGV[a + 1], t
    for j = 1, n do
      keys[j] = KEYS[k + j - 1]
      written[keys[j]] = false
    end
    for j = 1, width * n do
      argv[2 + j] = ARGV[a + 2 + j]
    end
    local ok, reply = pcall(decide, keys, argv)
    if not ok then
      if type(reply) == "table" and reply.err ~= nil then
        reply = tostring(reply.err)
      elseif type(reply) == "string" and string.find(reply, "^%u+ ") then
        -- a command's error raised by redis.call, its code first (OOM,
        -- READONLY, ...): kept, so the client can tell why
      else
        reply = "ERR " .. tostring(reply)
      end
    elseif type(reply) == "table" and reply.err ~= nil then
      reply = tostring(reply.err)
    end
    out[i] = reply
    k, a = k + n, a + 3 + width * n
  end
end
if now then
  out[count + 1] = now
end
return out
