//! Leased limits ([`crate::Limit::lease`]; docs/clients.md, "How a leased limit decides"): the process takes a
//! limit's tokens from Redis in batches (`TB.ACQUIREATMOST`) and admits requests from them in memory, by the
//! workspace core's [`Lease`], which keeps the bound exact over every process.
//!
//! ```text
//! one call    one refill in flight per key; the requests that come meanwhile wait for its end (at most the
//!             client's timeout), counted toward the next lease's size, then are decided again
//! refusals    Redis's refusal is remembered until its retry time: refused requests make no call
//! faults      a refill that fails leaves its request to the leased tokens, then to the layer's fail mode; the
//!             requests that waited on it take the leased tokens, then a call of their own
//! bounded     at most the local capacity's number of keys hold a lease; a key that finds no place is decided
//!             by its own Redis call, as a limit without lease; idle leases make room
//! direct      where grants lose their worth within milliseconds (the bucket nearly full), each request is
//!             decided by its own Redis call, side by side, until a lease would pay again
//! ```
//!
//! The clock is read under the table's lock, so that no decision values held tokens at an earlier instant than
//! the one it is made at.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use foldhash::fast::RandomState;
use redis_tb_core::{Admit, Lease, Params, LEASE_IDLE_US};
use tokio::sync::watch;

use crate::replies::{BucketResult, PartialGrant};

/// Redis's latest grant reply for a key: what the headers of a leased limit start from.
#[derive(Clone, Copy, Debug)]
struct Last {
    /// Tokens left in Redis's bucket after the grant.
    remaining: i64,
    reset_after_ms: i64,
    /// When the refill was sent (the table's clock, µs).
    sent_us: i64,
}

/// How the latest refill of a key ended, for the requests that waited on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Ended {
    /// Counts the refills ended.
    round: u64,
    /// It failed: the requests that waited take the leased tokens, then a call of their own each (whose failure
    /// takes the fail mode).
    pub(super) failed: bool,
}

/// One key's lease.
struct Slot {
    lease: Lease,
    /// When the refill in flight was sent.
    sent_us: i64,
    last: Option<Last>,
    ended: watch::Sender<Ended>,
}

struct Table {
    slots: HashMap<String, Slot, RandomState>,
    /// When idle leases were last swept from a full table (µs).
    swept_us: i64,
}

/// The leases of one layer, one per key of a leased limit.
pub(super) struct Leases {
    table: Mutex<Table>,
    capacity: usize,
    epoch: Instant,
}

/// What a request of a leased limit does next.
pub(super) enum Step {
    /// Decided: this bucket's result.
    Decided(BucketResult),
    /// Send `TB.ACQUIREATMOST key rate burst max`, then [`Leases::answered`] or [`Leases::failed`] (a
    /// [`Refilling`] sees to the latter).
    Call { max: u64 },
    /// A refill is in flight: wait for it to end, then ask again with `waited`.
    Wait(watch::Receiver<Ended>),
    /// No place for this key's lease: decide it by its own Redis call.
    NoRoom,
    /// The bucket is nearly full, where a grant loses its worth within milliseconds: decide it by its own Redis
    /// call, beside the others ([`Leases::observed`] hears its reply).
    Direct,
}

impl Leases {
    /// Leases for at most `capacity` keys.
    pub(super) fn new(capacity: usize) -> Leases {
        Leases {
            table: Mutex::new(Table {
                slots: HashMap::default(),
                swept_us: i64::MIN,
            }),
            capacity,
            epoch: Instant::now(),
        }
    }

    /// The table, whatever panicked while holding it before: every path through it leaves it consistent, and
    /// waiting requests must still hear of each refill's end.
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The clock the leases are kept on (µs).
    pub(super) fn now_us(&self) -> i64 {
        i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX)
    }

    /// The decision for one request of `cost` on `key` when the lease can make it without a call: from the
    /// tokens it holds, or by Redis's remembered refusal. `None`: the request must wait or send a refill
    /// ([`Leases::admit`]), or the key has no lease yet. Nothing changes then.
    pub(super) fn held(&self, key: &str, params: Params, cost: f64) -> Option<BucketResult> {
        if cost > params.burst() {
            return Some(never());
        }
        let mut table = self.table();
        let now_us = self.now_us();
        let slot = table.slots.get_mut(key)?;
        match slot.lease.admit_held(now_us, cost)? {
            Admit::Spent => Some(slot.result(true, 0, now_us, &params)),
            Admit::Refused { retry_after_ms } => {
                Some(slot.result(false, retry_after_ms, now_us, &params))
            }
            Admit::Call { .. } | Admit::Wait | Admit::Direct => None,
        }
    }

    /// Decides one request of `cost` on `key`'s lease: spend leased tokens, refuse from a remembered refusal,
    /// send a refill, wait for the one in flight, or call Redis directly. `waited`: the request waited on a refill
    /// before, and was counted toward the next lease's size then.
    pub(super) fn admit(&self, key: &str, params: Params, cost: f64, waited: bool) -> Step {
        if cost > params.burst() {
            return Step::Decided(never());
        }
        let mut table = self.table();
        let now_us = self.now_us();
        let Some(slot) = table.slot(key, params, now_us, self.capacity) else {
            return Step::NoRoom;
        };
        let admit = if waited {
            slot.lease.admit_again(now_us, cost)
        } else {
            slot.lease.admit(now_us, cost)
        };
        match admit {
            Admit::Spent => Step::Decided(slot.result(true, 0, now_us, &params)),
            Admit::Refused { retry_after_ms } => {
                Step::Decided(slot.result(false, retry_after_ms, now_us, &params))
            }
            Admit::Call { max } => {
                slot.sent_us = now_us;
                Step::Call {
                    max: u64::try_from(max).unwrap_or(1).max(1),
                }
            }
            Admit::Wait => Step::Wait(slot.ended.subscribe()),
            Admit::Direct => Step::Direct,
        }
    }

    /// The refill of `key` was answered with `grant`: the decision of the request that sent it (its tokens
    /// count as taken when Redis granted them).
    pub(super) fn answered(&self, key: &str, params: Params, grant: &PartialGrant) -> BucketResult {
        let mut table = self.table();
        let now_us = self.now_us();
        let refused = BucketResult {
            fits: false,
            remaining: grant.remaining,
            retry_after_ms: grant.retry_after_ms,
            reset_after_ms: grant.reset_after_ms,
        };
        let Some(slot) = table.slots.get_mut(key) else {
            return refused;
        };
        let sent_us = slot.sent_us;
        let decision = slot.lease.answered(
            sent_us,
            now_us,
            grant.granted,
            grant.retry_after_ms,
            grant.reset_after_ms,
        );
        slot.last = Some(Last {
            remaining: grant.remaining,
            reset_after_ms: grant.reset_after_ms,
            sent_us,
        });
        slot.ended.send_modify(|ended| {
            ended.round = ended.round.wrapping_add(1);
            ended.failed = false;
        });
        match decision {
            Some(Admit::Spent) => slot.result(true, 0, now_us, &params),
            Some(Admit::Refused { retry_after_ms }) => {
                slot.result(false, retry_after_ms, now_us, &params)
            }
            _ => refused,
        }
    }

    /// The refill of `key` ended without a grant: `failed` when Redis failed it, else it was dropped before it
    /// was sent (its request went away during its charge-backs). The requests waiting on it are told.
    pub(super) fn ended_without_grant(&self, key: &str, failed: bool) {
        let mut table = self.table();
        if let Some(slot) = table.slots.get_mut(key) {
            if failed {
                slot.lease.failed();
            } else {
                slot.lease.dropped();
            }
            slot.ended.send_modify(|ended| {
                ended.round = ended.round.wrapping_add(1);
                ended.failed = failed;
            });
        }
    }

    /// Redis answered a call of `key`'s own (not a refill), sent at `sent_us`, with `result`: its refusal is
    /// remembered, and whether leasing pays again.
    pub(super) fn observed(&self, key: &str, sent_us: i64, result: &BucketResult) {
        let mut table = self.table();
        let now_us = self.now_us();
        if let Some(slot) = table.slots.get_mut(key) {
            slot.lease.observed(
                sent_us,
                now_us,
                result.fits,
                result.retry_after_ms,
                result.reset_after_ms,
            );
        }
    }

    /// After a failed refill: `cost` from the leased tokens, if they hold it.
    pub(super) fn spend_held(&self, key: &str, params: Params, cost: f64) -> Option<BucketResult> {
        let mut table = self.table();
        let now_us = self.now_us();
        let slot = table.slots.get_mut(key)?;
        slot.lease
            .spend(now_us, cost)
            .then(|| slot.result(true, 0, now_us, &params))
    }

    /// The state of `key`'s lease as a result, taking nothing: for a leased limit of a request that another of
    /// its limits refused.
    pub(super) fn peek(&self, key: &str, params: Params, cost: f64) -> BucketResult {
        let table = self.table();
        let now_us = self.now_us();
        match table.slots.get(key) {
            Some(slot) => {
                let fits = slot.lease.spendable(now_us) >= cost;
                slot.result(fits, 0, now_us, &params)
            }
            None => BucketResult {
                fits: true,
                remaining: params.burst().floor() as i64,
                retry_after_ms: 0,
                reset_after_ms: 0,
            },
        }
    }
}

/// The result for a cost above the burst: refused, and waiting never helps.
fn never() -> BucketResult {
    BucketResult {
        fits: false,
        remaining: 0,
        retry_after_ms: -1,
        reset_after_ms: 0,
    }
}

impl Table {
    /// `key`'s slot, a new one if there is room (idle leases are swept from a full table at most once per
    /// [`LEASE_IDLE_US`], so a flood of new keys costs no sweep each).
    fn slot(
        &mut self,
        key: &str,
        params: Params,
        now_us: i64,
        capacity: usize,
    ) -> Option<&mut Slot> {
        if !self.slots.contains_key(key) {
            if self.slots.len() >= capacity {
                if now_us.saturating_sub(self.swept_us) < LEASE_IDLE_US {
                    return None;
                }
                self.swept_us = now_us;
                self.slots
                    .retain(|_, slot| slot.lease.in_flight() || !slot.lease.idle(now_us));
                if self.slots.len() >= capacity {
                    return None;
                }
            }
            let (ended, _) = watch::channel(Ended::default());
            self.slots.insert(
                key.to_owned(),
                Slot {
                    lease: Lease::new(params, now_us),
                    sent_us: now_us,
                    last: None,
                    ended,
                },
            );
        }
        self.slots.get_mut(key)
    }
}

impl Slot {
    /// A result for this lease at `now_us`: `remaining` is what Redis last said it kept plus what this process
    /// may still spend of its grants; the reset counts from Redis's last reply.
    fn result(
        &self,
        fits: bool,
        retry_after_ms: i64,
        now_us: i64,
        params: &Params,
    ) -> BucketResult {
        let spendable = self.lease.spendable(now_us);
        let (remaining, reset_after_ms) = match self.last {
            Some(last) => {
                let elapsed_ms = now_us.saturating_sub(last.sent_us).max(0) / 1_000;
                (
                    last.remaining as f64 + spendable,
                    last.reset_after_ms.saturating_sub(elapsed_ms).max(0),
                )
            }
            None => (params.burst(), 0),
        };
        BucketResult {
            fits,
            remaining: remaining.min(params.burst()).floor().max(0.0) as i64,
            retry_after_ms,
            reset_after_ms,
        }
    }
}

/// A refill under way: dropped before it ended (its request went away before it was sent, or its task
/// panicked), it ends without a grant, not failed: the requests waiting on it are decided again, and one of
/// them sends the next refill.
pub(super) struct Refilling {
    leases: Arc<Leases>,
    key: String,
    ended: bool,
}

impl Refilling {
    pub(super) fn new(leases: Arc<Leases>, key: &str) -> Refilling {
        Refilling {
            leases,
            key: key.to_owned(),
            ended: false,
        }
    }

    /// The refill's reply: the decision of its request; waiting requests are told.
    pub(super) fn answered(mut self, params: Params, grant: &PartialGrant) -> BucketResult {
        self.ended = true;
        self.leases.answered(&self.key, params, grant)
    }

    /// The refill failed; waiting requests are told.
    pub(super) fn failed(mut self) {
        self.ended = true;
        self.leases.ended_without_grant(&self.key, true);
    }
}

impl Drop for Refilling {
    fn drop(&mut self) {
        if !self.ended {
            self.leases.ended_without_grant(&self.key, false);
        }
    }
}
