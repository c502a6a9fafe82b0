//! `TB.CHARGE`, `TB.BLOCK` and `TB.LOWER`: take tokens whether or not the bucket holds them (a penalty, a cost
//! known only after the response), shut a key out for a while, and bring a bucket down to a level the caller's own
//! history allows (a client's charge-back after it decided calls in memory). Same arguments, state, expiry window
//! and replication as `TB.ACQUIRE`; each may leave the bucket in debt as a granted `TB.RESERVE` does, so every
//! other command treats the result as it treats a reservation's debt.
#![forbid(unsafe_code)]

use std::ffi::CStr;

use crate::bucket::{self, BlockMs, Charge as Charged, DebtBeyondLimit, ParamError};
use crate::number;
use crate::server::{self, ArgKind, Call, Command, CommandDocs};
use crate::stats::Tally;

use super::args::{parse_cost, parse_floor, parse_params};
use super::state::OpenBucket;
use super::{arg, one_bucket_args, one_bucket_docs, reply_counted, reply_error, TbError};

/// The charging command's name as registered.
pub const CHARGE_NAME: &CStr = c"tb.charge";
/// Like `TB.ACQUIRE`: it writes (refused above `maxmemory`, as every call that writes is) and is O(1).
pub const CHARGE_FLAGS: &CStr = c"write fast";
pub const CHARGE_DOCS: CommandDocs = one_bucket_docs(
    c"Takes cost tokens from the token bucket at key even when it does not hold them, leaving it in debt.",
    c"0.3.0",
    &one_bucket_args(arg(c"cost", ArgKind::Double, false)),
    false,
);
pub(super) const CHARGE_ARITY_ERROR: &CStr =
    c"ERR wrong number of arguments for 'tb.charge' command";

/// The blocking command's name as registered.
pub const BLOCK_NAME: &CStr = c"tb.block";
/// Same flags as `TB.CHARGE`.
pub const BLOCK_FLAGS: &CStr = CHARGE_FLAGS;
pub const BLOCK_DOCS: CommandDocs = one_bucket_docs(
    c"Denies every call with a cost above 0 on the token bucket at key for ms milliseconds; it then refills from empty.",
    c"0.3.0",
    &one_bucket_args(arg(c"ms", ArgKind::Integer, false)),
    false,
);
pub(super) const BLOCK_ARITY_ERROR: &CStr = c"ERR wrong number of arguments for 'tb.block' command";

/// The lowering command's name as registered.
pub const LOWER_NAME: &CStr = c"tb.lower";
/// Same flags as `TB.CHARGE`.
pub const LOWER_FLAGS: &CStr = CHARGE_FLAGS;
pub const LOWER_DOCS: CommandDocs = one_bucket_docs(
    c"Brings the token bucket at key down to tokens if it holds more, refilled to now; never raises it. Idempotent.",
    c"0.5.0",
    &one_bucket_args(arg(c"tokens", ArgKind::Double, false)),
    false,
);
pub(super) const LOWER_ARITY_ERROR: &CStr = c"ERR wrong number of arguments for 'tb.lower' command";

/// The three integers all three commands reply with.
fn reply_fields(charged: &Charged) -> [i64; 3] {
    [
        charged.remaining,
        charged.retry_after_ms,
        charged.reset_after_ms,
    ]
}

/// `TB.CHARGE key rate burst cost`.
pub struct Charge;

impl Command for Charge {
    fn run(call: &Call<'_>) {
        match charge(call) {
            Ok((charged, tokens)) => {
                let tally = if tokens == 0.0 {
                    Tally::Peek
                } else {
                    Tally::Charged { tokens }
                };
                reply_counted(call, tally, &reply_fields(&charged));
            }
            Err(error) => reply_error(call, error),
        }
    }
}

/// Runs a charge; returns the answer and the tokens it took.
fn charge(call: &Call<'_>) -> Result<(Charged, f64), TbError> {
    if call.arg_count() != 5 {
        return Err(TbError::WrongArity(CHARGE_ARITY_ERROR));
    }
    let params = parse_params(call, 2)?;
    let cost = parse_cost(call.arg(4).unwrap_or_default())?;
    let opened = OpenBucket::open(call, 1)?;
    let charged = bucket::charge(opened.stored, server::now_us(), &params, cost)
        .map_err(|DebtBeyondLimit| TbError::DebtBeyondLimit)?;
    opened.write(call, charged.write.as_ref())?;
    Ok((charged, cost.tokens()))
}

/// `TB.BLOCK key rate burst ms`.
pub struct Block;

impl Command for Block {
    fn run(call: &Call<'_>) {
        match block(call) {
            Ok(charged) => reply_counted(call, Tally::Blocked, &reply_fields(&charged)),
            Err(error) => reply_error(call, error),
        }
    }
}

fn block(call: &Call<'_>) -> Result<Charged, TbError> {
    if call.arg_count() != 5 {
        return Err(TbError::WrongArity(BLOCK_ARITY_ERROR));
    }
    let params = parse_params(call, 2)?;
    let duration = call
        .arg(4)
        .and_then(number::parse_i64)
        .ok_or(ParamError::BlockMs)
        .and_then(BlockMs::new)?;
    let opened = OpenBucket::open(call, 1)?;
    let charged = bucket::block(opened.stored, server::now_us(), &params, duration);
    opened.write(call, charged.write.as_ref())?;
    Ok(charged)
}

/// `TB.LOWER key rate burst tokens`.
pub struct Lower;

impl Command for Lower {
    fn run(call: &Call<'_>) {
        match lower(call) {
            Ok(charged) => reply_counted(call, Tally::Lowered, &reply_fields(&charged)),
            Err(error) => reply_error(call, error),
        }
    }
}

fn lower(call: &Call<'_>) -> Result<Charged, TbError> {
    if call.arg_count() != 5 {
        return Err(TbError::WrongArity(LOWER_ARITY_ERROR));
    }
    let params = parse_params(call, 2)?;
    let floor = parse_floor(call.arg(4).unwrap_or_default(), &params)?;
    let opened = OpenBucket::open(call, 1)?;
    let charged = bucket::lower(opened.stored, server::now_us(), &params, floor);
    opened.write(call, charged.write.as_ref())?;
    Ok(charged)
}
