//! A lease: tokens a process takes from a shared bucket in batches (`TB.ACQUIREATMOST`) and spends in memory,
//! without giving up `burst + rate · t` over all processes together.
//!
//! The rule (docs/clients.md, "How a leased limit decides"): a bucket that refills toward its burst forgets what
//! was taken from it. A grant answered with `reset_after_ms` left the bucket full again `reset_after_ms` later, so
//! of the tokens the grant handed out, at most `rate · (reset - now)` are still counted by the bucket at `now`: all
//! right after the grant, none at the reset. A process spends at most that many of each grant's tokens and drops
//! the rest, never spending or refunding them. Every grant's reply counts the tokens other processes hold, so the
//! grants' tokens lie one above the other in the bucket's deficit, and the sum over processes stays within it.
//!
//! Time is the caller's monotonic clock in microseconds; the reset is measured from when the call was *sent*
//! (the server ran it later, so the true reset is later) less the millisecond the reply's rounding may add: a
//! lease's tokens are valued at most as long as the bucket counts them. Pure, like the rest of the crate.
//!
//! The request whose call asked for a grant is decided by that grant when the reply arrives, from the grant's
//! tokens as they were when Redis granted them, not from their worth at the reply. Its admission counts at the
//! instant Redis took the tokens, exactly as a `TB.ACQUIRE` call's does: the bucket took them for this request,
//! and no other spend can claim them. Only the rest of the grant is valued by `rate · (reset - now)` for the
//! requests after it. Without this, a grant whose worth falls below one request's cost within a round trip (a
//! small burst, a slow link: a grant of the whole deficit is worth `rate · (reset_after - round trip)`, less than
//! itself) would never admit the request that asked for it, which would ask again for ever. So every request is
//! decided by at most one round trip of its own: a grant of at least its cost admits it, a refusal refuses it
//! (with Redis's retry time), a failure leaves it to the leased tokens and then the package's fail mode.
//!
//! The bound over processes holds because, for each grant, the tokens spent from any instant on never exceed what
//! the bucket still counts of that grant at that instant: the asking request's share at the instant Redis granted
//! it (the whole grant is counted then), every later spend by the `rate · (reset - now)` rule. A refund is sent
//! only while the bucket is as the process's latest grant left it ([`Lease::give_back`]).
#![forbid(unsafe_code)]

use super::{Params, MAX_AT_MOST};

/// A lease covers about this long of the process's own recent use: under steady load one refill call per hot
/// limit and process every few tens of milliseconds.
pub const LEASE_HORIZON_US: i64 = 50_000;
/// A lease whose limit has not been used for this long is given back.
pub const LEASE_IDLE_US: i64 = 100_000;
/// One lease takes at most this share of the burst (and at least one token, or the request's cost): what leasing
/// can cost the other processes is bounded by `processes · max_lease`.
pub const MAX_LEASE_SHARE: f64 = 0.1;
/// A grant that the bucket counts for less than this from when it was asked for (its bucket nearly full: it
/// refills what was taken within milliseconds) is not worth leasing: the requests after it are decided by calls
/// of their own ([`Admit::Direct`]), side by side, until a reply says a lease taken now would be worth this long
/// (the bucket's time to full, plus the time it takes to refill the lease itself).
pub const MIN_WORTH_US: i64 = 5_000;
/// Grants kept at once. A process asks again only when it holds too little for a request, so older grants are
/// nearly spent; a further grant drops the one closest to its reset (dropping is always safe).
const MAX_GRANTS: usize = 4;

/// Microseconds in a second and in a millisecond.
const MICROS_PER_SEC: f64 = 1_000_000.0;
const MICROS_PER_MS: i64 = 1_000;

/// The tokens left of one grant, and the instant (caller's clock, µs) from which the bucket counts none of them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Held {
    tokens: f64,
    reset_us: i64,
    /// Which grant this is: the lease's grants are numbered from 1 in the order they arrived.
    number: u64,
}

impl Held {
    /// The part the bucket still counts at `now_us`: `min(tokens, rate · (reset - now))`, never negative.
    fn worth(&self, now_us: i64, params: &Params) -> f64 {
        let left_s = self.reset_us.saturating_sub(now_us).max(0) as f64 / MICROS_PER_SEC;
        self.tokens.min(left_s * params.rate_per_sec()).max(0.0)
    }
}

/// What [`Lease::admit`] decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Admitted with leased tokens; no Redis call.
    Spent,
    /// Refused: Redis refused a refill less than the bucket's retry time ago (refused without a call), or
    /// refused the call this request asked for. Retry after this many milliseconds (rounded up; -1: never, the
    /// burst is below one token).
    Refused { retry_after_ms: i64 },
    /// The lease is short: send `TB.ACQUIREATMOST key rate burst max` now (it is the sending instant the reply
    /// is measured from), then [`Lease::answered`], which decides this request, or [`Lease::failed`], after
    /// which the request is admitted again (leased tokens first, then the package's fail mode).
    Call { max: i64 },
    /// A refill is already in flight: admit the request again when it is answered or has failed.
    Wait,
    /// Leasing does not pay now: the latest reply left the bucket nearly full, so a grant would lose its worth
    /// within [`MIN_WORTH_US`]. Decide this request by a call of its own (`TB.ACQUIRE`), then give its reply to
    /// [`Lease::observed`].
    Direct,
}

/// One process's lease on one limit's bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    params: Params,
    /// Closest to its reset first, spent ones dropped.
    grants: Vec<Held>,
    /// The number of the latest grant (0: none yet).
    latest: u64,
    /// A refill has been sent and not yet answered.
    in_flight: bool,
    /// The cost of the request whose admission sent the refill in flight: the reply decides it.
    asking: Option<f64>,
    /// Redis's last refusal holds until then (caller's clock, µs).
    refused_until_us: Option<i64>,
    /// Tokens requests asked for since `demand_since_us`: the process's own recent rate.
    demand: f64,
    demand_since_us: i64,
    /// The last request (admitted or refused).
    last_use_us: i64,
    /// The latest reply left the bucket within [`MIN_WORTH_US`] of full: requests are decided by calls of their own.
    direct: bool,
    /// The cost of the latest request (a leased limit's requests share one): what `observed` sizes a lease for.
    cost: f64,
    /// When the call of the newest reply so far was sent: a reply to an earlier call, arriving after it, says
    /// nothing newer about the bucket.
    newest_sent_us: i64,
    /// The cost of the requests told to wait on the refill in flight.
    waiting: f64,
    /// The cost of the requests that waited on the refill that ended last and have not been admitted again: a
    /// refill asked for meanwhile covers them too, however long ago they were counted.
    waking: f64,
}

impl Lease {
    /// An empty lease, created at `now_us`.
    pub fn new(params: Params, now_us: i64) -> Lease {
        Lease {
            params,
            grants: Vec::new(),
            latest: 0,
            in_flight: false,
            asking: None,
            refused_until_us: None,
            demand: 0.0,
            demand_since_us: now_us,
            last_use_us: now_us,
            direct: false,
            cost: 1.0,
            newest_sent_us: i64::MIN,
            waiting: 0.0,
            waking: 0.0,
        }
    }

    /// The most tokens one lease asks for: `MAX_LEASE_SHARE` of the burst, at least one.
    pub fn max_lease(&self) -> i64 {
        ((self.params.burst() * MAX_LEASE_SHARE).floor() as i64).clamp(1, MAX_AT_MOST)
    }

    /// Decides one request of `cost` tokens at `now_us`: spend leased tokens, refuse from a remembered refusal,
    /// ask Redis for a lease, wait for the refill in flight, or (the bucket nearly full) call Redis directly. The
    /// caller checks `cost <= burst` beforehand.
    pub fn admit(&mut self, now_us: i64, cost: f64) -> Admit {
        self.decide(now_us, cost, false)
    }

    /// [`Lease::admit`] for a request that waited on a refill and was counted toward the next lease's size then:
    /// decided as any other, counted no more.
    pub fn admit_again(&mut self, now_us: i64, cost: f64) -> Admit {
        self.decide(now_us, cost, true)
    }

    /// [`Lease::admit`]'s decision when it needs no call: `Spent` from the leased tokens, or `Refused` by the
    /// remembered refusal; `None` (nothing changed) when the request must wait for the refill in flight or send
    /// one, which [`Lease::admit`] then decides.
    pub fn admit_held(&mut self, now_us: i64, cost: f64) -> Option<Admit> {
        self.held(now_us, cost, cost)
    }

    /// [`Lease::admit`], the request counted toward the next lease's size unless `counted` already.
    fn decide(&mut self, now_us: i64, cost: f64, counted: bool) -> Admit {
        self.cost = cost;
        let count = if counted { 0.0 } else { cost };
        if counted {
            self.waking = (self.waking - cost).max(0.0);
        }
        if let Some(decided) = self.held(now_us, cost, count) {
            return decided;
        }
        if self.in_flight {
            // Counted now: the requests that wait on a refill are the process's demand as much as those it
            // decides, and with a slow round trip most requests wait.
            self.used(now_us, count);
            self.waiting += cost;
            return Admit::Wait;
        }
        if self.direct {
            self.used(now_us, count);
            return Admit::Direct;
        }
        if counted {
            // The size counts the asking request once.
            self.demand = (self.demand - cost).max(0.0);
        }
        self.ask(now_us, cost)
    }

    /// [`Lease::admit_held`], counting `count` tokens toward the next lease's size.
    fn held(&mut self, now_us: i64, cost: f64, count: f64) -> Option<Admit> {
        if self.spend(now_us, cost) {
            self.used(now_us, count);
            return Some(Admit::Spent);
        }
        if self.in_flight {
            return None;
        }
        let refused = self.refused(now_us)?;
        self.used(now_us, count);
        Some(refused)
    }

    /// A refill for a request of `cost` at `now_us`: in flight from now.
    fn ask(&mut self, now_us: i64, cost: f64) -> Admit {
        self.in_flight = true;
        self.asking = Some(cost);
        Admit::Call {
            max: self.next_size(now_us, cost),
        }
    }

    /// The reply, arrived at `now_us`, to the refill sent at `sent_us`: `[granted, remaining, retry_after_ms,
    /// reset_after_ms]` of `TB.ACQUIREATMOST`. Returns the decision for the request whose admission sent the call
    /// (`None` when no request asked, as for a call the caller sent on its own): `Spent` when the grant, with the
    /// leased tokens worth something at `now_us`, covers its cost, the grant's own tokens first and whole (they
    /// count as taken when Redis granted them); otherwise `Refused`. The rest of a grant is held until
    /// `sent + reset_after - 1 ms`; a refusal is remembered until `sent + retry_after` (for ever when
    /// `retry_after_ms` is -1: the burst is below one token).
    pub fn answered(
        &mut self,
        sent_us: i64,
        now_us: i64,
        granted: i64,
        retry_after_ms: i64,
        reset_after_ms: i64,
    ) -> Option<Admit> {
        self.ended();
        let asking = self.asking.take();
        let worth_us = counted_for_us(reset_after_ms);
        let reset_us = sent_us.saturating_add(worth_us);
        let newest = self.newest(sent_us);
        if newest {
            // A refusal finds the bucket empty, where a grant keeps its worth longest. Measured from when the call
            // was sent, as `observed` measures: a slow round trip does not turn leasing on and off.
            self.direct = granted > 0 && worth_us < MIN_WORTH_US;
        }
        if granted <= 0 {
            let until_us = refused_until(sent_us, retry_after_ms);
            if newest {
                self.refused_until_us = Some(until_us);
            }
            // The request that asked waits what this reply says, whether or not it is the newest news.
            return asking.map(|cost| {
                self.used(now_us, cost);
                refusal(until_us, now_us)
            });
        }
        if newest {
            self.refused_until_us = None;
        }
        // i64 -> f64: a grant is at most 2^53, exact.
        let mut tokens = granted as f64;
        self.latest = self.latest.saturating_add(1);
        let decision = asking.map(|cost| {
            // The request counts toward the next lease's size as every decided request does: counting only those
            // admitted from held tokens, a lease the asking request takes whole would never grow.
            self.used(now_us, cost);
            let own = tokens.min(cost);
            if own >= cost || self.spend(now_us, cost - own) {
                tokens -= own;
                return Admit::Spent;
            }
            // Redis held fewer whole tokens than the cost: the part missing, at the bucket's rate.
            let missing = cost - tokens - self.spendable(now_us);
            let wait_ms = (missing / self.params.rate_per_sec() * 1_000.0).ceil();
            Admit::Refused {
                retry_after_ms: (wait_ms as i64).max(1),
            }
        });
        if tokens > 0.0 {
            if self.grants.len() >= MAX_GRANTS {
                self.grants.remove(0);
            }
            self.grants.push(Held {
                tokens,
                reset_us,
                number: self.latest,
            });
            // Spent closest to their reset first: those lose their worth soonest.
            self.grants.sort_by_key(|held| held.reset_us);
        }
        decision
    }

    /// The refill failed (an error, a timeout): nothing is known to be granted. Tokens Redis may have granted
    /// are never spent, which only under-admits. The waiting requests are decided again, from the leased tokens
    /// first.
    pub fn failed(&mut self) {
        self.ended();
        // The requests that waited are decided by the tokens held, then calls of their own: none asks again.
        self.waking = 0.0;
        self.asking = None;
    }

    /// The refill was dropped before its reply (its request went away): nothing is known to be granted, and the
    /// requests that waited on it are admitted again ([`Lease::admit_again`]), the first of them sending a refill
    /// that covers the others.
    pub fn dropped(&mut self) {
        self.ended();
        self.asking = None;
    }

    /// The refill in flight ended: the requests that waited on it are to be admitted again.
    fn ended(&mut self) {
        self.in_flight = false;
        self.waking = std::mem::take(&mut self.waiting);
    }

    /// The reply `[allowed, retry_after_ms, reset_after_ms]`, arrived at `now_us`, to a request's own call sent at
    /// `sent_us` ([`Admit::Direct`], or any call made for this limit without the lease; the lease's requests all
    /// have the limit's one cost). A refusal is remembered until `sent + retry_after`, as a refill's is; an
    /// allowance forgets a remembered refusal. Leasing pays again once a lease taken now, of the size
    /// [`Lease::next_size`] would ask for the latest request's cost, would be worth at least [`MIN_WORTH_US`]: the
    /// bucket's time to full after this call, plus the time it takes to refill that lease.
    /// A reply to a call sent before that of a reply already given (own calls run side by side, and their replies
    /// may arrive out of order) is older news of the bucket and changes nothing.
    pub fn observed(
        &mut self,
        sent_us: i64,
        now_us: i64,
        allowed: bool,
        retry_after_ms: i64,
        reset_after_ms: i64,
    ) {
        if !self.newest(sent_us) {
            return;
        }
        if allowed {
            self.refused_until_us = None;
        } else if retry_after_ms > 0 {
            self.refused_until_us = Some(refused_until(sent_us, retry_after_ms));
        }
        // i64 -> f64: a lease is at most 2^53 tokens, exact.
        let refill_us = (self.size_for(now_us, self.cost) as f64 / self.params.rate_per_sec()
            * MICROS_PER_SEC) as i64;
        self.direct = counted_for_us(reset_after_ms).saturating_add(refill_us) < MIN_WORTH_US;
    }

    /// Whether a refill is in flight.
    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// The limit's parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Whether the limit has not been used for [`LEASE_IDLE_US`] at `now_us`.
    pub fn idle(&self, now_us: i64) -> bool {
        now_us.saturating_sub(self.last_use_us) >= LEASE_IDLE_US
    }

    /// Tokens the process may spend at `now_us`: over its grants, `min(held, rate · (reset - now))`.
    pub fn spendable(&self, now_us: i64) -> f64 {
        self.grants
            .iter()
            .map(|held| held.worth(now_us, &self.params))
            .sum()
    }

    /// Spends `cost` leased tokens at `now_us` if the lease holds that many, the grants closest to their reset
    /// first; otherwise spends nothing. Each grant first drops what the bucket no longer counts.
    pub fn spend(&mut self, now_us: i64, cost: f64) -> bool {
        let params = self.params;
        for held in &mut self.grants {
            held.tokens = held.worth(now_us, &params);
        }
        self.grants.retain(|held| held.tokens > 0.0);
        if self.spendable(now_us) < cost {
            return false;
        }
        let mut owed = cost;
        for held in &mut self.grants {
            let take = held.tokens.min(owed);
            held.tokens -= take;
            owed -= take;
        }
        self.grants.retain(|held| held.tokens > 0.0);
        true
    }

    /// Whether the lease is due to be given back at `now_us`: it holds tokens, no refill is in flight, and its
    /// limit has not been used for [`LEASE_IDLE_US`].
    pub fn refund_due(&self, now_us: i64) -> bool {
        !self.in_flight && self.idle(now_us) && self.refundable(now_us) > 0.0
    }

    /// What a refund sent at `now_us` may give back: the part of the *latest* grant the bucket still counts (none
    /// once that grant is spent: an older grant is never refunded).
    /// Only while the bucket is as that grant left it (see [`Lease::give_back`]) does a refund remove exactly
    /// these tokens; tokens of older grants may lie below other processes' later grants, and are dropped.
    pub fn refundable(&self, now_us: i64) -> f64 {
        self.grants
            .iter()
            .find(|held| held.number == self.latest)
            .map_or(0.0, |held| held.worth(now_us, &self.params))
    }

    /// Ends the lease at `now_us` (idle, shutdown): returns the amount to send as `TB.REFUND key rate burst
    /// amount` (0: send nothing) and drops every held token. `unchanged` says whether the bucket has not been
    /// written since the latest grant (in Redis: its stored `tokens`/`ts` as read with the grant, checked under
    /// `WATCH` and refunded in `MULTI`). Any other refund could lower the bucket below tokens other processes
    /// still hold, which then outlive their worth; so without that proof nothing is refunded.
    pub fn give_back(&mut self, now_us: i64, unchanged: bool) -> f64 {
        let amount = if unchanged {
            self.refundable(now_us)
        } else {
            0.0
        };
        self.grants.clear();
        amount
    }

    /// The remembered refusal, if it still holds at `now_us`.
    fn refused(&self, now_us: i64) -> Option<Admit> {
        let until_us = self.refused_until_us.filter(|until| *until > now_us)?;
        Some(refusal(until_us, now_us))
    }

    /// Whether the reply to a call sent at `sent_us` is the newest news of the bucket so far; if so, it is from now
    /// on.
    fn newest(&mut self, sent_us: i64) -> bool {
        if sent_us < self.newest_sent_us {
            return false;
        }
        self.newest_sent_us = sent_us;
        true
    }

    /// Records a request of `cost` tokens at `now_us` for the lease size and the idle timer.
    fn used(&mut self, now_us: i64, cost: f64) {
        self.demand += cost;
        self.last_use_us = now_us;
    }

    /// The size of the next lease at `now_us` for a request of `cost`: the tokens the process asked for per
    /// second since the last refill, times [`LEASE_HORIZON_US`], and at least what the requests still to be
    /// admitted after the last refill ask for with this one, rounded up; at least `cost` (rounded up) and
    /// otherwise at most [`Lease::max_lease`]. Starts a new measuring window.
    pub fn next_size(&mut self, now_us: i64, cost: f64) -> i64 {
        let size = self.size_for(now_us, cost);
        self.demand = 0.0;
        self.demand_since_us = now_us;
        // This refill covers the requests still to be admitted; those told to wait on it count in `waiting`.
        self.waking = 0.0;
        size
    }

    /// [`Lease::next_size`] without starting a new window.
    fn size_for(&self, now_us: i64, cost: f64) -> i64 {
        let window_us = now_us
            .saturating_sub(self.demand_since_us)
            .max(LEASE_HORIZON_US);
        let wanted = ((self.demand + cost) * LEASE_HORIZON_US as f64 / window_us as f64)
            .max(self.waking + cost);
        let need = (cost.ceil() as i64).clamp(1, MAX_AT_MOST);
        (wanted.ceil() as i64).clamp(1, self.max_lease()).max(need)
    }
}

/// Until when a refusal of a call sent at `sent_us` holds: `retry_after_ms` later, for ever when it is -1 (the
/// burst is below one token).
fn refused_until(sent_us: i64, retry_after_ms: i64) -> i64 {
    if retry_after_ms < 0 {
        i64::MAX
    } else {
        sent_us.saturating_add(retry_after_ms.saturating_mul(MICROS_PER_MS))
    }
}

/// The refusal at `now_us` of a request refused until `until_us`: its wait rounded up to the millisecond (0 once
/// it has passed), -1 when it holds for ever.
fn refusal(until_us: i64, now_us: i64) -> Admit {
    let retry_after_ms = if until_us == i64::MAX {
        -1
    } else {
        until_us
            .saturating_sub(now_us)
            .max(0)
            .saturating_add(MICROS_PER_MS - 1)
            / MICROS_PER_MS
    };
    Admit::Refused { retry_after_ms }
}

/// How long after a call was sent the bucket still counts what it took, from the reply's `reset_after_ms`: less
/// the millisecond the reply's rounding may add.
fn counted_for_us(reset_after_ms: i64) -> i64 {
    reset_after_ms
        .saturating_mul(MICROS_PER_MS)
        .saturating_sub(MICROS_PER_MS)
}

#[cfg(test)]
mod tests;
