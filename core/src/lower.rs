//! Lowering: bringing a bucket down to a level the caller knows it may hold, and never up.
//!
//! A client that decided calls in its own memory while it could not reach the server knows, from its own history,
//! how many tokens its bucket may hold now: what the server last told it, refilled since, minus what it admitted
//! meanwhile. When the server answers again, [`lower`] brings the server's bucket down to that level. The result is
//! `min(the bucket refilled to now, tokens)`, so it is idempotent: sent twice, retried, or raced by other callers
//! lowering the same bucket, the bucket ends at the lowest level any of them asked for, and nothing is taken twice.
//! (A [`charge`](super::charge) of what was admitted would take it again from a bucket that had already refilled
//! during the outage.)
//!
//! Pure like the rest of the crate. A lowered bucket below 0 is *in debt* exactly as a charged one is, bounded the
//! same way: `tokens` below `-(rate · 24 h)` is refused when the [`Floor`] is built.
#![forbid(unsafe_code)]

use super::charge::{answer, charged, refill_over_ms};
use super::{rebased_write, refilled, Charge, ParamError, Params, State, MAX_WAIT_LIMIT_MS};

/// The level a [`lower`] brings a bucket down to, in tokens: finite, and at least `-(rate · 24 h)` (a debt that a
/// day of refill repays, as [`charge`](super::charge) allows). It may exceed the burst, which then lowers nothing.
/// Built only by [`Floor::new`].
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Floor(f64);

impl Floor {
    /// Validates `tokens` against the bucket's `params`. The bound is the same product as the one a charge is held
    /// to, so a caller that clamps to `-(rate · 86400)` computed in doubles is accepted at the edge.
    pub fn new(tokens: f64, params: &Params) -> Result<Floor, ParamError> {
        if tokens.is_finite() && tokens >= -refill_over_ms(MAX_WAIT_LIMIT_MS, params) {
            // `-0.0 == 0.0`: store +0.0, so that the bucket is written as `0`, as every other command writes it.
            Ok(Floor(if tokens == 0.0 { 0.0 } else { tokens }))
        } else {
            Err(ParamError::Floor)
        }
    }

    pub fn tokens(&self) -> f64 {
        self.0
    }
}

/// Brings the bucket at `now_us` down to `floor`: refilled as every call refills it (a missing bucket is full), it
/// then holds `min(refilled, floor)`. A bucket already at or below `floor` is left as it is and nothing is written
/// (but a new time base is recorded after a clock step back, as every command does: see `refilled`). Never raises a
/// bucket; applying the same floor again at the same instant changes nothing.
pub fn lower(stored: Option<State>, now_us: i64, params: &Params, floor: Floor) -> Charge {
    let current = refilled(stored, now_us, params);
    if current.tokens <= floor.0 {
        return answer(
            &current,
            now_us,
            params,
            rebased_write(stored, now_us, params),
        );
    }
    let after = State {
        tokens: floor.0,
        updated_us: current.updated_us,
    };
    charged(after, now_us, params)
}

#[cfg(test)]
mod tests;
