//! redis-tb-core: the token bucket itself, pure arithmetic with no store, no clock and no I/O. The module
//! (`redis-tb`, as `redis_tb::bucket`) runs it on the state of a Redis hash at the server's time; the client
//! (`redis-tb-client`) runs it on its in-memory buckets at a monotonic time. Whoever calls keeps the state and
//! reads the clock, as redis-cell keeps its algorithm behind a store interface.
//!
//! `acquire(stored, now_us, params, cost)` takes the bucket as it was last written, the current time and
//! the caller's parameters, and returns a [`Decision`]: what to reply, and whether (and what) to write back.
//! [`reserve`] and [`refund`] do the same for pacing (take now, act later) and for giving tokens back;
//! [`acquire_each`] (`each.rs`) takes its own cost from each of several buckets, all or none, and
//! [`acquire_at_most`] (`at_most.rs`) takes up to a number of whole tokens; a [`Lease`] (`lease.rs`) is a process's
//! batch of such tokens, spent in memory.
//! Everything that touches the server lives in the module's `command/`; time is always an argument here so that
//! unit tests, property tests and benchmarks control it fully. `make lint` checks that this crate never imports
//! `redis_module` or reads a clock.
//!
//! The model: a bucket holds `tokens` as of `updated_us`. At any later instant `t` it holds
//! `min(burst, tokens + (t - updated_us) · rate)`. A missing bucket is a full one. Because the refill is a pure
//! function of time, a denied request needs no write at all, and a bucket can be allowed to expire exactly when it
//! would be full again. A clock that reads earlier than `updated_us` is the one exception: the bucket keeps its
//! tokens, refills from that reading on, and the first call to see it records the new time base (`refilled`).
//!
//! What holds for `tokens`: every state this crate writes has `tokens ≤ burst` (of the call that wrote it), and
//! `tokens ≥ 0` unless it was written by a [`reserve`] that granted with a wait, by a [`charge`] or [`block`]
//! (in `charge.rs`), or by a [`lower`] to a negative level (`lower.rs`). Such a bucket is *in debt*: its negative `tokens` are slots already promised to
//! callers, or tokens taken after the fact, repaid by the refill before anyone else is served.
//! [`acquire`] and [`acquire_all`] deny on a bucket in debt until the refill has repaid the debt and brought
//! `cost` on top, and say so in `retry_after_ms`; [`refund`] gives nothing back to it. A state read back from
//! the server may hold any finite `tokens` (a smaller `burst` than the writer's, or a hand-written `-1e300`,
//! which is just a very long debt); every function here stays finite for all of them.
//!
//! Tokens are `f64`. Every quantity that leaves this module as an integer (remaining tokens, milliseconds) is
//! derived with saturating conversions and then checked against the same refill function a later call will use,
//! so the advertised waits are exact with respect to what the server will actually decide.
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod at_most;
mod each;
mod lease;

pub use at_most::{acquire_at_most, AtMost, Partial, MAX_AT_MOST};
pub use each::{acquire_each, Each, Member};
pub use lease::{Admit, Lease, LEASE_HORIZON_US, LEASE_IDLE_US, MAX_LEASE_SHARE, MIN_WORTH_US};

/// Microseconds in a second: the unit conversion between `rate_per_sec` and the `*_us` timestamps.
const MICROS_PER_SEC: f64 = 1_000_000.0;
/// Milliseconds in a second, for reply fields in milliseconds against `rate_per_sec`.
const MILLIS_PER_SEC: f64 = 1_000.0;
/// Microseconds in a millisecond: replies and expiries are in milliseconds, state in microseconds.
const MICROS_PER_MS: i64 = 1_000;

/// The longest time-to-live a bucket key is given, in milliseconds (100 years of 365.25 days).
///
/// A bucket that would take longer than this to refill (say `rate 1e-9`, `burst 1e15`) expires after 100 years
/// and then reads as full. Capping keeps the absolute expiry far from any overflow in the server.
pub const MAX_TTL_MS: i64 = 36_525 * 24 * 3_600 * 1_000;

/// The largest `max_wait_ms` a [`reserve`] accepts: 24 hours.
///
/// A granted reservation leaves a debt of at most `rate · max_wait`, repaid within `max_wait`, so this also bounds
/// how long a bucket stays in debt and how far ahead its slots are promised. A day covers every pacing use we
/// know of (a rate of one per hour still leaves 24 slots); a longer wait is more likely a unit mistake than a
/// plan. It sits far below [`MAX_TTL_MS`], so a bucket in debt never hits the expiry cap before its debt is
/// repaid (an expiry then would forgive the debt and hand the promised slots to newcomers). Raising the bound
/// later breaks no caller; lowering it would.
pub const MAX_WAIT_LIMIT_MS: i64 = 24 * 3_600 * 1_000;

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
    /// `max_wait_ms` is not an integer in `0..=MAX_WAIT_LIMIT_MS`.
    MaxWait,
    /// `amount` is not a finite number ≥ 0.
    Amount,
    /// `max` (of a partial grant) is not an integer in `1..=MAX_AT_MOST`.
    AtMost,
    /// A block's `ms` is not an integer in `1..=MAX_WAIT_LIMIT_MS`.
    BlockMs,
    /// A lower's `tokens` is not a finite number of at least `-(rate · 24 h)`.
    Floor,
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

/// The longest a [`reserve`] caller agrees to wait, in milliseconds: `0..=MAX_WAIT_LIMIT_MS`. Zero makes a
/// reservation exactly an [`acquire`]. Built only by [`MaxWait::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MaxWait(i64);

impl MaxWait {
    pub fn new(max_wait_ms: i64) -> Result<MaxWait, ParamError> {
        if (0..=MAX_WAIT_LIMIT_MS).contains(&max_wait_ms) {
            Ok(MaxWait(max_wait_ms))
        } else {
            Err(ParamError::MaxWait)
        }
    }

    pub fn ms(&self) -> i64 {
        self.0
    }
}

/// Tokens a [`refund`] gives back; finite and ≥ 0. Zero changes nothing. Built only by [`Amount::new`].
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Amount(f64);

impl Amount {
    pub fn new(tokens: f64) -> Result<Amount, ParamError> {
        if tokens.is_finite() && tokens >= 0.0 {
            // As in `Cost::new`: store +0.0 for `-0.0`.
            Ok(Amount(tokens.abs()))
        } else {
            Err(ParamError::Amount)
        }
    }

    pub fn tokens(&self) -> f64 {
        self.0
    }
}

/// A bucket as stored: `tokens` as of `updated_us`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    /// Tokens held at `updated_us`; finite. Written states hold at most the writer's burst (a later call with a
    /// smaller burst sees more; the refill caps it). Negative only after a [`reserve`] granted with a wait, a
    /// [`charge`], a [`block`] or a [`lower`]: the debt, at most `rate · 24 h`. A decoded state may hold any finite value.
    pub tokens: f64,
    /// The caller's time of the last write in microseconds: the module's is the server's wall clock since the
    /// Unix epoch, the client's a monotonic clock. Moves backwards only when the clock does (see [`refilled`]).
    pub updated_us: i64,
}

impl State {
    /// Tokens this bucket holds at `at_us`: the refill, capped at `burst`. A time before `updated_us` adds
    /// nothing, so a clock that steps back never mints tokens. Finite for every finite `tokens`, and true up to
    /// rounding at every magnitude (see below).
    pub fn tokens_at(&self, at_us: i64, params: &Params) -> f64 {
        let elapsed_us = at_us.saturating_sub(self.updated_us).max(0);
        // i64 -> f64 rounds for |x| > 2^53 µs (285 years); the result stays monotone, which is all we need.
        // Seconds first, then times the rate: `elapsed_us · rate` would overflow to infinity for a huge finite
        // rate (1e303 over 250 ms) and refill a drained bucket at once.
        let elapsed_s = elapsed_us as f64 / MICROS_PER_SEC;
        let refill = elapsed_s * params.rate_per_sec;
        let tokens = if refill.is_finite() {
            // Can only overflow upwards, to `+inf`, when the true sum exceeds `f64::MAX` and hence any burst.
            self.tokens + refill
        } else {
            // The refill alone exceeds `f64::MAX`, yet a deep debt (rate 1e308, tokens -1.7e308, 2 s later) may
            // leave the true sum far below the burst. In units of the rate nothing overflows: the refill is
            // infinite only for a rate above 1e295, where `tokens / rate` is small, and the product is
            // infinite only when the true sum exceeds `f64::MAX`.
            (elapsed_s + self.tokens / params.rate_per_sec) * params.rate_per_sec
        };
        tokens.min(params.burst)
    }

    /// The bucket a reply describes: a bucket full again `reset_after_ms` after `at_us` lacks
    /// `rate · reset_after_ms / 1000` tokens then. Since the reply rounds its reset up to a millisecond, this
    /// holds at most `rate · 1 ms` fewer tokens than the bucket that answered, never more. A caller that keeps
    /// no state of its own (a client's in-memory bucket continuing from Redis's last answer) reads it back with
    /// [`State::tokens_at`], and `burst - tokens_at(t)`, which reaches 0 at the reset, is what that bucket still
    /// lacks at `t`: all that tokens taken with that reply can still be worth, as the refill forgets the rest.
    /// Finite for every reply.
    pub fn of_reply(reset_after_ms: i64, at_us: i64, params: &Params) -> State {
        let reset_s = reset_after_ms as f64 / MILLIS_PER_SEC;
        State {
            tokens: (params.burst - params.rate_per_sec * reset_s).max(-f64::MAX),
            updated_us: at_us,
        }
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
    /// Whole tokens left after this call, rounded down; 0 for a bucket in debt; saturates at `i64::MAX`.
    pub remaining: i64,
    /// 0 when allowed; -1 when impossible; otherwise milliseconds until `cost` tokens will be there (after any
    /// debt is repaid), rounded up.
    pub retry_after_ms: i64,
    /// Milliseconds until the bucket is full again (debt repaid), rounded up; 0 for a full bucket.
    pub reset_after_ms: i64,
    /// `Some` when an allowed call took a non-zero cost. Denials and peeks write nothing, except once per
    /// bucket after the clock steps back (see [`refilled`]).
    pub write: Option<Write>,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }
}

/// Decides one call at server time `now_us` against the stored bucket (`None`: missing, hence full).
///
/// A `cost` of 0 is a peek: allowed, nothing written (but see [`refilled`]), also on a bucket in debt (which reports `remaining` 0 and
/// a reset that counts the debt). Any other cost on a bucket in debt is denied until the debt is repaid and
/// `cost` is there on top: `retry_after_ms` counts both, because the refill simply starts from negative tokens.
pub fn acquire(stored: Option<State>, now_us: i64, params: &Params, cost: Cost) -> Decision {
    let mut decision = decide(&refilled(stored, now_us, params), now_us, params, cost);
    decision.write = decision
        .write
        .or_else(|| rebased_write(stored, now_us, params));
    decision
}

/// [`acquire`] on the bucket already refilled to now (`current`, from [`refilled`]).
fn decide(current: &State, now_us: i64, params: &Params, cost: Cost) -> Decision {
    // The reply for a bucket that is left as `state`, full again at `full_at_us`.
    let reply_for = |outcome, state: &State, full_at_us: i64, retry_after_ms| Decision {
        outcome,
        remaining: remaining(state),
        retry_after_ms,
        reset_after_ms: ms_until(now_us, full_at_us),
        write: None,
    };

    if cost.0 > params.burst {
        return reply_for(
            Outcome::Impossible,
            current,
            full_at_us(current, params),
            -1,
        );
    }
    // A peek is allowed whatever the bucket holds; checked apart because `tokens < 0` on a bucket in debt.
    if cost.0 == 0.0 {
        return reply_for(Outcome::Allowed, current, full_at_us(current, params), 0);
    }
    if current.tokens < cost.0 {
        let retry_after_ms = retry_after_ms(current, now_us, params, cost);
        return reply_for(
            Outcome::Denied,
            current,
            full_at_us(current, params),
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
    decision.write = Some(write_expiring(after, full_at, now_us, params));
    decision
}

/// The stored bucket refilled to now. A missing bucket is a full one.
///
/// A clock that reads earlier than the stored `updated_us` (a clock stepped back, or a failover to a server whose
/// clock is behind) has no refill to add: the bucket keeps its stored tokens (capped at `burst`, as any refill
/// is) and refills from the current reading on, whatever the size of the step. The refill earned between the
/// last write and that reading is not credited: from the stored state and one clock reading alone the step's
/// size is unknown, and crediting any time could grant more than `burst + rate · t` over real time. See
/// [`rebased_write`] for the one write that records the new time base.
fn refilled(stored: Option<State>, now_us: i64, params: &Params) -> State {
    match stored {
        Some(state) if now_us < state.updated_us => State {
            tokens: state.tokens.min(params.burst),
            updated_us: now_us,
        },
        Some(state) => State {
            tokens: state.tokens_at(now_us, params),
            updated_us: now_us,
        },
        None => State {
            tokens: params.burst,
            updated_us: now_us,
        },
    }
}

/// The write a call must make when it would otherwise write nothing (a denial, a peek, a refusal, a refund that
/// gives nothing back) but the clock reads earlier than the stored `updated_us`: the bucket as [`refilled`]
/// rebases it, tokens unchanged, as of now. Without it every later call would rebase to its own reading, and the
/// refill would never accumulate. Once written, the stored time is no longer ahead of the clock, so each bucket
/// takes at most one such write per backward step. `None` when the clock is not behind, and for a bucket that is
/// full anyway (it reads the same from any time base).
fn rebased_write(stored: Option<State>, now_us: i64, params: &Params) -> Option<Write> {
    let stored = stored.filter(|state| now_us < state.updated_us)?;
    let rebased = refilled(Some(stored), now_us, params);
    (rebased.tokens < params.burst)
        .then(|| write_expiring(rebased, full_at_us(&rebased, params), now_us, params))
}

/// The `remaining` reply: whole tokens, rounded down, never below 0 (a bucket in debt has none to offer).
fn remaining(state: &State) -> i64 {
    floor_saturating(state.tokens).max(0)
}

/// The write for `state`, which is full again at `full_at_us`: the key may expire then (rounded up to a whole
/// millisecond), or after [`MAX_TTL_MS`] if that comes first, and up to the slack of `params` later.
fn write_expiring(state: State, full_at_us: i64, now_us: i64, params: &Params) -> Write {
    let cap_ms = now_us.div_euclid(MICROS_PER_MS).saturating_add(MAX_TTL_MS);
    Write {
        state,
        expire_at_ms: ceil_div(full_at_us, MICROS_PER_MS).min(cap_ms),
        expire_slack_ms: expiry_slack_ms(params),
    }
}

/// The answer to a [`reserve`]: the four reply fields and the write, if any.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reservation {
    /// `Allowed`: granted, act after `wait_ms`. `Denied`: the wait would exceed `max_wait_ms`, or (only near
    /// `f64::MAX`) the debt would not fit a double; nothing taken.
    /// `Impossible`: `cost > burst`.
    pub outcome: Outcome,
    /// Granted: milliseconds the caller must wait before acting, 0 to act now, at most `max_wait_ms`. Denied: the
    /// wait a grant would have needed (a hint for a retry or a larger `max_wait_ms`). Impossible: -1. Exact as
    /// `retry_after_ms` is: the refill at now + `wait_ms` covers `cost` and debt, 1 ms earlier it does not.
    pub wait_ms: i64,
    /// Whole tokens left after this call, rounded down; 0 for a bucket in debt; saturates at `i64::MAX`.
    pub remaining: i64,
    /// Milliseconds until the bucket is full again, debt repaid, rounded up; 0 for a full bucket.
    pub reset_after_ms: i64,
    /// `Some` when a grant took a non-zero cost. Refusals and peeks write nothing, except once per bucket after
    /// the clock steps back (see [`refilled`]).
    pub write: Option<Write>,
}

impl Reservation {
    pub fn granted(&self) -> bool {
        self.outcome == Outcome::Allowed
    }
}

/// Reserves `cost` tokens for a caller willing to wait up to `max_wait` (first come, first served).
///
/// If `cost` tokens are there now, this is exactly [`acquire`]: same reply, same write, `wait_ms` 0. Otherwise
/// the wait is the time until the bucket, debt included, holds `cost`; if it is within `max_wait` the tokens are
/// taken now, leaving the bucket in debt (negative `tokens`), and the caller acts after `wait_ms`. The next
/// caller's wait counts this debt, so concurrent callers get distinct, increasing slots. A wait beyond
/// `max_wait` takes nothing, and neither does `cost > burst`. With `max_wait` 0 every answer equals
/// [`acquire`]'s, since a denial always waits at least 1 ms.
pub fn reserve(
    stored: Option<State>,
    now_us: i64,
    params: &Params,
    cost: Cost,
    max_wait: MaxWait,
) -> Reservation {
    let current = refilled(stored, now_us, params);
    let decision = decide(&current, now_us, params, cost);
    let as_acquired = Reservation {
        outcome: decision.outcome,
        wait_ms: decision.retry_after_ms,
        remaining: decision.remaining,
        reset_after_ms: decision.reset_after_ms,
        write: decision
            .write
            .or_else(|| rebased_write(stored, now_us, params)),
    };
    // Granted with a wait: `current.tokens < cost`, so this goes below zero. At the top of the range the debt may
    // not fit a double (rate 1e308, already -1.7e308 in debt, cost 1.7e308: the wait is 3.4 s, the debt
    // -3.4e308), and a state must stay finite: such a reservation is refused, with its true wait.
    let after = State {
        tokens: current.tokens - cost.0,
        updated_us: current.updated_us,
    };
    if decision.outcome != Outcome::Denied
        || decision.retry_after_ms > max_wait.ms()
        || !after.tokens.is_finite()
    {
        return as_acquired;
    }
    let full_at = full_at_us(&after, params);
    Reservation {
        outcome: Outcome::Allowed,
        wait_ms: decision.retry_after_ms,
        remaining: remaining(&after),
        reset_after_ms: ms_until(now_us, full_at),
        write: Some(write_expiring(after, full_at, now_us, params)),
    }
}

/// What the glue must do to the key after a [`refund`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyChange {
    /// Leave the key as it is.
    Keep,
    /// Store this state with its expiry.
    Write(Write),
    /// Delete the key: the bucket is full, and a missing key is a full bucket.
    Delete,
}

/// The answer to a [`refund`]: the three reply fields and the change to the key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Refund {
    /// True exactly when tokens were given back. The key may change without it, once per clock step back
    /// (see [`refilled`]).
    pub refunded: bool,
    /// Tokens actually given back: `amount`, or less where the burst capped it; 0 when nothing was refunded.
    pub tokens_refunded: f64,
    /// Whole tokens in the bucket after the call, rounded down; 0 for a bucket in debt; saturates at `i64::MAX`.
    pub remaining: i64,
    /// Milliseconds until the bucket is full again (debt repaid), rounded up; 0 for a full bucket.
    pub reset_after_ms: i64,
    pub change: KeyChange,
}

/// Gives `amount` tokens back for work that did not happen: refill to now, then add `amount`, capped at `burst`.
///
/// Refunds nothing (and changes nothing) when the key is missing (a full bucket), when `amount` is 0 or too small
/// to change the stored value, when the bucket is already full, and when the refilled bucket is in debt: debt
/// means other callers hold later slots, and tokens handed back now would let a newcomer act in a slot already
/// promised. So a reservation made while in debt cannot be given back; its slot simply goes unused. A bucket
/// that becomes full is deleted rather than written.
///
/// The grant a refund stands for is not known here. A refund at the very instant of its grant undoes it exactly.
/// One that comes later may hand back tokens that the refill (capped at `burst`), or another refund, had already
/// replaced, and lets that many more through than `burst + rate · t`: the tests pin an example and bound the
/// excess by the tokens such refunds put back.
pub fn refund(stored: Option<State>, now_us: i64, params: &Params, amount: Amount) -> Refund {
    let Some(stored) = stored else {
        return Refund {
            refunded: false,
            tokens_refunded: 0.0,
            remaining: floor_saturating(params.burst),
            reset_after_ms: 0,
            change: KeyChange::Keep,
        };
    };
    let current = refilled(Some(stored), now_us, params);
    // Nothing given back; the key changes only to record a new time base after a clock step back.
    let unchanged = |state: &State| Refund {
        refunded: false,
        tokens_refunded: 0.0,
        remaining: remaining(state),
        reset_after_ms: ms_until(now_us, full_at_us(state, params)),
        change: rebased_write(Some(stored), now_us, params)
            .map_or(KeyChange::Keep, KeyChange::Write),
    };
    if current.tokens < 0.0 {
        return unchanged(&current);
    }
    // Finite: `current.tokens ≤ burst` and `amount` are finite, so the sum can only overflow upwards, to `+inf`,
    // which the cap turns into `burst`.
    let after = State {
        tokens: (current.tokens + amount.0).min(params.burst),
        updated_us: current.updated_us,
    };
    if after.tokens <= current.tokens {
        return unchanged(&current);
    }
    if after.tokens >= params.burst {
        return Refund {
            refunded: true,
            tokens_refunded: after.tokens - current.tokens,
            remaining: remaining(&after),
            reset_after_ms: 0,
            change: KeyChange::Delete,
        };
    }
    let full_at = full_at_us(&after, params);
    Refund {
        refunded: true,
        tokens_refunded: after.tokens - current.tokens,
        remaining: remaining(&after),
        reset_after_ms: ms_until(now_us, full_at),
        change: KeyChange::Write(write_expiring(after, full_at, now_us, params)),
    }
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
    /// One entry per bucket, in order: the write for an allowed call; for a refused one, `None` except where a
    /// bucket records a new time base after a clock step back.
    pub writes: Vec<Option<Write>>,
}

/// Decides one call that takes `cost` from every bucket in `buckets` (stored state, parameters), all or none.
/// A bucket in debt refuses like any bucket short of `cost`, and its wait counts the debt.
pub fn acquire_all(buckets: &[(Option<State>, Params)], now_us: i64, cost: Cost) -> Combined {
    // The same decision as `TB.ACQUIREEACH` with one cost for every bucket (a property test pins it), summed up.
    let members: Vec<Member> = buckets
        .iter()
        .map(|&(stored, params)| Member {
            stored,
            params,
            cost,
        })
        .collect();
    let each = acquire_each(&members, now_us);
    let retry_after_ms = match each.buckets.get(each.limiting_index) {
        Some(limiting) if !each.allowed() => limiting.retry_after_ms,
        _ => 0,
    };
    Combined {
        outcome: each.outcome,
        remaining: each.buckets.iter().map(|d| d.remaining).min().unwrap_or(0),
        retry_after_ms,
        reset_after_ms: each
            .buckets
            .iter()
            .map(|d| d.reset_after_ms)
            .max()
            .unwrap_or(0),
        limiting_index: each.limiting_index,
        writes: each.buckets.iter().map(|d| d.write).collect(),
    }
}

/// Which bucket decides a call over several, from each bucket's `remaining` and `retry_after_ms` in call order
/// (`retry_after_ms` -1 when its cost exceeds its burst, as every reply writes it): when refused, the first whose
/// cost exceeds its burst, else the first with the longest wait; when allowed, the first with the fewest tokens
/// left. 0 for no bucket. `TB.ACQUIREEACH` and `TB.ACQUIREALL` choose by it, and so does a client that puts
/// together the replies of one call split over cluster slots.
pub fn limiting_index(allowed: bool, buckets: impl IntoIterator<Item = (i64, i64)>) -> usize {
    let mut best: Option<(usize, i64, i64)> = None;
    for (index, (remaining, retry_after_ms)) in buckets.into_iter().enumerate() {
        let better = match best {
            None => true,
            Some((_, fewest, _)) if allowed => remaining < fewest,
            Some((_, _, -1)) => false,
            Some((_, _, longest)) => retry_after_ms == -1 || retry_after_ms > longest,
        };
        if better {
            best = Some((index, remaining, retry_after_ms));
        }
    }
    best.map_or(0, |(index, _, _)| index)
}

/// Seconds the refill takes to bring `tokens` up to `target`: `(target - tokens) / rate`, without overflow. The
/// difference overflows for a deep debt at the top of the range (1.7e308 - -1.7e308) while the quotient is a few
/// seconds for a rate as large; each term divided first cannot overflow then (the difference is infinite only if
/// both terms exceed 1e308 in magnitude, and the rate is finite).
fn seconds_to_refill(tokens: f64, target: f64, params: &Params) -> f64 {
    let missing = target - tokens;
    if missing.is_finite() {
        missing / params.rate_per_sec
    } else {
        target / params.rate_per_sec - tokens / params.rate_per_sec
    }
}

/// The earliest microsecond at which `state` holds its full burst (saturating at `i64::MAX`).
fn full_at_us(state: &State, params: &Params) -> i64 {
    if state.tokens >= params.burst {
        return state.updated_us;
    }
    let estimate_us =
        ceil_saturating(seconds_to_refill(state.tokens, params.burst, params) * MICROS_PER_SEC);
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
    let estimate_us =
        ceil_saturating(seconds_to_refill(current.tokens, cost.0, params) * MICROS_PER_SEC);
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

/// Milliseconds until `state` holds one whole token (debt repaid): 0 when it does now, -1 when `burst < 1` (never),
/// else exact as [`retry_after_ms`] is. What `TB.ACQUIREATMOST`, `TB.CHARGE` and `TB.BLOCK` advertise.
fn ms_until_one_token(state: &State, now_us: i64, params: &Params) -> i64 {
    let one_token = Cost(1.0);
    if one_token.0 > params.burst {
        -1
    } else if state.tokens >= one_token.0 {
        0
    } else {
        retry_after_ms(state, now_us, params, one_token)
    }
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

mod charge;
pub use charge::{block, charge, BlockMs, Charge, DebtBeyondLimit};
mod lower;
pub use lower::{lower, Floor};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod clock_steps;
