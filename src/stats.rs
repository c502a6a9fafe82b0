//! Counters for `INFO tb`: what the module has decided since it was loaded.
//!
//! Every call lands in exactly one of `allowed`, `reserved_with_wait`, `denied`, `denied_cost_exceeds_burst`,
//! `peeks`, `refunds`, `refunds_ignored`, `charges`, `blocks`, `lowers` and `errors`, so they add up to `calls`.
//! `tokens_granted` sums the cost of allowed and reserved calls, `tokens_refunded` the tokens refunds gave back,
//! `tokens_charged` the cost of charges. A `TB.CHARGE` with a cost above 0 is a charge (it always lands, so it is
//! no grant and never a denial), one with cost 0 a peek, one refused for going too deep into debt an error.
//! Every `TB.BLOCK` that replies is a block, also one that left a longer debt as it was; every `TB.LOWER` that
//! replies is a lower, also one that found the bucket at or below its `tokens` and left it as it was.
//!
//! `CL.THROTTLE` counts as the others do: an allowed call with quantity above 0 as allowed (its quantity in
//! `tokens_granted`), quantity 0 as a peek, a limited call as denied, or as `denied_cost_exceeds_burst` when its
//! quantity exceeds the limit.
//!
//! A call on several buckets is one call: `TB.ACQUIREALL` and `TB.ACQUIREEACH` count once, under the outcome of
//! the whole call (a refusal under the limiting bucket's), and add to `tokens_granted` the largest cost they took
//! from one bucket (`TB.ACQUIREALL` its cost). So `TB.ACQUIREEACH` with one cost everywhere counts what
//! `TB.ACQUIREALL` would; costs of different buckets are often in different units (requests, bytes), and a sum of
//! them would mean nothing. A partial grant (`TB.ACQUIREATMOST`) counts as allowed with the tokens it took, a call
//! that found no whole token as denied, and one whose burst is below one token as `denied_cost_exceeds_burst`.
//!
//! The counters only ever grow (saturating at `u64::MAX`, and `tokens_granted` at the largest finite `f64`): a
//! metrics scraper computes rates from their differences, and a reset it did not see reads as a huge negative
//! rate. `CONFIG RESETSTAT` does not reset them, and no command filter watches for it: a filter sees
//! `CONFIG RESETSTAT` before the server decides to run it, so a client the server then refuses (NOAUTH, NOPERM, a
//! DISCARDed MULTI) could zero them (issue #12), and no server event tells a module that RESETSTAT really ran.
//!
//! Commands and INFO both run on the server's main thread, so the counters need no read-modify-write atomics: a
//! relaxed load and store is enough and costs what a plain `u64` would. They are atomics only because a `static`
//! must be `Sync`.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use crate::bucket::Outcome;
use crate::server::{self, InfoValue};

/// What one call did, as `INFO tb` counts it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tally {
    /// Took `tokens` (> 0) now, to act now.
    Granted {
        tokens: f64,
    },
    /// `TB.RESERVE` took `tokens` now, for the caller to act after a wait.
    GrantedWithWait {
        tokens: f64,
    },
    Denied,
    /// `cost > burst`: can never succeed.
    Impossible,
    /// A cost of 0.
    Peek,
    /// `TB.REFUND` gave back `tokens` (> 0).
    Refunded {
        tokens: f64,
    },
    /// `TB.REFUND` changed nothing (missing key, full bucket, a debt, or amount 0).
    NotRefunded,
    /// `TB.CHARGE` took `tokens` (> 0), into debt where the bucket lacked them.
    Charged {
        tokens: f64,
    },
    /// `TB.BLOCK` (whether it deepened the debt or found a longer one).
    Blocked,
    /// `TB.LOWER` (whether it brought the bucket down or found it at or below its `tokens`).
    Lowered,
    /// Refused with an error reply.
    Error,
}

impl Tally {
    /// The tally of a call that decided `outcome` for `cost` tokens, to act now.
    pub fn of(outcome: Outcome, cost: f64) -> Tally {
        match outcome {
            Outcome::Allowed if cost == 0.0 => Tally::Peek,
            Outcome::Allowed => Tally::Granted { tokens: cost },
            Outcome::Denied => Tally::Denied,
            Outcome::Impossible => Tally::Impossible,
        }
    }
}

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
static RESERVED_WITH_WAIT: Counter = Counter::new();
static REFUNDS: Counter = Counter::new();
static REFUNDS_IGNORED: Counter = Counter::new();
static CHARGES: Counter = Counter::new();
static BLOCKS: Counter = Counter::new();
static LOWERS: Counter = Counter::new();
/// An `f64` sum of granted costs, kept as its bit pattern.
static TOKENS_GRANTED_BITS: Counter = Counter::new();
/// An `f64` sum of refunded tokens, kept as its bit pattern.
static TOKENS_REFUNDED_BITS: Counter = Counter::new();
/// An `f64` sum of charged tokens, kept as its bit pattern.
static TOKENS_CHARGED_BITS: Counter = Counter::new();

/// Counts one call.
pub fn record(tally: Tally) {
    CALLS.add(1);
    let (counter, tokens_sum, tokens) = match tally {
        Tally::Granted { tokens } => (&ALLOWED, Some(&TOKENS_GRANTED_BITS), tokens),
        Tally::GrantedWithWait { tokens } => {
            (&RESERVED_WITH_WAIT, Some(&TOKENS_GRANTED_BITS), tokens)
        }
        Tally::Denied => (&DENIED, None, 0.0),
        Tally::Impossible => (&DENIED_COST_EXCEEDS_BURST, None, 0.0),
        Tally::Peek => (&PEEKS, None, 0.0),
        Tally::Refunded { tokens } => (&REFUNDS, Some(&TOKENS_REFUNDED_BITS), tokens),
        Tally::NotRefunded => (&REFUNDS_IGNORED, None, 0.0),
        Tally::Charged { tokens } => (&CHARGES, Some(&TOKENS_CHARGED_BITS), tokens),
        Tally::Blocked => (&BLOCKS, None, 0.0),
        Tally::Lowered => (&LOWERS, None, 0.0),
        Tally::Error => (&ERRORS, None, 0.0),
    };
    counter.add(1);
    if let Some(sum) = tokens_sum {
        let total = saturating_sum(f64::from_bits(sum.get()), tokens);
        sum.0.store(total.to_bits(), Ordering::Relaxed);
    }
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

/// Adds the `tb_stats` section to `INFO tb`.
pub fn add_info(ctx: &redis_module::InfoContext) {
    let sum = |bits: &Counter| InfoValue::Number(f64::from_bits(bits.get()));
    server::add_info_section(
        ctx,
        c"stats",
        &[
            (c"calls", InfoValue::Count(CALLS.get())),
            (c"allowed", InfoValue::Count(ALLOWED.get())),
            (
                c"reserved_with_wait",
                InfoValue::Count(RESERVED_WITH_WAIT.get()),
            ),
            (c"denied", InfoValue::Count(DENIED.get())),
            (
                c"denied_cost_exceeds_burst",
                InfoValue::Count(DENIED_COST_EXCEEDS_BURST.get()),
            ),
            (c"peeks", InfoValue::Count(PEEKS.get())),
            (c"refunds", InfoValue::Count(REFUNDS.get())),
            (c"refunds_ignored", InfoValue::Count(REFUNDS_IGNORED.get())),
            (c"charges", InfoValue::Count(CHARGES.get())),
            (c"blocks", InfoValue::Count(BLOCKS.get())),
            (c"lowers", InfoValue::Count(LOWERS.get())),
            (c"errors", InfoValue::Count(ERRORS.get())),
            (c"tokens_granted", sum(&TOKENS_GRANTED_BITS)),
            (c"tokens_refunded", sum(&TOKENS_REFUNDED_BITS)),
            (c"tokens_charged", sum(&TOKENS_CHARGED_BITS)),
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
