//! The glue between the server and the pure bucket: parse arguments, read the hash, decide, write, replicate,
//! reply. It owns the command contract; the README mirrors it.
//!
//! ```text
//! TB.ACQUIRE key rate burst [cost]
//!
//!   rate    tokens added per second        decimal, finite, > 0
//!   burst   capacity in tokens             decimal, finite, > 0
//!   cost    tokens this call takes         decimal, finite, >= 0, default 1; 0 is a peek
//!
//! Reply: array of 4 integers
//!   1) allowed          1 or 0
//!   2) remaining        whole tokens left after this call (floor)
//!   3) retry_after_ms   0 when allowed; -1 when cost > burst (never succeeds); else ms until cost tokens are there
//!   4) reset_after_ms   ms until the bucket is full again (rounded up); 0 when full
//!
//! State: a hash with exactly two fields
//!   tokens   decimal text that parses back to the exact f64 written
//!   ts       server wall-clock time of the last write, integer microseconds since the Unix epoch
//!   A missing key is a full bucket. The key expires no earlier than the moment the bucket is full again and at
//!   most a slack later: 1% of burst / rate, at least 1 s, at most a day (see `bucket::Write`).
//!
//! Errors (nothing is changed by a call that errors):
//!   ERR wrong number of arguments for 'tb.acquire' command
//!   ERR rate must be a positive number          (likewise burst; cost must be a non-negative number)
//!   WRONGTYPE Operation against a key holding the wrong kind of value
//!   ERR key is not a valid token bucket (...)   a hash with other fields or unparsable values
//!   ERR each key may appear only once           TB.ACQUIREALL naming a key twice
//!   ERR too many buckets: TB.ACQUIREALL takes at most 1000
//!   ERR failed to write the token bucket        the server refused a string or key the write needs; no known
//!                                               input or configuration leads here (renamed HSET/PEXPIREAT are
//!                                               refused at load time instead)
//! ```
//!
//! Only allowed calls with a non-zero cost write. Denials and peeks leave the key, its expiry and the replication
//! stream untouched: the refill is a pure function of time, so there is nothing to record. Nor do they signal the
//! key as modified, so a client's `WATCH` on a bucket survives them (issue #4).
//!
//! Replication sends the *effects*, `HSET key tokens T ts TS` and, when the expiry moves, `PEXPIREAT key MS`,
//! with exactly the bytes written here, never the command itself. `RM_ReplicateVerbatim` is for commands that "deterministically
//! re-create the new state" (`module.c`); ours reads the clock, so a replica re-running it would compute with its
//! own clock, and a replica or AOF loader without the module could not run it at all.
#![forbid(unsafe_code)]

use std::ffi::CStr;

use redis_module::{Context, RedisString, Status};

use crate::bucket::{self, Combined, Cost, Decision, Outcome, ParamError, Params, State, Write};
use crate::codec::{decode_state, with_encoded};
use crate::number;
use crate::server::{
    self, ArgDoc, ArgKind, Call, Command, CommandDocs, EventClass, Interned, Key, KeyKind, Support,
};
use crate::stats;

/// The command's name as registered.
pub const ACQUIRE_NAME: &CStr = c"tb.acquire";
/// Registration flags: it writes, may grow memory (refused under OOM), and is O(1).
pub const ACQUIRE_FLAGS: &CStr = c"write deny-oom fast";
/// What `COMMAND DOCS` and `COMMAND INFO` say about it.
pub const ACQUIRE_DOCS: CommandDocs = CommandDocs {
    summary: c"Refills the token bucket at key on the server clock and takes cost tokens if it holds them.",
    complexity: c"O(1)",
    since: c"0.1.0",
    arity: -4,
    first_key: 1,
    last_key: 0,
    key_step: 1,
    args: &[
        arg(c"key", ArgKind::Key, false),
        arg(c"rate", ArgKind::Double, false),
        arg(c"burst", ArgKind::Double, false),
        arg(c"cost", ArgKind::Double, true),
    ],
};

const fn arg(name: &'static CStr, kind: ArgKind, optional: bool) -> ArgDoc {
    ArgDoc {
        name,
        kind,
        optional,
        multiple: false,
        subargs: &[],
    }
}

const ACQUIRE_ARITY_ERROR: &CStr = c"ERR wrong number of arguments for 'tb.acquire' command";

/// The multi-bucket command's name as registered.
pub const ACQUIRE_ALL_NAME: &CStr = c"tb.acquireall";
/// Same flags as `TB.ACQUIRE`; O(N) in the number of buckets, which is small, so still `fast`.
pub const ACQUIRE_ALL_FLAGS: &CStr = ACQUIRE_FLAGS;
pub const ACQUIRE_ALL_DOCS: CommandDocs = CommandDocs {
    summary:
        c"Takes cost tokens from every listed token bucket if all of them hold it, else from none.",
    complexity: c"O(N) where N is the number of buckets",
    since: c"0.1.0",
    arity: -5,
    first_key: 2,
    last_key: -1,
    key_step: 3,
    args: &[
        arg(c"cost", ArgKind::Double, false),
        ArgDoc {
            name: c"bucket",
            kind: ArgKind::Block,
            optional: false,
            multiple: true,
            subargs: &[
                arg(c"key", ArgKind::Key, false),
                arg(c"rate", ArgKind::Double, false),
                arg(c"burst", ArgKind::Double, false),
            ],
        },
    ],
};
const ACQUIRE_ALL_ARITY_ERROR: &CStr = c"ERR wrong number of arguments for 'tb.acquireall' command";

/// Keyspace events a write fires: those of the native commands it replicates as (`HSET`, `PEXPIREAT`).
const EVENT_HSET: &CStr = c"hset";
const EVENT_EXPIRE: &CStr = c"expire";

/// Hash field holding the token count. A `static`, not a `const`: the server string is made once and reused.
static FIELD_TOKENS: Interned = Interned::new(c"tokens");
/// Hash field holding the time of the last write, in microseconds.
static FIELD_UPDATED_US: Interned = Interned::new(c"ts");

/// Everything a call can refuse with. Its wire text is API: integration tests assert it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TbError {
    /// Carries the command's own message, which names it.
    WrongArity(&'static CStr),
    DuplicateKey,
    TooManyBuckets,
    Param(ParamError),
    WrongType,
    NotABucket,
    WriteFailed,
}

impl TbError {
    /// The error line sent to the client, prefix included.
    pub fn wire_text(self) -> &'static CStr {
        match self {
            TbError::WrongArity(message) => message,
            TbError::DuplicateKey => c"ERR each key may appear only once",
            TbError::TooManyBuckets => c"ERR too many buckets: TB.ACQUIREALL takes at most 1000",
            TbError::Param(ParamError::Rate) => c"ERR rate must be a positive number",
            TbError::Param(ParamError::Burst) => c"ERR burst must be a positive number",
            TbError::Param(ParamError::Cost) => c"ERR cost must be a non-negative number",
            TbError::WrongType => c"WRONGTYPE Operation against a key holding the wrong kind of value",
            TbError::NotABucket => {
                c"ERR key is not a valid token bucket (expected a hash with only the fields tokens and ts)"
            }
            TbError::WriteFailed => c"ERR failed to write the token bucket",
        }
    }
}

impl From<ParamError> for TbError {
    fn from(error: ParamError) -> TbError {
        TbError::Param(error)
    }
}

/// The native commands the module's writes are replicated as. Each must exist under its own name, or a write
/// could not be replicated after it was made: the module checks them when it loads, so that no call can fail
/// between its first write and its reply (issue #12).
const REPLICATED_COMMANDS: [&CStr; 2] = [c"HSET", c"PEXPIREAT"];

/// The module's own ACL category, on servers that let modules add one.
const ACL_CATEGORY: &CStr = c"ratelimit";

/// Checks that the server can replicate what the module writes, then registers both commands with their docs and
/// ACL categories. Every server feature
/// is detected by the presence of its API, never by version number; a missing one is logged once and skipped.
pub fn register(ctx: &Context, args: &[RedisString]) -> Status {
    if !args.is_empty() {
        let given: Vec<String> = args.iter().map(RedisString::to_string_lossy).collect();
        ctx.log_warning(&format!(
            "redis-tb takes no module arguments; refusing to load with: {}",
            given.join(" ")
        ));
        return Status::Err;
    }
    for name in REPLICATED_COMMANDS {
        if !server::command_exists(ctx, name) {
            ctx.log_warning(&format!(
                "redis-tb: refusing to load: the command {} is renamed or disabled (rename-command), and the module replicates its writes as that command",
                name.to_string_lossy()
            ));
            return Status::Err;
        }
    }
    server::signal_only_modified_keys(ctx);
    // Added now, while loading: AddACLCategory is refused afterwards.
    let categories = match server::add_acl_category(ctx, ACL_CATEGORY) {
        Support::Done => c"write fast ratelimit",
        Support::Unsupported | Support::Failed => c"write fast",
    };
    let registered = [
        register_one::<Acquire>(ctx, ACQUIRE_NAME, ACQUIRE_FLAGS, &ACQUIRE_DOCS, categories),
        register_one::<AcquireAll>(
            ctx,
            ACQUIRE_ALL_NAME,
            ACQUIRE_ALL_FLAGS,
            &ACQUIRE_ALL_DOCS,
            categories,
        ),
    ];
    let mut docs = Support::Done;
    let mut acl = Support::Done;
    for result in registered {
        let Ok((command_docs, command_acl)) = result else {
            return Status::Err;
        };
        docs = docs.min(command_docs);
        acl = acl.min(command_acl);
    }
    if docs == Support::Unsupported {
        ctx.log_notice("redis-tb: this server has no RedisModule_SetCommandInfo (Redis < 7.0): no COMMAND DOCS or key specs");
    }
    if acl == Support::Unsupported {
        ctx.log_notice("redis-tb: this server has no module ACL categories (Redis < 7.2): grant the commands by name");
    }
    if !server::has_abs_expire() {
        ctx.log_notice("redis-tb: this server has no RedisModule_SetAbsExpire (Redis < 7.0): expiries are set relative to now; replicas and the AOF still get the absolute PEXPIREAT");
    }
    Status::Ok
}

/// Refuses `MODULE UNLOAD`. A server runs a command queued in a `MULTI` before the unload, or a blocked one, with
/// a pointer into the unloaded library and crashes (Redis 7.0, 8.2 and Valkey 9 alike); on servers with module ACL
/// categories an unload and reload also leaves `@ratelimit` empty. Upgrade by restarting the server, or by a
/// failover to a replica started with the new build.
pub fn refuse_unload(ctx: &Context) -> Status {
    ctx.log_warning("redis-tb cannot be unloaded: a transaction or script that queued a TB command would crash the server. Restart the server (or fail over to an upgraded replica) to upgrade the module");
    Status::Err
}

/// Registers one command and describes it where the server can take it. `Err` fails the module load.
fn register_one<C: Command>(
    ctx: &Context,
    name: &CStr,
    flags: &CStr,
    docs: &CommandDocs,
    categories: &CStr,
) -> Result<(Support, Support), Status> {
    let last_key = docs.legacy_last_key();
    if server::create_command::<C>(ctx, name, flags, docs.first_key, last_key, docs.key_step)
        == Status::Err
    {
        return Err(Status::Err);
    }
    let described = server::set_command_info(ctx, name, docs);
    if described == Support::Failed {
        ctx.log_warning("redis-tb: RedisModule_SetCommandInfo refused the command docs");
        return Err(Status::Err);
    }
    let categorized = server::set_acl_categories(ctx, name, categories);
    if categorized == Support::Failed {
        ctx.log_warning("redis-tb: RedisModule_SetCommandACLCategories refused the categories");
        return Err(Status::Err);
    }
    Ok((described, categorized))
}

/// `TB.ACQUIRE key rate burst [cost]`.
pub struct Acquire;

impl Command for Acquire {
    fn run(call: &Call<'_>) {
        match acquire(call) {
            Ok((decision, cost)) => reply_decided(
                call,
                decision.outcome,
                cost,
                &[
                    i64::from(decision.allowed()),
                    decision.remaining,
                    decision.retry_after_ms,
                    decision.reset_after_ms,
                ],
            ),
            Err(error) => reply_error(call, error),
        }
    }
}

fn acquire(call: &Call<'_>) -> Result<(Decision, Cost), TbError> {
    if !(4..=5).contains(&call.arg_count()) {
        return Err(TbError::WrongArity(ACQUIRE_ARITY_ERROR));
    }
    let params = parse_params(call, 2)?;
    let cost = match call.arg(4) {
        Some(bytes) => parse_cost(bytes)?,
        None => Cost::new(1.0)?,
    };
    let key = call.open_key(1).ok_or(TbError::WriteFailed)?;
    let stored = read_state(&key)?;
    let decision = bucket::acquire(stored, server::now_us(), &params, cost);
    if let Some(write) = decision.write {
        write_state(call, &key, &write, stored.is_some())?;
    }
    Ok((decision, cost))
}

/// `TB.ACQUIREALL cost key rate burst [key rate burst ...]`.
pub struct AcquireAll;

impl Command for AcquireAll {
    fn run(call: &Call<'_>) {
        match acquire_all(call) {
            Ok((combined, cost)) => reply_decided(
                call,
                combined.outcome,
                cost,
                &[
                    i64::from(combined.outcome == Outcome::Allowed),
                    combined.remaining,
                    combined.retry_after_ms,
                    combined.reset_after_ms,
                    i64::try_from(combined.limiting_index).unwrap_or(i64::MAX),
                ],
            ),
            Err(error) => reply_error(call, error),
        }
    }
}

/// Arguments per bucket in `TB.ACQUIREALL`: key, rate, burst.
const BUCKET_ARGS: usize = 3;
/// Most buckets one `TB.ACQUIREALL` may name. A call costs about 1.5 µs of server time per bucket, and no call may
/// hold the server for more than a few milliseconds: 1,000 buckets take about 1.5 ms. (Without a cap, one call
/// naming 30,000 buckets held every other client for 45 ms.) The error text says the number: keep them in step.
const MAX_BUCKETS: usize = 1_000;
/// Index of the first bucket's key in `TB.ACQUIREALL` (after the name and the cost).
const FIRST_BUCKET_ARG: usize = 2;

fn acquire_all(call: &Call<'_>) -> Result<(Combined, Cost), TbError> {
    let argc = call.arg_count();
    if argc <= FIRST_BUCKET_ARG || !(argc - FIRST_BUCKET_ARG).is_multiple_of(BUCKET_ARGS) {
        return Err(TbError::WrongArity(ACQUIRE_ALL_ARITY_ERROR));
    }
    if (argc - FIRST_BUCKET_ARG) / BUCKET_ARGS > MAX_BUCKETS {
        return Err(TbError::TooManyBuckets);
    }
    let cost = parse_cost(call.arg(1).unwrap_or_default())?;
    let key_indexes: Vec<usize> = (FIRST_BUCKET_ARG..argc).step_by(BUCKET_ARGS).collect();
    let params = key_indexes
        .iter()
        .map(|&key_index| parse_params(call, key_index + 1))
        .collect::<Result<Vec<Params>, TbError>>()?;
    if has_duplicate(key_indexes.iter().map(|&key_index| call.arg(key_index))) {
        return Err(TbError::DuplicateKey);
    }
    let keys = key_indexes
        .iter()
        .map(|&key_index| call.open_key(key_index).ok_or(TbError::WriteFailed))
        .collect::<Result<Vec<Key<'_>>, TbError>>()?;
    let members = keys
        .iter()
        .zip(params)
        .map(|(key, params)| Ok((read_state(key)?, params)))
        .collect::<Result<Vec<(Option<State>, Params)>, TbError>>()?;
    let combined = bucket::acquire_all(&members, server::now_us(), cost);
    // Every key was read and checked above, so these writes cannot fail half-way for a reason we could
    // have caught first; all of them reach replicas and the AOF inside the one MULTI/EXEC of this command.
    for ((key, (stored, _)), write) in keys.iter().zip(&members).zip(&combined.writes) {
        if let Some(write) = write {
            write_state(call, key, write, stored.is_some())?;
        }
    }
    Ok((combined, cost))
}

/// Whether any two of `keys` are equal. Sorting makes it O(N log N): a pairwise check held the server for seconds
/// on a call naming 30,000 buckets (issue #12).
fn has_duplicate<'a>(keys: impl Iterator<Item = Option<&'a [u8]>>) -> bool {
    let mut sorted: Vec<Option<&[u8]>> = keys.collect();
    sorted.sort_unstable();
    sorted.windows(2).any(|pair| pair.first() == pair.last())
}

/// Counts a decided call in `INFO tb` and sends its integers.
fn reply_decided(call: &Call<'_>, outcome: Outcome, cost: Cost, fields: &[i64]) {
    stats::record(outcome, cost.tokens());
    call.reply_integers(fields);
}

/// Counts a refused call in `INFO tb` and sends its error.
fn reply_error(call: &Call<'_>, error: TbError) {
    stats::record_error();
    call.reply_error(error.wire_text());
}

/// Parses `rate` at `rate_index` and `burst` right after it. A caller sends the same two texts on every call to a
/// bucket, so the last pair parsed is remembered with its `Params`: the same bytes give the same result.
fn parse_params(call: &Call<'_>, rate_index: usize) -> Result<Params, TbError> {
    let (rate_text, burst_text) = (call.arg(rate_index), call.arg(rate_index + 1));
    if let (Some(rate_text), Some(burst_text)) = (rate_text, burst_text) {
        if let Some(params) = LAST_PARAMS.with(|last| last.get().lookup(rate_text, burst_text)) {
            return Ok(params);
        }
    }
    let params = Params::new(
        parse_number(rate_text).ok_or(ParamError::Rate)?,
        parse_number(burst_text).ok_or(ParamError::Burst)?,
    )?;
    if let (Some(rate_text), Some(burst_text)) = (rate_text, burst_text) {
        LAST_PARAMS.with(|last| last.set(ParamsCache::new(rate_text, burst_text, params)));
    }
    Ok(params)
}

/// Longest `rate` or `burst` text the cache holds; longer ones are parsed every time.
const CACHED_TEXT_LEN: usize = 24;

/// The last valid `rate`/`burst` texts parsed, with their `Params`. Only valid pairs are kept, so a hit never
/// skips a check.
#[derive(Clone, Copy)]
struct ParamsCache {
    rate: [u8; CACHED_TEXT_LEN],
    rate_len: usize,
    burst: [u8; CACHED_TEXT_LEN],
    burst_len: usize,
    params: Option<Params>,
}

impl ParamsCache {
    const EMPTY: ParamsCache = ParamsCache {
        rate: [0; CACHED_TEXT_LEN],
        rate_len: 0,
        burst: [0; CACHED_TEXT_LEN],
        burst_len: 0,
        params: None,
    };

    fn new(rate_text: &[u8], burst_text: &[u8], params: Params) -> ParamsCache {
        let mut cache = ParamsCache::EMPTY;
        let (Some(rate), Some(burst)) = (
            cache.rate.get_mut(..rate_text.len()),
            cache.burst.get_mut(..burst_text.len()),
        ) else {
            return ParamsCache::EMPTY;
        };
        rate.copy_from_slice(rate_text);
        burst.copy_from_slice(burst_text);
        cache.rate_len = rate_text.len();
        cache.burst_len = burst_text.len();
        cache.params = Some(params);
        cache
    }

    fn lookup(&self, rate_text: &[u8], burst_text: &[u8]) -> Option<Params> {
        let same = self.rate.get(..self.rate_len) == Some(rate_text)
            && self.burst.get(..self.burst_len) == Some(burst_text);
        self.params.filter(|_| same)
    }
}

thread_local! {
    /// Commands run on the server's main thread only; a thread-local needs no lock and no `unsafe`.
    static LAST_PARAMS: std::cell::Cell<ParamsCache> = const { std::cell::Cell::new(ParamsCache::EMPTY) };
}

fn parse_cost(bytes: &[u8]) -> Result<Cost, TbError> {
    Ok(Cost::new(
        parse_number(Some(bytes)).ok_or(ParamError::Cost)?,
    )?)
}

/// Parses a decimal argument: what Rust's `f64` grammar accepts (`1`, `0.5`, `2.5e-3`), finite only (see
/// [`number::parse_f64`]).
fn parse_number(bytes: Option<&[u8]>) -> Option<f64> {
    number::parse_f64(bytes?)
}

/// Reads the bucket: `None` for a missing key, the decoded state for a bucket hash.
fn read_state(key: &Key<'_>) -> Result<Option<State>, TbError> {
    match key.kind() {
        KeyKind::Empty => Ok(None),
        KeyKind::Other => Err(TbError::WrongType),
        KeyKind::Hash if key.hash_len() != 2 => Err(TbError::NotABucket),
        KeyKind::Hash => key
            .hash_get2([&FIELD_TOKENS, &FIELD_UPDATED_US], decode_state)
            .map(Some)
            .ok_or(TbError::NotABucket),
    }
}

/// Writes the new state, moves the key's expiry only when it falls outside the write's window (see
/// [`Write`]), replicates exactly those effects (the same value strings go to the hash and to the replicated
/// `HSET`), and fires the keyspace events the equivalent native commands would.
///
/// On a live bucket whose expiry still fits, the write replicates as one `HSET`, which the server sends alone;
/// creating a bucket, or moving its expiry (about once per slack on a hot key), adds a `PEXPIREAT`, and the server
/// wraps the pair in `MULTI`/`EXEC`. `existed` says whether the key was there before this call.
///
/// Nothing here can fail after the first write for a reason we could have checked first: the value strings are
/// made up front, the key was opened for writing and holds a hash or nothing, and the module refused to load where
/// `HSET` or `PEXPIREAT` is renamed (see `REPLICATED_COMMANDS`).
fn write_state(
    call: &Call<'_>,
    key: &Key<'_>,
    write: &Write,
    existed: bool,
) -> Result<(), TbError> {
    let (tokens, updated_us) = with_encoded(&write.state, |tokens, updated_us| {
        (call.create_string(tokens), call.create_string(updated_us))
    });
    let (Some(tokens), Some(updated_us)) = (tokens, updated_us) else {
        return Err(TbError::WriteFailed);
    };
    // Only ask an existing key for its expiry (Redis 8.2 crashes on an empty one).
    let current_expiry_ms = if existed { key.expire_at_ms() } else { None };
    let new_expiry_ms = (!write.keeps_expiry(current_expiry_ms)).then(|| write.new_expiry_ms());
    let fields = [(&FIELD_TOKENS, &tokens), (&FIELD_UPDATED_US, &updated_us)];
    key.hash_set2(fields)
        .and_then(|()| call.replicate_hset(key, fields))
        .map_err(|()| TbError::WriteFailed)?;
    call.notify(EventClass::Hash, EVENT_HSET, key);
    if let Some(at_ms) = new_expiry_ms {
        key.set_expire_at(at_ms)
            .and_then(|()| call.replicate_pexpireat(key, at_ms))
            .map_err(|()| TbError::WriteFailed)?;
        call.notify(EventClass::Generic, EVENT_EXPIRE, key);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_cache_hits_only_the_same_texts() {
        let params = Params::new(10.0, 20.0).expect("valid");
        let cache = ParamsCache::new(b"10", b"20", params);
        assert_eq!(cache.lookup(b"10", b"20"), Some(params));
        assert_eq!(cache.lookup(b"10", b"2"), None);
        assert_eq!(cache.lookup(b"1", b"20"), None);
        assert_eq!(cache.lookup(b"10", b"200"), None);
        assert_eq!(ParamsCache::EMPTY.lookup(b"", b""), None);
        let long = [b'1'; CACHED_TEXT_LEN + 1];
        assert_eq!(
            ParamsCache::new(&long, b"20", params).lookup(&long, b"20"),
            None
        );
    }

    #[test]
    fn parse_number_refuses_a_missing_argument() {
        assert_eq!(parse_number(Some(b"2.5")), Some(2.5));
        assert_eq!(parse_number(None), None);
    }

    #[test]
    fn error_texts_carry_a_redis_prefix() {
        let all = [
            TbError::WrongArity(ACQUIRE_ARITY_ERROR),
            TbError::WrongArity(ACQUIRE_ALL_ARITY_ERROR),
            TbError::DuplicateKey,
            TbError::TooManyBuckets,
            TbError::Param(ParamError::Rate),
            TbError::Param(ParamError::Burst),
            TbError::Param(ParamError::Cost),
            TbError::WrongType,
            TbError::NotABucket,
            TbError::WriteFailed,
        ];
        for error in all {
            let text = error.wire_text().to_str().expect("ascii");
            assert!(
                text.starts_with("ERR ") || text.starts_with("WRONGTYPE "),
                "{text}"
            );
        }
    }
}
