//! `CL.THROTTLE`: redis-cell's command, reply for reply, over the same keys, on the pure core in `gcra`.
//!
//! Where it differs from redis-cell, it does so on purpose: negative arguments and arithmetic that overflows are
//! errors (redis-cell accepts them, with undefined results, or crashes the server); a key that holds no decimal TAT
//! is an error (redis-cell panics); a key of another type is `WRONGTYPE`; and the write is replicated as its
//! effect, `SET key tat PXAT ms`, so a replica or AOF without any module holds the same value and expiry (redis-cell
//! replicates the command, which a replica then runs on its own clock).
#![forbid(unsafe_code)]

use std::ffi::CStr;

use crate::gcra::{self, GcraError, Limit, Quantity, TatWrite, Throttle};
use crate::number;
use crate::server::{self, ArgKind, Call, Command, CommandDocs, EventClass, Key, KeyKind};
use crate::stats::Tally;

use super::state::memory_for_writes;
use super::{arg, reply_counted, reply_error, TbError};

/// The command's name as registered: redis-cell's.
pub const THROTTLE_NAME: &CStr = c"cl.throttle";
/// It writes and is O(1). Not `deny-oom`, as no command of the module is: above `maxmemory` a call that would
/// store a TAT is refused with Redis's OOM reply and changes nothing, a limited call is answered as redis-cell
/// answers it, and a peek (quantity 0) is answered without its write (it would store the same TAT, or one not
/// ahead, which counts as none).
pub const THROTTLE_FLAGS: &CStr = c"write fast";
pub const THROTTLE_DOCS: CommandDocs = CommandDocs {
    summary: c"Rate limits the key with GCRA on the server clock, as redis-cell's CL.THROTTLE: limited, limit, remaining, retry_after and reset_after in seconds.",
    complexity: c"O(1)",
    since: c"0.5.0",
    // The name, key, max_burst, count_per_period, period and an optional quantity.
    arity: -5,
    first_key: 1,
    last_key: 0,
    key_step: 1,
    args: &[
        arg(c"key", ArgKind::Key, false),
        arg(c"max_burst", ArgKind::Integer, false),
        arg(c"count_per_period", ArgKind::Integer, false),
        arg(c"period", ArgKind::Integer, false),
        arg(c"quantity", ArgKind::Integer, true),
    ],
};
pub(super) const THROTTLE_ARITY_ERROR: &CStr =
    c"ERR wrong number of arguments for 'cl.throttle' command";

/// Keyspace events of a write: those of the `SET ... PXAT` it replicates as.
const EVENT_SET: &CStr = c"set";
const EVENT_EXPIRE: &CStr = c"expire";

/// `CL.THROTTLE key max_burst count_per_period period [quantity]`.
pub struct Throttled;

impl Command for Throttled {
    fn run(call: &Call<'_>) {
        match throttle(call) {
            Ok((decision, quantity)) => {
                reply_counted(call, tally(&decision, quantity), &decision.reply())
            }
            Err(error) => reply_error(call, error),
        }
    }
}

fn tally(decision: &Throttle, quantity: Quantity) -> Tally {
    match (decision.limited, decision.exceeds_limit, quantity.get()) {
        (true, true, _) => Tally::Impossible,
        (true, false, _) => Tally::Denied,
        (false, _, 0) => Tally::Peek,
        // Counted in requests, as a quantity is; exact below 2^53.
        (false, _, quantity) => Tally::Granted {
            tokens: quantity as f64,
        },
    }
}

fn throttle(call: &Call<'_>) -> Result<(Throttle, Quantity), TbError> {
    if !(5..=6).contains(&call.arg_count()) {
        return Err(TbError::WrongArity(THROTTLE_ARITY_ERROR));
    }
    let max_burst = parse_integer(call, 2, GcraError::MaxBurst)?;
    let count_per_period = parse_integer(call, 3, GcraError::CountPerPeriod)?;
    let period_s = parse_integer(call, 4, GcraError::Period)?;
    let quantity = match call.arg(5) {
        Some(_) => Quantity::new(parse_integer(call, 5, GcraError::Quantity)?)?,
        None => Quantity::new(1)?,
    };
    let limit = Limit::new(max_burst, count_per_period, period_s)?;
    let key = call.open_key(1).ok_or(TbError::WriteFailed)?;
    let stored_tat_ns = read_tat(&key)?;
    let decision = gcra::throttle(stored_tat_ns, server::now_ns(), &limit, quantity)?;
    if let Some(write) = &decision.write {
        if quantity.get() > 0 {
            memory_for_writes(call, true)?;
            write_tat(call, &key, write)?;
        } else if !call.out_of_memory() {
            // A peek stores the TAT it found, or now (no more than a missing key): above maxmemory it is answered
            // without that write.
            write_tat(call, &key, write)?;
        }
    }
    Ok((decision, quantity))
}

/// The integer argument at `index`; `error` names it when it is missing or not an integer.
fn parse_integer(call: &Call<'_>, index: usize, error: GcraError) -> Result<i64, TbError> {
    call.arg(index)
        .and_then(number::parse_i64)
        .ok_or(TbError::Gcra(error))
}

/// The stored TAT: `None` for a missing key, the decimal ns of a string key.
fn read_tat(key: &Key<'_>) -> Result<Option<i64>, TbError> {
    match key.kind() {
        KeyKind::Empty => Ok(None),
        KeyKind::String => key
            .string_get(number::parse_i64)
            .flatten()
            .map(Some)
            .ok_or(TbError::NotAThrottleState),
        KeyKind::Hash | KeyKind::Other => Err(TbError::WrongType),
    }
}

/// Stores the new TAT with its absolute expiry, replicates exactly that as one `SET key tat PXAT ms` (the same
/// bytes as the value written), and fires the events `SET ... PXAT` fires.
///
/// Nothing here can fail after the write for a reason we could have checked first: the key holds a string or
/// nothing, and the module refused to load where `SET` is renamed (see `REPLICATED_COMMANDS`).
fn write_tat(call: &Call<'_>, key: &Key<'_>, write: &TatWrite) -> Result<(), TbError> {
    let mut text = itoa::Buffer::new();
    let tat = text.format(write.tat_ns).as_bytes();
    key.string_set(tat)
        .and_then(|()| key.set_expire_at(write.expire_at_ms))
        .and_then(|()| call.replicate_set_pxat(key, tat, write.expire_at_ms))
        .map_err(|()| TbError::WriteFailed)?;
    call.notify(EventClass::String, EVENT_SET, key);
    call.notify(EventClass::Generic, EVENT_EXPIRE, key);
    Ok(())
}
