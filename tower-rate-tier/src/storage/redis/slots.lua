-- A concurrency limit's slots: one sorted set per key, a member per slot
-- in use (its lease id), scored by the time its lease ends (microseconds).
--
-- KEYS[1]  the key's slot set (under the key's hash tag)
-- ARGV[1]  "a" (acquire) or "r" (release)
-- ARGV[2]  now in microseconds, or "" for the server's TIME
-- ARGV[3]  the lease id (the member)
-- ARGV[4]  the limit (acquire)
-- ARGV[5]  the lease in microseconds (acquire)
--
-- Reply: {taken (1 or 0), slots in use after, now}.
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
local key = KEYS[1]
-- leases that have passed are slots free again (an instance that died,
-- a release that failed)
redis.call("ZREMRANGEBYSCORE", key, "-inf", now)
if ARGV[1] == "r" then
  redis.call("ZREM", key, ARGV[3])
  return {1, redis.call("ZCARD", key), now}
end
local limit = tonumber(ARGV[4])
local lease = tonumber(ARGV[5])
local in_use = redis.call("ZCARD", key)
if in_use >= limit then
  return {0, in_use, now}
end
redis.call("ZADD", key, now + lease, ARGV[3])
-- every lease has the same length: the newest ends last
redis.call("PEXPIRE", key, math.ceil(lease / 1000) + 1)
return {1, in_use + 1, now}
