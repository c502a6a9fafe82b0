//! The token bucket itself: pure arithmetic, no Redis, no clock, no I/O.
//!
//! `acquire(stored, now_us, params, cost)` takes the bucket as it was last written, the current server time and
//! the caller's parameters, and returns a [`Decision`]: what to reply, and whether (and what) to write back.
//! Everything that touches the server lives in `command.rs`; time is always an argument here so that unit tests,
//! property tests and benchmarks control it fully. `make lint` checks that this file never imports
//! `redis_module` or reads a clock.
//!
//! The model: a bucket holds `tokens` (0 ≤ tokens ≤ burst) as of `updated_us`. At any later instant `t` it holds
//! `min(burst, tokens + (t - updated_us) · rate)`. A missing bucket is a full one. Because the refill is a pure
//! function of time, a denied request needs no write at all, and a bucket can be allowed to expire exactly when it
//! would be full again.
//!
//! Tokens are `f64`. Every quantity that leaves this module as an integer (remaining tokens, milliseconds) is
//! derived with saturating conversions and then checked against the same refill function a later call will use,
//! so the advertised waits are exact with respect to what the server will actually decide.
#![forbid(unsafe_code)]

/// Microseconds in a second: the unit conversion between `rate_per_sec` and the `*_us` timestamps.
const MICROS_PER_SEC: f64 = 1_000_000.0;
/// Microseconds in a millisecond: replies and expiries are in milliseconds, state in microseconds.
const MICROS_PER_MS: i64 = 1_000;

/// The longest time-to-live a bucket key is given, in milliseconds (100 years of 365.25 days).
///
/// A bucket that would take longer than this to refill (say `rate 1e-9`, `burst 1e15`) expires after 100 years
/// and then reads as full. Capping keeps the absolute expiry far from any overflow in the server.
pub const MAX_TTL_MS: i64 = 36_525 * 24 * 3_600 * 1_000;

/// How many one-millisecond corrections an advertised wait may need after the closed-form estimate.
/// Floating-point rounding moves the estimate by at most one step; a few more cost nothing and keep the loop
/// bounded however odd the inputs.
const MAX_CORRECTIONS: u32 = 4;

/// Which argument was refused by a validating constructor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamError {
    /// `rate` is not a finite number > 0.
    Rate,
    /// `burst` is not a finite number > 0.
    Burst,
    /// `cost` is not a finite number ≥ 0.
    Cost,
}

/// The shape of one bucket, as the caller passes it on every call. Built only by [`Params::new`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Tokens added per second; finite and > 0.
    rate_per_sec: f64,
    /// Capacity in tokens; finite and > 0.
    burst: f64,
}

impl Params {
    /// Validates `rate_per_sec` and `burst`: both finite and strictly positive.
    pub fn new(rate_per_sec: f64, burst: f64) -> Result<Params, ParamError> {
        if !(rate_per_sec.is_finite() && rate_per_sec > 0.0) {
            return Err(ParamError::Rate);
        }
        if !(burst.is_finite() && burst > 0.0) {
            return Err(ParamError::Burst);
        }
        Ok(Params {
            rate_per_sec,
            burst,
        })
    }

    pub fn rate_per_sec(&self) -> f64 {
        self.rate_per_sec
    }

    pub fn burst(&self) -> f64 {
        self.burst
    }
}

/// Tokens one call takes; finite and ≥ 0. Zero is a peek. Built only by [`Cost::new`].
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Cost(f64);

impl Cost {
    pub fn new(tokens: f64) -> Result<Cost, ParamError> {
        if tokens.is_finite() && tokens >= 0.0 {
            // `-0.0 >= 0.0` holds; store +0.0 so a peek is always exactly zero.
            Ok(Cost(tokens.abs()))
        } else {
            Err(ParamError::Cost)
        }
    }

    pub fn tokens(&self) -> f64 {
        self.0
    }
}

/// A bucket as stored: `tokens` as of `updated_us`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    /// Tokens held at `updated_us`; finite and ≥ 0. May exceed the burst of a later call whose burst is smaller:
    /// the refill caps it.
    pub tokens: f64,
    /// Server wall-clock time of the last write, microseconds since the Unix epoch. Never moves backwards.
    pub updated_us: i64,
}

impl State {
    /// Tokens this bucket holds at `at_us`: the refill, capped at `burst`. A time before `updated_us` adds
    /// nothing, so a clock that steps back never mints tokens.
    pub fn tokens_at(&self, at_us: i64, params: &Params) -> f64 {
        let elapsed_us = at_us.saturating_sub(self.updated_us).max(0);
        // i64 -> f64 rounds for |x| > 2^53 µs (285 years); the result stays monotone, which is all we need.
        // Seconds first, then times the rate: `elapsed_us · rate` would overflow to infinity for a huge finite
        // rate (1e303 over 250 ms) and refill a drained bucket at once. This way the product is infinite only
        // when the true refill exceeds `f64::MAX`, hence any burst, so the cap below gives the right answer.
        let refill = elapsed_us as f64 / MICROS_PER_SEC * params.rate_per_sec;
        (self.tokens + refill).min(params.burst)
    }
}

/// What a call decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The bucket paid `cost`.
    Allowed,
    /// Not enough tokens now; they will be there after `retry_after_ms`.
    Denied,
    /// `cost > burst`: no wait will ever make this succeed.
    Impossible,
}

/// The shortest expiry slack, in milliseconds: a hot key moves its expiry at most about once a second.
pub const MIN_EXPIRY_SLACK_MS: i64 = 1_000;
/// The longest expiry slack, in milliseconds (one day), however slowly a bucket refills.
pub const MAX_EXPIRY_SLACK_MS: i64 = 86_400_000;

/// A write the glue must perform: the new state, and the window its key's expiry must lie in.
///
/// The key must not expire before `expire_at_ms`, the moment the bucket is full again: a missing key reads as a
/// full bucket, so an earlier expiry (on the primary, on a replica, or after a restart) would hand a drained
/// bucket's tokens back. Expiring later loses nothing, so the key may outlive that moment by up to
/// `expire_slack_ms`. That slack lets most writes leave the expiry alone and replicate a single `HSET`: the moment
/// of full only moves later as tokens are taken (by `cost / rate` per grant), so an expiry set to
/// `expire_at_ms + expire_slack_ms` stays valid until the bucket's moment of full passes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Write {
    pub state: State,
    /// Absolute Unix time in milliseconds at which the bucket is full again (rounded up), capped at
    /// `now + MAX_TTL_MS`. Since a missing bucket is a full one, expiring then loses nothing.
    pub expire_at_ms: i64,
    /// How long the key may outlive `expire_at_ms`, in milliseconds: [`expiry_slack_ms`] of the parameters.
    pub expire_slack_ms: i64,
}

impl Write {
    /// Whether a key that now expires at `current_ms` (absolute Unix ms; `None`: no expiry) may keep it: it lies in
    /// `[expire_at_ms, expire_at_ms + expire_slack_ms]`.
    pub fn keeps_expiry(&self, current_ms: Option<i64>) -> bool {
        current_ms.is_some_and(|at_ms| {
            at_ms >= self.expire_at_ms
                && at_ms <= self.expire_at_ms.saturating_add(self.expire_slack_ms)
        })
    }

    /// The expiry to give the key when [`Write::keeps_expiry`] says it must move: the end of the window, so that it
    /// stays valid for as long as possible.
    pub fn new_expiry_ms(&self) -> i64 {
        self.expire_at_ms.saturating_add(self.expire_slack_ms)
    }
}

/// How long a key may outlive its bucket's moment of full: 1% of the time the bucket takes to fill from empty,
/// at least [`MIN_EXPIRY_SLACK_MS`] and at most [`MAX_EXPIRY_SLACK_MS`].
pub fn expiry_slack_ms(params: &Params) -> i64 {
    // burst / rate seconds, 1% of it in ms: burst / rate · 10. Saturating cast; NaN cannot arise from validated
    // parameters, and `clamp` would keep it in range anyway after `ceil_saturating`.
    ceil_saturating(params.burst / params.rate_per_sec * 10.0)
        .clamp(MIN_EXPIRY_SLACK_MS, MAX_EXPIRY_SLACK_MS)
}

/// The full answer to one call: the four reply fields and the write, if any.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub outcome: Outcome,
    /// Whole tokens left after this call, rounded down; saturates at `i64::MAX`.
    pub remaining: i64,
    /// 0 when allowed; -1 when impossible; otherwise milliseconds until `cost` tokens will be there, rounded up.
    pub retry_after_ms: i64,
    /// Milliseconds until the bucket is full again, rounded up; 0 for a full bucket.
    pub reset_after_ms: i64,
    /// `Some` only when an allowed call took a non-zero cost. Denials and peeks write nothing.
    pub write: Option<Write>,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }
}

/// Decides one call at server time `now_us` against the stored bucket (`None`: missing, hence full).
pub fn acquire(stored: Option<State>, now_us: i64, params: &Params, cost: Cost) -> Decision {
    // The bucket as of `as_of_us`, the later of now and its last write: a stored time ahead of our clock (a
    // clock stepped back, or a failover to a replica whose clock is behind) is honoured, never rewritten to
    // an earlier one.
    let current = match stored {
        Some(state) => {
            let as_of_us = now_us.max(state.updated_us);
            State {
                tokens: state.tokens_at(as_of_us, params),
                updated_us: as_of_us,
            }
        }
        None => State {
            tokens: params.burst,
            updated_us: now_us,
        },
    };
    // The reply for a bucket that is left as `state`, full again at `full_at_us`.
    let reply_for = |outcome, state: &State, full_at_us: i64, retry_after_ms| Decision {
        outcome,
        remaining: floor_saturating(state.tokens),
        retry_after_ms,
        reset_after_ms: ms_until(now_us, full_at_us),
        write: None,
    };

    if cost.0 > params.burst {
        return reply_for(
            Outcome::Impossible,
            &current,
            full_at_us(&current, params),
            -1,
        );
    }
    if current.tokens < cost.0 {
        let retry_after_ms = retry_after_ms(&current, now_us, params, cost);
        return reply_for(
            Outcome::Denied,
            &current,
            full_at_us(&current, params),
            retry_after_ms,
        );
    }
    let after = State {
        tokens: (current.tokens - cost.0).max(0.0),
        updated_us: current.updated_us,
    };
    // One refill computation serves both the reply's reset and the key's expiry.
    let full_at = full_at_us(&after, params);
    let mut decision = reply_for(Outcome::Allowed, &after, full_at, 0);
    if cost.0 > 0.0 {
        let cap_ms = now_us.div_euclid(MICROS_PER_MS).saturating_add(MAX_TTL_MS);
        decision.write = Some(Write {
            state: after,
            expire_at_ms: ceil_div(full_at, MICROS_PER_MS).min(cap_ms),
            expire_slack_ms: expiry_slack_ms(params),
        });
    }
    decision
}

/// The answer to a call on several buckets at once, which takes `cost` from every bucket only if all can pay.
#[derive(Debug, Clone, PartialEq)]
pub struct Combined {
    /// `Allowed` only if every bucket allowed; `Impossible` if any bucket's burst is below the cost.
    pub outcome: Outcome,
    /// The smallest `remaining` over the buckets (after the call if allowed, as they stand if refused).
    pub remaining: i64,
    /// 0 when allowed; -1 when impossible; otherwise the longest wait, after which every bucket can pay.
    pub retry_after_ms: i64,
    /// The longest `reset_after_ms` over the buckets.
    pub reset_after_ms: i64,
    /// 0-based index of the bucket that decided the reply: when refused, the one that cannot pay (the first
    /// impossible one, else the longest wait); when allowed, the one with the fewest tokens left, whose burst and
    /// reset a caller should put in its rate-limit headers. Ties go to the earlier bucket.
    pub limiting_index: usize,
    /// One entry per bucket, in order: the write for an allowed call, all `None` for a refused one.
    pub writes: Vec<Option<Write>>,
}

/// Decides one call that takes `cost` from every bucket in `buckets` (stored state, parameters), all or none.
pub fn acquire_all(buckets: &[(Option<State>, Params)], now_us: i64, cost: Cost) -> Combined {
    let decisions: Vec<Decision> = buckets
        .iter()
        .map(|(stored, params)| acquire(*stored, now_us, params, cost))
        .collect();
    let all_allowed = decisions.iter().all(Decision::allowed);
    // When refused, buckets that could have paid are reported as they stand: nothing was taken from them.
    let reported: Vec<Decision> = if all_allowed {
        decisions
    } else {
        buckets
            .iter()
            .zip(decisions)
            .map(|((stored, params), decision)| match decision.outcome {
                Outcome::Allowed => acquire(*stored, now_us, params, Cost(0.0)),
                Outcome::Denied | Outcome::Impossible => decision,
            })
            .collect()
    };
    let fewest_left = first_extreme(&reported, |d| std::cmp::Reverse(d.remaining));
    let limiting_index = if all_allowed {
        fewest_left
    } else {
        let impossible = reported
            .iter()
            .position(|d| d.outcome == Outcome::Impossible);
        impossible.unwrap_or_else(|| first_extreme(&reported, |d| d.retry_after_ms))
    };
    let (outcome, retry_after_ms) = match reported.get(limiting_index) {
        Some(limiting) if !all_allowed => (limiting.outcome, limiting.retry_after_ms),
        _ => (Outcome::Allowed, 0),
    };
    Combined {
        outcome,
        remaining: reported.iter().map(|d| d.remaining).min().unwrap_or(0),
        retry_after_ms,
        reset_after_ms: reported.iter().map(|d| d.reset_after_ms).max().unwrap_or(0),
        limiting_index,
        writes: reported.iter().map(|d| d.write).collect(),
    }
}

/// Index of the first element with the largest `key` (0 for an empty slice).
fn first_extreme<K: Ord>(decisions: &[Decision], key: impl Fn(&Decision) -> K) -> usize {
    let mut best = 0;
    for (index, decision) in decisions.iter().enumerate().skip(1) {
        if decisions.get(best).is_some_and(|b| key(decision) > key(b)) {
            best = index;
        }
    }
    best
}

/// The earliest microsecond at which `state` holds its full burst (saturating at `i64::MAX`).
fn full_at_us(state: &State, params: &Params) -> i64 {
    let missing = params.burst - state.tokens;
    if missing <= 0.0 {
        return state.updated_us;
    }
    let estimate_us = ceil_saturating(missing / params.rate_per_sec * MICROS_PER_SEC);
    let mut at_us = state.updated_us.saturating_add(estimate_us);
    for _ in 0..MAX_CORRECTIONS {
        if at_us == i64::MAX || state.tokens_at(at_us, params) >= params.burst {
            break;
        }
        at_us = at_us.saturating_add(1);
    }
    at_us
}

/// Milliseconds from `now_us` until `cost` tokens are there, given the bucket is short now. Exact against
/// [`State::tokens_at`]: a call `retry_after_ms` later is allowed, one a millisecond earlier is not.
fn retry_after_ms(current: &State, now_us: i64, params: &Params, cost: Cost) -> i64 {
    let missing = cost.0 - current.tokens;
    let estimate_us = ceil_saturating(missing / params.rate_per_sec * MICROS_PER_SEC);
    let ready_us = current.updated_us.saturating_add(estimate_us);
    let mut wait_ms = ms_until(now_us, ready_us).max(1);
    let paid_after = |ms: i64| -> bool {
        let at_us = now_us.saturating_add(ms.saturating_mul(MICROS_PER_MS));
        current.tokens_at(at_us, params) >= cost.0
    };
    for _ in 0..MAX_CORRECTIONS {
        if wait_ms == i64::MAX || paid_after(wait_ms) {
            break;
        }
        wait_ms = wait_ms.saturating_add(1);
    }
    for _ in 0..MAX_CORRECTIONS {
        if wait_ms <= 1 || !paid_after(wait_ms - 1) {
            break;
        }
        wait_ms -= 1;
    }
    wait_ms
}

/// Whole milliseconds from `now_us` to `at_us`, rounded up; 0 if `at_us` is not in the future. An `at_us` that
/// saturated (beyond the year 294,000 of the microsecond timeline) stays saturated: `i64::MAX`.
fn ms_until(now_us: i64, at_us: i64) -> i64 {
    if at_us == i64::MAX {
        return i64::MAX;
    }
    ceil_div(at_us.saturating_sub(now_us).max(0), MICROS_PER_MS)
}

/// `ceil(numerator / denominator)` for a positive denominator, without overflow.
fn ceil_div(numerator: i64, denominator: i64) -> i64 {
    let quotient = numerator.div_euclid(denominator);
    if numerator.rem_euclid(denominator) == 0 {
        quotient
    } else {
        quotient.saturating_add(1)
    }
}

/// `ceil(x)` as an integer; saturates at the `i64` bounds, and a NaN (which the validated inputs cannot
/// produce) becomes `i64::MAX`, the conservative answer for a wait.
fn ceil_saturating(x: f64) -> i64 {
    if x.is_nan() {
        return i64::MAX;
    }
    // Float-to-int `as` saturates at the bounds (Rust reference, "numeric cast"); nothing else is lost here
    // because the value is already integral.
    x.ceil() as i64
}

/// `floor(x)` as an integer, saturating; used for the `remaining` reply.
fn floor_saturating(x: f64) -> i64 {
    if x.is_nan() {
        return 0;
    }
    // Saturating cast of an already integral value, as in `ceil_saturating`.
    x.floor() as i64
}

#[cfg(test)]
mod tests;
