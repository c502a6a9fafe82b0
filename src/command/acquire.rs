//! `TB.ACQUIRE` and `TB.ACQUIREALL`: take tokens now, or not at all.
#![forbid(unsafe_code)]

use std::ffi::CStr;

use crate::bucket::{self, Combined, Cost, Decision, Outcome, Params, State};
use crate::server::{self, ArgDoc, ArgKind, Call, Command, CommandDocs};
use crate::stats::Tally;

use super::args::{parse_cost, parse_params};
use super::state::OpenBucket;
use super::{arg, one_bucket_args, one_bucket_docs, reply_counted, reply_error, TbError};

/// The command's name as registered.
pub const ACQUIRE_NAME: &CStr = c"tb.acquire";
/// Registration flags: it writes and is O(1). Not `deny-oom`, which would have the server refuse every call above
/// `maxmemory`: there a call that would write is refused with Redis's OOM reply and changes nothing, and a
/// refusal or a peek is answered (see `state::memory_for_writes`).
pub const ACQUIRE_FLAGS: &CStr = c"write fast";
/// What `COMMAND DOCS` and `COMMAND INFO` say about it.
pub const ACQUIRE_DOCS: CommandDocs = one_bucket_docs(
    c"Refills the token bucket at key on the server clock and takes cost tokens if it holds them.",
    c"0.1.0",
    &one_bucket_args(arg(c"cost", ArgKind::Double, true)),
    true,
);

pub(super) const ACQUIRE_ARITY_ERROR: &CStr =
    c"ERR wrong number of arguments for 'tb.acquire' command";

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
pub(super) const ACQUIRE_ALL_ARITY_ERROR: &CStr =
    c"ERR wrong number of arguments for 'tb.acquireall' command";
pub(super) const ACQUIRE_ALL_TOO_MANY_ERROR: &CStr =
    c"ERR too many buckets: TB.ACQUIREALL takes at most 1000";

/// `TB.ACQUIRE key rate burst [cost]`.
pub struct Acquire;

impl Command for Acquire {
    fn run(call: &Call<'_>) {
        match acquire(call) {
            Ok((decision, cost)) => reply_counted(
                call,
                Tally::of(decision.outcome, cost.tokens()),
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
    let opened = OpenBucket::open(call, 1)?;
    let decision = bucket::acquire(opened.stored, server::now_us(), &params, cost);
    opened.write(call, decision.write.as_ref())?;
    Ok((decision, cost))
}

/// `TB.ACQUIREALL cost key rate burst [key rate burst ...]`.
pub struct AcquireAll;

impl Command for AcquireAll {
    fn run(call: &Call<'_>) {
        match acquire_all(call) {
            Ok((combined, cost)) => reply_counted(
                call,
                Tally::of(combined.outcome, cost.tokens()),
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
/// Most buckets one `TB.ACQUIREALL` (or `TB.ACQUIREEACH`) may name. A call costs about 1.5 µs of server time per bucket, and no call may
/// hold the server for more than a few milliseconds: 1,000 buckets take about 1.5 ms. (Without a cap, one call
/// naming 30,000 buckets held every other client for 45 ms.) The error text says the number: keep them in step.
pub(super) const MAX_BUCKETS: usize = 1_000;
/// Index of the first bucket's key in `TB.ACQUIREALL` (after the name and the cost).
const FIRST_BUCKET_ARG: usize = 2;

fn acquire_all(call: &Call<'_>) -> Result<(Combined, Cost), TbError> {
    let argc = call.arg_count();
    if argc <= FIRST_BUCKET_ARG || !(argc - FIRST_BUCKET_ARG).is_multiple_of(BUCKET_ARGS) {
        return Err(TbError::WrongArity(ACQUIRE_ALL_ARITY_ERROR));
    }
    if (argc - FIRST_BUCKET_ARG) / BUCKET_ARGS > MAX_BUCKETS {
        return Err(TbError::TooManyBuckets(ACQUIRE_ALL_TOO_MANY_ERROR));
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
    let opened = OpenBucket::open_all(call, &key_indexes)?;
    let members: Vec<(Option<State>, Params)> = opened
        .iter()
        .zip(params)
        .map(|(bucket, params)| (bucket.stored, params))
        .collect();
    let combined = bucket::acquire_all(&members, server::now_us(), cost);
    // Every key was read and checked above, so these writes cannot fail half-way for a reason we could
    // have caught first; all of them reach replicas and the AOF inside the one MULTI/EXEC of this command.
    OpenBucket::write_each(
        call,
        opened
            .iter()
            .zip(combined.writes.iter().map(Option::as_ref)),
    )?;
    Ok((combined, cost))
}

/// Whether any two of `keys` are equal. Sorting makes it O(N log N): a pairwise check held the server for seconds
/// on a call naming 30,000 buckets (issue #12).
pub(super) fn has_duplicate<'a>(keys: impl Iterator<Item = Option<&'a [u8]>>) -> bool {
    let mut sorted: Vec<Option<&[u8]>> = keys.collect();
    sorted.sort_unstable();
    sorted.windows(2).any(|pair| pair.first() == pair.last())
}
