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
//! TB.ACQUIREEACH key rate burst cost [key rate burst cost ...]      (1 to 1000 buckets, each key once)
//!
//! Reply: array of 2 + N elements
//!   1) allowed          1 when every bucket held its own cost and paid it, else 0 and nothing is taken
//!   2) limiting_index   0-based; TB.ACQUIREALL's rule: refused: the first bucket whose cost exceeds its burst,
//!                       else the first with the longest wait; allowed: the first with the fewest tokens left
//!   3..) per bucket, in argument order, 4 integers with TB.ACQUIRE's meanings for that bucket and its cost:
//!        fits (1 when that bucket alone holds its cost now), remaining, retry_after_ms (0 when it fits, -1 when
//!        its cost exceeds its burst), reset_after_ms; remaining and reset after this call
//!
//! TB.ACQUIREATMOST key rate burst max                                (max an integer from 1 to 2^53)
//!
//! Reply: array of 4 integers
//!   1) granted          min(max, whole tokens in the bucket); 0 when less than one whole token is there
//!   2) remaining        3) retry_after_ms: 0 when granted, -1 when burst < 1, else ms until one whole token
//!   4) reset_after_ms
//!
//! TB.CHARGE key rate burst cost                                      (cost as for TB.ACQUIRE; 0 changes nothing)
//! TB.BLOCK key rate burst ms                                         (ms an integer from 1 to 86400000)
//!
//! TB.LOWER key rate burst tokens                                     (tokens decimal, finite, >= -(rate * 86400))
//!
//!   CHARGE takes cost even when the bucket lacks it, leaving a debt (negative tokens) that every other command
//!   treats as a reservation's; refused if tokens after < -(rate * 86400). BLOCK sets tokens to
//!   min(tokens, -(rate * ms / 1000)): denied (TB.RESERVE waits) until ms from now, a longer debt kept. LOWER sets
//!   the refilled tokens to min(tokens now, tokens): never raises a bucket, and a second identical call changes
//!   nothing.
//! Reply: array of 3 integers
//!   1) remaining        whole tokens left after the call, never below 0
//!   2) retry_after_ms   ms until one whole token is there (debt repaid); 0 when there now; -1 when burst < 1
//!   3) reset_after_ms
//!
//! CL.THROTTLE key max_burst count_per_period period [quantity]        (redis-cell's command, reply for reply)
//!
//!   max_burst         integer >= 0; the limit L is max_burst + 1
//!   count_per_period  integer >= 1, per period seconds (integer >= 1); quantity integer >= 0, default 1
//! Reply: array of 5 integers
//!   1) limited          0 or 1
//!   2) limit            max_burst + 1
//!   3) remaining        requests of quantity 1 left after this call, never below 0
//!   4) retry_after      seconds until this call would be allowed; -1 when allowed, and when it never will be
//!   5) reset_after      seconds until the key is empty again
//!   Both waits are truncated to the ms, then rounded up to whole seconds (2.000 s -> 2, 2.001 s -> 3).
//! State: a string, the theoretical arrival time in decimal ns since the epoch, expiring when it passes (rounded up
//!   to the ms); written by allowed calls only (quantity 0 too), replicated as `SET key tat PXAT ms`. See `gcra`.
//! Errors: ERR max_burst must be an integer from 0 to 9223372036854775806 (likewise count_per_period, period,
//!   quantity: each named), ERR key does not hold a CL.THROTTLE state (...), WRONGTYPE for a hash or other type,
//!   and ERRs for limits whose nanoseconds overflow (see `TbError::wire_text`).
//!
//! Errors (nothing is changed by a call that errors):
//!   ERR wrong number of arguments for 'tb.acquire' command
//!   ERR rate must be a positive number          (likewise burst; cost must be a non-negative number)
//!   WRONGTYPE Operation against a key holding the wrong kind of value
//!   ERR key is not a valid token bucket (...)   a hash with other fields or unparsable values
//!   ERR each key may appear only once           TB.ACQUIREALL or TB.ACQUIREEACH naming a key twice
//!   ERR too many buckets: TB.ACQUIREALL takes at most 1000            (likewise TB.ACQUIREEACH)
//!   ERR max must be an integer from 1 to 9007199254740992
//!   ERR ms must be an integer from 1 to 86400000                      TB.BLOCK
//!   ERR tokens must be a number no lower than -(rate * 86400)         TB.LOWER
//!   ERR charge would put the bucket more than 24 hours of refill into debt
//!   ERR TB commands are refused inside scripts on Redis before 7.0: ...   any command from a script on 6.2
//!   OOM command not allowed when used memory > 'maxmemory'.   Redis's own text: a call that would write, above
//!                                               maxmemory (every command but TB.REFUND; a CL.THROTTLE peek is
//!                                               answered without its write). No command is `deny-oom`, so a
//!                                               refusal or a peek is answered at any memory
//!   ERR failed to write the token bucket        the server refused a string or key the write needs; no known
//!                                               input or configuration leads here (renamed HSET/PEXPIREAT are
//!                                               refused at load time instead)
//! ```
//!
//! Only allowed calls with a non-zero cost write. Denials and peeks leave the key, its expiry and the replication
//! stream untouched: the refill is a pure function of time, so there is nothing to record. Nor do they signal the
//! key as modified, so a client's `WATCH` on a bucket survives them (issue #4). The one exception is a clock that
//! reads earlier than a bucket's `ts` (a step back, or a failover to a server whose clock is behind): the bucket
//! keeps its tokens and refills from that reading, and the first call of any command to see it writes (and
//! replicates) the bucket with the new `ts`, once per bucket per step (issue #19; `bucket::refilled`). Every
//! command gets this from the core's decision, never from code of its own here.
//!
//! Replication sends the *effects*, `HSET key tokens T ts TS` and, when the expiry moves, `PEXPIREAT key MS`,
//! with exactly the bytes written here, never the command itself. `RM_ReplicateVerbatim` is for commands that "deterministically
//! re-create the new state" (`module.c`); ours reads the clock, so a replica re-running it would compute with its
//! own clock, and a replica or AOF loader without the module could not run it at all.
//!
//! Layout: `throttle` holds `CL.THROTTLE`; `acquire` holds `TB.ACQUIRE` and `TB.ACQUIREALL`; `each` holds `TB.ACQUIREEACH` and
//! `TB.ACQUIREATMOST`; `reserve` holds `TB.RESERVE` and `TB.REFUND`; `charge` holds `TB.CHARGE`, `TB.BLOCK` and `TB.LOWER`; `args` parses what every command shares (rate,
//! burst, cost); `state` reads and writes a bucket's hash, expiry and replication; this file holds the error
//! type, the replies and the module's registration.
#![forbid(unsafe_code)]

mod acquire;
mod args;
mod charge;
mod each;
mod reserve;
mod state;
mod throttle;

use std::ffi::CStr;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{Context, RedisString, Status};

use crate::bucket::ParamError;
use crate::gcra::GcraError;
use crate::server::{self, ArgDoc, ArgKind, Call, Command, CommandDocs, ShutdownHook, Support};
use crate::stats::{self, Tally};

use acquire::{
    Acquire, AcquireAll, ACQUIRE_ALL_DOCS, ACQUIRE_ALL_FLAGS, ACQUIRE_ALL_NAME, ACQUIRE_DOCS,
    ACQUIRE_FLAGS, ACQUIRE_NAME,
};
use charge::{
    Block, Charge, Lower, BLOCK_DOCS, BLOCK_FLAGS, BLOCK_NAME, CHARGE_DOCS, CHARGE_FLAGS,
    CHARGE_NAME, LOWER_DOCS, LOWER_FLAGS, LOWER_NAME,
};
use each::{
    AcquireAtMost, AcquireEach, ACQUIRE_AT_MOST_DOCS, ACQUIRE_AT_MOST_FLAGS, ACQUIRE_AT_MOST_NAME,
    ACQUIRE_EACH_DOCS, ACQUIRE_EACH_FLAGS, ACQUIRE_EACH_NAME,
};
use reserve::{
    Refund, Reserve, REFUND_DOCS, REFUND_FLAGS, REFUND_NAME, RESERVE_DOCS, RESERVE_FLAGS,
    RESERVE_NAME,
};
use throttle::{Throttled, THROTTLE_DOCS, THROTTLE_FLAGS, THROTTLE_NAME};

const fn arg(name: &'static CStr, kind: ArgKind, optional: bool) -> ArgDoc {
    ArgDoc {
        name,
        kind,
        optional,
        multiple: false,
        subargs: &[],
    }
}

/// The docs of a command on one bucket, `key rate burst last`, where `last` is the one argument after the bucket
/// (optional for `TB.ACQUIRE`'s cost): O(1), the key at position 1.
const fn one_bucket_docs(
    summary: &'static CStr,
    since: &'static CStr,
    args: &'static [ArgDoc],
    optional_last: bool,
) -> CommandDocs {
    CommandDocs {
        summary,
        complexity: c"O(1)",
        since,
        // The name, key, rate, burst and the last argument; "at least 4" when that one may be left out.
        arity: if optional_last { -4 } else { 5 },
        first_key: 1,
        last_key: 0,
        key_step: 1,
        args,
    }
}

/// `key rate burst` then `last`: the arguments of every one-bucket command, for [`one_bucket_docs`].
const fn one_bucket_args(last: ArgDoc) -> [ArgDoc; 4] {
    [
        arg(c"key", ArgKind::Key, false),
        arg(c"rate", ArgKind::Double, false),
        arg(c"burst", ArgKind::Double, false),
        last,
    ]
}

/// Everything a call can refuse with. Its wire text is API: integration tests assert it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TbError {
    /// Carries the command's own message, which names it.
    WrongArity(&'static CStr),
    DuplicateKey,
    /// Carries the command's own message, which names it.
    TooManyBuckets(&'static CStr),
    Param(ParamError),
    /// `TB.CHARGE` would leave a debt that a day of refill does not repay.
    DebtBeyondLimit,
    WrongType,
    NotABucket,
    WriteFailed,
    /// Called from a script on a server whose scripts can keep a module's writes from replicas and the AOF.
    ScriptOnLegacyServer,
    /// A `CL.THROTTLE` argument or result out of range.
    Gcra(GcraError),
    /// A `CL.THROTTLE` key holding a string that is not a decimal TAT.
    NotAThrottleState,
    /// The call would write while the server is above `maxmemory` (see [`state::memory_for_writes`]).
    OutOfMemory,
}

impl TbError {
    /// The error line sent to the client, prefix included.
    pub fn wire_text(self) -> &'static CStr {
        match self {
            TbError::WrongArity(message) => message,
            TbError::DuplicateKey => c"ERR each key may appear only once",
            TbError::TooManyBuckets(message) => message,
            TbError::Param(ParamError::Rate) => c"ERR rate must be a positive number",
            TbError::Param(ParamError::Burst) => c"ERR burst must be a positive number",
            TbError::Param(ParamError::Cost) => c"ERR cost must be a non-negative number",
            TbError::Param(ParamError::MaxWait) => {
                c"ERR max_wait_ms must be an integer from 0 to 86400000"
            }
            TbError::Param(ParamError::Amount) => c"ERR amount must be a non-negative number",
            TbError::Param(ParamError::AtMost) => {
                c"ERR max must be an integer from 1 to 9007199254740992"
            }
            TbError::Param(ParamError::BlockMs) => c"ERR ms must be an integer from 1 to 86400000",
            TbError::Param(ParamError::Floor) => {
                c"ERR tokens must be a number no lower than -(rate * 86400)"
            }
            TbError::DebtBeyondLimit => {
                c"ERR charge would put the bucket more than 24 hours of refill into debt"
            }
            TbError::WrongType => c"WRONGTYPE Operation against a key holding the wrong kind of value",
            TbError::NotABucket => {
                c"ERR key is not a valid token bucket (expected a hash with only the fields tokens and ts)"
            }
            TbError::WriteFailed => c"ERR failed to write the token bucket",
            TbError::Gcra(GcraError::MaxBurst) => {
                c"ERR max_burst must be an integer from 0 to 9223372036854775806"
            }
            TbError::Gcra(GcraError::CountPerPeriod) => {
                c"ERR count_per_period must be a positive integer"
            }
            TbError::Gcra(GcraError::Period) => {
                c"ERR period must be a positive integer (seconds)"
            }
            TbError::Gcra(GcraError::Quantity) => c"ERR quantity must be a non-negative integer",
            TbError::Gcra(GcraError::IntervalUnderOneNs) => {
                c"ERR count_per_period / period must be at most 1000000000 a second (requests at least 1 ns apart)"
            }
            TbError::Gcra(GcraError::ToleranceTooLong) => {
                c"ERR (max_burst + 1) * period / count_per_period must be under 2^63 ns (about 292 years)"
            }
            TbError::Gcra(GcraError::TatOutOfRange) => {
                c"ERR the key's theoretical arrival time would pass 2^63 ns since the epoch (the year 2262)"
            }
            TbError::NotAThrottleState => {
                c"ERR key does not hold a CL.THROTTLE state (expected a string of decimal nanoseconds since the epoch)"
            }
            // Redis's own reply to a `deny-oom` command, word for word, so that clients treat both alike.
            TbError::OutOfMemory => c"OOM command not allowed when used memory > 'maxmemory'.",
            TbError::ScriptOnLegacyServer => {
                c"ERR TB commands are refused inside scripts on Redis before 7.0: there a script (redis.set_repl, or lua-replicate-commands no) can keep their writes from replicas and the AOF. Call them outside the script (MULTI/EXEC is fine), or upgrade to Redis 7.0 or later"
            }
        }
    }
}

impl From<GcraError> for TbError {
    fn from(error: GcraError) -> TbError {
        TbError::Gcra(error)
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
const REPLICATED_COMMANDS: [&CStr; 3] = [c"HSET", c"PEXPIREAT", c"DEL"];
/// The native command `CL.THROTTLE`'s writes are replicated as, checked likewise when it is registered.
const THROTTLE_REPLICATED_COMMAND: &CStr = c"SET";

/// The module argument that leaves `CL.THROTTLE` out (`cl-throttle no`), for a server that loads redis-cell too.
const CL_THROTTLE_ARG: &str = "cl-throttle";

/// What the module's load arguments ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LoadOptions {
    /// Register `CL.THROTTLE` (the default; `cl-throttle no` leaves it to another module).
    cl_throttle: bool,
}

/// Parses the load arguments: nothing, or `cl-throttle yes|no` (case-insensitive). The error is the log line.
fn parse_load_args(args: &[String]) -> Result<LoadOptions, String> {
    let mut options = LoadOptions { cl_throttle: true };
    let mut rest = args;
    while let [name, tail @ ..] = rest {
        if !name.eq_ignore_ascii_case(CL_THROTTLE_ARG) {
            return Err(format!(
                "redis-tb: refusing to load: unknown module argument '{name}' (the only one is `{CL_THROTTLE_ARG} yes|no`)"
            ));
        }
        let value = tail.first().map(String::as_str);
        options.cl_throttle = match value.map(str::to_ascii_lowercase).as_deref() {
            Some("yes") => true,
            Some("no") => false,
            _ => {
                return Err(format!(
                    "redis-tb: refusing to load: `{CL_THROTTLE_ARG}` takes yes or no, got {}",
                    value.map_or("nothing".to_string(), |value| format!("'{value}'"))
                ))
            }
        };
        rest = tail.get(1..).unwrap_or_default();
    }
    Ok(options)
}

/// The module's own ACL category, on servers that let modules add one.
const ACL_CATEGORY: &CStr = c"ratelimit";

/// Checks that the server can replicate what the module writes, then registers every command with its docs and
/// ACL categories. Every server feature is detected by the presence of its API, not by version number; a missing
/// one is logged once and skipped. The one exception, a behaviour rather than an API, is [`SCRIPTS_MAY_DROP_WRITES`].
pub fn register(ctx: &Context, args: &[RedisString]) -> Status {
    let given: Vec<String> = args.iter().map(RedisString::to_string_lossy).collect();
    let options = match parse_load_args(&given) {
        Ok(options) => options,
        Err(message) => {
            ctx.log_warning(&message);
            return Status::Err;
        }
    };
    let throttle_needs = options.cl_throttle.then_some(THROTTLE_REPLICATED_COMMAND);
    for name in REPLICATED_COMMANDS.into_iter().chain(throttle_needs) {
        if !server::command_exists(ctx, name) {
            ctx.log_warning(&format!(
                "redis-tb: refusing to load: the command {} is renamed or disabled (rename-command), and the module replicates its writes as that command",
                name.to_string_lossy()
            ));
            return Status::Err;
        }
    }
    let legacy_scripts = server::server_version().is_none_or(|version| version < (7, 0, 0));
    SCRIPTS_MAY_DROP_WRITES.store(legacy_scripts, Ordering::Relaxed);
    server::signal_only_modified_keys(ctx);
    // Added now, while loading: AddACLCategory is refused afterwards.
    let categories = match server::add_acl_category(ctx, ACL_CATEGORY) {
        Support::Done => c"write fast ratelimit",
        Support::Unsupported | Support::Failed => c"write fast",
    };
    // First, so that a name taken by another module (redis-cell) fails the load before anything else is set up.
    let throttle = if options.cl_throttle {
        let registered = register_one::<Throttled>(
            ctx,
            THROTTLE_NAME,
            THROTTLE_FLAGS,
            &THROTTLE_DOCS,
            categories,
        );
        if registered.is_err() {
            ctx.log_warning("redis-tb: refusing to load: could not register CL.THROTTLE, most likely because another module (redis-cell) already did. Load redis-tb with the module argument `cl-throttle no` to leave CL.THROTTLE to that module, or load redis-tb alone");
            return Status::Err;
        }
        registered
    } else {
        Ok((Support::Done, Support::Done))
    };
    let registered = [
        throttle,
        register_one::<Acquire>(ctx, ACQUIRE_NAME, ACQUIRE_FLAGS, &ACQUIRE_DOCS, categories),
        register_one::<AcquireAll>(
            ctx,
            ACQUIRE_ALL_NAME,
            ACQUIRE_ALL_FLAGS,
            &ACQUIRE_ALL_DOCS,
            categories,
        ),
        register_one::<Reserve>(ctx, RESERVE_NAME, RESERVE_FLAGS, &RESERVE_DOCS, categories),
        register_one::<Refund>(ctx, REFUND_NAME, REFUND_FLAGS, &REFUND_DOCS, categories),
        register_one::<AcquireEach>(
            ctx,
            ACQUIRE_EACH_NAME,
            ACQUIRE_EACH_FLAGS,
            &ACQUIRE_EACH_DOCS,
            categories,
        ),
        register_one::<AcquireAtMost>(
            ctx,
            ACQUIRE_AT_MOST_NAME,
            ACQUIRE_AT_MOST_FLAGS,
            &ACQUIRE_AT_MOST_DOCS,
            categories,
        ),
        register_one::<Charge>(ctx, CHARGE_NAME, CHARGE_FLAGS, &CHARGE_DOCS, categories),
        register_one::<Block>(ctx, BLOCK_NAME, BLOCK_FLAGS, &BLOCK_DOCS, categories),
        register_one::<Lower>(ctx, LOWER_NAME, LOWER_FLAGS, &LOWER_DOCS, categories),
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
    if legacy_scripts {
        ctx.log_notice("redis-tb: scripts on this server (Redis < 7.0) can keep a module's writes from replicas and the AOF: the commands are refused inside scripts");
    }
    if !server::has_abs_expire() {
        ctx.log_notice("redis-tb: this server has no RedisModule_SetAbsExpire (Redis < 7.0): expiries are set relative to now; replicas and the AOF still get the absolute PEXPIREAT");
    }
    // Last, after everything that can fail: a server that refuses the load unmaps the library but keeps event
    // subscriptions, and would call into unmapped code at SHUTDOWN.
    if server::on_shutdown::<AllowUnloadAtShutdown>(ctx) == Support::Failed {
        ctx.log_warning("redis-tb: could not subscribe to the shutdown event");
    }
    Status::Ok
}

/// Refuses `MODULE UNLOAD`. A server runs a command queued in a `MULTI` before the unload, or a blocked one, with
/// a pointer into the unloaded library and crashes (Redis 7.0, 8.2 and Valkey 9 alike); on servers with module ACL
/// categories an unload and reload also leaves `@ratelimit` empty. Upgrade by restarting the server, or by a
/// failover to a replica started with the new build.
///
/// At shutdown no command can run any more, so a server that unloads its modules on the way out (Valkey) may:
/// refusing there would only log a failure.
pub fn refuse_unload(ctx: &Context) -> Status {
    if SHUTTING_DOWN.load(Ordering::Relaxed) {
        return Status::Ok;
    }
    ctx.log_warning("redis-tb cannot be unloaded: a transaction or script that queued a TB command would crash the server. Restart the server (or fail over to an upgraded replica) to upgrade the module");
    Status::Err
}

/// Set once the server has begun to shut down.
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// Lets [`refuse_unload`] allow the unload at shutdown.
struct AllowUnloadAtShutdown;

impl ShutdownHook for AllowUnloadAtShutdown {
    fn on_shutdown() {
        SHUTTING_DOWN.store(true, Ordering::Relaxed);
    }
}

/// Whether scripts on this server can keep the module's writes from replicas and the AOF (Redis before 7.0), set
/// once at load.
///
/// On 6.2 a script's `redis.set_repl()` (anything but `REPL_ALL`) filters what a module command replicates, and
/// with `lua-replicate-commands no` the script's effects are not replicated at all: the `EVAL` is, and a replica
/// or AOF loader re-runs it with its own clock, or fails where it lacks the module (`luaRedisGenericCommand` and
/// `call()` in 6.2's scripting.c and server.c). Neither setting is visible to a module (`RM_GetContextFlags` says
/// only that a script is running), so the one rule that keeps replicas and the AOF equal to the primary is to
/// refuse every call from a script there. Redis 7.0 replicates a script's effects always and lets no script
/// filter a module's. This is told by version, not by an API's presence, because it is a behaviour.
static SCRIPTS_MAY_DROP_WRITES: AtomicBool = AtomicBool::new(false);

/// Every command as registered: refused inside a script where [`SCRIPTS_MAY_DROP_WRITES`], before it reads or
/// changes anything; otherwise `C` itself. Applied by [`register_one`], so no command can miss it.
struct ScriptGuarded<C>(PhantomData<C>);

impl<C: Command> Command for ScriptGuarded<C> {
    fn run(call: &Call<'_>) {
        // The flag first: on 7.0+ the context flags are never read.
        if SCRIPTS_MAY_DROP_WRITES.load(Ordering::Relaxed) && call.in_script() {
            reply_error(call, TbError::ScriptOnLegacyServer);
        } else {
            C::run(call);
        }
    }
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
    if server::create_command::<ScriptGuarded<C>>(
        ctx,
        name,
        flags,
        docs.first_key,
        last_key,
        docs.key_step,
    ) == Status::Err
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

/// Counts a call in `INFO tb` as `tally` and sends its integers.
fn reply_counted(call: &Call<'_>, tally: Tally, fields: &[i64]) {
    stats::record(tally);
    call.reply_integers(fields);
}

/// Counts a refused call in `INFO tb` and sends its error.
fn reply_error(call: &Call<'_>, error: TbError) {
    stats::record(Tally::Error);
    call.reply_error(error.wire_text());
}

#[cfg(test)]
mod tests {
    use super::*;
    use acquire::{ACQUIRE_ALL_ARITY_ERROR, ACQUIRE_ALL_TOO_MANY_ERROR, ACQUIRE_ARITY_ERROR};
    use charge::{BLOCK_ARITY_ERROR, CHARGE_ARITY_ERROR, LOWER_ARITY_ERROR};
    use each::{
        ACQUIRE_AT_MOST_ARITY_ERROR, ACQUIRE_EACH_ARITY_ERROR, ACQUIRE_EACH_TOO_MANY_ERROR,
    };
    use reserve::{REFUND_ARITY_ERROR, RESERVE_ARITY_ERROR};
    use throttle::THROTTLE_ARITY_ERROR;

    fn load(args: &[&str]) -> Result<LoadOptions, String> {
        parse_load_args(&args.iter().map(|arg| arg.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn load_arguments_switch_cl_throttle() {
        assert_eq!(load(&[]), Ok(LoadOptions { cl_throttle: true }));
        assert_eq!(
            load(&["cl-throttle", "no"]),
            Ok(LoadOptions { cl_throttle: false })
        );
        assert_eq!(
            load(&["CL-THROTTLE", "No"]),
            Ok(LoadOptions { cl_throttle: false })
        );
        assert_eq!(
            load(&["cl-throttle", "yes"]),
            Ok(LoadOptions { cl_throttle: true })
        );
        assert_eq!(
            load(&["cl-throttle", "no", "cl-throttle", "yes"]),
            Ok(LoadOptions { cl_throttle: true })
        );
        let error = load(&["cl-throttle"]).expect_err("no value");
        assert!(error.contains("takes yes or no, got nothing"), "{error}");
        let error = load(&["cl-throttle", "off"]).expect_err("bad value");
        assert!(error.contains("got 'off'"), "{error}");
        let error = load(&["bogus"]).expect_err("unknown");
        assert!(error.contains("unknown module argument 'bogus'"), "{error}");
    }

    #[test]
    fn error_texts_carry_a_redis_prefix() {
        let all = [
            TbError::WrongArity(ACQUIRE_ARITY_ERROR),
            TbError::WrongArity(ACQUIRE_ALL_ARITY_ERROR),
            TbError::WrongArity(RESERVE_ARITY_ERROR),
            TbError::WrongArity(REFUND_ARITY_ERROR),
            TbError::WrongArity(ACQUIRE_EACH_ARITY_ERROR),
            TbError::WrongArity(ACQUIRE_AT_MOST_ARITY_ERROR),
            TbError::DuplicateKey,
            TbError::TooManyBuckets(ACQUIRE_ALL_TOO_MANY_ERROR),
            TbError::TooManyBuckets(ACQUIRE_EACH_TOO_MANY_ERROR),
            TbError::Param(ParamError::Rate),
            TbError::Param(ParamError::Burst),
            TbError::Param(ParamError::Cost),
            TbError::Param(ParamError::MaxWait),
            TbError::Param(ParamError::Amount),
            TbError::Param(ParamError::AtMost),
            TbError::Param(ParamError::BlockMs),
            TbError::DebtBeyondLimit,
            TbError::WrongArity(CHARGE_ARITY_ERROR),
            TbError::WrongArity(BLOCK_ARITY_ERROR),
            TbError::WrongArity(LOWER_ARITY_ERROR),
            TbError::Param(ParamError::Floor),
            TbError::WrongType,
            TbError::NotABucket,
            TbError::WriteFailed,
            TbError::ScriptOnLegacyServer,
            TbError::WrongArity(THROTTLE_ARITY_ERROR),
            TbError::NotAThrottleState,
            TbError::Gcra(GcraError::MaxBurst),
            TbError::Gcra(GcraError::CountPerPeriod),
            TbError::Gcra(GcraError::Period),
            TbError::Gcra(GcraError::Quantity),
            TbError::Gcra(GcraError::IntervalUnderOneNs),
            TbError::Gcra(GcraError::ToleranceTooLong),
            TbError::Gcra(GcraError::TatOutOfRange),
            TbError::OutOfMemory,
        ];
        for error in all {
            let text = error.wire_text().to_str().expect("ascii");
            assert!(
                text.starts_with("ERR ")
                    || text.starts_with("WRONGTYPE ")
                    || text.starts_with("OOM "),
                "{text}"
            );
        }
    }
}
