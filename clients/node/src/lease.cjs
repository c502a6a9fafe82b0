"use strict";
// A lease: tokens a process takes from a shared bucket in batches (TB.ACQUIREATMOST) and spends in memory, without
// giving up burst + rate * t over all processes together. The rule is docs/clients.md ("How a leased limit
// decides") and its data fixtures/leases.json, which the Rust workspace's core decides by too.
//   - A bucket that refills toward its burst forgets what was taken from it. A grant answered with reset_after_ms
//     left the bucket full again that long after the call was sent (less the millisecond of the reply's rounding),
//     so of the grant's tokens a process may spend at most rate * (reset - now) at now, and drops the rest.
//   - The request whose call asked for a grant is decided by that grant when the reply arrives, from its tokens as
//     they were when Redis granted them: a grant of at least its cost admits it, however long the round trip took.
//   - One refill is in flight per lease; the requests meanwhile wait for it. A refusal is remembered until its
//     retry time. Where a grant would lose its worth within MIN_WORTH_US (the bucket nearly full), requests are
//     decided by calls of their own until a reply says leasing pays again.
// Time is the caller's monotonic clock in integer microseconds. Pure: no I/O, no clock.

/** A lease covers about this long of the process's own recent use. */
const LEASE_HORIZON_US = 50_000;
/** A lease whose limit has not been used for this long is due to be given back. */
const LEASE_IDLE_US = 100_000;
/** One lease takes at most this share of the burst (and at least one token, or the request's cost). */
const MAX_LEASE_SHARE = 0.1;
/** A grant the bucket counts for less than this from when it was asked for is not worth leasing. */
const MIN_WORTH_US = 5_000;
/** Grants kept at once; a further grant drops the one closest to its reset (dropping is always safe). */
const MAX_GRANTS = 4;
/** The largest max of TB.ACQUIREATMOST: 2^53, so that a grant converts to a double exactly. */
const MAX_AT_MOST = 2 ** 53;

const MICROS_PER_SEC = 1_000_000;
const MICROS_PER_MS = 1_000;

/** The part of a grant the bucket still counts at nowUs: min(tokens, rate * (reset - now)), never negative. */
function worth(held, nowUs, rate) {
  const leftS = Math.max(held.resetUs - nowUs, 0) / MICROS_PER_SEC;
  return Math.max(Math.min(held.tokens, leftS * rate), 0);
}

/** Where the core's 64-bit instants saturate, in µs: an instant there is for ever. */
const FOREVER_US = 2 ** 63;

/** Until when a refusal of a call sent at sentUs holds: for ever (Infinity) when retryAfterMs is -1 or saturates. */
function refusedUntil(sentUs, retryAfterMs) {
  const until = sentUs + retryAfterMs * MICROS_PER_MS;
  return retryAfterMs < 0 || until >= FOREVER_US ? Infinity : until;
}

/** The refusal at nowUs of a request refused until untilUs: its wait in whole ms, rounded up; -1 for ever. */
function refusal(untilUs, nowUs) {
  if (untilUs === Infinity) return { refused: -1 };
  return { refused: Math.ceil(Math.max(untilUs - nowUs, 0) / MICROS_PER_MS) };
}

/** How long after a call was sent the bucket still counts what it took: less the millisecond of rounding. */
function countedForUs(resetAfterMs) {
  return Math.min(resetAfterMs * MICROS_PER_MS, FOREVER_US) - MICROS_PER_MS;
}

/**
 * One process's lease on one limit's bucket of `rate` tokens a second up to `burst`, created at `nowUs`.
 * `admit` and `admitAgain` answer "spent" (admitted with leased tokens), "wait" (a refill is in flight: admit the
 * request again once it has ended), "direct" (decide it by a call of its own, then `observed`), { call: max }
 * (send TB.ACQUIREATMOST key rate burst max now, then `answered`, which decides this request, or `failed`) or
 * { refused: retryAfterMs } (-1: never).
 */
class Lease {
  constructor(rate, burst, nowUs) {
    if (!(Number.isFinite(rate) && rate > 0 && Number.isFinite(burst) && burst > 0)) {
      throw new RangeError(`a lease needs a finite rate and burst above 0, not ${rate} and ${burst}`);
    }
    this.rate = rate;
    this.burst = burst;
    /** Closest to its reset first, spent ones dropped: { tokens, resetUs, number }. */
    this.grants = [];
    /** The number of the latest grant (0: none yet). */
    this.latest = 0;
    this.inFlight = false;
    /** The cost of the request whose admission sent the refill in flight: the reply decides it. */
    this.asking = null;
    /** Redis's last refusal holds until then (µs); null: none. */
    this.refusedUntilUs = null;
    /** Tokens asked for since demandSinceUs: the process's own recent rate. */
    this.demand = 0;
    this.demandSinceUs = nowUs;
    this.lastUseUs = nowUs;
    /** The latest reply left the bucket within MIN_WORTH_US of full: requests make calls of their own. */
    this.direct = false;
    /** The cost of the latest request: what `observed` sizes a lease for. */
    this.cost = 1;
    /** When the call of the newest reply so far was sent. */
    this.newestSentUs = -Infinity;
    /** The cost of the requests told to wait on the refill in flight. */
    this.waiting = 0;
    /**
     * The cost of the requests that waited on the refill that ended last and have not been admitted again: a refill
     * asked for meanwhile covers them too, however long ago they were counted.
     */
    this.waking = 0;
  }

  /** The most tokens one lease asks for: MAX_LEASE_SHARE of the burst, at least one. */
  maxLease() {
    return Math.min(Math.max(Math.floor(this.burst * MAX_LEASE_SHARE), 1), MAX_AT_MOST);
  }

  /** Decides one request of `cost` tokens (at most the burst, checked by the caller) at `nowUs`. */
  admit(nowUs, cost) {
    return this._decide(nowUs, cost, false);
  }

  /** `admit` for a request that waited on a refill: it was counted toward the next lease's size then. */
  admitAgain(nowUs, cost) {
    return this._decide(nowUs, cost, true);
  }

  _decide(nowUs, cost, counted) {
    this.cost = cost;
    const count = counted ? 0 : cost;
    if (counted) this.waking = Math.max(this.waking - cost, 0);
    const decided = this._held(nowUs, cost, count);
    if (decided !== null) return decided;
    if (this.inFlight) {
      // The requests that wait on a refill are the process's demand as much as those it decides.
      this._used(nowUs, count);
      this.waiting += cost;
      return "wait";
    }
    if (this.direct) {
      this._used(nowUs, count);
      return "direct";
    }
    // The size counts the asking request once.
    if (counted) this.demand = Math.max(this.demand - cost, 0);
    this.inFlight = true;
    this.asking = cost;
    return { call: this.nextSize(nowUs, cost) };
  }

  /** "spent" from the leased tokens or a remembered refusal; null (nothing changed) otherwise. */
  _held(nowUs, cost, count) {
    if (this.spend(nowUs, cost)) {
      this._used(nowUs, count);
      return "spent";
    }
    if (this.inFlight) return null;
    const refused = this._refused(nowUs);
    if (refused === null) return null;
    this._used(nowUs, count);
    return refused;
  }

  /**
   * The reply [granted, remaining, retry_after_ms, reset_after_ms] of TB.ACQUIREATMOST, arrived at `nowUs`, to the
   * refill sent at `sentUs`. Returns the decision of the request that asked (null when none did): "spent" when the
   * grant, with the leased tokens worth something now, covers its cost (the grant's own tokens first and whole),
   * else a refusal.
   */
  answered(sentUs, nowUs, granted, retryAfterMs, resetAfterMs) {
    this._ended();
    const asking = this.asking;
    this.asking = null;
    const worthUs = countedForUs(resetAfterMs);
    const resetUs = sentUs + worthUs;
    const newest = this._newest(sentUs);
    if (newest) this.direct = granted > 0 && worthUs < MIN_WORTH_US;
    if (granted <= 0) {
      const untilUs = refusedUntil(sentUs, retryAfterMs);
      if (newest) this.refusedUntilUs = untilUs;
      if (asking === null) return null;
      this._used(nowUs, asking);
      return refusal(untilUs, nowUs);
    }
    if (newest) this.refusedUntilUs = null;
    let tokens = granted;
    this.latest += 1;
    let decision = null;
    if (asking !== null) {
      // Counted as every decided request is: counting only those admitted from held tokens, a lease the asking
      // request takes whole would never grow.
      this._used(nowUs, asking);
      const own = Math.min(tokens, asking);
      if (own >= asking || this.spend(nowUs, asking - own)) {
        tokens -= own;
        decision = "spent";
      } else {
        // Redis held fewer whole tokens than the cost: the part missing, at the bucket's rate.
        const missing = asking - tokens - this.spendable(nowUs);
        decision = { refused: Math.max(Math.ceil((missing / this.rate) * 1_000), 1) };
      }
    }
    if (tokens > 0) {
      if (this.grants.length >= MAX_GRANTS) this.grants.shift();
      this.grants.push({ tokens, resetUs, number: this.latest });
      // Spent closest to their reset first: those lose their worth soonest.
      this.grants.sort((a, b) => a.resetUs - b.resetUs);
    }
    return decision;
  }

  /** The refill failed: nothing is known to be granted, and tokens Redis may have granted are never spent. */
  failed() {
    this._ended();
    // The requests that waited are decided by the tokens held, then calls of their own: none asks again.
    this.waking = 0;
    this.asking = null;
  }

  /**
   * The refill was dropped before its reply (its request went away): nothing is known to be granted, and the
   * requests that waited on it are admitted again (`admitAgain`), the first of them sending a refill that covers the
   * others.
   */
  dropped() {
    this._ended();
    this.asking = null;
  }

  /** The refill in flight ended: the requests that waited on it are to be admitted again. */
  _ended() {
    this.inFlight = false;
    this.waking = this.waiting;
    this.waiting = 0;
  }

  /**
   * The reply [allowed, remaining, retry_after_ms, reset_after_ms], arrived at `nowUs`, to a request's own call sent
   * at `sentUs`. A refusal is remembered until sent + retry_after; leasing pays again once a lease taken now would be
   * worth MIN_WORTH_US. An older reply than one already given changes nothing.
   */
  observed(sentUs, nowUs, allowed, retryAfterMs, resetAfterMs) {
    if (!this._newest(sentUs)) return;
    if (allowed) this.refusedUntilUs = null;
    else if (retryAfterMs > 0) this.refusedUntilUs = refusedUntil(sentUs, retryAfterMs);
    const refillUs = Math.trunc((this._sizeFor(nowUs, this.cost) / this.rate) * MICROS_PER_SEC);
    this.direct = countedForUs(resetAfterMs) + refillUs < MIN_WORTH_US;
  }

  /** Whether the limit has not been used for LEASE_IDLE_US at `nowUs`. */
  idle(nowUs) {
    return nowUs - this.lastUseUs >= LEASE_IDLE_US;
  }

  /** Tokens the process may spend at `nowUs`: over its grants, min(held, rate * (reset - now)). */
  spendable(nowUs) {
    let sum = 0;
    for (const held of this.grants) sum += worth(held, nowUs, this.rate);
    return sum;
  }

  /**
   * Spends `cost` leased tokens at `nowUs` if the lease holds that many, the grants closest to their reset first;
   * otherwise spends nothing. Each grant first drops what the bucket no longer counts.
   */
  spend(nowUs, cost) {
    for (const held of this.grants) held.tokens = worth(held, nowUs, this.rate);
    this.grants = this.grants.filter((held) => held.tokens > 0);
    if (this.spendable(nowUs) < cost) return false;
    let owed = cost;
    for (const held of this.grants) {
      const take = Math.min(held.tokens, owed);
      held.tokens -= take;
      owed -= take;
    }
    this.grants = this.grants.filter((held) => held.tokens > 0);
    return true;
  }

  /** Whether the lease is due to be given back: it holds tokens, no refill is in flight, and it is idle. */
  refundDue(nowUs) {
    return !this.inFlight && this.idle(nowUs) && this.refundable(nowUs) > 0;
  }

  /** The part of the latest grant the bucket still counts at `nowUs` (0 once that grant is spent). */
  refundable(nowUs) {
    const held = this.grants.find((grant) => grant.number === this.latest);
    return held === undefined ? 0 : worth(held, nowUs, this.rate);
  }

  /**
   * Ends the lease at `nowUs` and drops every held token; returns the amount to send as TB.REFUND (0: send nothing).
   * Only when `unchanged` (the bucket is as the latest grant left it) is anything refunded: any other refund could
   * raise the bucket under tokens other processes still hold.
   */
  giveBack(nowUs, unchanged) {
    const amount = unchanged ? this.refundable(nowUs) : 0;
    this.grants = [];
    return amount;
  }

  /** The next lease's size at `nowUs` for a request of `cost`, starting a new measuring window. */
  nextSize(nowUs, cost) {
    const size = this._sizeFor(nowUs, cost);
    this.demand = 0;
    this.demandSinceUs = nowUs;
    // This refill covers the requests still to be admitted; those told to wait on it count in `waiting`.
    this.waking = 0;
    return size;
  }

  _sizeFor(nowUs, cost) {
    const windowUs = Math.max(nowUs - this.demandSinceUs, LEASE_HORIZON_US);
    const wanted = Math.max(((this.demand + cost) * LEASE_HORIZON_US) / windowUs, this.waking + cost);
    const need = Math.min(Math.max(Math.ceil(cost), 1), MAX_AT_MOST);
    return Math.max(Math.min(Math.max(Math.ceil(wanted), 1), this.maxLease()), need);
  }

  _refused(nowUs) {
    const untilUs = this.refusedUntilUs;
    if (untilUs === null || untilUs <= nowUs) return null;
    return refusal(untilUs, nowUs);
  }

  _newest(sentUs) {
    if (sentUs < this.newestSentUs) return false;
    this.newestSentUs = sentUs;
    return true;
  }

  _used(nowUs, cost) {
    this.demand += cost;
    this.lastUseUs = nowUs;
  }
}

module.exports = { Lease, LEASE_HORIZON_US, LEASE_IDLE_US, MAX_LEASE_SHARE, MIN_WORTH_US, MAX_AT_MOST };
