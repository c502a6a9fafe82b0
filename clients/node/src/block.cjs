"use strict";
// The block of the drop-ins (rate-limiter-flexible's `blockDuration` and `block()`, @nestjs/throttler's
// `blockDuration`), as their libraries mean it: the request that first goes over the limit blocks the key for the
// block's duration; refusals during the block do not extend it; and when it ends the next request is admitted.
//
// A block is a debt in the bucket (TB.BLOCK), sized so that the bucket holds the refused request's `cost` exactly
// when the block ends. The bucket alone cannot tell the block's last stretch (the debt repaid, `cost` not yet
// there) from an ordinary empty bucket, so a refusal that waits no longer than an empty bucket would is a new
// crossing only if no block marker is set: `SET <marker> 1 PX <block> NX`, which one caller wins. A refusal with a
// longer wait is inside a block (or a penalty's debt: the library does not block on those either) and costs no
// extra round trip; neither does any allowed request.

const { connect } = require("./connection.cjs");

/** The marker's key: the bucket's, a NUL byte and "blocked" (no limiter's key text holds a NUL, so no bucket's). */
function markerKey(bucketKey) {
  return `${bucketKey}\u0000blocked`;
}

/** Milliseconds for `cost` tokens to refill at `rate` per second. */
function refillMs(rate, cost) {
  return Math.ceil((cost / rate) * 1000);
}

class Blocker {
  /** @param tb the TbClient the buckets live on */
  constructor(tb) {
    this.tb = tb;
    this._connection = connect(tb.redis);
  }

  /**
   * Blocks `key` for `blockMs` from now, the block ending with `cost` tokens there; the marker makes the refusals
   * of its last stretch refusals, not new crossings. Resolves with the wait for `cost` (at least `blockMs`; longer
   * when a deeper debt was already there).
   */
  async block(key, rate, burst, cost, blockMs) {
    return this._block(key, rate, burst, cost, Math.ceil(blockMs), []);
  }

  /**
   * After TB.ACQUIRE refused `cost` on `key` (reply `refused`): blocks the key if this refusal is the one that
   * crossed the limit, and resolves with the wait for `cost`.
   */
  async afterRefusal(key, rate, burst, cost, blockMs, refused) {
    const waitMs = refused.retryAfterMs;
    if (!(blockMs > 0) || waitMs > refillMs(rate, cost)) return waitMs;
    // A cost above the burst never fits (wait -1), but crosses the limit all the same: the library blocks the key,
    // and the block ends with room for an ordinary request (one token).
    const fits = waitMs >= 0 ? cost : 1;
    const blockedMs = await this._block(key, rate, burst, fits, Math.ceil(blockMs), ["NX"]);
    if (blockedMs === undefined) return waitMs;
    return waitMs < 0 ? blockedMs : Math.max(waitMs, blockedMs);
  }

  /** Deletes the key's marker (with its bucket, the block is gone). */
  async forget(key) {
    await this._send(markerKey(key), ["DEL", markerKey(key)]);
  }

  /**
   * Sets the marker (only if absent with `NX`: undefined when another caller's block is running), then the debt,
   * then moves the marker's end to the block's, measured by the server after the debt: the marker outlives the
   * debt by one round trip, never the other way round. Until then it lives the block and a second, should this
   * process not get to the last write.
   */
  async _block(key, rate, burst, cost, blockMs, condition) {
    const marker = markerKey(key);
    const set = await this._send(marker, ["SET", marker, "1", "PX", String(blockMs + 1000), ...condition]);
    if (set === null) return undefined;
    const costMs = refillMs(rate, cost);
    // A block shorter than the refill of `cost` empties the bucket (a debt of a millisecond): it ends when `cost`
    // is back, a little after `blockMs`, since a bucket cannot hold part of `cost` and refuse it for `blockMs`.
    const blocked = await this.tb.block(key, rate, burst, Math.max(1, blockMs - costMs));
    // TB.BLOCK reports the wait for one token; the wait for `cost` is the debt plus their refill.
    const waitMs = blocked.retryAfterMs - refillMs(rate, 1) + costMs;
    await this._send(marker, ["PEXPIRE", marker, String(Math.max(1, waitMs))]);
    return waitMs;
  }

  _send(key, args) {
    return this._connection.send(key, args);
  }
}

module.exports = { Blocker, markerKey, refillMs };
