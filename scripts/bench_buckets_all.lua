-- The Lua peer of TB.ACQUIREALL for `make bench`: takes cost from every bucket only if all of them hold it, on the
-- server clock, the way a hand-written multi-key limiter script does it.
--
-- KEYS     the buckets, hashes {tokens, ts}; ts in Unix milliseconds
-- ARGV     cost, then rate and burst for each key in order
-- Reply    {allowed, remaining, retry_after_ms, reset_after_ms, limiting_index} as TB.ACQUIREALL
local cost = tonumber(ARGV[1])
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local tokens, rates, bursts = {}, {}, {}
local allowed, remaining, retry_ms, reset_ms, limiting = 1, math.huge, 0, 0, 0
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local stored = redis.call('HMGET', key, 'tokens', 'ts')
  local t, ts = tonumber(stored[1]), tonumber(stored[2])
  if t == nil or ts == nil then
    t, ts = burst, now_ms
  end
  if now_ms > ts then
    t = math.min(burst, t + (now_ms - ts) * rate / 1000)
  end
  tokens[i], rates[i], bursts[i] = t, rate, burst
  if t < cost then
    allowed = 0
    local wait = math.ceil((cost - t) / rate * 1000)
    if wait > retry_ms then
      retry_ms, limiting = wait, i - 1
    end
  end
end

for i, key in ipairs(KEYS) do
  local t = tokens[i]
  if allowed == 1 then
    t = t - cost
    redis.call('HSET', key, 'tokens', t, 'ts', now_ms)
    redis.call('PEXPIRE', key, math.max(math.ceil((bursts[i] - t) / rates[i] * 1000), 1))
  end
  remaining = math.min(remaining, math.floor(t))
  reset_ms = math.max(reset_ms, math.ceil((bursts[i] - t) / rates[i] * 1000))
end
return {allowed, remaining, retry_ms, reset_ms, limiting}
