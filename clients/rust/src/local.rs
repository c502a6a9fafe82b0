//! In-memory token buckets: what the fail mode `local` limits with while Redis fails (docs/clients.md, "When
//! Redis fails"; `fixtures/local.json` holds the rule as call sequences). One process's buckets, with the keys and
//! limits of the Redis ones, so a fault never means "unlimited" and never hands out a fresh burst:
//!
//! ```text
//! per call     a call that fails is decided by the buckets of its own keys; an answer for another key
//!              never clears or refills them
//! continues    each answer Redis gives for a key is remembered: the bucket holds
//!              burst - rate * reset_after_ms / 1000 - owed - charging tokens as of that moment (negative in
//!              debt), what Redis has not seen yet still taken; an accepted floor shows Redis has seen
//!              everything admitted before it was made, whatever became of earlier charge-backs
//! owed         what a bucket admitted is owed to Redis until a charge-back covers it
//! charging     what charge-backs in flight cover, each its own share, until its outcome is known: accepted
//!              (the share leaves), failed like a fault (the share is owed again) or refused by a
//!              configuration error (the share is dropped) ([`LocalBuckets::charge_ended`])
//! floor        before each call for a diverged key (owed or charging above 0) that reaches Redis, the caller
//!              sends TB.LOWER key rate burst <tokens>, tokens being the bucket's now
//!              ([`LocalBuckets::charge_backs`]): Redis comes down to what this process's history allows and no
//!              lower. A minimum is idempotent, so every call sends its own and none charges twice
//! bounded      at most `capacity` keys; a new key takes the place of one of the 16 least recently used that
//!              is full again and not diverged, else it shares its limit's overflow bucket (never charged back)
//! ```
//!
//! The arithmetic is the module's own, the workspace crate `redis-tb-core`: the refill, whether a cost fits, the
//! reply fields and the rule for a clock that steps back are the ones `TB.ACQUIREEACH` runs. This file keeps what
//! only a client has (the table, what is owed, the charge-backs) and converts at its boundary: the caller passes a
//! monotonic clock in milliseconds, the core counts integer microseconds. Pure, no I/O, no clock of its own.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};

use foldhash::fast::RandomState;
use redis_tb_core::{self as bucket, Cost, Member, Params, State, MAX_WAIT_LIMIT_MS};

use crate::error::Error;
use crate::failure::Action;
use crate::replies::{AcquiredEach, BucketResult};

/// Keys kept unless another capacity is set.
pub const DEFAULT_CAPACITY: usize = 10_000;
/// A floor is never below a day of refill in debt: the bound `TB.LOWER` accepts, as `TB.CHARGE`'s (the core's
/// [`MAX_WAIT_LIMIT_MS`]), in seconds.
const DEBT_BOUND_S: f64 = (MAX_WAIT_LIMIT_MS / 1_000) as f64;
/// How many of the least recently used keys a new key may take the place of.
const EVICTION_WINDOW: usize = 16;

/// One bucket of a call: its key, the name of its limit (which names the overflow bucket), the limit's rate
/// (tokens per second) and burst, and the cost the call takes from it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalBucket<'a> {
    pub key: &'a str,
    pub limit: &'a str,
    pub rate: f64,
    pub burst: f64,
    pub cost: f64,
}

/// A charge-back the caller sends before a call that reaches Redis: `TB.LOWER key rate burst tokens`.
#[derive(Clone, Debug, PartialEq)]
pub struct ChargeBack {
    pub key: String,
    pub rate: f64,
    pub burst: f64,
    /// The floor: the in-memory bucket's tokens when the charge-back was made, at least a day of refill in debt
    /// (`-rate * 86400`).
    pub tokens: f64,
    /// The tokens admitted in memory this charge-back covers, moved from `owed` to `charging` when it was made;
    /// 0 when charge-backs already in flight cover everything admitted.
    pub share: f64,
    /// Everything the bucket had admitted in memory when it was made (its `admitted`): the floor covers all of it,
    /// so once Redis accepts it, Redis has seen that much, whatever became of earlier charge-backs.
    covers: f64,
    /// The entry it was made for (`Entry::born`): a key that left the table and came back is a new count.
    entry: u64,
}

/// How a charge-back ended, for [`LocalBuckets::charge_ended`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// Redis took it: what it covered is in Redis's bucket.
    Accepted,
    /// No reply, or an error of a fault (a fail-mode row of the failure table): what it covered is owed again,
    /// and the call it went before is decided in memory. Also what a charge-back never sent, or dropped unanswered
    /// with its call, comes to: sending the floor again is harmless.
    Failed,
    /// A configuration error (`NOPERM`, a script error, ...): what it covered is dropped, and the call goes on to
    /// Redis; a limiter that can never charge back must not stay in memory for good.
    Refused,
}

impl ChargeOutcome {
    /// The outcome of a charge-back that failed with `err`: refused only by the server's own error reply of a
    /// row that does not take the fail mode (a configuration error); failed for a fault's reply and for every
    /// error of the client's own (no reply, a lost connection, a reply of an unexpected shape), which says nothing
    /// of what the server did.
    pub fn of_error(err: &Error) -> ChargeOutcome {
        if err.is_server_reply() && err.failure().action != Action::FailMode {
            ChargeOutcome::Refused
        } else {
            ChargeOutcome::Failed
        }
    }
}

/// The core's time from the caller's monotonic milliseconds: whole microseconds, saturating (`as` from f64
/// saturates at the bounds and maps NaN to 0).
fn micros(now_ms: f64) -> i64 {
    (now_ms * 1_000.0).round() as i64
}

/// The core's parameters of `bucket`: `None` for a rate or burst that is not a finite number above 0, which
/// [`crate::Limit`] never builds.
fn params_of(bucket: &LocalBucket<'_>) -> Option<Params> {
    Params::new(bucket.rate, bucket.burst).ok()
}

#[derive(Clone, Debug)]
struct Entry {
    params: Params,
    /// The bucket as the core sees it: tokens as of `updated_us` (the caller's clock in microseconds), at most
    /// `burst`, negative for a bucket in debt.
    held: State,
    /// Tokens admitted in memory that no charge-back sent covers; >= 0.
    owed: f64,
    /// Tokens covered by charge-backs in flight: the sum of their shares; >= 0, exactly 0 when `in_flight` is.
    charging: f64,
    /// Charge-backs in flight with a share above 0. Counted, so that `charging` returns to exactly 0 however
    /// their shares added up in floating point.
    in_flight: u32,
    /// Every token this bucket has admitted in memory, summed; only grows.
    admitted: f64,
    /// The largest `covers` of an accepted charge-back: Redis has seen this much of `admitted`.
    confirmed: f64,
    /// Unique to this entry (the recency counter when it was inserted).
    born: u64,
    /// Its place in the recency order (`LocalBuckets::order`).
    used: u64,
}

impl Entry {
    /// Whether Redis has not seen everything this bucket admitted: its calls send a floor first, and it keeps
    /// its place in the table.
    fn diverged(&self) -> bool {
        self.owed > 0.0 || self.in_flight > 0
    }

    /// What Redis has not seen of this bucket's admissions: what is owed or in flight, less what a charge-back
    /// Redis accepted shows it has seen. A later charge-back's floor covers an earlier one's share, and the later
    /// one's outcome can be known first (its call's task ran first): the earlier share is not taken twice.
    fn unseen(&self) -> f64 {
        (self.owed + self.charging).min(self.admitted - self.confirmed)
    }
}

/// Where a bucket of a call lives for this decision.
enum Slot {
    Table(String),
    Overflow(String),
}

/// One process's in-memory buckets. Not thread-safe by itself: the layer keeps it behind a mutex.
#[derive(Debug)]
pub struct LocalBuckets {
    capacity: usize,
    table: HashMap<String, Entry, RandomState>,
    /// Recency: use counter -> key, least recent first.
    order: BTreeMap<u64, String>,
    next_use: u64,
    /// How many entries are diverged ([`Entry::diverged`]): with none, a call needs no look-up for them.
    diverged: usize,
    /// One per limit name, for keys that found no place.
    overflow: HashMap<String, State>,
}

impl Default for LocalBuckets {
    fn default() -> Self {
        LocalBuckets::new(DEFAULT_CAPACITY)
    }
}

impl LocalBuckets {
    /// Buckets for at most `capacity` keys (with 0, every key shares its limit's overflow bucket).
    pub fn new(capacity: usize) -> LocalBuckets {
        LocalBuckets {
            capacity,
            table: HashMap::default(),
            order: BTreeMap::new(),
            next_use: 0,
            diverged: 0,
            overflow: HashMap::new(),
        }
    }

    /// Whether any key is diverged: without one, no call has a charge-back to send.
    pub fn has_diverged(&self) -> bool {
        self.diverged > 0
    }

    /// The charge-backs to send before a call for `buckets` reaches Redis, in call order: one per diverged key,
    /// its floor the bucket's tokens at `now_ms`. Each takes what its key owes as its share (in flight from now)
    /// and must be reported to [`LocalBuckets::charge_ended`] once, sent or not.
    pub fn charge_backs(&mut self, buckets: &[LocalBucket<'_>], now_ms: f64) -> Vec<ChargeBack> {
        if self.diverged == 0 {
            return Vec::new();
        }
        let now_us = micros(now_ms);
        let mut charges: Vec<ChargeBack> = Vec::new();
        for bucket in buckets {
            if charges.iter().any(|charge| charge.key == bucket.key) {
                continue;
            }
            let Some(entry) = self.table.get_mut(bucket.key) else {
                continue;
            };
            if !entry.diverged() {
                continue;
            }
            let share = std::mem::take(&mut entry.owed);
            if share > 0.0 {
                entry.charging += share;
                entry.in_flight = entry.in_flight.saturating_add(1);
            }
            let rate = entry.params.rate_per_sec();
            charges.push(ChargeBack {
                key: bucket.key.to_owned(),
                rate,
                burst: entry.params.burst(),
                tokens: entry
                    .held
                    .tokens_at(now_us, &entry.params)
                    .max(-(rate * DEBT_BOUND_S)),
                share,
                covers: entry.admitted,
                entry: entry.born,
            });
        }
        charges
    }

    /// A charge-back from [`LocalBuckets::charge_backs`] ended with `outcome`: its share leaves what is in flight,
    /// and is owed again if it failed.
    pub fn charge_ended(&mut self, charge: &ChargeBack, outcome: ChargeOutcome) {
        let Some(entry) = self.table.get_mut(&charge.key) else {
            return;
        };
        if outcome == ChargeOutcome::Accepted && charge.entry == entry.born {
            entry.confirmed = entry.confirmed.max(charge.covers);
        }
        if charge.share <= 0.0 {
            return;
        }
        let was = entry.diverged();
        entry.in_flight = entry.in_flight.saturating_sub(1);
        entry.charging = if entry.in_flight == 0 {
            0.0
        } else {
            (entry.charging - charge.share).max(0.0)
        };
        if outcome == ChargeOutcome::Failed {
            entry.owed += charge.share;
        }
        let now = entry.diverged();
        self.count_diverged(was, now);
    }

    /// Redis answered a call for `buckets` with `results` (one per bucket) at `now_ms`: each bucket continues
    /// from there if a fault comes, less what Redis has not seen (owed, or covered by charge-backs in flight and
    /// not by an accepted later floor).
    // Folded into each caller: the layer's usual path calls it once per request.
    #[inline(always)]
    pub fn answered(&mut self, buckets: &[LocalBucket<'_>], results: &[BucketResult], now_ms: f64) {
        let now_us = micros(now_ms);
        for (bucket, result) in buckets.iter().zip(results) {
            let Some(params) = params_of(bucket) else {
                continue;
            };
            // reset_after_ms is the time to full: the bucket lacks rate * reset_after_ms / 1000 tokens.
            let tokens = State::of_reply(result.reset_after_ms, now_us, &params).tokens;
            if let Some(entry) = self.table.get_mut(bucket.key) {
                entry.params = params;
                entry.held = State {
                    tokens: (tokens - entry.unseen()).max(-f64::MAX),
                    updated_us: now_us,
                };
                mark_used(&mut self.order, &mut self.next_use, entry, bucket.key);
            } else if self.make_room(now_us, buckets) {
                let held = State {
                    tokens,
                    updated_us: now_us,
                };
                self.insert(bucket, params, held);
            }
        }
    }

    /// The decision of the in-memory buckets for a call that Redis did not answer: each bucket's cost from every
    /// bucket, or nothing from any, in `TB.ACQUIREEACH`'s shape. What a table bucket admits is owed.
    pub fn acquire_each(&mut self, buckets: &[LocalBucket<'_>], now_ms: f64) -> AcquiredEach {
        let now_us = micros(now_ms);
        let mut slots = Vec::with_capacity(buckets.len());
        let mut members = Vec::with_capacity(buckets.len());
        for (index, bucket) in buckets.iter().enumerate() {
            let (Some(params), Ok(cost)) = (params_of(bucket), Cost::new(bucket.cost)) else {
                return unusable(buckets.len(), index);
            };
            let (slot, held) = self.slot(bucket, params, now_us, buckets);
            slots.push(slot);
            members.push(Member {
                stored: Some(held),
                params,
                cost,
            });
        }
        let each = bucket::acquire_each(&members, now_us);
        let allowed = each.allowed();
        let mut results = Vec::with_capacity(buckets.len());
        for ((bucket, slot), decision) in buckets.iter().zip(&slots).zip(&each.buckets) {
            // The core writes what changed: a grant's tokens taken, or a new time base after a clock step back.
            // Without a write the bucket stands as it was: its refill is a function of time alone.
            if let Some(write) = decision.write {
                match slot {
                    Slot::Table(key) => {
                        if let Some(entry) = self.table.get_mut(key) {
                            entry.held = write.state;
                        }
                    }
                    Slot::Overflow(limit) => {
                        self.overflow.insert(limit.clone(), write.state);
                    }
                }
            }
            if let Slot::Table(key) = slot {
                if allowed && bucket.cost > 0.0 {
                    if let Some(entry) = self.table.get_mut(key) {
                        let was = entry.diverged();
                        entry.owed += bucket.cost;
                        entry.admitted += bucket.cost;
                        self.count_diverged(was, true);
                    }
                }
                self.touch(key);
            }
            results.push(BucketResult {
                fits: decision.allowed(),
                remaining: decision.remaining,
                retry_after_ms: decision.retry_after_ms,
                reset_after_ms: decision.reset_after_ms,
            });
        }
        AcquiredEach {
            allowed,
            limiting_index: each.limiting_index,
            buckets: results,
        }
    }

    /// The bucket `bucket` is decided by: its own, a new one if there is room, else its limit's overflow bucket.
    /// The keys of `call` keep their places meanwhile.
    fn slot(
        &mut self,
        bucket: &LocalBucket<'_>,
        params: Params,
        now_us: i64,
        call: &[LocalBucket<'_>],
    ) -> (Slot, State) {
        let full = State {
            tokens: params.burst(),
            updated_us: now_us,
        };
        if let Some(entry) = self.table.get(bucket.key) {
            return (Slot::Table(bucket.key.to_owned()), entry.held);
        }
        if self.make_room(now_us, call) {
            self.insert(bucket, params, full);
            return (Slot::Table(bucket.key.to_owned()), full);
        }
        let held = *self.overflow.entry(bucket.limit.to_owned()).or_insert(full);
        (Slot::Overflow(bucket.limit.to_owned()), held)
    }

    /// Whether a new key fits: the table has room, or one of its least recently used keys that is full again,
    /// is not diverged and is not a key of the `call` under way gave up its place.
    fn make_room(&mut self, now_us: i64, call: &[LocalBucket<'_>]) -> bool {
        if self.table.len() < self.capacity {
            return true;
        }
        let evictable = self
            .order
            .iter()
            .take(EVICTION_WINDOW)
            .find(|(_, key)| {
                let in_call = call.iter().any(|bucket| bucket.key == key.as_str());
                !in_call
                    && self.table.get(key.as_str()).is_some_and(|entry| {
                        !entry.diverged()
                            && entry.held.tokens_at(now_us, &entry.params) >= entry.params.burst()
                    })
            })
            .map(|(&used, key)| (used, key.clone()));
        match evictable {
            Some((used, key)) => {
                self.order.remove(&used);
                self.table.remove(&key);
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, bucket: &LocalBucket<'_>, params: Params, held: State) {
        let used = self.bump();
        self.order.insert(used, bucket.key.to_owned());
        self.table.insert(
            bucket.key.to_owned(),
            Entry {
                params,
                held,
                owed: 0.0,
                charging: 0.0,
                in_flight: 0,
                admitted: 0.0,
                confirmed: 0.0,
                born: used,
                used,
            },
        );
    }

    /// An entry went from diverged `was` to diverged `now`.
    fn count_diverged(&mut self, was: bool, now: bool) {
        match (was, now) {
            (false, true) => self.diverged = self.diverged.saturating_add(1),
            (true, false) => self.diverged = self.diverged.saturating_sub(1),
            _ => {}
        }
    }

    fn touch(&mut self, key: &str) {
        if let Some(entry) = self.table.get_mut(key) {
            mark_used(&mut self.order, &mut self.next_use, entry, key);
        }
    }

    fn bump(&mut self) -> u64 {
        self.next_use = self.next_use.saturating_add(1);
        self.next_use
    }
}

/// Makes `entry` (of `key`) the most recently used: moves it to the end of the recency order, keeping the key's
/// text it already holds there. The most recently used key (a hot key) is there already: nothing to move.
fn mark_used(order: &mut BTreeMap<u64, String>, next_use: &mut u64, entry: &mut Entry, key: &str) {
    if entry.used == *next_use {
        return;
    }
    *next_use = next_use.saturating_add(1);
    let text = order.remove(&entry.used).unwrap_or_else(|| key.to_owned());
    entry.used = *next_use;
    order.insert(*next_use, text);
}

/// The answer for a call whose bucket at `index` has a rate, burst or cost the core refuses (never one a
/// [`crate::Limit`] builds): refused as impossible, nothing taken or remembered.
fn unusable(len: usize, index: usize) -> AcquiredEach {
    let refused = BucketResult {
        fits: false,
        remaining: 0,
        retry_after_ms: -1,
        reset_after_ms: 0,
    };
    AcquiredEach {
        allowed: false,
        limiting_index: index,
        buckets: vec![refused; len],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(key: &str) -> LocalBucket<'_> {
        LocalBucket {
            key,
            limit: "api",
            rate: 1.0,
            burst: 1.0,
            cost: 1.0,
        }
    }

    /// A call's second new key never takes the place its first new key just took: that key's admission would be
    /// owed by no one.
    #[test]
    fn a_key_of_the_call_under_way_keeps_its_place() {
        let mut local = LocalBuckets::new(2);
        let full = answer(1, 0);
        local.answered(&[bucket("x")], &[full], 0.0);
        assert!(local.acquire_each(&[bucket("y")], 0.0).allowed);
        // c takes x's place (full, owes nothing); d finds y owing and c in the call: the overflow bucket.
        let decision = local.acquire_each(&[bucket("c"), bucket("d")], 0.0);
        assert!(decision.allowed);
        let owed: Vec<String> = local
            .charge_backs(&[bucket("c"), bucket("d"), bucket("y")], 0.0)
            .into_iter()
            .map(|charge| charge.key)
            .collect();
        assert_eq!(owed, ["c", "y"]);
    }

    fn answer(remaining: i64, reset_after_ms: i64) -> BucketResult {
        BucketResult {
            fits: true,
            remaining,
            retry_after_ms: 0,
            reset_after_ms,
        }
    }

    fn limit(key: &str) -> LocalBucket<'_> {
        LocalBucket {
            key,
            limit: "api",
            rate: 1.0,
            burst: 10.0,
            cost: 1.0,
        }
    }

    /// Admits `count` calls for `key` in memory at `now_ms`.
    fn admit(local: &mut LocalBuckets, key: &str, count: usize, now_ms: f64) {
        for _ in 0..count {
            assert!(local.acquire_each(&[limit(key)], now_ms).allowed);
        }
    }

    /// Every admission is in exactly one share: what the charge-backs of concurrent calls cover adds up to what
    /// memory admitted, each admission once, and nothing is lost while a charge is in flight.
    #[test]
    fn concurrent_charge_backs_cover_each_admission_once() {
        let mut local = LocalBuckets::new(10);
        admit(&mut local, "k", 4, 0.0);
        let first = local.charge_backs(&[limit("k")], 0.0);
        let second = local.charge_backs(&[limit("k")], 0.0);
        assert_eq!(first.len(), 1);
        assert_eq!(
            second.len(),
            1,
            "a call for a key with a charge in flight sends its own floor"
        );
        assert_eq!((first[0].share, second[0].share), (4.0, 0.0));
        assert_eq!((first[0].tokens, second[0].tokens), (6.0, 6.0));
        // Admitted while the first is in flight: owed, in the next share, and still taken from what Redis says.
        admit(&mut local, "k", 1, 0.0);
        local.answered(&[limit("k")], &[answer(8, 2000)], 0.0);
        let third = local.charge_backs(&[limit("k")], 0.0);
        assert_eq!(third[0].share, 1.0);
        assert_eq!(third[0].tokens, 8.0 - 4.0 - 1.0);
        // The first fails: its share is owed again; the third is accepted.
        local.charge_ended(&first[0], ChargeOutcome::Failed);
        local.charge_ended(&second[0], ChargeOutcome::Accepted);
        local.charge_ended(&third[0], ChargeOutcome::Accepted);
        let again = local.charge_backs(&[limit("k")], 0.0);
        assert_eq!(again[0].share, 4.0);
        local.charge_ended(&again[0], ChargeOutcome::Accepted);
        assert!(local.charge_backs(&[limit("k")], 0.0).is_empty());
        // Nothing unseen any more: an answer is taken as it is.
        local.answered(&[limit("k")], &[answer(2, 8000)], 0.0);
        let decision = local.acquire_each(&[limit("k")], 0.0);
        assert_eq!(decision.buckets[0].remaining, 1);
    }

    /// Two calls for a diverged key each send a floor; the second's covers the first's share. When the second call's
    /// task learns its charge-back was accepted and its call answered before the first's task learns anything, the
    /// answer already holds the first share: it is not taken from it again (a fault then would charge it twice).
    #[test]
    fn an_accepted_floor_shows_every_earlier_share_seen() {
        let mut local = LocalBuckets::new(10);
        admit(&mut local, "k", 4, 0.0);
        let first = local.charge_backs(&[limit("k")], 0.0);
        let second = local.charge_backs(&[limit("k")], 0.0);
        assert_eq!((first[0].share, second[0].share), (4.0, 0.0));
        local.charge_ended(&second[0], ChargeOutcome::Accepted);
        // Redis came down to the floor, 6: the second call takes one of them.
        local.answered(&[limit("k")], &[answer(5, 5000)], 0.0);
        local.charge_ended(&first[0], ChargeOutcome::Accepted);
        assert_eq!(
            local.acquire_each(&[limit("k")], 0.0).buckets[0].remaining,
            4,
            "5 left in Redis, one admitted in memory"
        );
        // Admitted after the floor: still unseen, whatever else was accepted.
        let third = local.charge_backs(&[limit("k")], 0.0);
        assert_eq!((third[0].share, third[0].tokens), (1.0, 4.0));
        local.answered(&[limit("k")], &[answer(3, 7000)], 0.0);
        local.charge_ended(&third[0], ChargeOutcome::Failed);
        assert_eq!(
            local.acquire_each(&[limit("k")], 0.0).buckets[0].remaining,
            1,
            "3 in Redis's answer, less the unseen admission and this one"
        );
    }

    /// A refused charge-back's share is dropped: the key no longer sends a floor, and an answer is taken as it is.
    #[test]
    fn a_refused_charge_back_is_dropped() {
        let mut local = LocalBuckets::new(10);
        admit(&mut local, "k", 3, 0.0);
        let charges = local.charge_backs(&[limit("k")], 0.0);
        local.charge_ended(&charges[0], ChargeOutcome::Refused);
        assert!(local.charge_backs(&[limit("k")], 0.0).is_empty());
        local.answered(&[limit("k")], &[answer(9, 1000)], 0.0);
        assert_eq!(
            local.acquire_each(&[limit("k")], 0.0).buckets[0].remaining,
            8
        );
    }

    /// Shares that do not add up exactly in floating point still leave the key undiverged once all have ended.
    #[test]
    fn charging_returns_to_zero_whatever_the_shares_add_up_to() {
        let mut local = LocalBuckets::new(10);
        let tenth = LocalBucket {
            cost: 0.1,
            ..limit("k")
        };
        let mut charges = Vec::new();
        for _ in 0..3 {
            assert!(local.acquire_each(&[tenth], 0.0).allowed);
            charges.extend(local.charge_backs(&[tenth], 0.0));
        }
        for charge in charges.iter().rev() {
            local.charge_ended(charge, ChargeOutcome::Accepted);
        }
        assert!(local.charge_backs(&[tenth], 0.0).is_empty());
        // Not diverged, full again: its place can be taken.
        let mut small = LocalBuckets::new(1);
        admit(&mut small, "k", 1, 0.0);
        let charges = small.charge_backs(&[limit("k")], 0.0);
        small.charge_ended(&charges[0], ChargeOutcome::Accepted);
        assert!(small.acquire_each(&[limit("other")], 1000.0).allowed);
        assert!(small.charge_backs(&[limit("k")], 1000.0).is_empty());
        assert_eq!(small.charge_backs(&[limit("other")], 1000.0).len(), 1);
    }

    /// A floor is never below a day of refill in debt, the bound TB.LOWER accepts.
    #[test]
    fn a_floor_stops_at_a_day_of_debt() {
        let slow = LocalBucket {
            rate: 0.001,
            burst: 1.0,
            ..limit("k")
        };
        let deep = BucketResult {
            fits: false,
            remaining: 0,
            retry_after_ms: 0,
            reset_after_ms: i64::MAX / 2,
        };
        let mut local = LocalBuckets::new(10);
        assert!(local.acquire_each(&[slow], 0.0).allowed);
        local.answered(&[slow], &[deep], 0.0);
        let charges = local.charge_backs(&[slow], 0.0);
        assert_eq!(charges[0].tokens, -0.001 * 86_400.0);
    }

    /// The core's rule for a clock that reads earlier than a bucket's time: no token minted, the refill starts
    /// from the earlier reading.
    #[test]
    fn a_clock_that_steps_back_mints_nothing() {
        let mut local = LocalBuckets::new(10);
        admit(&mut local, "k", 10, 1000.0);
        let back = local.acquire_each(&[limit("k")], 0.0);
        assert!(!back.allowed);
        assert_eq!(back.buckets[0].retry_after_ms, 1000);
        assert!(local.acquire_each(&[limit("k")], 1000.0).allowed);
        assert!(!local.acquire_each(&[limit("k")], 1000.0).allowed);
    }

    /// A server's error reply, as redis-rs hands it over.
    pub(crate) fn reply_error(text: &str) -> Error {
        match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(err)) => Error::Redis(err.into()),
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn only_the_server_s_refusal_drops_a_charge_back() {
        for fault in [
            "OOM command not allowed when used memory > 'maxmemory'.",
            "ERR user_script:1: READONLY You can't write against a read only replica.",
        ] {
            assert_eq!(
                ChargeOutcome::of_error(&reply_error(fault)),
                ChargeOutcome::Failed
            );
        }
        for refusal in [
            "NOPERM User u has no permissions to run the 'tb.lower' command",
            "ERR unknown command 'TB.LOWER', with args beginning with: ",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ] {
            let err = reply_error(refusal);
            assert_eq!(
                ChargeOutcome::of_error(&err),
                ChargeOutcome::Refused,
                "{refusal}"
            );
        }
        // Errors of the client's own say nothing of what the server did: what the charge-back covers stays owed,
        // although their row is a configuration error's.
        let own = [
            Error::Protocol("a reply of another shape".to_owned()),
            Error::InvalidArgument("a bad argument".to_owned()),
            Error::Timeout(std::time::Duration::from_millis(5)),
            Error::Unavailable("no connection".to_owned()),
            Error::Redis(redis::RedisError::from((
                redis::ErrorKind::ClientError,
                "closed",
            ))),
        ];
        for err in own {
            assert_eq!(
                ChargeOutcome::of_error(&err),
                ChargeOutcome::Failed,
                "{err:?}"
            );
        }
        assert!(Error::Protocol(String::new()).failure().is_config_error());
    }

    /// The layer's sequence of a call whose charge-back meets an error of the client's own: the share is owed
    /// again and the key stays diverged, so the next call sends the floor again.
    #[test]
    fn a_charge_back_failed_by_the_client_itself_stays_owed() {
        let mut local = LocalBuckets::new(10);
        let full = answer(1, 0);
        local.answered(&[limit("k")], &[full], 0.0);
        assert!(local.acquire_each(&[limit("k")], 0.0).allowed);
        let charges = local.charge_backs(&[limit("k")], 0.0);
        assert_eq!(charges.len(), 1);
        let outcome = ChargeOutcome::of_error(&Error::Protocol("unexpected".to_owned()));
        for charge in &charges {
            local.charge_ended(charge, outcome);
        }
        assert!(local.has_diverged());
        let again = local.charge_backs(&[limit("k")], 0.0);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].share, charges[0].share);
    }
}

#[cfg(test)]
mod fixture;
