//! In-memory token buckets: what the fail mode `local` limits with while Redis fails (docs/clients.md, "When
//! Redis fails"; `fixtures/local.json` holds the rule as call sequences). One process's buckets, with the keys and
//! limits of the Redis ones, so a fault never means "unlimited" and never hands out a fresh burst:
//!
//! ```text
//! per call     a call that fails is decided by the buckets of its own keys; an answer for another key
//!              never clears or refills them
//! continues    each answer Redis gives for a key is remembered: the bucket holds
//!              burst - rate * reset_after_ms / 1000 tokens as of that moment (negative in debt)
//! owed         what a bucket admitted is owed to Redis: the caller sends TB.CHARGE key rate burst <owed>
//!              before the key's next call that reaches Redis ([`LocalBuckets::owed`]); a failed charge-back
//!              stays owed
//! bounded      at most `capacity` keys; a new key takes the place of one of the 16 least recently used that
//!              is full again and owes nothing, else it shares its limit's overflow bucket (never charged back)
//! ```
//!
//! The arithmetic is the module's in floating point, on a monotonic clock the caller passes (milliseconds):
//! pure, no I/O, no clock of its own.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};

use crate::replies::{AcquiredEach, BucketResult};

/// Keys kept unless another capacity is set.
pub const DEFAULT_CAPACITY: usize = 10_000;
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

/// A charge-back the caller sends before a call that reaches Redis: `TB.CHARGE key rate burst cost`.
#[derive(Clone, Debug, PartialEq)]
pub struct ChargeBack {
    pub key: String,
    pub rate: f64,
    pub burst: f64,
    pub cost: f64,
}

#[derive(Clone, Copy, Debug)]
struct Held {
    /// Tokens as of `at_ms`; at most `burst`, negative for a bucket in debt.
    tokens: f64,
    at_ms: f64,
}

impl Held {
    fn now(self, rate: f64, burst: f64, now_ms: f64) -> f64 {
        let elapsed_s = (now_ms - self.at_ms).max(0.0) / 1000.0;
        (self.tokens + elapsed_s * rate).min(burst)
    }
}

#[derive(Clone, Debug)]
struct Entry {
    rate: f64,
    burst: f64,
    held: Held,
    /// Tokens admitted in memory and not yet charged back to Redis.
    owed: f64,
    /// Its place in the recency order (`LocalBuckets::order`).
    used: u64,
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
    table: HashMap<String, Entry>,
    /// Recency: use counter -> key, least recent first.
    order: BTreeMap<u64, String>,
    next_use: u64,
    /// How many entries owe a charge-back (`owed > 0`): with none, a call needs no look-up for them.
    owing: usize,
    /// One per limit name, for keys that found no place.
    overflow: HashMap<String, Held>,
}

impl Default for LocalBuckets {
    fn default() -> Self {
        LocalBuckets::new(DEFAULT_CAPACITY)
    }
}

impl LocalBuckets {
    /// Buckets for at most `capacity` keys (at least one).
    pub fn new(capacity: usize) -> LocalBuckets {
        LocalBuckets {
            capacity: capacity.max(1),
            table: HashMap::new(),
            order: BTreeMap::new(),
            next_use: 0,
            owing: 0,
            overflow: HashMap::new(),
        }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The charge-backs to send before a call for `buckets` reaches Redis, in call order.
    pub fn owed(&self, buckets: &[LocalBucket<'_>]) -> Vec<ChargeBack> {
        if self.owing == 0 {
            return Vec::new();
        }
        buckets
            .iter()
            .filter_map(|bucket| {
                let entry = self.table.get(bucket.key)?;
                (entry.owed > 0.0).then(|| ChargeBack {
                    key: bucket.key.to_owned(),
                    rate: entry.rate,
                    burst: entry.burst,
                    cost: entry.owed,
                })
            })
            .collect()
    }

    /// Redis took (or refused for good) the charge-back of `key`: nothing is owed for it any more.
    pub fn settled(&mut self, key: &str) {
        if let Some(entry) = self.table.get_mut(key) {
            if entry.owed > 0.0 {
                self.owing = self.owing.saturating_sub(1);
            }
            entry.owed = 0.0;
        }
    }

    /// Redis answered a call for `buckets` with `results` (one per bucket) at `now_ms`: each bucket continues
    /// from there if a fault comes.
    pub fn answered(&mut self, buckets: &[LocalBucket<'_>], results: &[BucketResult], now_ms: f64) {
        for (bucket, result) in buckets.iter().zip(results) {
            // reset_after_ms is the time to full: the bucket lacks rate * reset_after_ms / 1000 tokens.
            let reset_s = result.reset_after_ms as f64 / 1000.0;
            let tokens = bucket.burst - bucket.rate * reset_s;
            let held = Held {
                tokens,
                at_ms: now_ms,
            };
            if let Some(entry) = self.table.get_mut(bucket.key) {
                entry.rate = bucket.rate;
                entry.burst = bucket.burst;
                entry.held = held;
                mark_used(&mut self.order, &mut self.next_use, entry, bucket.key);
            } else if self.make_room(now_ms, buckets) {
                self.insert(bucket, held);
            }
        }
    }

    /// The decision of the in-memory buckets for a call that Redis did not answer: each bucket's cost from every
    /// bucket, or nothing from any, in `TB.ACQUIREEACH`'s shape. What a table bucket admits is owed.
    pub fn acquire_each(&mut self, buckets: &[LocalBucket<'_>], now_ms: f64) -> AcquiredEach {
        let mut slots = Vec::with_capacity(buckets.len());
        let mut tokens = Vec::with_capacity(buckets.len());
        for bucket in buckets {
            let (slot, held) = self.slot(bucket, now_ms, buckets);
            tokens.push(held.now(bucket.rate, bucket.burst, now_ms));
            slots.push(slot);
        }
        let fits: Vec<bool> = buckets
            .iter()
            .zip(&tokens)
            .map(|(bucket, held)| bucket.cost <= *held)
            .collect();
        let allowed = fits.iter().all(|&fit| fit);
        let mut results = Vec::with_capacity(buckets.len());
        for (((bucket, slot), held), fit) in buckets.iter().zip(&slots).zip(&tokens).zip(&fits) {
            let after = if allowed { held - bucket.cost } else { *held };
            let stored = Held {
                tokens: after,
                at_ms: now_ms,
            };
            match slot {
                Slot::Table(key) => {
                    if let Some(entry) = self.table.get_mut(key) {
                        entry.held = stored;
                        if allowed {
                            if entry.owed <= 0.0 && bucket.cost > 0.0 {
                                self.owing = self.owing.saturating_add(1);
                            }
                            entry.owed += bucket.cost;
                        }
                    }
                    self.touch(key);
                }
                Slot::Overflow(limit) => {
                    self.overflow.insert(limit.clone(), stored);
                }
            }
            results.push(result(bucket, after, *fit));
        }
        let limiting_index = limiting_index(&results, allowed);
        AcquiredEach {
            allowed,
            limiting_index,
            buckets: results,
        }
    }

    /// The bucket `bucket` is decided by: its own, a new one if there is room, else its limit's overflow bucket.
    /// The keys of `call` keep their places meanwhile.
    fn slot(
        &mut self,
        bucket: &LocalBucket<'_>,
        now_ms: f64,
        call: &[LocalBucket<'_>],
    ) -> (Slot, Held) {
        let full = Held {
            tokens: bucket.burst,
            at_ms: now_ms,
        };
        if let Some(entry) = self.table.get(bucket.key) {
            return (Slot::Table(bucket.key.to_owned()), entry.held);
        }
        if self.make_room(now_ms, call) {
            self.insert(bucket, full);
            return (Slot::Table(bucket.key.to_owned()), full);
        }
        let held = *self.overflow.entry(bucket.limit.to_owned()).or_insert(full);
        (Slot::Overflow(bucket.limit.to_owned()), held)
    }

    /// Whether a new key fits: the table has room, or one of its least recently used keys that is full again,
    /// owes nothing and is not a key of the `call` under way gave up its place.
    fn make_room(&mut self, now_ms: f64, call: &[LocalBucket<'_>]) -> bool {
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
                        entry.owed <= 0.0
                            && entry.held.now(entry.rate, entry.burst, now_ms) >= entry.burst
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

    fn insert(&mut self, bucket: &LocalBucket<'_>, held: Held) {
        let used = self.bump();
        self.order.insert(used, bucket.key.to_owned());
        self.table.insert(
            bucket.key.to_owned(),
            Entry {
                rate: bucket.rate,
                burst: bucket.burst,
                held,
                owed: 0.0,
                used,
            },
        );
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

/// Milliseconds, rounded up, saturating (a double beyond i64 becomes its bound).
fn ceil_ms(ms: f64) -> i64 {
    // `as` from f64 saturates at the bounds and maps NaN to 0.
    ms.ceil() as i64
}

fn result(bucket: &LocalBucket<'_>, tokens: f64, fits: bool) -> BucketResult {
    let retry_after_ms = if fits {
        0
    } else if bucket.cost > bucket.burst {
        -1
    } else {
        ceil_ms((bucket.cost - tokens) / bucket.rate * 1000.0)
    };
    BucketResult {
        fits,
        remaining: tokens.floor().max(0.0) as i64,
        retry_after_ms,
        reset_after_ms: ceil_ms((bucket.burst - tokens) / bucket.rate * 1000.0).max(0),
    }
}

/// As the module chooses it: refused, the first bucket whose cost exceeds its burst, else the first with the
/// longest wait; allowed, the first with the fewest tokens left.
pub fn limiting_index(results: &[BucketResult], allowed: bool) -> usize {
    let mut best = 0;
    for (index, result) in results.iter().enumerate() {
        let Some(current) = results.get(best) else {
            break;
        };
        let better = if allowed {
            result.remaining < current.remaining
        } else if current.retry_after_ms == -1 {
            false
        } else {
            result.retry_after_ms == -1 || result.retry_after_ms > current.retry_after_ms
        };
        if better {
            best = index;
        }
    }
    best
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
        let full = BucketResult {
            fits: true,
            remaining: 1,
            retry_after_ms: 0,
            reset_after_ms: 0,
        };
        local.answered(&[bucket("x")], &[full], 0.0);
        assert!(local.acquire_each(&[bucket("y")], 0.0).allowed);
        // c takes x's place (full, owes nothing); d finds y owing and c in the call: the overflow bucket.
        let decision = local.acquire_each(&[bucket("c"), bucket("d")], 0.0);
        assert!(decision.allowed);
        let owed: Vec<String> = local
            .owed(&[bucket("c"), bucket("d"), bucket("y")])
            .into_iter()
            .map(|charge| charge.key)
            .collect();
        assert_eq!(owed, ["c", "y"]);
    }
}
