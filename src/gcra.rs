//! The pure core of `CL.THROTTLE`: the generic cell rate algorithm (GCRA) exactly as redis-cell computes it, so
//! that a key written by either module means the same to the other and every reply is the same integer.
//!
//! Never imports `redis_module`, reads no clock and does no I/O: time is an argument (`now_ns`, nanoseconds since
//! the Unix epoch), so tests and benches control it fully.
//!
//! The algorithm, in redis-cell's terms:
//! - `limit` L = max_burst + 1: how many requests a fresh key admits at one instant;
//! - emission interval T = trunc(period * 10^9 / count_per_period) ns, divided in `f64` as redis-cell does;
//! - delay variation tolerance tau = L * T;
//! - the stored theoretical arrival time (TAT, ns since the epoch) is when the key would be empty again; a missing
//!   key has TAT = now;
//! - `new_tat = max(tat, now) + quantity * T`; the call is limited iff `now < new_tat - tau`.
//!
//! An allowed call stores `new_tat` (quantity 0 too: it refreshes the expiry), with the key expiring at
//! `new_tat` rounded up to the millisecond; a limited call changes nothing. Redis deletes a key only once its clock
//! is past the expiry's millisecond, so the state outlives its TAT by under 2 ms and never vanishes while the TAT
//! is ahead: a call then always sees the TAT the last one stored, and the limit holds at any rate. (redis-cell
//! expires the key `trunc_ms(new_tat - now)` after now's millisecond, which can be the millisecond before the
//! TAT's when the two sub-millisecond parts add up past one: its key then vanishes while the TAT is still ahead,
//! and the next call sees a fresh key. Where its key lasts until the TAT, the replies here are its replies, but for
//! one corner: in the millisecond our key outlives its, a call that can never succeed (`quantity > L`) counts its
//! `remaining` from the past TAT, where redis-cell counts it from a missing key.)
//!
//! redis-cell's own arithmetic is kept where it differs from the exact one, because its results are the contract:
//! T is divided in `f64`; `remaining` is computed in `f64` over whole microseconds (so an interval under 1 µs gives
//! `i64::MAX`); and a wait is converted to seconds through `f64` (`seconds + nanoseconds / 10^9`), truncated, plus
//! one when a millisecond remains, so a wait past about 194 days can read one second high.
#![forbid(unsafe_code)]

/// Nanoseconds in a second, a millisecond and a microsecond.
const NS_PER_S: i128 = 1_000_000_000;
const NS_PER_MS: i128 = 1_000_000;
const NS_PER_US: i128 = 1_000;

/// Why a limit or a call cannot be computed. Each names the argument a client should change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcraError {
    /// `max_burst` is negative, or `max_burst + 1` overflows.
    MaxBurst,
    /// `count_per_period` is zero or negative.
    CountPerPeriod,
    /// `period` is zero or negative.
    Period,
    /// `quantity` is negative.
    Quantity,
    /// `period / count_per_period` is under 1 ns: redis-cell calls this a zero rate.
    IntervalUnderOneNs,
    /// `(max_burst + 1) * period / count_per_period` is 2^63 ns (292 years) or more.
    ToleranceTooLong,
    /// The TAT an allowed call would store is past 2^63 ns since the epoch (the year 2262).
    TatOutOfRange,
}

/// A validated limit. [`Limit::new`] is the only way to build one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// L = max_burst + 1, at least 1: the reply's second element.
    limit: i64,
    /// T, the emission interval in ns: 1 ≤ T ≤ tau.
    interval_ns: i64,
    /// tau = L * T in ns, the delay variation tolerance: the most a TAT may run ahead of now. ≤ i64::MAX.
    tolerance_ns: i64,
}

impl Limit {
    /// `max_burst` ≥ 0, `count_per_period` ≥ 1 and `period_s` ≥ 1 (seconds), as `CL.THROTTLE` takes them.
    pub fn new(max_burst: i64, count_per_period: i64, period_s: i64) -> Result<Limit, GcraError> {
        if max_burst < 0 {
            return Err(GcraError::MaxBurst);
        }
        let limit = max_burst.checked_add(1).ok_or(GcraError::MaxBurst)?;
        if count_per_period <= 0 {
            return Err(GcraError::CountPerPeriod);
        }
        if period_s <= 0 {
            return Err(GcraError::Period);
        }
        let interval_ns = emission_interval_ns(period_s, count_per_period)?;
        let tolerance_ns = interval_ns
            .checked_mul(limit)
            .ok_or(GcraError::ToleranceTooLong)?;
        Ok(Limit {
            limit,
            interval_ns,
            tolerance_ns,
        })
    }

    /// L = max_burst + 1.
    pub fn limit(&self) -> i64 {
        self.limit
    }

    /// T in ns.
    pub fn interval_ns(&self) -> i64 {
        self.interval_ns
    }

    /// tau = L * T in ns.
    pub fn tolerance_ns(&self) -> i64 {
        self.tolerance_ns
    }
}

/// T = trunc(period * 10^9 / count) ns, with the division in `f64` as redis-cell does it: for periods up to about
/// 104 days (period * 10^9 ≤ 2^53) that equals the integer quotient; above, `f64` rounding can make it differ.
fn emission_interval_ns(period_s: i64, count_per_period: i64) -> Result<i64, GcraError> {
    let period_ns = i128::from(period_s) * NS_PER_S;
    // Both conversions round to the nearest f64, as redis-cell's `as f64` does.
    let interval = period_ns as f64 / count_per_period as f64;
    if interval < 1.0 {
        return Err(GcraError::IntervalUnderOneNs);
    }
    // 2^63 as f64 is exact; anything below it truncates into i64 range.
    if interval >= 9_223_372_036_854_775_808.0 {
        return Err(GcraError::ToleranceTooLong);
    }
    Ok(trunc_f64(interval))
}

/// How much one call takes: `quantity` ≥ 0 emission intervals. 0 is a peek that still refreshes the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity(i64);

impl Quantity {
    pub fn new(quantity: i64) -> Result<Quantity, GcraError> {
        if quantity < 0 {
            Err(GcraError::Quantity)
        } else {
            Ok(Quantity(quantity))
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// What an allowed call stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TatWrite {
    /// The new TAT, ns since the epoch: the key's value as decimal text.
    pub tat_ns: i64,
    /// When the key expires, Unix ms: the TAT rounded up to the millisecond, so the key lasts until the TAT.
    pub expire_at_ms: i64,
}

/// The decision of one call, as `CL.THROTTLE` replies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttle {
    /// Whether the call was refused.
    pub limited: bool,
    /// L = max_burst + 1.
    pub limit: i64,
    /// Requests of quantity 1 the key would admit now, after this call; never negative.
    pub remaining: i64,
    /// ns until this call would be allowed; -10^9 (the reply's -1 s) when allowed, and when `quantity * T > tau`
    /// (it never will be).
    pub retry_after_ns: i128,
    /// ns until the key is empty again: `tat - now` after an allowed call, before a limited one (negative when the
    /// stored TAT is already past).
    pub reset_after_ns: i128,
    /// Whether `quantity * T > tau`: the call can never be allowed.
    pub exceeds_limit: bool,
    /// The write of an allowed call; `None` when limited.
    pub write: Option<TatWrite>,
}

impl Throttle {
    /// The reply's `retry_after`: whole seconds, -1 when allowed or never (see [`whole_seconds_up`]).
    pub fn retry_after_s(&self) -> i64 {
        whole_seconds_up(self.retry_after_ns)
    }

    /// The reply's `reset_after` in whole seconds (see [`whole_seconds_up`]).
    pub fn reset_after_s(&self) -> i64 {
        whole_seconds_up(self.reset_after_ns)
    }

    /// The five integers of the reply: limited, limit, remaining, retry_after, reset_after.
    pub fn reply(&self) -> [i64; 5] {
        [
            i64::from(self.limited),
            self.limit,
            self.remaining,
            self.retry_after_s(),
            self.reset_after_s(),
        ]
    }
}

/// Decides one call at `now_ns` on a key holding `stored_tat_ns` (`None`: missing).
///
/// Errors only when an allowed call's TAT would not fit the stored form (past the year 2262).
pub fn throttle(
    stored_tat_ns: Option<i64>,
    now_ns: i64,
    limit: &Limit,
    quantity: Quantity,
) -> Result<Throttle, GcraError> {
    let now = i128::from(now_ns);
    let tat = stored_tat_ns.map_or(now, i128::from);
    let interval = i128::from(limit.interval_ns);
    let tolerance = i128::from(limit.tolerance_ns);
    // No overflow in i128: each factor is below 2^63.
    let increment = interval * i128::from(quantity.0);
    let new_tat = tat.max(now) + increment;
    let allow_at = new_tat - tolerance;
    let exceeds_limit = increment > tolerance;
    let (limited, ttl, retry_after, write) = if now < allow_at {
        let retry_after = if exceeds_limit {
            -NS_PER_S
        } else {
            allow_at - now
        };
        (true, tat - now, retry_after, None)
    } else {
        let tat_ns = i64::try_from(new_tat).map_err(|_| GcraError::TatOutOfRange)?;
        let ttl = new_tat - now;
        // Below 2^63 ns, so the quotient fits.
        let expire_at_ms = i64::try_from(ceil_ms(new_tat)).map_err(|_| GcraError::TatOutOfRange)?;
        let write = TatWrite {
            tat_ns,
            expire_at_ms,
        };
        (false, ttl, -NS_PER_S, Some(write))
    };
    Ok(Throttle {
        limited,
        limit: limit.limit,
        remaining: remaining(tolerance - ttl, interval),
        retry_after_ns: retry_after,
        reset_after_ns: ttl,
        exceeds_limit,
        write,
    })
}

/// An instant in ns as Unix ms, rounded up (toward the future, negative instants too).
fn ceil_ms(instant_ns: i128) -> i128 {
    let whole = instant_ns.div_euclid(NS_PER_MS);
    if instant_ns.rem_euclid(NS_PER_MS) == 0 {
        whole
    } else {
        whole + 1
    }
}

/// Requests left: `next_ns / T` over whole microseconds in `f64`, truncated, when `next_ns > -T`; else 0.
/// `next_ns = tau - ttl` is the tolerance the key has not used. redis-cell's computation, kept for its results:
/// an interval under 1 µs divides by zero and saturates to `i64::MAX` (0 for 0 / 0).
fn remaining(next_ns: i128, interval_ns: i128) -> i64 {
    if next_ns <= -interval_ns {
        return 0;
    }
    let next_us = (next_ns / NS_PER_US) as f64;
    let interval_us = (interval_ns / NS_PER_US) as f64;
    trunc_f64(next_us / interval_us)
}

/// A duration in ns as the reply's whole seconds: `seconds + nanoseconds / 10^9` in `f64` (redis-cell's
/// `Duration::as_seconds_f64`), truncated, plus 1 when at least a whole millisecond is past the second. So
/// 2.000 s reads 2, 2.001 s reads 3, 4 µs reads 0, -1 s reads -1.
pub fn whole_seconds_up(duration_ns: i128) -> i64 {
    let seconds = duration_ns / NS_PER_S;
    let subsec_ns = duration_ns % NS_PER_S;
    let whole = trunc_f64(seconds as f64 + subsec_ns as f64 / 1e9);
    if subsec_ns / NS_PER_MS > 0 {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// `value` truncated toward zero into `i64`, saturating at its ends and 0 for NaN: Rust's `as` from `f64`, which
/// is redis-cell's conversion.
fn trunc_f64(value: f64) -> i64 {
    value as i64
}

#[cfg(test)]
mod tests;
