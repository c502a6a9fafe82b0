-- A GCRA limiter written for `make bench` (scripts/bench_lua.py) in the shape go-redis/redis_rate's script has:
-- the server clock (TIME), the key's theoretical arrival time (GET), the new one with an expiry (SET EX).
--
-- KEYS[1]  the limiter's key: the theoretical arrival time, seconds since the epoch as a decimal
-- ARGV     rate (per second), burst, cost
-- Reply    {allowed, remaining, retry_after_ms, reset_after_ms}, as TB.ACQUIRE's
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000

local interval = 1 / rate
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + interval * cost
local allow_at = new_tat - interval * burst
if now < allow_at then
  return {0, 0, math.ceil((allow_at - now) * 1000), math.ceil((tat - now) * 1000)}
end
local reset = new_tat - now
redis.call('SET', KEYS[1], new_tat, 'EX', math.ceil(reset))
return {1, math.floor((now - allow_at) / interval), 0, math.ceil(reset * 1000)}
