//! `TB.RESERVE` and `TB.REFUND`: pacing callers that can wait, and giving back tokens for work that did not
//! happen. Same arguments, state, expiry window and replication as `TB.ACQUIRE`.
#![forbid(unsafe_code)]

use std::ffi::CStr;

use crate::bucket::{self, Amount, KeyChange, MaxWait, Outcome, ParamError, Reservation};
use crate::number;
use crate::server::{self, ArgKind, Call, Command, CommandDocs};
use crate::stats::Tally;

use super::args::{parse_cost, parse_params};
use super::state::OpenBucket;
use super::{arg, one_bucket_args, one_bucket_docs, reply_counted, reply_error, TbError};

/// The reserving command's name as registered.
pub const RESERVE_NAME: &CStr = c"tb.reserve";
/// Like `TB.ACQUIRE`: it writes (refused above `maxmemory`, as every call that writes is) and is O(1).
pub const RESERVE_FLAGS: &CStr = c"write fast";
pub const RESERVE_DOCS: CommandDocs = CommandDocs {
    summary: c"Takes cost tokens from the token bucket at key now, for the caller to act after a wait of at most max_wait_ms.",
    complexity: c"O(1)",
    since: c"0.2.0",
    arity: 6,
    first_key: 1,
    last_key: 0,
    key_step: 1,
    args: &[
        arg(c"key", ArgKind::Key, false),
        arg(c"rate", ArgKind::Double, false),
        arg(c"burst", ArgKind::Double, false),
        arg(c"cost", ArgKind::Double, false),
        arg(c"max_wait_ms", ArgKind::Integer, false),
    ],
};
pub(super) const RESERVE_ARITY_ERROR: &CStr =
    c"ERR wrong number of arguments for 'tb.reserve' command";

/// The refunding command's name as registered.
pub const REFUND_NAME: &CStr = c"tb.refund";
/// Not `deny-oom`, as no command is, and unlike the others performed above `maxmemory` too: a refund rewrites two
/// fields of an existing hash (at most a few bytes more, when an integral token count becomes a fraction) or
/// deletes it, and a limiter that cannot give tokens back while memory is full would over-count.
pub const REFUND_FLAGS: &CStr = c"write fast";
pub const REFUND_DOCS: CommandDocs = one_bucket_docs(
    c"Gives amount tokens back to the token bucket at key, up to its burst, unless it is in debt.",
    c"0.2.0",
    &one_bucket_args(arg(c"amount", ArgKind::Double, false)),
    false,
);
pub(super) const REFUND_ARITY_ERROR: &CStr =
    c"ERR wrong number of arguments for 'tb.refund' command";

/// `TB.RESERVE key rate burst cost max_wait_ms`.
pub struct Reserve;

impl Command for Reserve {
    fn run(call: &Call<'_>) {
        match reserve(call) {
            Ok((reservation, tally)) => reply_counted(
                call,
                tally,
                &[
                    i64::from(reservation.granted()),
                    reservation.wait_ms,
                    reservation.remaining,
                    reservation.reset_after_ms,
                ],
            ),
            Err(error) => reply_error(call, error),
        }
    }
}

fn reserve(call: &Call<'_>) -> Result<(Reservation, Tally), TbError> {
    if call.arg_count() != 6 {
        return Err(TbError::WrongArity(RESERVE_ARITY_ERROR));
    }
    let params = parse_params(call, 2)?;
    let cost = parse_cost(call.arg(4).unwrap_or_default())?;
    let max_wait = call
        .arg(5)
        .and_then(number::parse_i64)
        .ok_or(ParamError::MaxWait)
        .and_then(MaxWait::new)?;
    let opened = OpenBucket::open(call, 1)?;
    let reservation = bucket::reserve(opened.stored, server::now_us(), &params, cost, max_wait);
    opened.write(call, reservation.write.as_ref())?;
    let tally = match reservation.outcome {
        Outcome::Allowed if reservation.wait_ms > 0 => Tally::GrantedWithWait {
            tokens: cost.tokens(),
        },
        outcome => Tally::of(outcome, cost.tokens()),
    };
    Ok((reservation, tally))
}

/// `TB.REFUND key rate burst amount`.
pub struct Refund;

impl Command for Refund {
    fn run(call: &Call<'_>) {
        match refund(call) {
            Ok(refund) => reply_counted(
                call,
                if refund.refunded {
                    Tally::Refunded {
                        tokens: refund.tokens_refunded,
                    }
                } else {
                    Tally::NotRefunded
                },
                &[
                    i64::from(refund.refunded),
                    refund.remaining,
                    refund.reset_after_ms,
                ],
            ),
            Err(error) => reply_error(call, error),
        }
    }
}

fn refund(call: &Call<'_>) -> Result<bucket::Refund, TbError> {
    if call.arg_count() != 5 {
        return Err(TbError::WrongArity(REFUND_ARITY_ERROR));
    }
    let params = parse_params(call, 2)?;
    let amount = call
        .arg(4)
        .and_then(number::parse_f64)
        .ok_or(ParamError::Amount)
        .and_then(Amount::new)?;
    let opened = OpenBucket::open(call, 1)?;
    let refund = bucket::refund(opened.stored, server::now_us(), &params, amount);
    match refund.change {
        KeyChange::Keep => {}
        KeyChange::Write(write) => opened.write_at_any_memory(call, Some(&write))?,
        KeyChange::Delete => opened.delete(call)?,
    }
    Ok(refund)
}
