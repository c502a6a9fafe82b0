//! Charges and blocks: taking tokens whether or not the bucket holds them, for costs known only after the fact
//! (a failed login's penalty, a response's size) and for shutting a key out for a while.
//!
//! Pure like the rest of the crate: no Redis, no clock, no I/O. Both leave a bucket *in debt* exactly as a granted
//! [`reserve`](super::reserve) does (negative `tokens`, see the crate doc), so `acquire`, `reserve`,
//! `refund` and `acquire_all` need nothing new: they already deny, wait, or refuse to refund on negative tokens
//! until the refill has repaid the debt.
//!
//! A debt is bounded by what [`MAX_WAIT_LIMIT_MS`] of refill repays, as a reservation's is: a [`charge`] that would
//! go deeper is refused and changes nothing, and a [`block`] is at most that long. So a bucket written here is
//! repaid within a day and never reaches the [`MAX_TTL_MS`](super::MAX_TTL_MS) expiry cap while in debt (an
//! expiry then would forgive the debt).
//!
//! Why a block is a debt and not a stored time in the future: a `ts` ahead of the server clock reads as a clock
//! step, which the core re-bases to the current reading, and that would cancel the block. A debt of
//! `rate · duration` holds on every server and replica whatever its clock does, and combines with an existing
//! debt by keeping the deeper of the two: a block never shortens a debt, nor revokes a reserved slot.
#![forbid(unsafe_code)]

use super::{
    full_at_us, ms_until, ms_until_one_token, rebased_write, refilled, remaining, write_expiring,
    Cost, ParamError, Params, State, Write, MAX_WAIT_LIMIT_MS,
};

/// Milliseconds in a second, for turning a duration in ms into refill.
const MS_PER_SEC: f64 = 1_000.0;

/// How long a [`block`] lasts, in milliseconds: `1..=MAX_WAIT_LIMIT_MS`. Built only by [`BlockMs::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockMs(i64);

impl BlockMs {
    pub fn new(ms: i64) -> Result<BlockMs, ParamError> {
        if (1..=MAX_WAIT_LIMIT_MS).contains(&ms) {
            Ok(BlockMs(ms))
        } else {
            Err(ParamError::BlockMs)
        }
    }

    pub fn ms(&self) -> i64 {
        self.0
    }
}

/// The answer to a [`charge`], a [`block`] or a [`lower`](super::lower): the three reply fields and the write, if any.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Charge {
    /// Whole tokens left after the call, rounded down; 0 for a bucket in debt; saturates at `i64::MAX`.
    pub remaining: i64,
    /// Milliseconds until one whole token is there (debt repaid), rounded up: 0 if it is there now, -1 when the
    /// burst is below one token (never). Exact as `acquire`'s `retry_after_ms` is for a cost of 1: an acquire of
    /// one token is allowed `retry_after_ms` later and denied 1 ms earlier.
    pub retry_after_ms: i64,
    /// Milliseconds until the bucket is full again, debt repaid, rounded up; 0 for a full bucket.
    pub reset_after_ms: i64,
    /// `Some` when the bucket changed: a charge with a cost above 0, a block that made a debt deeper, or a lower
    /// that brought the bucket down; otherwise only to record a new time base after a clock step back (see
    /// `refilled`).
    pub write: Option<Write>,
}

/// Why a [`charge`] was refused: it would leave the bucket in debt beyond what [`MAX_WAIT_LIMIT_MS`] of refill
/// repays (or beyond what an `f64` holds). Nothing was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebtBeyondLimit;

/// The deepest debt allowed, in tokens (a positive number): what `duration_ms` of refill repays, `rate ·
/// duration`, held at `f64::MAX` where that product overflows (a rate above about 2e303 per second): a debt
/// can be no deeper, so for such rates a day's block is repaid sooner than a day.
pub(super) fn refill_over_ms(duration_ms: i64, params: &Params) -> f64 {
    // Seconds first, then times the rate, as in `State::tokens_at`, so the two agree on what a duration repays.
    let refill = duration_ms as f64 / MS_PER_SEC * params.rate_per_sec;
    if refill.is_finite() {
        refill
    } else {
        f64::MAX
    }
}

/// Takes `cost` from the bucket at `now_us` whether or not it holds it: the bucket goes into debt by what it
/// lacks, like a reservation granted with a wait, and every later call waits for the refill to repay it.
///
/// A cost of 0 changes nothing and reports the bucket (but records a new time base after a clock step back, as
/// every command does: see `refilled`). A charge whose result would be below `-(rate · 24 h)`
/// tokens (a debt that a day of refill does not repay) is refused with [`DebtBeyondLimit`], also when the debt is
/// already that deep before it; at the exact edge it lands. A cost above the burst is no special case: it lands if
/// the debt it leaves is within the bound.
pub fn charge(
    stored: Option<State>,
    now_us: i64,
    params: &Params,
    cost: Cost,
) -> Result<Charge, DebtBeyondLimit> {
    let current = refilled(stored, now_us, params);
    if cost.tokens() == 0.0 {
        return Ok(answer(
            &current,
            now_us,
            params,
            rebased_write(stored, now_us, params),
        ));
    }
    // Finite operands; the difference can only overflow downwards, to `-inf`, which the check refuses.
    let after = State {
        tokens: current.tokens - cost.tokens(),
        updated_us: current.updated_us,
    };
    if !after.tokens.is_finite() || after.tokens < -refill_over_ms(MAX_WAIT_LIMIT_MS, params) {
        return Err(DebtBeyondLimit);
    }
    Ok(charged(after, now_us, params))
}

/// Blocks the bucket for `duration` from `now_us`: every call with a cost above 0 is denied (a reservation waits)
/// until then, and the bucket refills from empty afterwards. Stored as a debt of `rate · duration` tokens. A
/// bucket already deeper in debt (reservations or charges that a longer refill repays) is left as it is: the
/// block keeps whichever ends later, never shortening a debt (and writes only to record a new time base after a
/// clock step back, as every command does).
pub fn block(stored: Option<State>, now_us: i64, params: &Params, duration: BlockMs) -> Charge {
    let current = refilled(stored, now_us, params);
    let blocked_tokens = -refill_over_ms(duration.0, params);
    if current.tokens <= blocked_tokens {
        let write = rebased_write(stored, now_us, params);
        return answer(&current, now_us, params, write);
    }
    let after = State {
        tokens: blocked_tokens,
        updated_us: current.updated_us,
    };
    charged(after, now_us, params)
}

/// The answer for a bucket left as `after`, which must be written.
pub(super) fn charged(after: State, now_us: i64, params: &Params) -> Charge {
    let full_at = full_at_us(&after, params);
    let write = write_expiring(after, full_at, now_us, params);
    answer(&after, now_us, params, Some(write))
}

/// The reply for a bucket left as `state`, with `write` if it changed.
pub(super) fn answer(state: &State, now_us: i64, params: &Params, write: Option<Write>) -> Charge {
    Charge {
        remaining: remaining(state),
        retry_after_ms: ms_until_one_token(state, now_us, params),
        reset_after_ms: ms_until(now_us, full_at_us(state, params)),
        write,
    }
}

#[cfg(test)]
mod tests;
