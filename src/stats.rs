//! Counters for `INFO tb`: what the module has decided since it was loaded.
//!
//! Every call lands in exactly one of `allowed`, `denied`, `denied_cost_exceeds_burst`, `peeks` and `errors`, so
//! they add up to `calls`. `tokens_granted` sums the cost of allowed calls.
//!
//! The counters only ever grow (saturating at `u64::MAX`, and `tokens_granted` at the largest finite `f64`): a
//! metrics scraper computes rates from their differences, and a reset it did not see reads as a huge negative
//! rate. `CONFIG RESETSTAT` does not reset them. An earlier version reset them from a command filter that saw
//! `CONFIG RESETSTAT` before the server decided to run it, so a client the server then refused (NOAUTH, NOPERM,
//! a DISCARDed MULTI) could zero them (issue #12); no server event tells a module that RESETSTAT really ran.
//!
//! Commands and INFO both run on the server's main thread, so the counters need no read-modify-write atomics: a
//! relaxed load and store is enough and costs what a plain `u64` would. They are atomics only because a `static`
//! must be `Sync`.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use crate::bucket::Outcome;
use crate::server::{self, InfoValue};

/// A counter bumped only from the server's main thread.
struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    fn add(&self, n: u64) {
        self.0
            .store(self.get().saturating_add(n), Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

static CALLS: Counter = Counter::new();
static ALLOWED: Counter = Counter::new();
static DENIED: Counter = Counter::new();
static DENIED_COST_EXCEEDS_BURST: Counter = Counter::new();
static PEEKS: Counter = Counter::new();
static ERRORS: Counter = Counter::new();
/// An `f64` sum of granted costs, kept as its bit pattern.
static TOKENS_GRANTED_BITS: Counter = Counter::new();

/// Counts one decided call that asked for `cost` tokens (from one bucket, or from each of several).
pub fn record(outcome: Outcome, cost: f64) {
    CALLS.add(1);
    match outcome {
        Outcome::Allowed if cost == 0.0 => PEEKS.add(1),
        Outcome::Allowed => {
            ALLOWED.add(1);
            let granted = saturating_sum(f64::from_bits(TOKENS_GRANTED_BITS.get()), cost);
            TOKENS_GRANTED_BITS
                .0
                .store(granted.to_bits(), Ordering::Relaxed);
        }
        Outcome::Denied => DENIED.add(1),
        Outcome::Impossible => DENIED_COST_EXCEEDS_BURST.add(1),
    }
}

/// Counts one call refused with an error.
pub fn record_error() {
    CALLS.add(1);
    ERRORS.add(1);
}

/// `total + cost`, held at `f64::MAX` instead of overflowing to infinity: costs are finite, but a few near
/// `f64::MAX` add up past it.
fn saturating_sum(total: f64, cost: f64) -> f64 {
    let sum = total + cost;
    if sum.is_finite() {
        sum
    } else {
        f64::MAX
    }
}

/// The counters as `INFO` shows them, in order.
pub struct Snapshot {
    pub calls: u64,
    pub allowed: u64,
    pub denied: u64,
    pub denied_cost_exceeds_burst: u64,
    pub peeks: u64,
    pub errors: u64,
    pub tokens_granted: f64,
}

pub fn snapshot() -> Snapshot {
    Snapshot {
        calls: CALLS.get(),
        allowed: ALLOWED.get(),
        denied: DENIED.get(),
        denied_cost_exceeds_burst: DENIED_COST_EXCEEDS_BURST.get(),
        peeks: PEEKS.get(),
        errors: ERRORS.get(),
        tokens_granted: f64::from_bits(TOKENS_GRANTED_BITS.get()),
    }
}

/// Adds the `tb_stats` section to `INFO tb`.
pub fn add_info(ctx: &redis_module::InfoContext) {
    let now = snapshot();
    server::add_info_section(
        ctx,
        c"stats",
        &[
            (c"calls", InfoValue::Count(now.calls)),
            (c"allowed", InfoValue::Count(now.allowed)),
            (c"denied", InfoValue::Count(now.denied)),
            (
                c"denied_cost_exceeds_burst",
                InfoValue::Count(now.denied_cost_exceeds_burst),
            ),
            (c"peeks", InfoValue::Count(now.peeks)),
            (c"errors", InfoValue::Count(now.errors)),
            (c"tokens_granted", InfoValue::Number(now.tokens_granted)),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_sum_saturates_at_the_largest_finite_value() {
        assert_eq!(saturating_sum(f64::MAX, f64::MAX), f64::MAX);
        assert_eq!(saturating_sum(1e308, 1e308), f64::MAX);
        assert_eq!(saturating_sum(1.5, 3.0), 4.5);
    }

    #[test]
    fn counters_saturate() {
        let counter = Counter::new();
        counter.add(u64::MAX - 1);
        counter.add(5);
        assert_eq!(counter.get(), u64::MAX);
    }
}
