"use strict";
// The in-memory token buckets of `fail: "local"`: while Redis fails, each process limits with buckets of the same
// limits, so a request is neither let through unlimited nor refused for want of Redis. They start full, are
// dropped when Redis answers again, and are bounded (the least recently used go first), so a flood of identities
// cannot grow the process. Decisions have the shape of a TB.ACQUIREEACH reply, so headers come out as usual.

const MAX_BUCKETS = 10_000;

class LocalBuckets {
  constructor(maxBuckets = MAX_BUCKETS) {
    this.maxBuckets = maxBuckets;
    /** Redis key -> { tokens, atMs }: 0 <= tokens <= burst, as of `atMs` (performance.now() milliseconds). */
    this.buckets = new Map();
  }

  /** Forgets every bucket: Redis answers again and holds the truth. */
  clear() {
    this.buckets.clear();
  }

  /** The tokens of `bucket` now, refilled since it was last seen; marks it most recently used. */
  _tokens(bucket, nowMs) {
    const state = this.buckets.get(bucket.key);
    if (state === undefined) return bucket.burst;
    this.buckets.delete(bucket.key);
    return Math.min(bucket.burst, state.tokens + ((nowMs - state.atMs) / 1000) * bucket.rate);
  }

  _store(key, tokens, nowMs) {
    this.buckets.set(key, { tokens, atMs: nowMs });
    if (this.buckets.size > this.maxBuckets) this.buckets.delete(this.buckets.keys().next().value);
  }

  /**
   * Takes each bucket's cost from every bucket, or nothing from any: `buckets` [{ key, rate, burst, cost }].
   * Returns { allowed, limitingIndex, buckets: [{ fits, remaining, retryAfterMs, resetAfterMs }] }.
   */
  acquire(buckets, nowMs = performance.now()) {
    const tokens = buckets.map((bucket) => this._tokens(bucket, nowMs));
    const fits = buckets.map((bucket, index) => bucket.cost <= tokens[index]);
    const allowed = fits.every(Boolean);
    const reports = buckets.map((bucket, index) => {
      const left = allowed ? tokens[index] - bucket.cost : tokens[index];
      this._store(bucket.key, left, nowMs);
      let retryAfterMs = 0;
      if (!fits[index]) retryAfterMs = bucket.cost > bucket.burst ? -1 : Math.ceil(((bucket.cost - left) / bucket.rate) * 1000);
      const resetAfterMs = Math.ceil(((bucket.burst - left) / bucket.rate) * 1000);
      return { fits: fits[index], remaining: Math.floor(left), retryAfterMs, resetAfterMs };
    });
    return { allowed, limitingIndex: limiting(reports), buckets: reports };
  }
}

/** The bucket that decided: the refusing one with the longest wait, else the one with the fewest tokens left. */
function limiting(reports) {
  let best = 0;
  for (let index = 1; index < reports.length; index++) {
    const [a, b] = [reports[index], reports[best]];
    const better = a.fits === b.fits ? (a.fits ? a.remaining < b.remaining : wait(a) > wait(b)) : !a.fits;
    if (better) best = index;
  }
  return best;
}

function wait(report) {
  return report.retryAfterMs < 0 ? Infinity : report.retryAfterMs;
}

module.exports = { LocalBuckets, MAX_BUCKETS };
