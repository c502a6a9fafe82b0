//! A partial grant: take up to `max` whole tokens, as many as the bucket holds now.
//!
//! For callers that can use less than they asked for (a batch of messages, a page of rows): instead of a denial
//! they get what is there. Whole tokens only, so the grant is an integer the caller can act on. Built on the
//! core's refill and decision, so a grant of `n` writes exactly what `acquire` with cost `n` writes. Pure, like
//! the rest of the crate: no Redis, no clock, no I/O.
#![forbid(unsafe_code)]

use super::{
    decide, full_at_us, ms_until, ms_until_one_token, rebased_write, refilled, remaining, Cost,
    Outcome, ParamError, Params, State, Write,
};

/// The largest `max` a caller may ask for: 2^53, the largest integer up to which every integer is an exact
/// `f64`, so a grant converts to tokens without rounding.
pub const MAX_AT_MOST: i64 = 1 << 53;

/// How many whole tokens a call takes at most: an integer in `1..=MAX_AT_MOST`. Built only by [`AtMost::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AtMost(i64);

impl AtMost {
    pub fn new(max_tokens: i64) -> Result<AtMost, ParamError> {
        if (1..=MAX_AT_MOST).contains(&max_tokens) {
            Ok(AtMost(max_tokens))
        } else {
            Err(ParamError::AtMost)
        }
    }

    pub fn tokens(&self) -> i64 {
        self.0
    }
}

/// The answer to an [`acquire_at_most`]: the four reply fields and the write, if any.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Partial {
    /// Whole tokens taken: `min(max, whole tokens in the bucket)`, 0 when less than one whole token is there.
    pub granted: i64,
    /// Whole tokens left after this call, rounded down; 0 for a bucket in debt; saturates at `i64::MAX`.
    pub remaining: i64,
    /// 0 when something was granted; -1 when the burst is below one token (no wait ever grants one); otherwise
    /// milliseconds until one whole token is there (debt repaid first), exact as `acquire`'s retry is.
    pub retry_after_ms: i64,
    /// Milliseconds until the bucket is full again (debt repaid), rounded up; 0 for a full bucket.
    pub reset_after_ms: i64,
    /// `Some` when `granted > 0`; otherwise `None`, except once per bucket after the clock steps back (see
    /// `refilled`), as for every command.
    pub write: Option<Write>,
}

impl Partial {
    /// The outcome `INFO tb` counts: allowed when something was granted, impossible when the burst is below one
    /// token, else denied.
    pub fn outcome(&self) -> Outcome {
        match (self.granted, self.retry_after_ms) {
            (0, -1) => Outcome::Impossible,
            (0, _) => Outcome::Denied,
            _ => Outcome::Allowed,
        }
    }
}

/// Takes `min(max, whole tokens in the bucket)` at `now_us`. A bucket in debt holds no whole token. Granting
/// `n` decides and writes exactly what [`acquire`](super::acquire) with cost `n` would.
pub fn acquire_at_most(
    stored: Option<State>,
    now_us: i64,
    params: &Params,
    max: AtMost,
) -> Partial {
    let current = refilled(stored, now_us, params);
    // Never above 2^53, so exact as an f64; never above the tokens held, so `decide` grants it.
    let granted = remaining(&current).min(max.0);
    if granted == 0 {
        return Partial {
            granted: 0,
            remaining: 0,
            retry_after_ms: ms_until_one_token(&current, now_us, params),
            reset_after_ms: ms_until(now_us, full_at_us(&current, params)),
            // Nothing taken; only a clock behind the stored time writes, to record the new time base.
            write: rebased_write(stored, now_us, params),
        };
    }
    // i64 -> f64 is exact below 2^53, and `granted ≤ MAX_AT_MOST`.
    let decision = decide(&current, now_us, params, Cost(granted as f64));
    Partial {
        granted,
        remaining: decision.remaining,
        retry_after_ms: 0,
        reset_after_ms: decision.reset_after_ms,
        write: decision.write,
    }
}

#[cfg(test)]
mod tests;
