//! `TB.ACQUIREEACH` (several buckets, each with its own cost, all or nothing, a result per bucket) and
//! `TB.ACQUIREATMOST` (take up to `max` whole tokens). Same state, expiry window, replication and errors as
//! `TB.ACQUIRE` and `TB.ACQUIREALL`.
#![forbid(unsafe_code)]

use std::ffi::CStr;

use crate::bucket::{self, AtMost, Each, Member, ParamError, Partial};
use crate::number;
use crate::server::{self, ArgDoc, ArgKind, Call, Command, CommandDocs};
use crate::stats::{self, Tally};

use super::acquire::{has_duplicate, ACQUIRE_FLAGS, MAX_BUCKETS};
use super::args::{parse_cost, parse_params};
use super::state::OpenBucket;
use super::{arg, one_bucket_args, one_bucket_docs, reply_counted, reply_error, TbError};

/// The per-bucket-cost command's name as registered.
pub const ACQUIRE_EACH_NAME: &CStr = c"tb.acquireeach";
/// Same flags as `TB.ACQUIREALL`: O(N) in a number of buckets capped at 1,000, so still `fast`.
pub const ACQUIRE_EACH_FLAGS: &CStr = ACQUIRE_FLAGS;
pub const ACQUIRE_EACH_DOCS: CommandDocs = CommandDocs {
    summary: c"Takes each listed token bucket's own cost if every bucket holds it, else takes nothing; replies per bucket.",
    complexity: c"O(N) where N is the number of buckets",
    since: c"0.3.0",
    arity: -5,
    first_key: 1,
    last_key: -1,
    key_step: 4,
    args: &[ArgDoc {
        name: c"bucket",
        kind: ArgKind::Block,
        optional: false,
        multiple: true,
        subargs: &one_bucket_args(arg(c"cost", ArgKind::Double, false)),
    }],
};
pub(super) const ACQUIRE_EACH_ARITY_ERROR: &CStr =
    c"ERR wrong number of arguments for 'tb.acquireeach' command";
pub(super) const ACQUIRE_EACH_TOO_MANY_ERROR: &CStr =
    c"ERR too many buckets: TB.ACQUIREEACH takes at most 1000";

/// The partial-grant command's name as registered.
pub const ACQUIRE_AT_MOST_NAME: &CStr = c"tb.acquireatmost";
/// Same flags as `TB.ACQUIRE`.
pub const ACQUIRE_AT_MOST_FLAGS: &CStr = ACQUIRE_FLAGS;
pub const ACQUIRE_AT_MOST_DOCS: CommandDocs = one_bucket_docs(
    c"Takes as many whole tokens as the token bucket at key holds now, up to max.",
    c"0.3.0",
    &one_bucket_args(arg(c"max", ArgKind::Integer, false)),
    false,
);
pub(super) const ACQUIRE_AT_MOST_ARITY_ERROR: &CStr =
    c"ERR wrong number of arguments for 'tb.acquireatmost' command";

/// `TB.ACQUIREEACH key rate burst cost [key rate burst cost ...]`.
pub struct AcquireEach;

impl Command for AcquireEach {
    fn run(call: &Call<'_>) {
        match acquire_each(call) {
            Ok((each, tally)) => reply_each(call, &each, tally),
            Err(error) => reply_error(call, error),
        }
    }
}

/// Sends `[allowed, limiting_index, [fits, remaining, retry_after_ms, reset_after_ms] ...]`, counted as `tally`.
fn reply_each(call: &Call<'_>, each: &Each, tally: Tally) {
    stats::record(tally);
    call.reply_integers_and_rows(
        &[
            i64::from(each.allowed()),
            i64::try_from(each.limiting_index).unwrap_or(i64::MAX),
        ],
        each.buckets.iter().map(|decision| {
            [
                i64::from(decision.allowed()),
                decision.remaining,
                decision.retry_after_ms,
                decision.reset_after_ms,
            ]
        }),
    );
}

/// Arguments per bucket in `TB.ACQUIREEACH`: key, rate, burst, cost.
const EACH_BUCKET_ARGS: usize = 4;
/// Index of the first bucket's key (right after the name).
const EACH_FIRST_BUCKET_ARG: usize = 1;

fn acquire_each(call: &Call<'_>) -> Result<(Each, Tally), TbError> {
    let argc = call.arg_count();
    if argc <= EACH_FIRST_BUCKET_ARG
        || !(argc - EACH_FIRST_BUCKET_ARG).is_multiple_of(EACH_BUCKET_ARGS)
    {
        return Err(TbError::WrongArity(ACQUIRE_EACH_ARITY_ERROR));
    }
    if (argc - EACH_FIRST_BUCKET_ARG) / EACH_BUCKET_ARGS > MAX_BUCKETS {
        return Err(TbError::TooManyBuckets(ACQUIRE_EACH_TOO_MANY_ERROR));
    }
    let key_indexes: Vec<usize> = (EACH_FIRST_BUCKET_ARG..argc)
        .step_by(EACH_BUCKET_ARGS)
        .collect();
    // Arguments in the order given, so the first bad one is the one reported.
    let shapes = key_indexes
        .iter()
        .map(|&key_index| {
            let params = parse_params(call, key_index + 1)?;
            let cost = parse_cost(call.arg(key_index + 3).unwrap_or_default())?;
            Ok((params, cost))
        })
        .collect::<Result<Vec<_>, TbError>>()?;
    if has_duplicate(key_indexes.iter().map(|&key_index| call.arg(key_index))) {
        return Err(TbError::DuplicateKey);
    }
    let opened = OpenBucket::open_all(call, &key_indexes)?;
    let members: Vec<Member> = opened
        .iter()
        .zip(shapes)
        .map(|(bucket, (params, cost))| Member {
            stored: bucket.stored,
            params,
            cost,
        })
        .collect();
    let each = bucket::acquire_each(&members, server::now_us());
    // Every key was read and checked above, so the writes cannot fail half-way for a reason we could have caught
    // first; they reach replicas and the AOF inside the one MULTI/EXEC of this command.
    OpenBucket::write_each(
        call,
        opened
            .iter()
            .zip(each.buckets.iter().map(|decision| decision.write.as_ref())),
    )?;
    let tally = Tally::of(each.outcome, each.largest_cost_taken(&members));
    Ok((each, tally))
}

/// `TB.ACQUIREATMOST key rate burst max`.
pub struct AcquireAtMost;

impl Command for AcquireAtMost {
    fn run(call: &Call<'_>) {
        match acquire_at_most(call) {
            Ok(partial) => reply_counted(
                call,
                // A partial grant counts as allowed, with the tokens it took.
                Tally::of(partial.outcome(), granted_tokens(&partial)),
                &[
                    partial.granted,
                    partial.remaining,
                    partial.retry_after_ms,
                    partial.reset_after_ms,
                ],
            ),
            Err(error) => reply_error(call, error),
        }
    }
}

/// The tokens a partial grant took: exact, since a grant never exceeds 2^53.
fn granted_tokens(partial: &Partial) -> f64 {
    partial.granted as f64
}

fn acquire_at_most(call: &Call<'_>) -> Result<Partial, TbError> {
    if call.arg_count() != 5 {
        return Err(TbError::WrongArity(ACQUIRE_AT_MOST_ARITY_ERROR));
    }
    let params = parse_params(call, 2)?;
    let max = call
        .arg(4)
        .and_then(number::parse_i64)
        .ok_or(ParamError::AtMost)
        .and_then(AtMost::new)?;
    let opened = OpenBucket::open(call, 1)?;
    let partial = bucket::acquire_at_most(opened.stored, server::now_us(), &params, max);
    opened.write(call, partial.write.as_ref())?;
    Ok(partial)
}
