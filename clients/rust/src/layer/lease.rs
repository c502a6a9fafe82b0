//! Leased limits ([`crate::Limit::lease`]; docs/clients.md, "How a leased limit decides"): the process takes a
//! limit's tokens from Redis in batches (`TB.ACQUIREATMOST`) and admits requests from them in memory, by the
//! workspace core's [`Lease`], which keeps the bound exact over every process.
//!
//! ```text
//! one call    one refill in flight per key; the requests that come meanwhile wait for its end, then are
//!             decided again (leased tokens first)
//! refusals    Redis's refusal is remembered until its retry time: refused requests make no call
//! faults      a refill that fails leaves the request to the leased tokens, then to the layer's fail mode; a
//!             refill whose request is dropped (the client went away) ends as failed, so no one waits on it
//! bounded     at most the local capacity's number of keys hold a lease; a key that finds no place is decided
//!             by its own Redis call, as a limit without lease
//! idle        a lease whose limit is idle is dropped when its place is needed; its tokens are worth less each
//!             moment and none once its grant's reset time has passed
//! ```
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Mutex;

use redis_tb_core::{Admit, Lease, Params, LEASE_IDLE_US};
use tokio::sync::watch;

use crate::replies::{BucketResult, PartialGrant};

/// Redis's latest grant reply for a key: what the headers of a leased limit start from.
#[derive(Clone, Copy, Debug)]
struct Last {
    /// Tokens left in Redis's bucket after the grant.
    remaining: i64,
    reset_after_ms: i64,
    /// When the refill was sent (caller's clock, µs).
    sent_us: i64,
}

/// One key's lease.
struct Slot {
    lease: Lease,
    /// When the refill in flight was sent.
    sent_us: i64,
    last: Option<Last>,
    /// Counts the refills ended (answered or failed): the requests waiting on one watch it.
    ended: watch::Sender<u64>,
}

struct Table {
    slots: HashMap<String, Slot>,
    /// When idle leases were last swept from a full table (caller's clock, µs).
    swept_us: i64,
}

/// The leases of one layer, one per key of a leased limit.
pub(super) struct Leases {
    table: Mutex<Table>,
    capacity: usize,
}

/// What a request of a leased limit does next.
pub(super) enum Step {
    /// Decided: this bucket's result.
    Decided(BucketResult),
    /// Send `TB.ACQUIREATMOST key rate burst max`, then [`Leases::answered`] or [`Leases::failed`].
    Call { max: u64 },
    /// A refill is in flight: wait for it to end, then ask again.
    Wait(watch::Receiver<u64>),
    /// No place for this key's lease: decide it by its own Redis call.
    NoRoom,
}

impl Leases {
    /// Leases for at most `capacity` keys.
    pub(super) fn new(capacity: usize) -> Leases {
        Leases {
            table: Mutex::new(Table {
                slots: HashMap::new(),
                swept_us: i64::MIN,
            }),
            capacity,
        }
    }

    /// Decides one request of `cost` on `key`'s lease at `now_us`.
    pub(super) fn admit(&self, key: &str, params: Params, cost: f64, now_us: i64) -> Step {
        let Ok(mut table) = self.table.lock() else {
            return Step::NoRoom;
        };
        if cost > params.burst() {
            return Step::Decided(BucketResult {
                fits: false,
                remaining: 0,
                retry_after_ms: -1,
                reset_after_ms: 0,
            });
        }
        let Some(slot) = table.slot(key, params, now_us, self.capacity) else {
            return Step::NoRoom;
        };
        match slot.lease.admit(now_us, cost) {
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
        }
    }

    /// The refill of `key` was answered with `grant` at `now_us`: the decision of the request that sent it.
    pub(super) fn answered(
        &self,
        key: &str,
        params: Params,
        grant: &PartialGrant,
        now_us: i64,
    ) -> BucketResult {
        let refused = BucketResult {
            fits: false,
            remaining: grant.remaining,
            retry_after_ms: grant.retry_after_ms,
            reset_after_ms: grant.reset_after_ms,
        };
        let Ok(mut table) = self.table.lock() else {
            return refused;
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
        slot.ended
            .send_modify(|ended| *ended = ended.wrapping_add(1));
        match decision {
            Some(Admit::Spent) => slot.result(true, 0, now_us, &params),
            Some(Admit::Refused { retry_after_ms }) => {
                slot.result(false, retry_after_ms, now_us, &params)
            }
            _ => refused,
        }
    }

    /// The refill of `key` failed (or its request went away): the waiting requests are decided again. When
    /// `cost` is given, spends it from the leased tokens at `now_us` if they hold it: whether they did.
    pub(super) fn failed(&self, key: &str, cost: Option<f64>, now_us: i64) -> Option<BucketResult> {
        let mut table = self.table.lock().ok()?;
        let slot = table.slots.get_mut(key)?;
        slot.lease.failed();
        slot.ended
            .send_modify(|ended| *ended = ended.wrapping_add(1));
        let cost = cost?;
        let params = *slot.lease.params();
        slot.lease
            .spend(now_us, cost)
            .then(|| slot.result(true, 0, now_us, &params))
    }

    /// The state of `key`'s lease as a result, taking nothing: for a leased limit of a request that another of
    /// its limits refused.
    pub(super) fn peek(&self, key: &str, params: Params, cost: f64, now_us: i64) -> BucketResult {
        let table = self.table.lock().ok();
        match table.as_ref().and_then(|table| table.slots.get(key)) {
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

impl Table {
    /// `key`'s slot, a new one if there is room (idle leases are swept from a full table at most once per
    /// [`LEASE_IDLE_US`]).
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
                    .retain(|_, slot| !slot.lease.idle(now_us) || slot.lease.in_flight());
                if self.slots.len() >= capacity {
                    return None;
                }
            }
            let (ended, _) = watch::channel(0);
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
