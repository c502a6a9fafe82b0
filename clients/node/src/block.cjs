"use strict";
// The block of the drop-ins (rate-limiter-flexible's `blockDuration` and `block()`, @nestjs/throttler's
// `blockDuration`), as their libraries mean it: the request that first goes over the limit blocks the key for the
// block's duration; refusals during the block do not extend it; and when it ends the key starts afresh (the
// library's window or hits are gone), so the next requests are admitted up to the whole limit.
//
// A block is a debt in the bucket (TB.BLOCK), sized so that the bucket holds the refused request's `cost` exactly
// when the block ends, and a marker key that outlives the block by the refill of the whole bucket:
// - The bucket alone cannot tell the block's last stretch (the debt repaid, `cost` not yet there) from an ordinary
//   empty bucket, so a refusal that waits no longer than an empty bucket would is a new crossing only if no marker
//   is set: `SET <marker> 1 PX <ms> NX`, which one caller wins. A refusal with a longer wait is inside a block (or
//   a penalty's debt: the libraries do not block on those either) and costs no extra round trip.
// - The key starts afresh on the first granted request after the block that leaves the bucket empty (always the
//   case for the first one after the block): a `PTTL` of the marker shows the block over, and the one caller whose
//   `DEL` removes the marker refunds the rest of the bucket. A bucket left with a token or more costs no extra
//   round trip; an empty one costs that `PTTL`.

/** The marker's key: the bucket's, a NUL byte and "blocked" (no limiter's key text holds a NUL, so no bucket's). */
function markerKey(bucketKey) {
  return `${bucketKey}\u0000blocked`;
}

/** Milliseconds for `cost` tokens to refill at `rate` per second. */
function refillMs(rate, cost) {
  return Math.ceil((cost / rate) * 1000);
}

class Blocker {
  /**
   * @param calls the calls of the drop-in (lane.cjs `callsFor`): its TbClient methods and `send(key, args)`, each
   *   under its deadline
   */
  constructor(calls) {
    this.tb = calls;
  }

  /**
   * Blocks `key` for `blockMs` from now (marker and debt); resolves with the wait to report: the block's end (a
   * deeper debt already there ends later).
   */
  async block(key, rate, burst, cost, blockMs) {
    return this._block(key, rate, burst, cost, Math.ceil(blockMs), []);
  }

  /**
   * After TB.ACQUIRE refused `cost` on `key` (reply `refused`), with blocks of `blockMs`: blocks the key if this
   * refusal crossed the limit, or starts it afresh if its block is over. Resolves with `{ waitMs }` for a refusal,
   * or `{ granted }`, the reply of a take that succeeded on the afresh bucket. With `manual` (the caller blocks keys
   * itself, with `block`), a marker is read even where `blockMs` is 0, so that such a block is reported and ends
   * as one started by a refusal.
   */
  async afterRefusal(key, rate, burst, cost, blockMs, refused, manual = false) {
    const waitMs = refused.retryAfterMs;
    const blocks = blockMs > 0;
    // Longer than an empty bucket's wait (a millisecond of rounding aside): a debt, so a block or a penalty is
    // running, and nothing is asked of Redis.
    if (!(blocks || manual) || waitMs > refillMs(rate, cost) + 1) return { waitMs };
    if (blocks) {
      // A cost above the burst never fits (wait -1), but crosses the limit all the same: the library blocks the
      // key, and the block ends with room for an ordinary request (one token).
      const fits = waitMs >= 0 ? cost : 1;
      const blockedMs = await this._block(key, rate, burst, fits, Math.ceil(blockMs), ["NX"]);
      if (blockedMs !== undefined) return { waitMs: waitMs < 0 ? blockedMs : Math.max(waitMs, blockedMs) };
    }
    // A marker is there: the block is running (its end is the marker's less the refill of the whole bucket), or
    // it is over and the key starts afresh.
    const marker = markerKey(key);
    const pttl = await this._send(marker, ["PTTL", marker]);
    if (pttl > refillMs(rate, burst)) return { waitMs: pttl - refillMs(rate, burst) };
    if (!(pttl > 0) || !(await this._afresh(key, rate, burst, burst)) || waitMs < 0) return { waitMs };
    const granted = await this.tb.acquire(key, rate, burst, cost);
    return granted.allowed ? { granted } : { waitMs: granted.retryAfterMs };
  }

  /**
   * After TB.ACQUIRE granted `cost` on `key` (reply `granted`) with blocks of `blockMs`: if that left the bucket
   * empty after a block of this key ended, the key starts afresh (the rest of the bucket refunded). Resolves with
   * the reply to report: the refund's remaining and reset, or `granted` as it was. `manual` as for afterRefusal.
   */
  async afterGrant(key, rate, burst, cost, blockMs, granted, manual = false) {
    if (!(blockMs > 0 || manual) || granted.remaining > 0) return granted;
    const marker = markerKey(key);
    const pttl = await this._send(marker, ["PTTL", marker]);
    // More than the refill of the whole bucket left: the block is running (a grant inside it is a penalty's or a
    // reservation's business); none: no block ended lately.
    if (!(pttl > 0 && pttl <= refillMs(rate, burst))) return granted;
    const refunded = await this._afresh(key, rate, burst, burst - cost);
    return refunded ? { ...granted, remaining: refunded.remaining, resetAfterMs: refunded.resetAfterMs } : granted;
  }

  /** Deletes the key's marker (with its bucket, the block is gone). */
  async forget(key) {
    await this._send(markerKey(key), ["DEL", markerKey(key)]);
  }

  /** Starts the key afresh after its block: the caller whose DEL removes the marker refunds `amount` tokens. */
  async _afresh(key, rate, burst, amount) {
    const marker = markerKey(key);
    if ((await this._send(marker, ["DEL", marker])) !== 1) return undefined;
    return this.tb.refund(key, rate, burst, Math.max(0, amount));
  }

  /**
   * Sets the marker (only if absent with `NX`: undefined when another caller's block is running), then the debt,
   * then moves the marker's end to the block's plus the refill of the whole bucket, measured by the server after
   * the debt: a `PTTL` of at most that refill means the block is over. Until then it lives a second longer, should
   * this process not get to the last write.
   */
  async _block(key, rate, burst, cost, blockMs, condition) {
    const marker = markerKey(key);
    const fullMs = refillMs(rate, burst);
    const set = await this._send(marker, ["SET", marker, "1", "PX", String(blockMs + 1000 + fullMs), ...condition]);
    if (set === null) return undefined;
    const costMs = refillMs(rate, cost);
    // The debt leaves `cost` there when the block ends. A block shorter than the refill of `cost` empties the
    // bucket (a debt of a millisecond), which then refuses past the block's end until the key starts afresh.
    const short = blockMs - costMs < 1;
    const blocked = await this.tb.block(key, rate, burst, short ? 1 : blockMs - costMs);
    // TB.BLOCK reports the wait for one token; the wait for `cost` is the debt plus their refill.
    const endMs = short ? blockMs : blocked.retryAfterMs - refillMs(rate, 1) + costMs;
    await this._send(marker, ["PEXPIRE", marker, String(Math.max(1, endMs) + fullMs)]);
    return endMs;
  }

  _send(key, args) {
    return this.tb.send(key, args);
  }
}

module.exports = { Blocker, markerKey, refillMs };
