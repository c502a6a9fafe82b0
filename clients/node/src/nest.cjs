"use strict";
// A @nestjs/throttler `ThrottlerStorage` over a token bucket: `ThrottlerModule.forRoot({ throttlers: [{ ttl,
// limit }], storage: new TbThrottlerStorage({ client }) })`. The guard passes limit, ttl and blockDuration on every
// call; the bucket holds `limit` tokens and refills `limit` per `ttl`. One TB.ACQUIRE per request:
//   allowed  totalHits = the tokens in use (1..limit), timeToExpire = seconds until the bucket is full again
//   refused  isBlocked, totalHits = limit + 1, timeToBlockExpire = seconds until a request can pass. As with the
//            library's own storage, the first refusal blocks the key for `blockDuration` (the guard's default is
//            `ttl`), a refusal while blocked does not extend the block, and after the block the key starts
//            afresh (block.cjs). blockDuration 0: no block, the wait is the next token's.

const { TbClient } = require("./client.cjs");
const { TbArgumentError } = require("./errors.cjs");
const { Blocker } = require("./block.cjs");
const { checkOptions, checkTimeout } = require("./options.cjs");
const { callsFor } = require("./lane.cjs");

class TbThrottlerStorage {
  /**
   * @param options.client  a TbClient, or an ioredis / node-redis client or cluster
   * @param options.prefix  prepended to the guard's key (default "throttler:")
   * @param options.timeoutMs the deadline of each call (default 1000, a positive finite number), after which it
   *   rejects and is never charged later, as the middleware's (lane.cjs)
   */
  constructor(options = {}) {
    checkOptions("TbThrottlerStorage", options, ["client", "prefix", "timeoutMs"]);
    const { client, prefix = "throttler:", timeoutMs = 1000 } = options;
    if (client === undefined) throw new TbArgumentError("TbThrottlerStorage needs { client }: a TbClient or a Redis client");
    this.client = TbClient.from(client);
    this._calls = callsFor(client, this.client, checkTimeout(timeoutMs, "TbThrottlerStorage"));
    this._blocker = new Blocker(this._calls);
    this.prefix = prefix;
  }

  /** The guard's call. `throttlerName` is already part of the guard's key, so one key is one bucket. */
  async increment(key, ttl, limit, blockDuration, _throttlerName) {
    if (!(ttl > 0)) throw new TbArgumentError(`TbThrottlerStorage: ttl must be > 0 ms, got ${ttl}`);
    if (!(limit > 0)) {
      // A bucket of no tokens: every request is over the limit, as the library's storage answers `limit: 0`.
      const waitMs = blockDuration > 0 ? blockDuration : ttl;
      const timeToBlockExpire = Math.ceil(waitMs / 1000);
      return { totalHits: 1, timeToExpire: Math.ceil(ttl / 1000), isBlocked: true, timeToBlockExpire };
    }
    const bucket = this.prefix + key;
    const rate = limit / (ttl / 1000);
    const reply = await this._calls.acquire(bucket, rate, limit, 1);
    // As the library's: the refusal that crosses the limit blocks the key, refusals inside the block do not extend
    // it, and after it the key starts afresh (block.cjs).
    if (reply.allowed) {
      return this._granted(limit, await this._blocker.afterGrant(bucket, rate, limit, 1, blockDuration, reply));
    }
    const { granted, waitMs } = await this._blocker.afterRefusal(bucket, rate, limit, 1, blockDuration, reply);
    if (granted) return this._granted(limit, granted);
    return {
      totalHits: limit + 1,
      timeToExpire: Math.ceil(reply.resetAfterMs / 1000),
      isBlocked: true,
      timeToBlockExpire: Math.ceil(Math.max(0, waitMs) / 1000),
    };
  }

  _granted(limit, reply) {
    const used = Math.ceil(limit - reply.remaining);
    return {
      totalHits: Math.min(limit, Math.max(1, used)),
      timeToExpire: Math.ceil(reply.resetAfterMs / 1000),
      isBlocked: false,
      timeToBlockExpire: 0,
    };
  }
}

module.exports = { TbThrottlerStorage };
