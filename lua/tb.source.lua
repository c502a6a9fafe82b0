--[[
redis-tb as a Lua script: the module's token bucket for servers that cannot load the module (managed Redis,
Valkey services). The client packages load this one file (never a copy) and use it only where the module is
absent; buckets move between the two without migration, because both keep the same hash, the same expiry window
and the same replies.

ONE FILE, TWO FORMS

  The EVAL form is this file as it is. The function library (Redis 7.0+, Valkey) is generated from it, never kept
  apart, by prefixing two lines:

    "#!lua name=" .. LIB .. "\n" .. "local TB_LIBRARY = '" .. LIB .. "'\n" .. <this file>

  where LIB is "tb_" followed by the package version with its dots as underscores (0.5.0: tb_0_5_0), so that two
  versions can live side by side on one server. Loaded with FUNCTION LOAD, the file registers one function per
  command, LIB .. "_" .. the command's name in lowercase without "tb.", its dots as underscores:
  tb_0_5_0_acquire, _acquireall, _acquireeach, _acquireatmost, _reserve, _refund, _charge, _block, _lower,
  _cl_throttle. Their flags: none for the nine that write (above maxmemory such a function is refused with OOM
  before it runs, peeks and refusals included: see WHERE IT DIFFERS), `allow-oom` for TB.REFUND, which the module
  performs above maxmemory too.

  "This file" is lua/tb.lua, which every package loads. It is generated from lua/tb.source.lua, the file to read and
  edit, by scripts/lua_inline.py (`make lua`; `make lint` checks it): the same text, with each use of a named
  constant (a top-level `local NAME = <literal>`) written as its literal, so that no function captures it. The EVAL
  form runs the whole file on every call, and every top-level local a function captures costs that call an upvalue.

HOW THE FILE RUNS

  Top to bottom: the constants; number parsing; the stored hash and its expiry; the hot path (an allowed
  TB.ACQUIRE, decided on scalars); the entry's first part (the EVAL form's first attempt); the general part
  (`general`: the core in full and every other command, built on first need); CL.THROTTLE's part; the entry's
  second part (the library's functions, the EVAL form's second attempt).

CALLING IT

  EVALSHA <sha1> <numkeys> <key> [<key> ...] [@<µs>] <command> <the command's other arguments, keys left out>
  FCALL   <LIB>_<command> <numkeys> <key> [<key> ...] [@<µs>] <the command's other arguments, keys left out>

  KEYS     the buckets, in the order the command names them
  @<µs>    optional, first: the caller's clock, integer microseconds since the Unix epoch (`@1700000000000000`),
           for servers that refuse TIME inside scripts. With it the script never calls TIME. A bucket's time never
           runs backwards: a reading earlier than the bucket's last one counts as that one (no refill, the stored
           `ts` kept), so callers whose clocks differ by up to `skew` are held to burst + rate * (t + skew). (On
           the server's clock a step back rebases the bucket instead, as the module does: see below.) The expiry is
           then set relative to the server's clock (PEXPIRE, the window counted from the bucket's time, which the
           call never puts behind its reading), so a caller's clock that is off cannot make a bucket vanish.
           The caller's clock is checked against the server's where a key already has an expiry (Redis 7.0+,
           Valkey): PEXPIRETIME minus PTTL is the server's millisecond, read without TIME. Then a reading more than
           10 s ahead of it counts as 10 s ahead, and a stored `ts` beyond that (written by a new bucket's first
           reading, before any expiry could tell the server's clock, or before the server's clock stepped back) is
           rebased as on the server's clock: tokens kept, time from this reading on. So a caller whose clock is a
           day ahead holds the bucket's time at most 10 s past the server's, and others' waits (retry_after_ms)
           by at most those 10 s. A reading earlier than the bucket's ts counts its waits from no earlier than the
           server's clock (or the ts, where none is known): a lagging caller is told the bucket's wait, not its lag.
           Redis 6.2 has no PEXPIRETIME: there a reading is taken as it is, and a bucket whose time ran ahead
           stands still until its key expires (its refill time and slack, server time).
  ARGV     (EVAL form only) the command it emulates, case-insensitive: TB.ACQUIRE, TB.ACQUIREALL, TB.ACQUIREEACH,
           TB.ACQUIREATMOST, TB.RESERVE, TB.REFUND, TB.CHARGE, TB.BLOCK, TB.LOWER or CL.THROTTLE; the function form
           names it instead
  then     that command's arguments in their order, without its keys:

    TB.ACQUIRE        KEYS = key           ARGV = TB.ACQUIRE rate burst [cost]
    TB.ACQUIREALL     KEYS = key1..keyN    ARGV = TB.ACQUIREALL cost rate1 burst1 ... rateN burstN
    TB.ACQUIREEACH    KEYS = key1..keyN    ARGV = TB.ACQUIREEACH rate1 burst1 cost1 ... rateN burstN costN
    TB.ACQUIREATMOST  KEYS = key           ARGV = TB.ACQUIREATMOST rate burst max
    TB.RESERVE        KEYS = key           ARGV = TB.RESERVE rate burst cost max_wait_ms
    TB.REFUND         KEYS = key           ARGV = TB.REFUND rate burst amount
    TB.CHARGE         KEYS = key           ARGV = TB.CHARGE rate burst cost
    TB.BLOCK          KEYS = key           ARGV = TB.BLOCK rate burst ms
    TB.LOWER          KEYS = key           ARGV = TB.LOWER rate burst tokens
    CL.THROTTLE       KEYS = key           ARGV = CL.THROTTLE max_burst count_per_period period [quantity]

  e.g. TB.ACQUIRE user:42 10 20 1  is  EVALSHA <sha1> 1 user:42 TB.ACQUIRE 10 20 1
                                   or   FCALL tb_0_5_0_acquire 1 user:42 10 20 1
                                   or   FCALL tb_0_5_0_acquire 1 user:42 @1700000000000000 10 20 1

CL.THROTTLE is redis-cell's command as the module has it (a string key holding the TAT in ns since the epoch,
expiring at the TAT rounded up to the millisecond, so that it lasts until its TAT at any rate; refused calls write
nothing; the reply's waits in whole seconds): the same replies, errors and key, with its ns arithmetic exact (see
its section below).

The reply, the error texts, the stored hash (`tokens` as the shortest decimal that reads back to the same double,
an integer literal when integral below 2^53; `ts` in integer microseconds), the expiry window and the effects sent
to replicas and the AOF (HSET, PEXPIREAT, DEL) are the module's: see the README's command reference. The
arithmetic is the module's core (src/bucket.rs) transcribed step by step on the same IEEE doubles, on the
server's clock (TIME); a differential test runs both at the same frozen instants and compares replies and hashes.

WHERE IT DIFFERS FROM THE MODULE

  - Integers above 2^53 are not exact in Lua. Replies that the module saturates at 2^63-1 (absurd parameters,
    e.g. a bucket that takes millennia to refill) come back as 9223372036854774784, the largest double below
    2^63; stored `ts` values above 2^53 µs (after the year 2255) are read to the nearest double, and an instant
    computed beyond 2^53 µs (a bucket full again only after the year 2255) is rounded to a double, so its reset
    or wait may come back 1 ms low.
  - Out of memory (above maxmemory): the module answers a call that writes nothing (a peek, a refusal, a full
    bucket), refuses one that would write with Redis's OOM reply and changes nothing, and performs TB.REFUND. The
    EVAL form does the same (Redis refuses a script's first write with that reply; a CL.THROTTLE peek is answered
    without its write), but for a partial TB.REFUND, which it refuses (a refund that fills the bucket deletes the
    key and succeeds in both). The function form cannot: Redis either refuses a function before it runs (no flags)
    or lets it write past maxmemory (`allow-oom`), so there every call but TB.REFUND is refused, peeks and
    refusals too.
  - On the caller's clock (`@<µs>`), a reading earlier than a bucket's last one leaves the bucket's time where it
    is, and a reading more than 10 s past the server's clock counts as 10 s past (see CALLING IT); the module, on
    its server's clock, rebases the bucket to an earlier reading.
  - Redis 6.2 has no PEXPIRETIME: there the current expiry is read as TIME + PTTL, which may read a millisecond
    low, so an expiry may be kept up to 1 ms past the window's end (never before its start). On the caller's
    clock the expiry is read and set relative to the server's clock (PTTL, PEXPIRE) on every server, with the
    same millisecond.
  - CL.THROTTLE reads the server's clock through TIME, to the µs: its `now` is a whole µs in ns, where the
    module reads the ns. On the caller's clock, its expiry is set relative (PX: the TAT's lead rounded up to the
    ms, at least 1), and a stored TAT further past the reading than both tau + 10 s and the
    key's own expiry counts as that far (a refused call's waits are the key's, not another clock's lead). Its
    integers above 2^53 in a reply (a limit or `remaining` that large) are rounded to a double, and i64::MAX
    comes back as 9223372036854774784.
  - Redis 6.2 replicates a script's effects only after redis.replicate_commands(), which this script calls first;
    a caller's own `redis.set_repl` or `lua-replicate-commands no` is theirs to avoid (the module cannot stop
    them either on 6.2).
  - Cost: an allowed TB.ACQUIRE through the library costs the server about what the usual Lua hash token bucket
    costs; through EVAL more, because Redis runs the whole file on every EVAL call (docs/performance.md has the
    figures).
]]

-- Which form runs: FUNCTION LOAD offers redis.register_function, EVAL does not. (The top level runs at FUNCTION LOAD
-- with only `redis` in reach: no math, string or pcall before a call.)
local AS_LIBRARY = redis.register_function ~= nil

if not AS_LIBRARY and redis.replicate_commands then
  -- Redis 6.2 refuses a write after TIME unless the script replicates its effects; 7.0+ always does.
  redis.replicate_commands()
end

---------------------------------------------------------------------------------------------------------------
-- Constants, named once (lua/tb.lua has each use written as its literal: see ONE FILE, TWO FORMS).
---------------------------------------------------------------------------------------------------------------

-- The stored hash's fields (src/codec.rs): the bucket's tokens and its time in µs.
local FIELD_TOKENS = 'tokens'
local FIELD_TS = 'ts'
local MICROS_PER_SEC = 1000000.0
local MICROS_PER_MS = 1000
-- 2^53: every integer below it is exact as a double.
local EXACT_LIMIT = 9007199254740992
-- How long a bucket may be kept: 100 years of 365.25 days.
local MAX_TTL_MS = 36525 * 24 * 3600 * 1000
-- The longest wait a call may accept or impose (TB.RESERVE's max_wait_ms, TB.BLOCK's ms, TB.CHARGE's debt): a day.
local MAX_WAIT_LIMIT_MS = 24 * 3600 * 1000
-- How many 1 µs (or 1 ms) steps correct an estimated instant that a double's rounding put off by a few.
local MAX_CORRECTIONS = 4
-- The bounds of how long a key may outlive its bucket's moment of full (see write_bucket).
local MIN_EXPIRY_SLACK_MS = 1000
local MAX_EXPIRY_SLACK_MS = 86400000
-- The most keys TB.ACQUIREALL and TB.ACQUIREEACH take; the largest `max` TB.ACQUIREATMOST takes.
local MAX_BUCKETS = 1000
local MAX_AT_MOST = EXACT_LIMIT
-- How far past the server's millisecond (as the keys' expiries tell it) the caller's clock may read: 10 s, to the
-- last µs of that millisecond.
local CALLER_LEAD_LIMIT_US = 10000999
-- i64::MAX and i64::MIN as the module saturates to them; 2^63 is the double nearest to i64::MAX.
local I64_MAX = 9223372036854775808
local I64_MIN = -9223372036854775808
-- What a saturated reply is sent as: a reply converts a double to a 64-bit integer, and 2^63 does not fit.
local REPLY_MAX = 9223372036854774784
-- math.huge, spelled without `math`, which the top level cannot reach at FUNCTION LOAD: the literal reads as
-- infinity.
local HUGE = 1e309

-- The module's error texts; a command's name takes the place of %s.
local ERR_ARITY = "ERR wrong number of arguments for '%s' command"
local ERR_COST = 'ERR cost must be a non-negative number'
local ERR_MAX_WAIT = 'ERR max_wait_ms must be an integer from 0 to 86400000'
local ERR_AMOUNT = 'ERR amount must be a non-negative number'
local ERR_AT_MOST = 'ERR max must be an integer from 1 to 9007199254740992'
local ERR_BLOCK_MS = 'ERR ms must be an integer from 1 to 86400000'
local ERR_DEBT = 'ERR charge would put the bucket more than 24 hours of refill into debt'
local ERR_FLOOR = 'ERR tokens must be a number no lower than -(rate * 86400)'
local ERR_DUPLICATE = 'ERR each key may appear only once'
local ERR_TOO_MANY = 'ERR too many buckets: %s takes at most %d'
local ERR_WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'
local ERR_NOT_BUCKET = 'ERR key is not a valid token bucket (expected a hash with only the fields tokens and ts)'
local ERR_CALLER_CLOCK =
  'ERR the caller clock must be @ then integer microseconds since the epoch, up to 9007199254740992'

-- The caller's clock for the call under way (µs), or nil: the server's (TIME). Set on each call's entry.
local caller_now_us

-- Builds the rest of the script on first need (defined below).
local general

-- The rest of the script. Where the file has not defined `general` yet (the EVAL form's first attempt, see
-- "Everything else" below), raises { needs_general = true, command = <the command's name, where known> }.
local function need_general(command)
  if general == nil then error({ needs_general = true, command = command }) end
  return general()
end

-- A refusal travels as a Lua error carrying this table, and leaves as the error reply (`failure`); nothing is
-- written before every check has passed, as in the module. A server's error (a failed read or write) is refused
-- as it came.
local function refuse(text)
  error({ tb_error = text })
end

---------------------------------------------------------------------------------------------------------------
-- Numbers as the module parses them (src/number.rs: Rust's grammar, finite values only).
---------------------------------------------------------------------------------------------------------------

-- Texts already parsed (`memo`: f64, i64), and the texts the script wrote last with their values (`recent`: f64,
-- i64, and text by value): a library keeps them across calls, so a caller's usual arguments and a hot key's stored
-- fields are a table lookup instead of a scan and a tonumber; the EVAL form starts afresh on every call and keeps
-- none. Both bounded: cleared at MEMO_LIMIT and RECENT_LIMIT entries (every write adds three to `recent`). One
-- table holds all of them, nil in the EVAL form: one variable for the functions below to capture, where each
-- captured variable costs the EVAL form an upvalue on every call.
local MEMO_LIMIT = 256
local RECENT_LIMIT = 192
local cache

-- The library only: the EVAL form, which keeps nothing, would create them on every call for nothing.
if AS_LIBRARY then
  cache = {}

  local function memo_reset()
    cache.memo_f64, cache.memo_i64, cache.memo_entries = {}, {}, 0
  end

  cache.recent_reset = function()
    cache.recent_f64, cache.recent_i64, cache.recent_text, cache.recent_entries = {}, {}, {}, 0
  end

  cache.memo_add = function(memo, text, value)
    memo[text] = value
    cache.memo_entries = cache.memo_entries + 1
    if cache.memo_entries > MEMO_LIMIT then memo_reset() end
  end

  memo_reset()
  cache.recent_reset()
end

-- A finite decimal: [+-] (digits [. digits] | . digits) [e [+-] digits]. Lua's tonumber reads that grammar (C's
-- strtod, correctly rounded) and more: spaces, hex, inf, nan and whatever follows a NUL byte, each of which holds a
-- byte outside [0-9.eE+-]. So one scan for such a byte, then tonumber, then finite values only: `1e400` and `1`
-- followed by 309 zeros are refused, as the module refuses them.
local function parse_f64(text)
  if cache then
    local known = cache.memo_f64[text] or cache.recent_f64[text]
    if known then return known end
  end
  if text == nil or string.find(text, '[^%d%.eE+-]') then return nil end
  local value = tonumber(text)
  if value == nil or value ~= value or value == HUGE or value == -HUGE then return nil end
  if cache and #text <= 32 then cache.memo_add(cache.memo_f64, text, value) end
  return value
end

-- An integer in i64 range: [+-] digits.
local function parse_i64(text)
  if cache then
    local known = cache.memo_i64[text] or cache.recent_i64[text]
    if known then return known end
  end
  if text == nil or not string.find(text, '^[+-]?%d+$') then return nil end
  if #text >= 19 then
    local sign, digits = string.match(text, '^([+-]?)(%d+)$')
    local significant = string.match(digits, '^0*(%d+)$')
    local limit = (sign == '-') and '9223372036854775808' or '9223372036854775807'
    if #significant > #limit or (#significant == #limit and significant > limit) then return nil end
  end
  local value = tonumber(text)
  if cache and #text <= 32 then cache.memo_add(cache.memo_i64, text, value) end
  return value
end

local function parse_rate_burst(rate_text, burst_text)
  -- The memo first, without a call: a caller's usual rate and burst.
  local memo = cache and cache.memo_f64
  local rate = memo and memo[rate_text] or parse_f64(rate_text)
  if rate == nil or not (rate > 0) then refuse('ERR rate must be a positive number') end
  local burst = memo and memo[burst_text] or parse_f64(burst_text)
  if burst == nil or not (burst > 0) then refuse('ERR burst must be a positive number') end
  return rate, burst
end

-- A finite number >= 0, with -0 read as 0 (as Cost::new and Amount::new).
local function parse_non_negative(text, message)
  local value = cache and cache.memo_f64[text] or parse_f64(text)
  if value == nil or not (value >= 0) then refuse(message) end
  if value == 0 then return 0 end
  return value
end

local function parse_ranged_integer(text, low, high, message)
  local value = parse_i64(text)
  if value == nil or value < low or value > high then refuse(message) end
  -- From 2^53 on a double no longer tells neighbours apart (2^53 + 1 reads as 2^53): compare the digits.
  if value >= EXACT_LIMIT and string.format('%.0f', value) ~= string.match(text, '^%+?0*(%d+)$') then
    refuse(message)
  end
  return value
end

---------------------------------------------------------------------------------------------------------------
-- The stored form (src/codec.rs) and the key's expiry (src/command/state.rs).
---------------------------------------------------------------------------------------------------------------

-- ryu's shortest round-trip text, built with the rest of the script on first need (see `general`).
local ryu_format

-- An integer below 2^53 as its digits ('%d' formats a C long: cheaper than '%.0f'), anything else through '%.0f'.
local function encode_integer(value)
  if value < EXACT_LIMIT and value > -EXACT_LIMIT then return string.format('%d', value) end
  return string.format('%.0f', value)
end

-- The module's `tokens` text: an integer literal when integral below 2^53; else the shortest decimal that reads
-- back to the same double in ryu's layout. The common case, a value whose shortest form has at most 15
-- significant digits written without an exponent (1e-4 <= |x| < 1e15), is '%.15g' as is: when a decimal of at most
-- 15 digits reads back to x, x rounds to it at 15 digits and '%g' drops the trailing zeros, and in that range ryu
-- writes the same plain digits. Everything else takes the exact fallback. (Its caller, write_bucket, looks in
-- `recent` first.)
local function encode_tokens(tokens)
  if tokens % 1 == 0 and tokens < EXACT_LIMIT and tokens > -EXACT_LIMIT then
    return string.format('%d', tokens)
  end
  local text = string.format('%.15g', tokens)
  if tonumber(text) == tokens and not string.find(text, 'e', 1, true) then return text end
  if not ryu_format then need_general() end
  return ryu_format(tokens)
end

-- The bucket at `key` as two values, tokens and ts: nil when missing; refuses another type or a hash that is not
-- a bucket (exactly the fields tokens and ts, in either order).
local function read_bucket(key)
  local fields = redis.pcall('HGETALL', key)
  if fields.err then refuse(fields.err) end
  local n = #fields
  if n == 0 then return nil end
  local tokens_text, ts_text
  if n ~= 4 then
    refuse(ERR_NOT_BUCKET)
  elseif fields[1] == FIELD_TOKENS and fields[3] == FIELD_TS then
    tokens_text, ts_text = fields[2], fields[4]
  elseif fields[1] == FIELD_TS and fields[3] == FIELD_TOKENS then
    tokens_text, ts_text = fields[4], fields[2]
  else
    refuse(ERR_NOT_BUCKET)
  end
  -- What the script wrote last first, without a call: a hot key's fields.
  local tokens = cache and cache.recent_f64[tokens_text] or parse_f64(tokens_text)
  local ts = cache and cache.recent_i64[ts_text] or parse_i64(ts_text)
  if tokens == nil or ts == nil or ts < 0 then refuse(ERR_NOT_BUCKET) end
  return tokens, ts
end

-- The server's clock for the call under way, and its text ('%d' of it), read once per call. On the caller's clock
-- it is what the keys' expiries tell of the server's clock (µs at the start of its millisecond, no text), or nil.
local server_now_us, server_now_text

-- The clock of the call under way, read once per call after its keys have been read. On the caller's clock, the
-- server's own clock is read where a key has an expiry: PEXPIRETIME (absolute) minus PTTL (relative) is the server's
-- millisecond, without TIME. A reading more than 10 s ahead of it counts as 10 s ahead (the last µs of the
-- millisecond 10 s after the server's); see CALLING IT in the header, and `holds_time` for a stored time beyond.
-- Redis 6.2 has no PEXPIRETIME: there the reading is taken as it is.
local function now_us(keys)
  if caller_now_us then
    if server_now_us == nil and redis.REDIS_VERSION_NUM then
      for i = 1, #keys do
        local at_ms = redis.call('PEXPIRETIME', keys[i])
        if at_ms > 0 then
          server_now_us = (at_ms - redis.call('PTTL', keys[i])) * 1000
          if caller_now_us > server_now_us + CALLER_LEAD_LIMIT_US then
            caller_now_us = server_now_us + CALLER_LEAD_LIMIT_US
          end
          break
        end
      end
    end
    return caller_now_us
  end
  if server_now_us then return server_now_us end
  local time = redis.call('TIME')
  local micros = time[2]
  if #micros < 6 then micros = string.sub('00000' .. micros, -6) end
  server_now_text = time[1] .. micros
  server_now_us = tonumber(server_now_text)
  return server_now_us
end

-- Writes the bucket (tokens, ts) and moves its expiry only when it falls outside [expire_at_ms, + slack_ms], as
-- the module does: one HSET on a live bucket, HSET and PEXPIREAT otherwise. The slack (bucket::expiry_slack_ms) is
-- 1% of the time the bucket takes to fill from empty (burst / rate s), in ms rounded up, within
-- [MIN_EXPIRY_SLACK_MS, MAX_EXPIRY_SLACK_MS]; rate and burst are positive and finite, so it is never NaN.
-- On the caller's clock the expiry is set relative (PEXPIRE) to the bucket's own time (its latest reading), so
-- that a caller whose clock is off does not set it in the server's past (the bucket would vanish and come back
-- full) or far beyond the window.
-- The key's current expiry is read in ms on the clock of `now_us`: on the server's clock it is PEXPIRETIME; Redis
-- 6.2 lacks it, and the caller's clock may differ from the server's: there it is now + PTTL. PTTL counts from the
-- server's clock a moment after `now_us` was read, so the sum is never above the true expiry (by a millisecond at
-- most): a kept expiry is then never before the window, at worst 1 ms past its end.
local function write_bucket(key, tokens, ts, expire_at_ms, rate, burst, existed, now_us)
  local slack_ms = burst / rate * 10.0
  if slack_ms <= MIN_EXPIRY_SLACK_MS then
    slack_ms = MIN_EXPIRY_SLACK_MS
  elseif slack_ms > MAX_EXPIRY_SLACK_MS then
    slack_ms = MAX_EXPIRY_SLACK_MS
  elseif slack_ms % 1 > 0 then
    slack_ms = slack_ms - slack_ms % 1 + 1
  end
  local recent_text = cache and cache.recent_text
  local tokens_text = recent_text and recent_text[tokens] or encode_tokens(tokens)
  local ts_text = ts == server_now_us and server_now_text or encode_integer(ts)
  if caller_now_us then now_us = ts end
  local keep = false
  if existed then
    local at_ms
    if redis.REDIS_VERSION_NUM and not caller_now_us then
      at_ms = redis.call('PEXPIRETIME', key)
    else
      at_ms = redis.call('PTTL', key)
      -- floor(now_us / 1000): exact, now_us being an integer below 2^53.
      if at_ms >= 0 then at_ms = (now_us - now_us % MICROS_PER_MS) / MICROS_PER_MS + at_ms end
    end
    -- A negative at_ms (no expiry, or no key) is below any window.
    keep = at_ms >= expire_at_ms and at_ms <= expire_at_ms + slack_ms
  end
  local written = redis.pcall('HSET', key, FIELD_TOKENS, tokens_text, FIELD_TS, ts_text)
  if written ~= 0 and written ~= 1 and written ~= 2 then refuse(written.err) end -- not a count: an error
  if recent_text then
    cache.recent_f64[tokens_text], cache.recent_i64[ts_text], recent_text[tokens] = tokens, ts, tokens_text
    cache.recent_entries = cache.recent_entries + 3
    if cache.recent_entries > RECENT_LIMIT then cache.recent_reset() end
  end
  if not keep then
    local at_ms = expire_at_ms + slack_ms -- both far below 2^53: at most now + 100 years, and a day
    if caller_now_us then
      redis.call('PEXPIRE', key, encode_integer(at_ms - (now_us - now_us % MICROS_PER_MS) / MICROS_PER_MS))
    else
      redis.call('PEXPIREAT', key, encode_integer(at_ms))
    end
  end
end

---------------------------------------------------------------------------------------------------------------
-- The hot path: the core's decision for the common case of an allowed call, on scalars.
---------------------------------------------------------------------------------------------------------------

-- The core's refilled + decide for a bucket (stored tokens and ts, or nil: new) that holds the cost: the clock not
-- behind its ts, 0 < cost <= tokens, every instant below 2^53 µs and no refill beyond the largest double. Returns
-- the tokens left and the instant the bucket is full again, the same doubles and steps as the general path
-- (tokens_at, full_at_us with its corrections); nil for any other case, which the general path decides.
local function take(stored_tokens, stored_ts, now, rate, burst, cost)
  local tokens = burst
  if stored_ts then
    if now < stored_ts then return nil end
    local refill = (now - stored_ts) / MICROS_PER_SEC * rate
    if refill == HUGE then return nil end
    tokens = stored_tokens + refill
    if tokens > burst then tokens = burst end
  end
  if cost > burst or cost == 0 or tokens < cost then return nil end
  local after = tokens - cost
  if after < 0 then after = 0 end
  if after >= burst then return after, now end
  local missing = burst - after
  if missing == HUGE then return nil end
  local wait_us = missing / rate * MICROS_PER_SEC
  if not (wait_us < EXACT_LIMIT) then return nil end
  local full_at = now + (wait_us - wait_us % 1) -- now + ceil(wait_us)
  if wait_us % 1 > 0 then full_at = full_at + 1 end
  if not (full_at < EXACT_LIMIT) then return nil end
  for _ = 1, MAX_CORRECTIONS do
    local refill = (full_at - now) / MICROS_PER_SEC * rate
    if refill == HUGE then return nil end
    if after + refill >= burst then break end
    full_at = full_at + 1
  end
  return after, full_at
end

-- Writes what `take` decided and returns the reply's remaining (saturated as the core's) and reset: the core's
-- write_expiring and reply, with every instant a non-negative integer below 2^53. `x % 1000` is exact there, so
-- floor and ceil of x / 1000 need no correction (floor_div, ceil_div), and `x % 1` neither.
local function write_taken(key, after, full_at, now, rate, burst, existed)
  local cap_ms = (now - now % MICROS_PER_MS) / MICROS_PER_MS + MAX_TTL_MS
  local expire_at_ms = (full_at - full_at % MICROS_PER_MS) / MICROS_PER_MS
  if full_at % MICROS_PER_MS > 0 then expire_at_ms = expire_at_ms + 1 end
  if expire_at_ms > cap_ms then expire_at_ms = cap_ms end
  write_bucket(key, after, now, expire_at_ms, rate, burst, existed, now)
  local wait_us = full_at - now
  local reset_ms = (wait_us - wait_us % MICROS_PER_MS) / MICROS_PER_MS
  if wait_us % MICROS_PER_MS > 0 then reset_ms = reset_ms + 1 end
  local left = after - after % 1 -- floor(after), after >= 0, saturated as floor_saturating
  if left >= I64_MAX then left = I64_MAX end
  return left, reset_ms
end

-- Everything else (the core in full, the other commands, ryu's formatting) is built by `general` on first need:
-- once per FUNCTION LOAD in the library. In the EVAL form, where Redis runs the whole file on every call, even
-- defining `general` costs: there it is defined below the hot path's first attempt, which raises `needs_general`
-- (before any write) when it needs the rest; the file then defines it and runs the call again.
local acquire_general, general_commands

-- CL.THROTTLE's part, built on its first call (defined below the general part).
local build_throttle


---------------------------------------------------------------------------------------------------------------
-- TB.ACQUIRE: the hot path, then the general one for what it leaves.
---------------------------------------------------------------------------------------------------------------

-- argv[first] onwards are TB.ACQUIRE's arguments (rate burst [cost]).
local function acquire_command(keys, argv, first)
  local n = #argv - first + 1
  if #keys ~= 1 or n < 2 or n > 3 then refuse(string.format(ERR_ARITY, 'tb.acquire')) end
  local rate, burst = parse_rate_burst(argv[first], argv[first + 1])
  local cost = 1
  if n == 3 then cost = parse_non_negative(argv[first + 2], ERR_COST) end
  local key = keys[1]
  local tokens, ts = read_bucket(key)
  local now = now_us(keys)
  local after, full_at = take(tokens, ts, now, rate, burst, cost)
  if after == nil then
    if not acquire_general then need_general() end
    return acquire_general(key, rate, burst, cost, tokens, ts, now)
  end
  local left, reset_ms = write_taken(key, after, full_at, now, rate, burst, tokens ~= nil)
  if left >= REPLY_MAX then left = REPLY_MAX end -- int(), which the general part defines
  return { 1, left, 0, reset_ms }
end

-- Reads an optional leading `@<µs>` at argv[first]; returns the index of the argument after it.
local function take_clock(argv, first)
  local text = argv[first]
  caller_now_us, server_now_us, server_now_text = nil, nil, nil
  if text and string.byte(text, 1) == 64 then -- '@'
    caller_now_us = parse_ranged_integer(string.sub(text, 2), 0, EXACT_LIMIT, ERR_CALLER_CLOCK)
    return first + 1
  end
  return first
end

local function rest_of(argv, first)
  if first == 1 then return argv end
  local args = {}
  for i = first, #argv do args[i - first + 1] = argv[i] end
  return args
end

-- The EVAL form: [@<µs>] <command> <arguments>.
local function eval_form(keys, argv)
  local at = take_clock(argv, 1)
  local name = argv[at]
  if name ~= 'TB.ACQUIRE' then name = name and string.upper(name) end
  if name == 'TB.ACQUIRE' then return acquire_command(keys, argv, at + 1) end
  local command = name and need_general(name)[name]
  if not command then refuse('ERR unknown redis-tb command: ' .. tostring(argv[at])) end
  return command(keys, rest_of(argv, at + 1))
end

---------------------------------------------------------------------------------------------------------------
-- The entry, first part: the EVAL form's first attempt. The EVAL form runs this whole file on every call, so it
-- tries the call here, where only the hot path exists: an allowed TB.ACQUIRE and every refusal end here, and the
-- rest of the file never runs. A call that needs the rest raises `needs_general` (before any write) and runs again
-- in the entry's second part, at the end of the file, which also registers the library's functions.
---------------------------------------------------------------------------------------------------------------

-- `failure`, which answers a call that raised, is defined after this attempt, so that an allowed call never
-- creates it.
local first_failed, first_failure = false, nil
if not AS_LIBRARY then
  local ok, result = pcall(eval_form, KEYS, ARGV)
  if ok then return result end
  first_failed, first_failure = true, result
end

-- What a call that raised answers: a refusal's table becomes its error reply; any other error (a redis.call that
-- failed) propagates. A server's error goes out as the module sends it: a key of another type with the module's
-- WRONGTYPE text, and a refused write without the place in the script that Redis 6.2 puts before it
-- ('@user_script: 662: -OOM ...': above maxmemory Redis refuses a script's first write).
local function failure(result)
  if type(result) ~= 'table' or not result.tb_error then error(result) end
  local text = result.tb_error
  if string.sub(text, 1, 9) == 'WRONGTYPE' then return redis.error_reply(ERR_WRONGTYPE) end
  return redis.error_reply(string.match(text, '^@[^:]*: %d+: %-(.*)$') or text)
end

if first_failed and not (type(first_failure) == 'table' and first_failure.needs_general) then
  return failure(first_failure)
end

-- The rest of the script; returns the commands table (also left in general_commands).
general = function()
  if general_commands then return general_commands end
  -- A reply integer: saturated values become the largest double a reply can carry.
  local function int(value)
    if value >= REPLY_MAX then return REPLY_MAX end
    return value
  end

  ---------------------------------------------------------------------------------------------------------------
  -- Saturating integer arithmetic on doubles (exact below 2^53), as the core's i64 arithmetic.
  ---------------------------------------------------------------------------------------------------------------

  local function clamp_i64(x)
    if x >= I64_MAX then return I64_MAX end
    if x <= I64_MIN then return I64_MIN end
    return x
  end

  local function sat_add(a, b) return clamp_i64(a + b) end
  local function sat_sub(a, b) return clamp_i64(a - b) end
  local function sat_mul(a, b) return clamp_i64(a * b) end

  local function ceil_saturating(x)
    if x ~= x then return I64_MAX end
    return clamp_i64(math.ceil(x))
  end

  local function floor_saturating(x)
    if x ~= x then return 0 end
    return clamp_i64(math.floor(x))
  end

  -- floor(n / d) for d > 0; the quotient of two doubles may round across an integer, so correct it by one.
  local function floor_div(n, d)
    local q = math.floor(n / d)
    if q * d > n then
      q = q - 1
    elseif (q + 1) * d <= n then
      q = q + 1
    end
    return q
  end

  local function ceil_div(n, d)
    local q = floor_div(n, d)
    if n - q * d == 0 then return q end
    return sat_add(q, 1)
  end

  ---------------------------------------------------------------------------------------------------------------
  -- The core: src/bucket.rs, function by function. A state is { tokens = <double>, ts = <µs> }.
  ---------------------------------------------------------------------------------------------------------------

  local function tokens_at(state, at_us, p)
    local elapsed_us = math.max(sat_sub(at_us, state.ts), 0)
    local elapsed_s = elapsed_us / MICROS_PER_SEC
    local refill = elapsed_s * p.rate
    local tokens
    if refill ~= HUGE then
      tokens = state.tokens + refill
    else
      -- A refill beyond the largest double, counted in units of the rate (a deep debt at the top of the range).
      tokens = (elapsed_s + state.tokens / p.rate) * p.rate
    end
    return math.min(tokens, p.burst)
  end

  -- Seconds the refill takes from `tokens` to `target`, without overflow: term by term where the difference
  -- overflows.
  local function seconds_to_refill(tokens, target, p)
    local missing = target - tokens
    if missing ~= HUGE and missing ~= -HUGE then return missing / p.rate end
    return target / p.rate - tokens / p.rate
  end

  -- Whether a reading earlier than the stored ts leaves the bucket's time where it is: on the caller's clock, unless
  -- the stored ts lies more than CALLER_LEAD_LIMIT_US past the server's clock read from the keys' expiries (it was
  -- written where no expiry told the server's clock, as a new bucket, or before the server's clock stepped back).
  local function holds_time(stored_ts)
    return caller_now_us ~= nil and not (server_now_us and stored_ts > server_now_us + CALLER_LEAD_LIMIT_US)
  end

  -- A clock that reads earlier than the stored ts (stepped back, or a promoted replica behind): the bucket keeps its
  -- tokens, capped at burst, and refills from now on. On the caller's clock the bucket's time stands still instead
  -- (holds_time): callers whose clocks differ take turns, and a rebase on each turn would refill the difference
  -- every time.
  local function refilled(stored, now_us, p)
    if stored then
      if now_us < stored.ts then
        return { tokens = math.min(stored.tokens, p.burst), ts = holds_time(stored.ts) and stored.ts or now_us }
      end
      return { tokens = tokens_at(stored, now_us, p), ts = now_us }
    end
    return { tokens = p.burst, ts = now_us }
  end

  -- The instant a call counts its waits from, first thing in each of the core's entry points below: the reading,
  -- except on the caller's clock where the bucket holds a later ts (holds_time). There the reading refills nothing
  -- either way, and its waits count from no earlier than the server's clock read from the keys' expiries, or where
  -- none told it (Redis 6.2), from the ts: a caller whose clock lags is told the wait the bucket imposes, not that
  -- wait plus its lag.
  local function counted_now(stored, now_us)
    if stored and now_us < stored.ts and holds_time(stored.ts) then
      if not server_now_us then return stored.ts end
      return math.max(now_us, math.min(stored.ts, server_now_us))
    end
    return now_us
  end

  local function remaining(state)
    return math.max(floor_saturating(state.tokens), 0)
  end

  local function ms_until(now_us, at_us)
    if at_us == I64_MAX then return I64_MAX end
    return ceil_div(math.max(sat_sub(at_us, now_us), 0), MICROS_PER_MS)
  end

  local function full_at_us(state, p)
    if state.tokens >= p.burst then return state.ts end
    local estimate_us = ceil_saturating(seconds_to_refill(state.tokens, p.burst, p) * MICROS_PER_SEC)
    local at_us = sat_add(state.ts, estimate_us)
    for _ = 1, MAX_CORRECTIONS do
      if at_us == I64_MAX or tokens_at(state, at_us, p) >= p.burst then break end
      at_us = sat_add(at_us, 1)
    end
    return at_us
  end

  -- Whether `current` holds `cost` after waiting `ms` from now.
  local function paid_after(current, now_us, p, cost, ms)
    local at_us = sat_add(now_us, sat_mul(ms, MICROS_PER_MS))
    return tokens_at(current, at_us, p) >= cost
  end

  local function retry_after_ms(current, now_us, p, cost)
    local estimate_us = ceil_saturating(seconds_to_refill(current.tokens, cost, p) * MICROS_PER_SEC)
    local ready_us = sat_add(current.ts, estimate_us)
    local wait_ms = math.max(ms_until(now_us, ready_us), 1)
    for _ = 1, MAX_CORRECTIONS do
      if wait_ms == I64_MAX or paid_after(current, now_us, p, cost, wait_ms) then break end
      wait_ms = sat_add(wait_ms, 1)
    end
    for _ = 1, MAX_CORRECTIONS do
      if wait_ms <= 1 or not paid_after(current, now_us, p, cost, wait_ms - 1) then break end
      wait_ms = wait_ms - 1
    end
    return wait_ms
  end

  -- The cap counts from the bucket's time: on the caller's clock a call may count from before the ts it keeps.
  local function write_expiring(state, full_at, now_us, p)
    local cap_ms = sat_add(floor_div(math.max(now_us, state.ts), MICROS_PER_MS), MAX_TTL_MS)
    return {
      state = state,
      expire_at_ms = math.min(ceil_div(full_at, MICROS_PER_MS), cap_ms),
      p = p,
    }
  end

  -- The write a call that would write nothing makes when the clock reads earlier than the stored ts: the bucket as
  -- `refilled` rebases it, so that the refill accumulates from now. Once per bucket per step; none for a full one.
  local function rebased_write(stored, now_us, p)
    if not stored or now_us >= stored.ts or holds_time(stored.ts) then return nil end
    local rebased = refilled(stored, now_us, p)
    if rebased.tokens >= p.burst then return nil end
    return write_expiring(rebased, full_at_us(rebased, p), now_us, p)
  end

  -- Outcomes, as the core's `Outcome`.
  local ALLOWED, DENIED, IMPOSSIBLE = 'allowed', 'denied', 'impossible'

  local function reply_for(outcome, state, now_us, full_at, retry)
    return {
      outcome = outcome,
      remaining = remaining(state),
      retry_after_ms = retry,
      reset_after_ms = ms_until(now_us, full_at),
    }
  end

  local function decide(current, now_us, p, cost)
    if cost > p.burst then
      return reply_for(IMPOSSIBLE, current, now_us, full_at_us(current, p), -1)
    end
    if cost == 0 then
      return reply_for(ALLOWED, current, now_us, full_at_us(current, p), 0)
    end
    if current.tokens < cost then
      local retry = retry_after_ms(current, now_us, p, cost)
      return reply_for(DENIED, current, now_us, full_at_us(current, p), retry)
    end
    local after = { tokens = math.max(current.tokens - cost, 0.0), ts = current.ts }
    local full_at = full_at_us(after, p)
    local decision = reply_for(ALLOWED, after, now_us, full_at, 0)
    decision.write = write_expiring(after, full_at, now_us, p)
    return decision
  end

  local function acquire(stored, now_us, p, cost)
    now_us = counted_now(stored, now_us)
    local d = decide(refilled(stored, now_us, p), now_us, p, cost)
    d.write = d.write or rebased_write(stored, now_us, p)
    return d
  end

  -- Index (1-based) of the first decision with the largest key(d).
  local function first_extreme(decisions, key)
    local best = 1
    for i = 2, #decisions do
      if key(decisions[i]) > key(decisions[best]) then best = i end
    end
    return best
  end

  local function fewest_left(d) return -d.remaining end
  local function longest_wait(d) return d.retry_after_ms end

  -- acquire_all and acquire_each share this: `members` = { { stored, p, cost } ... }.
  local function acquire_many(members, now_us)
    local decisions = {}
    local all_allowed = true
    for i, m in ipairs(members) do
      decisions[i] = acquire(m.stored, now_us, m.p, m.cost)
      if decisions[i].outcome ~= ALLOWED then all_allowed = false end
    end
    if all_allowed then
      return { outcome = ALLOWED, limiting = first_extreme(decisions, fewest_left), buckets = decisions }
    end
    local reported = {}
    for i, m in ipairs(members) do
      if decisions[i].outcome == ALLOWED then
        reported[i] = acquire(m.stored, now_us, m.p, 0)
      else
        reported[i] = decisions[i]
      end
    end
    local limiting
    for i, d in ipairs(reported) do
      if d.outcome == IMPOSSIBLE then
        limiting = i
        break
      end
    end
    limiting = limiting or first_extreme(reported, longest_wait)
    return { outcome = reported[limiting].outcome, limiting = limiting, buckets = reported }
  end

  local function reserve(stored, now_us, p, cost, max_wait_ms)
    now_us = counted_now(stored, now_us)
    local current = refilled(stored, now_us, p)
    local d = decide(current, now_us, p, cost)
    -- A debt that does not fit a double (only near its largest value) is refused, as a wait beyond max_wait is.
    local debt = current.tokens - cost
    if d.outcome ~= DENIED or d.retry_after_ms > max_wait_ms or debt == -HUGE then
      return { outcome = d.outcome, wait_ms = d.retry_after_ms, remaining = d.remaining,
               reset_after_ms = d.reset_after_ms, write = d.write or rebased_write(stored, now_us, p) }
    end
    local after = { tokens = current.tokens - cost, ts = current.ts }
    local full_at = full_at_us(after, p)
    return {
      outcome = ALLOWED,
      wait_ms = d.retry_after_ms,
      remaining = remaining(after),
      reset_after_ms = ms_until(now_us, full_at),
      write = write_expiring(after, full_at, now_us, p),
    }
  end

  -- change: nil (keep), 'delete', or a write.
  -- A refund that refunds nothing: the bucket as it is (rebased after a clock step back).
  local function unchanged(stored, state, now_us, p)
    return { refunded = 0, remaining = remaining(state), reset_after_ms = ms_until(now_us, full_at_us(state, p)),
             write = rebased_write(stored, now_us, p) }
  end

  local function refund(stored, now_us, p, amount)
    now_us = counted_now(stored, now_us)
    if not stored then
      return { refunded = 0, remaining = floor_saturating(p.burst), reset_after_ms = 0 }
    end
    local current = refilled(stored, now_us, p)
    if current.tokens < 0 then return unchanged(stored, current, now_us, p) end
    local after = { tokens = math.min(current.tokens + amount, p.burst), ts = current.ts }
    if after.tokens <= current.tokens then return unchanged(stored, current, now_us, p) end
    if after.tokens >= p.burst then
      return { refunded = 1, remaining = remaining(after), reset_after_ms = 0, delete = true }
    end
    local full_at = full_at_us(after, p)
    return {
      refunded = 1,
      remaining = remaining(after),
      reset_after_ms = ms_until(now_us, full_at),
      write = write_expiring(after, full_at, now_us, p),
    }
  end

  local function acquire_at_most(stored, now_us, p, max)
    now_us = counted_now(stored, now_us)
    local current = refilled(stored, now_us, p)
    local granted = math.min(remaining(current), max)
    if granted == 0 then
      local retry
      if 1 > p.burst then
        retry = -1
      else
        retry = retry_after_ms(current, now_us, p, 1)
      end
      return { granted = 0, remaining = 0, retry_after_ms = retry,
               reset_after_ms = ms_until(now_us, full_at_us(current, p)), write = rebased_write(stored, now_us, p) }
    end
    local d = decide(current, now_us, p, granted)
    return { granted = granted, remaining = d.remaining, retry_after_ms = 0,
             reset_after_ms = d.reset_after_ms, write = d.write }
  end

  -- What `duration_ms` of refill repays, held at the largest double where the product overflows.
  local function refill_over_ms(duration_ms, p)
    local refill = duration_ms / 1000.0 * p.rate
    if refill == HUGE then return 1.7976931348623157e308 end
    return refill
  end

  local function charge_answer(state, now_us, p, write)
    local retry
    if 1 > p.burst then
      retry = -1
    elseif state.tokens >= 1 then
      retry = 0
    else
      retry = retry_after_ms(state, now_us, p, 1)
    end
    return { remaining = remaining(state), retry_after_ms = retry,
             reset_after_ms = ms_until(now_us, full_at_us(state, p)), write = write }
  end

  local function charged(after, now_us, p)
    local full_at = full_at_us(after, p)
    return charge_answer(after, now_us, p, write_expiring(after, full_at, now_us, p))
  end

  local function charge(stored, now_us, p, cost)
    now_us = counted_now(stored, now_us)
    local current = refilled(stored, now_us, p)
    if cost == 0 then return charge_answer(current, now_us, p, rebased_write(stored, now_us, p)) end
    local after = { tokens = current.tokens - cost, ts = current.ts }
    if after.tokens == -HUGE or after.tokens < -refill_over_ms(MAX_WAIT_LIMIT_MS, p) then
      refuse(ERR_DEBT)
    end
    return charged(after, now_us, p)
  end

  local function block(stored, now_us, p, duration_ms)
    now_us = counted_now(stored, now_us)
    local current = refilled(stored, now_us, p)
    local blocked_tokens = -refill_over_ms(duration_ms, p)
    if current.tokens <= blocked_tokens then
      return charge_answer(current, now_us, p, rebased_write(stored, now_us, p))
    end
    return charged({ tokens = blocked_tokens, ts = current.ts }, now_us, p)
  end

  -- min(refilled, floor): never raises a bucket; the same floor twice at one instant changes nothing the second time.
  local function lower(stored, now_us, p, floor)
    now_us = counted_now(stored, now_us)
    local current = refilled(stored, now_us, p)
    if current.tokens <= floor then
      return charge_answer(current, now_us, p, rebased_write(stored, now_us, p))
    end
    return charged({ tokens = floor, ts = current.ts }, now_us, p)
  end


  -- The digits and decimal exponent of `%.<p-1>e` text: "1.2345e+06" -> "12345", 6.
  local function split_scientific(text)
    local lead, fraction, exponent = text:match('^(%d)%.?(%d*)e([+-]%d+)$')
    return lead .. fraction, tonumber(exponent)
  end

  -- The next p-digit decimal above `digits` (a string of p digits): "1299" -> "1300", "999" -> "1000" (one longer).
  local function increment_digits(digits)
    local i = #digits
    while i >= 1 and digits:sub(i, i) == '9' do i = i - 1 end
    if i == 0 then return '1' .. string.rep('0', #digits), true end
    local bumped = string.char(digits:byte(i) + 1)
    return digits:sub(1, i - 1) .. bumped .. string.rep('0', #digits - i), false
  end

  -- The shortest digits that read back to `x` (> 0, finite), closest to `x` among the shortest: what ryu
  -- computes. `%.<p-1>e` rounds correctly, so at each length its text is the closest candidate; only where `x` is
  -- a power of two (its rounding interval is narrower below) can that candidate fall outside while the next one up
  -- lies inside, so that one is tried too.
  local function shortest_digits(x)
    -- Up to 15 significant digits, `%.15g` already is the answer: a double's rounding interval is narrower than
    -- half a unit of the 15th digit, so when a decimal of at most 15 digits reads back to `x`, `x` rounds to it at
    -- 15 digits (and `%g` drops the trailing zeros). One format and one read for most values. Not for subnormals,
    -- whose intervals are wider.
    local first = 1
    if x >= 2.2250738585072014e-308 then
      local text = string.format('%.15g', x)
      if tonumber(text) == x then
        local mantissa = string.match(text, '^[^e]*')
        local significant = string.gsub(string.gsub(string.gsub(mantissa, '%.', ''), '^0+', ''), '0+$', '')
        return split_scientific(string.format('%.' .. math.max(#significant - 1, 0) .. 'e', x))
      end
      first = 16
    end
    for p = first, 17 do
      local digits, exponent = split_scientific(string.format('%.' .. (p - 1) .. 'e', x))
      if tonumber(digits:sub(1, 1) .. '.' .. digits:sub(2) .. 'e' .. exponent) == x then
        return digits, exponent
      end
      local up, carried = increment_digits(digits)
      local up_exponent = exponent
      if carried then
        up = up:sub(1, p)
        up_exponent = exponent + 1
      end
      if tonumber(up:sub(1, 1) .. '.' .. up:sub(2) .. 'e' .. up_exponent) == x then
        return up, up_exponent
      end
    end
    -- Unreachable: 17 significant digits always round-trip.
    local digits, exponent = split_scientific(string.format('%.16e', x))
    return digits, exponent
  end

  -- ryu's layout of a double (Rust's `ryu::Buffer::format`): "12340000000.0", "12.34", "0.001234", "1e30",
  -- "1.234e33", "1e-7".
  ryu_format = function(x)
    local sign = ''
    if x < 0 then
      sign = '-'
      x = -x
    end
    if x == 0 then return sign .. '0.0' end
    local digits, exponent = shortest_digits(x)
    digits = digits:gsub('0+$', '')
    if digits == '' then digits = '0' end
    local length = #digits
    local kk = exponent + 1 -- 10^(kk-1) <= x < 10^kk
    local k = kk - length -- exponent of the last digit
    if k >= 0 and kk <= 16 then
      return sign .. digits .. string.rep('0', k) .. '.0'
    elseif kk > 0 and kk <= 16 then
      return sign .. digits:sub(1, kk) .. '.' .. digits:sub(kk + 1)
    elseif kk > -5 and kk <= 0 then
      return sign .. '0.' .. string.rep('0', -kk) .. digits
    elseif length == 1 then
      return sign .. digits .. 'e' .. string.format('%d', kk - 1)
    end
    return sign .. digits:sub(1, 1) .. '.' .. digits:sub(2) .. 'e' .. string.format('%d', kk - 1)
  end

  ---------------------------------------------------------------------------------------------------------------
  -- The stored form as the core's states: { tokens = <double>, ts = <µs> } and writes.
  ---------------------------------------------------------------------------------------------------------------

  local function parse_params(rate_text, burst_text)
    local rate, burst = parse_rate_burst(rate_text, burst_text)
    return { rate = rate, burst = burst }
  end

  local function state_of(tokens, ts)
    if tokens == nil then return nil end
    return { tokens = tokens, ts = ts }
  end

  local function read_state(key)
    return state_of(read_bucket(key))
  end

  local function write_state(key, write, existed, now)
    write_bucket(key, write.state.tokens, write.state.ts, write.expire_at_ms, write.p.rate, write.p.burst, existed,
      now)
  end

  ---------------------------------------------------------------------------------------------------------------
  -- The commands: arguments checked in the module's order, then read, decide, write, reply.
  ---------------------------------------------------------------------------------------------------------------

  -- TB.ACQUIRE past its arguments and its read, for what `take` leaves to the general path.
  acquire_general = function(key, rate, burst, cost, stored_tokens, stored_ts, now)
    local stored = state_of(stored_tokens, stored_ts)
    local d = acquire(stored, now, { rate = rate, burst = burst }, cost)
    if d.write then write_state(key, d.write, stored ~= nil, now) end
    return { d.outcome == ALLOWED and 1 or 0, int(d.remaining), int(d.retry_after_ms), int(d.reset_after_ms) }
  end

  -- Pairwise below 16 keys (interned strings compare in one step), a set above.
  local function check_distinct(keys)
    local n = #keys
    if n <= 16 then
      for i = 2, n do
        for j = 1, i - 1 do
          if keys[i] == keys[j] then refuse(ERR_DUPLICATE) end
        end
      end
      return
    end
    local seen = {}
    for i = 1, n do
      if seen[keys[i]] then refuse(ERR_DUPLICATE) end
      seen[keys[i]] = true
    end
  end

  -- TB.ACQUIREALL and TB.ACQUIREEACH keep bucket i's rate, burst, cost, stored tokens and ts, and what `take` made
  -- of it (tokens after, full-at instant) at 7i - 6 .. 7i of one table, reused by every call (a library's calls
  -- never overlap): no table per bucket on the way to an allowed call.
  local many = {}

  -- Each bucket's parameters, checked in the module's order: (rate burst) each after a shared cost, or
  -- (rate burst cost) each.
  local function parse_many(n, args, shared_cost)
    for i = 1, n do
      local o = 7 * i - 7
      if shared_cost then
        many[o + 1], many[o + 2] = parse_rate_burst(args[2 * i], args[2 * i + 1])
        many[o + 3] = shared_cost
      else
        many[o + 1], many[o + 2] = parse_rate_burst(args[3 * i - 2], args[3 * i - 1])
        many[o + 3] = parse_non_negative(args[3 * i], ERR_COST)
      end
    end
  end

  -- Reads every bucket, then the clock; true when `take` decides every bucket (all allowed, the common case).
  local function read_and_take_many(keys, n)
    for i = 1, n do
      local o = 7 * i - 7
      many[o + 4], many[o + 5] = read_bucket(keys[i])
    end
    local now = now_us(keys)
    for i = 1, n do
      local o = 7 * i - 7
      local after, full_at = take(many[o + 4], many[o + 5], now, many[o + 1], many[o + 2], many[o + 3])
      if after == nil then return now, false end
      many[o + 6], many[o + 7] = after, full_at
    end
    return now, true
  end

  -- Writes bucket i as `take` decided; returns its reply's remaining and reset.
  local function write_taken_many(keys, i, now)
    local o = 7 * i - 7
    return write_taken(keys[i], many[o + 6], many[o + 7], now, many[o + 1], many[o + 2], many[o + 4] ~= nil)
  end

  -- The general path's members, { p, cost, stored }, from what parse_many and read_and_take_many kept.
  local function members_of(n)
    local members = {}
    for i = 1, n do
      local o = 7 * i - 7
      members[i] = { p = { rate = many[o + 1], burst = many[o + 2] }, cost = many[o + 3],
                     stored = state_of(many[o + 4], many[o + 5]) }
    end
    return members
  end

  local function write_members(keys, members, decisions, now)
    for i = 1, #keys do
      local write = decisions[i].write
      if write then write_state(keys[i], write, members[i].stored ~= nil, now) end
    end
  end

  local function acquireall_command(keys, args)
    local n = #keys
    if n == 0 or #args ~= 1 + 2 * n then refuse(string.format(ERR_ARITY, 'tb.acquireall')) end
    if n > MAX_BUCKETS then refuse(string.format(ERR_TOO_MANY, 'TB.ACQUIREALL', MAX_BUCKETS)) end
    parse_many(n, args, parse_non_negative(args[1], ERR_COST))
    check_distinct(keys)
    local now, all_taken = read_and_take_many(keys, n)
    if all_taken then
      local fewest, limiting, max_reset = nil, 1, 0
      for i = 1, n do
        local left, reset_ms = write_taken_many(keys, i, now)
        if fewest == nil or left < fewest then fewest, limiting = left, i end
        if reset_ms > max_reset then max_reset = reset_ms end
      end
      return { 1, int(fewest), 0, max_reset, limiting - 1 }
    end
    local members = members_of(n)
    local combined = acquire_many(members, now)
    -- A refused call still writes the buckets that record a new time base after a clock step back.
    write_members(keys, members, combined.buckets, now)
    local min_remaining, max_reset = nil, 0
    for _, d in ipairs(combined.buckets) do
      if min_remaining == nil or d.remaining < min_remaining then min_remaining = d.remaining end
      if d.reset_after_ms > max_reset then max_reset = d.reset_after_ms end
    end
    local retry = 0
    if combined.outcome ~= ALLOWED then retry = combined.buckets[combined.limiting].retry_after_ms end
    return { combined.outcome == ALLOWED and 1 or 0, int(min_remaining), int(retry), int(max_reset),
             combined.limiting - 1 }
  end

  local function acquireeach_command(keys, args)
    local n = #keys
    if n == 0 or #args ~= 3 * n then refuse(string.format(ERR_ARITY, 'tb.acquireeach')) end
    if n > MAX_BUCKETS then refuse(string.format(ERR_TOO_MANY, 'TB.ACQUIREEACH', MAX_BUCKETS)) end
    parse_many(n, args, nil)
    check_distinct(keys)
    local now, all_taken = read_and_take_many(keys, n)
    if all_taken then
      local reply = { 1, 0 }
      local fewest
      for i = 1, n do
        local left, reset_ms = write_taken_many(keys, i, now)
        reply[i + 2] = { 1, int(left), 0, reset_ms }
        if fewest == nil or left < fewest then fewest, reply[2] = left, i - 1 end
      end
      return reply
    end
    local members = members_of(n)
    local each = acquire_many(members, now)
    write_members(keys, members, each.buckets, now)
    local reply = { each.outcome == ALLOWED and 1 or 0, each.limiting - 1 }
    for i, d in ipairs(each.buckets) do
      reply[i + 2] = { d.outcome == ALLOWED and 1 or 0, int(d.remaining), int(d.retry_after_ms),
                       int(d.reset_after_ms) }
    end
    return reply
  end

  local function acquireatmost_command(keys, args)
    if #keys ~= 1 or #args ~= 3 then refuse(string.format(ERR_ARITY, 'tb.acquireatmost')) end
    local p = parse_params(args[1], args[2])
    local max = parse_ranged_integer(args[3], 1, MAX_AT_MOST, ERR_AT_MOST)
    local stored = read_state(keys[1])
    local now = now_us(keys)
    local partial = acquire_at_most(stored, now, p, max)
    if partial.write then write_state(keys[1], partial.write, stored ~= nil, now) end
    return { int(partial.granted), int(partial.remaining), int(partial.retry_after_ms), int(partial.reset_after_ms) }
  end

  local function reserve_command(keys, args)
    if #keys ~= 1 or #args ~= 4 then refuse(string.format(ERR_ARITY, 'tb.reserve')) end
    local p = parse_params(args[1], args[2])
    local cost = parse_non_negative(args[3], ERR_COST)
    local max_wait = parse_ranged_integer(args[4], 0, MAX_WAIT_LIMIT_MS, ERR_MAX_WAIT)
    local stored = read_state(keys[1])
    local now = now_us(keys)
    local r = reserve(stored, now, p, cost, max_wait)
    if r.write then write_state(keys[1], r.write, stored ~= nil, now) end
    return { r.outcome == ALLOWED and 1 or 0, int(r.wait_ms), int(r.remaining), int(r.reset_after_ms) }
  end

  local function refund_command(keys, args)
    if #keys ~= 1 or #args ~= 3 then refuse(string.format(ERR_ARITY, 'tb.refund')) end
    local p = parse_params(args[1], args[2])
    local amount = parse_non_negative(args[3], ERR_AMOUNT)
    local stored = read_state(keys[1])
    local now = now_us(keys)
    local r = refund(stored, now, p, amount)
    if r.delete then
      redis.call('DEL', keys[1])
    elseif r.write then
      write_state(keys[1], r.write, true, now)
    end
    return { r.refunded, int(r.remaining), int(r.reset_after_ms) }
  end

  -- TB.CHARGE, TB.BLOCK and TB.LOWER: key rate burst and a third argument (its count already checked; `third`
  -- parses it, given the bucket's parameters), one charge-shaped answer.
  local function charge_shaped(keys, args, third, decide)
    local p = parse_params(args[1], args[2])
    local value = third(args[3], p)
    local stored = read_state(keys[1])
    local now = now_us(keys)
    local c = decide(stored, now, p, value)
    if c.write then write_state(keys[1], c.write, stored ~= nil, now) end
    return { int(c.remaining), int(c.retry_after_ms), int(c.reset_after_ms) }
  end

  local function charge_cost(text) return parse_non_negative(text, ERR_COST) end
  local function block_ms(text) return parse_ranged_integer(text, 1, MAX_WAIT_LIMIT_MS, ERR_BLOCK_MS) end

  local function charge_command(keys, args)
    if #keys ~= 1 or #args ~= 3 then refuse(string.format(ERR_ARITY, 'tb.charge')) end
    return charge_shaped(keys, args, charge_cost, charge)
  end

  local function block_command(keys, args)
    if #keys ~= 1 or #args ~= 3 then refuse(string.format(ERR_ARITY, 'tb.block')) end
    return charge_shaped(keys, args, block_ms, block)
  end

  -- TB.LOWER's tokens: finite and at least a day of refill in debt, the bound TB.CHARGE's debt is held to; -0 read
  -- as 0, as Floor::new.
  local function lower_floor(text, p)
    local value = parse_f64(text)
    if value == nil or value < -refill_over_ms(MAX_WAIT_LIMIT_MS, p) then refuse(ERR_FLOOR) end
    if value == 0 then return 0 end
    return value
  end

  local function lower_command(keys, args)
    if #keys ~= 1 or #args ~= 3 then refuse(string.format(ERR_ARITY, 'tb.lower')) end
    return charge_shaped(keys, args, lower_floor, lower)
  end

  local throttle_command
  local function throttle_entry(keys, args)
    throttle_command = throttle_command or build_throttle()
    return throttle_command(keys, args)
  end

  -- The dispatch table: the general part's commands by name, for the EVAL form's ARGV and the library's functions
  -- alike (TB.ACQUIRE's hot path, acquire_command, is served before this part exists). Every key in one
  -- constructor, so that the table is sized once.
  general_commands = {
    ['TB.ACQUIREALL'] = acquireall_command,
    ['TB.ACQUIREEACH'] = acquireeach_command,
    ['TB.ACQUIREATMOST'] = acquireatmost_command,
    ['TB.RESERVE'] = reserve_command,
    ['TB.REFUND'] = refund_command,
    ['TB.CHARGE'] = charge_command,
    ['TB.BLOCK'] = block_command,
    ['TB.LOWER'] = lower_command,
    ['CL.THROTTLE'] = throttle_entry,
  }
  return general_commands
end

---------------------------------------------------------------------------------------------------------------
-- CL.THROTTLE: redis-cell's GCRA, as the module's src/gcra.rs computes it. Its instants are ns since the epoch
-- (past 2^53 since 1970-04-15) and its products reach 2^126, beyond a double: they are exact integers here, held
-- as a sign and base-10^7 limbs (least significant first; a limb times a limb stays below 2^53). Where the module
-- converts to f64 (the interval, `remaining`, the reply's seconds) the script converts the exact decimal with
-- tonumber, which rounds to nearest as Rust's `as f64` does.
---------------------------------------------------------------------------------------------------------------

-- Built on the first CL.THROTTLE call, and defined only where it may come: by the library, and by an EVAL call
-- that names CL.THROTTLE (its first attempt raised `needs_general` for it). The EVAL form runs this file on every
-- call, and a closure over this many variables is not free to create: every call that leaves the hot path (a
-- denied TB.ACQUIRE) would pay for it.
if AS_LIBRARY or first_failure.command == 'CL.THROTTLE' then
  build_throttle = function()
    local LIMB = 10000000

    -- An exact integer from decimal digits (no sign, leading zeros allowed).
    local function big(digits, negative)
      local limbs = {}
      local i = #digits
      while i >= 1 do
        limbs[#limbs + 1] = tonumber(string.sub(digits, math.max(i - 6, 1), i))
        i = i - 7
      end
      while #limbs > 0 and limbs[#limbs] == 0 do limbs[#limbs] = nil end
      limbs.negative = (negative and #limbs > 0) or false
      return limbs
    end

    -- An exact integer from a non-negative double below 2^53.
    local function big_small(n)
      local limbs = {}
      while n > 0 do
        local rest = math.floor(n / LIMB)
        limbs[#limbs + 1] = n - rest * LIMB
        n = rest
      end
      limbs.negative = false
      return limbs
    end

    local function big_digits(x)
      if #x == 0 then return '0' end
      local parts = { string.format('%d', x[#x]) }
      for i = #x - 1, 1, -1 do parts[#parts + 1] = string.format('%07d', x[i]) end
      return table.concat(parts)
    end

    local function big_text(x)
      return (x.negative and '-' or '') .. big_digits(x)
    end

    -- Magnitudes: compare, add, subtract (a >= b), multiply.
    local function mag_cmp(a, b)
      if #a ~= #b then return #a < #b and -1 or 1 end
      for i = #a, 1, -1 do
        if a[i] ~= b[i] then return a[i] < b[i] and -1 or 1 end
      end
      return 0
    end

    local function mag_add(a, b, negative)
      local sum, carry = {}, 0
      for i = 1, math.max(#a, #b) do
        local limb = (a[i] or 0) + (b[i] or 0) + carry
        carry = limb >= LIMB and 1 or 0
        sum[i] = limb - carry * LIMB
      end
      if carry > 0 then sum[#sum + 1] = carry end
      sum.negative = (negative and #sum > 0) or false
      return sum
    end

    local function mag_sub(a, b, negative)
      local difference, borrow = {}, 0
      for i = 1, #a do
        local limb = a[i] - (b[i] or 0) - borrow
        borrow = limb < 0 and 1 or 0
        difference[i] = limb + borrow * LIMB
      end
      while #difference > 0 and difference[#difference] == 0 do difference[#difference] = nil end
      difference.negative = (negative and #difference > 0) or false
      return difference
    end

    local function big_cmp(a, b)
      if a.negative ~= b.negative then return a.negative and -1 or 1 end
      local c = mag_cmp(a, b)
      return a.negative and -c or c
    end

    local function big_add(a, b)
      if a.negative == b.negative then return mag_add(a, b, a.negative) end
      if mag_cmp(a, b) >= 0 then return mag_sub(a, b, a.negative) end
      return mag_sub(b, a, b.negative)
    end

    local function big_neg(a)
      local copy = {}
      for i = 1, #a do copy[i] = a[i] end
      copy.negative = (not a.negative and #a > 0) or false
      return copy
    end

    local function big_sub(a, b) return big_add(a, big_neg(b)) end

    -- Non-negative operands.
    local function big_mul(a, b)
      local product = {}
      for i = 1, #a + #b do product[i] = 0 end
      for i = 1, #a do
        local carry = 0
        for j = 1, #b do
          local limb = product[i + j - 1] + a[i] * b[j] + carry
          carry = math.floor(limb / LIMB)
          product[i + j - 1] = limb - carry * LIMB
        end
        local k = i + #b
        while carry > 0 do
          local limb = product[k] + carry
          carry = math.floor(limb / LIMB)
          product[k] = limb - carry * LIMB
          k = k + 1
        end
      end
      while #product > 0 and product[#product] == 0 do product[#product] = nil end
      product.negative = false
      return product
    end

    -- x / 10^k truncated toward zero (k = 3, 6 or 9): whole limbs dropped, then a division by 10^(k mod 7) from the
    -- top limb down (a remainder times a limb stays below 10^13).
    local function big_shift(x, k)
      local drop = math.floor(k / 7)
      local divisor = 10 ^ (k - 7 * drop)
      local quotient, remainder = {}, 0
      for i = #x, drop + 1, -1 do
        local value = remainder * LIMB + x[i]
        local q = math.floor(value / divisor)
        quotient[i - drop] = q
        remainder = value - q * divisor
      end
      while #quotient > 0 and quotient[#quotient] == 0 do quotient[#quotient] = nil end
      quotient.negative = (x.negative and #quotient > 0) or false
      return quotient
    end

    -- x as the nearest double: exact below 10^14 (two limbs), through a correctly rounded decimal above.
    local function big_f64(x)
      if #x > 2 then return tonumber(big_text(x)) end
      local value = (x[2] or 0) * LIMB + (x[1] or 0)
      return x.negative and -value or value
    end

    local I64_LIMIT = big('9223372036854775808') -- 2^63
    local ONE = big('1')
    local ROUND_UP_MS = big('999999') -- added to ns before dividing by 10^6, to round up

    local ERR_MAX_BURST = 'ERR max_burst must be an integer from 0 to 9223372036854775806'
    local ERR_COUNT = 'ERR count_per_period must be a positive integer'
    local ERR_PERIOD = 'ERR period must be a positive integer (seconds)'
    local ERR_QUANTITY = 'ERR quantity must be a non-negative integer'
    local ERR_INTERVAL =
      'ERR count_per_period / period must be at most 1000000000 a second (requests at least 1 ns apart)'
    local ERR_TOLERANCE = 'ERR (max_burst + 1) * period / count_per_period must be under 2^63 ns (about 292 years)'
    local ERR_TAT = "ERR the key's theoretical arrival time would pass 2^63 ns since the epoch (the year 2262)"
    local ERR_NOT_THROTTLE =
      'ERR key does not hold a CL.THROTTLE state (expected a string of decimal nanoseconds since the epoch)'

    -- An i64 argument or stored value (the module's number::parse_i64) as an exact integer; nil when it is not one.
    local function parse_exact(text)
      if parse_i64(text) == nil then return nil end
      local sign, digits = string.match(text, '^([+-]?)(%d+)$')
      return big(digits, sign == '-')
    end

    local function parse_argument(text, message)
      return parse_exact(text) or refuse(message)
    end

    -- A duration in ns as the reply's whole seconds (gcra::whole_seconds_up): seconds + ns / 10^9 in doubles,
    -- truncated, plus 1 when a whole millisecond is past the second.
    local function whole_seconds_up(duration)
      local seconds = big_f64(big_shift(duration, 9)) -- below 2^63 / 10^9: exact
      local subsec = (duration[1] or 0) + ((duration[2] or 0) % 100) * LIMB -- the low 9 digits
      if duration.negative then subsec = -subsec end
      local total = seconds + subsec / 1e9
      local whole = total >= 0 and math.floor(total) or math.ceil(total)
      if subsec >= 1000000 then whole = whole + 1 end
      return whole
    end

    -- Requests left (gcra::remaining): (tau - ttl) / T over whole µs in doubles, truncated; 0 at -T or below; an
    -- interval under 1 µs divides by zero, as in the module (i64::MAX, or 0 for 0 / 0).
    local function throttle_remaining(next_ns, interval)
      if big_cmp(next_ns, big_neg(interval)) <= 0 then return 0 end
      local next_us = big_f64(big_shift(next_ns, 3))
      local interval_us = big_f64(big_shift(interval, 3))
      local ratio = next_us / interval_us
      if ratio ~= ratio then return 0 end
      if ratio >= I64_MAX then return REPLY_MAX end
      return ratio >= 0 and math.floor(ratio) or math.ceil(ratio)
    end

    -- The key's TAT: nil when missing; WRONGTYPE for a hash or another type; an error unless decimal i64 text.
    local function read_tat(key)
      local value = redis.pcall('GET', key)
      if type(value) == 'table' and value.err then refuse(value.err) end
      if not value then return nil end
      return parse_exact(value) or refuse(ERR_NOT_THROTTLE)
    end

    -- The library keeps the limits it has computed ({ L, T, tau } by their three argument texts), bounded as its memo
    -- of numbers: a caller's usual limit costs a lookup. Nil in the EVAL form, which keeps nothing.
    local limits, limits_kept = cache and {}, 0

    -- L, T and tau of valid max_burst, count_per_period and period texts (already parsed: max_burst, count, period).
    local function limit_of(max_burst, count, period)
      if max_burst.negative or mag_cmp(max_burst, big('9223372036854775807')) >= 0 then refuse(ERR_MAX_BURST) end
      local limit = big_add(max_burst, ONE)
      if count.negative or #count == 0 then refuse(ERR_COUNT) end
      if period.negative or #period == 0 then refuse(ERR_PERIOD) end
      -- T = trunc(period * 10^9 / count), divided in doubles as the module and redis-cell do.
      local interval_f64 = tonumber(big_digits(period) .. '000000000') / big_f64(count)
      if interval_f64 < 1 then refuse(ERR_INTERVAL) end
      if interval_f64 >= I64_MAX then refuse(ERR_TOLERANCE) end
      local interval = interval_f64 < EXACT_LIMIT and big_small(math.floor(interval_f64))
        or big(string.format('%.0f', math.floor(interval_f64)))
      local tolerance = big_mul(interval, limit)
      if mag_cmp(tolerance, I64_LIMIT) >= 0 then refuse(ERR_TOLERANCE) end
      return { limit, interval, tolerance }
    end

    -- CL.THROTTLE key max_burst count_per_period period [quantity]: arguments checked in the module's order (each
    -- parsed, then the quantity's sign, then the limit), then read, decide, write, reply.
    return function(keys, args)
      if #keys ~= 1 or #args < 3 or #args > 4 then refuse(string.format(ERR_ARITY, 'cl.throttle')) end
      local limit_text = args[1] .. ' ' .. args[2] .. ' ' .. args[3]
      local known = limits and limits[limit_text]
      local max_burst, count, period
      if not known then -- a known limit's three texts parse (valid texts hold no space: no two triples share a key)
        max_burst = parse_argument(args[1], ERR_MAX_BURST)
        count = parse_argument(args[2], ERR_COUNT)
        period = parse_argument(args[3], ERR_PERIOD)
      end
      local quantity = ONE
      if args[4] then
        quantity = parse_argument(args[4], ERR_QUANTITY)
        if quantity.negative then refuse(ERR_QUANTITY) end
      end
      if not known then
        known = limit_of(max_burst, count, period)
        if limits then
          if limits_kept >= MEMO_LIMIT then limits, limits_kept = {}, 0 end
          limits[limit_text], limits_kept = known, limits_kept + 1
        end
      end
      local limit, interval, tolerance = known[1], known[2], known[3]
      local key = keys[1]
      local stored = read_tat(key)
      local now = big_mul(big_small(now_us(keys)), big_small(1000))
      local tat = stored or now
      -- On the caller's clock a stored TAT further past the reading than both tau + 10 s and the key's expiry (its
      -- PTTL, which counts the TAT's lead on the server's clock, plus the 2 ms its rounding and the reading's
      -- millisecond can take) was written by a clock ahead of both: it counts as that far. The call is refused either
      -- way (the TAT stays at least tau past the reading), and its waits are then the key's own, not the other
      -- clock's lead.
      if stored and caller_now_us then
        local ttl_ms = redis.call('PTTL', key)
        if ttl_ms >= 0 then
          local lead_us = math.max(CALLER_LEAD_LIMIT_US + big_f64(big_shift(tolerance, 3)), (ttl_ms + 2) * 1000)
          local latest = big_add(now, big(string.format('%.0f', lead_us) .. '000'))
          if big_cmp(tat, latest) > 0 then tat = latest end
        end
      end
      local limited, ttl, retry_s, write_tat = true, nil, -1, nil
      -- quantity * T > tau, i.e. quantity > L: never allowed, and the product (up to 2^126) is not needed.
      if mag_cmp(quantity, limit) > 0 then
        ttl = big_sub(tat, now)
      else
        local new_tat = big_add(big_cmp(tat, now) > 0 and tat or now, big_mul(interval, quantity))
        local allow_at = big_sub(new_tat, tolerance)
        if big_cmp(now, allow_at) < 0 then
          ttl = big_sub(tat, now)
          retry_s = whole_seconds_up(big_sub(allow_at, now))
        else
          if big_cmp(new_tat, I64_LIMIT) >= 0 then refuse(ERR_TAT) end
          limited, ttl, write_tat = false, big_sub(new_tat, now), new_tat
        end
      end
      if write_tat then
        -- Expiring at the TAT rounded up to the millisecond, as the module's PXAT: Redis deletes a key only once
        -- its clock is past that millisecond, so the key lasts until its TAT and the next call sees it however soon
        -- it comes. On the caller's clock the expiry is set relative to the server's millisecond (PX), as far from
        -- it as the TAT rounded up is from the reading's millisecond (so the same expiry where the clocks agree,
        -- and never less than the TAT's lead), at least 1 ms (PX takes no 0; a TAT not ahead is worth no more than
        -- a missing key). Instants are non-negative: ceil(x / 10^6) is trunc((x + 999999) / 10^6).
        local at_ms = big_shift(big_add(write_tat, ROUND_UP_MS), 6)
        local written
        if caller_now_us then
          local lead_ms = math.max(big_f64(big_sub(at_ms, big_shift(now, 6))), 1)
          written = redis.pcall('SET', key, big_text(write_tat), 'PX', string.format('%d', lead_ms))
        else
          written = redis.pcall('SET', key, big_text(write_tat), 'PXAT', big_text(at_ms))
        end
        -- Above maxmemory Redis refuses a script's first write (OOM): an allowed call is refused with that text and
        -- changes nothing, as the module refuses it; a peek (quantity 0) is answered without its write, as the
        -- module answers it (it would store the TAT it found, or now: no more than a missing key). Redis 6.2 puts
        -- the script's line before the text.
        if type(written) == 'table' and written.err
            and not (#quantity == 0 and string.find(written.err, 'OOM command not allowed', 1, true)) then
          refuse(written.err)
        end
      end
      return { limited and 1 or 0, math.min(big_f64(limit), REPLY_MAX),
               throttle_remaining(big_sub(tolerance, ttl), interval), retry_s, whole_seconds_up(ttl) }
    end
  end
end

---------------------------------------------------------------------------------------------------------------
-- The entry, second part: FUNCTION LOAD registers one function per command; the EVAL form runs again the call
-- whose first attempt needed the general part.
---------------------------------------------------------------------------------------------------------------

if AS_LIBRARY then
  -- The function form: FCALL <LIB>_<command> with [@<µs>] <arguments>. TB.ACQUIRE's hot path takes them as they
  -- are, the general part's commands without the clock.
  local function function_form(command, keys, argv)
    local first = take_clock(argv, 1)
    if command == 'TB.ACQUIRE' then return acquire_command(keys, argv, first) end
    return general()[command](keys, rest_of(argv, first))
  end

  -- name, command, flags: TB.REFUND is performed above maxmemory (allow-oom), as the module performs it; no flag
  -- lets a function answer refusals there yet refuse writes, so every other one is refused before it runs.
  local functions = {
    { 'acquire', 'TB.ACQUIRE', {} },
    { 'acquireall', 'TB.ACQUIREALL', {} },
    { 'acquireeach', 'TB.ACQUIREEACH', {} },
    { 'acquireatmost', 'TB.ACQUIREATMOST', {} },
    { 'reserve', 'TB.RESERVE', {} },
    { 'refund', 'TB.REFUND', { 'allow-oom' } },
    { 'charge', 'TB.CHARGE', {} },
    { 'block', 'TB.BLOCK', {} },
    { 'lower', 'TB.LOWER', {} },
    { 'cl_throttle', 'CL.THROTTLE', {} },
  }
  for i = 1, #functions do
    local command = functions[i][2]
    redis.register_function {
      function_name = TB_LIBRARY .. '_' .. functions[i][1],
      callback = function(keys, argv)
        local ok, result = pcall(function_form, command, keys, argv)
        if ok then return result end
        return failure(result)
      end,
      flags = functions[i][3],
    }
  end
else
  local ok, result = pcall(eval_form, KEYS, ARGV)
  if ok then return result end
  return failure(result)
end

