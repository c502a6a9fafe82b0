-- The Lua token bucket that `make bench` measures TB.ACQUIRE against: the usual script-based limiter, written the
-- way such scripts usually are (a hash of tokens and ts, refill, take cost, PEXPIRE), with TB.ACQUIRE's reply.
--
-- KEYS[1]  the bucket, a hash {tokens, ts}; ts in Unix milliseconds
-- ARGV     rate (tokens/s), burst, cost, [now_ms]
--          without now_ms the script reads the server clock (TIME), as TB.ACQUIRE does
-- Reply    {allowed, remaining, retry_after_ms, reset_after_ms}
--
-- Numbers reach redis.call as Lua numbers, so Redis formats them itself: fractional token counts are stored with
-- 17 significant digits ("8.6999999999999993"), which is what the bytes-per-bucket comparison sees.
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now_ms = tonumber(ARGV[4])
if now_ms == nil then
  local time = redis.call('TIME')
  now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local stored = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(stored[1])
local ts_ms = tonumber(stored[2])
if tokens == nil or ts_ms == nil then
  tokens, ts_ms = burst, now_ms
end
if now_ms > ts_ms then
  tokens = math.min(burst, tokens + (now_ms - ts_ms) * rate / 1000)
  ts_ms = now_ms
end

if tokens < cost then
  return {0, math.floor(tokens), math.ceil((cost - tokens) / rate * 1000),
          math.ceil((burst - tokens) / rate * 1000)}
end
tokens = tokens - cost
local reset_ms = math.ceil((burst - tokens) / rate * 1000)
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', ts_ms)
redis.call('PEXPIRE', KEYS[1], math.max(reset_ms, 1))
return {1, math.floor(tokens), 0, reset_ms}
