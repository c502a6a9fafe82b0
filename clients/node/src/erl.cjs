"use strict";
// An express-rate-limit `Store` over a token bucket: `rateLimit({ limit, windowMs, store: new TbStore({ client }) })`.
// express-rate-limit counts hits and refuses above `limit`; the bucket holds `limit` tokens (the burst) and
// refills `limit` of them per `windowMs`, so the hit count the store reports is what the bucket has used:
//   increment   TB.ACQUIRE 1: allowed -> the tokens in use (1..limit); refused -> limit + 1, so the middleware refuses
//   decrement   TB.REFUND 1 (skipFailedRequests / skipSuccessfulRequests give the token back)
//   get         TB.ACQUIRE 0 (a peek); resetKey DEL
// `resetTime` is when the refused request could succeed (refused) or when the bucket is full again (allowed).

const { TbClient } = require("./client.cjs");
const { TbArgumentError } = require("./errors.cjs");

class TbStore {
  /**
   * @param options.client   a TbClient, or an ioredis / node-redis client or cluster
   * @param options.prefix   prepended to the key (default "rl:")
   * @param options.burst    the bucket's capacity (default: express-rate-limit's `limit`, which must then be a number)
   * @param options.rate     tokens per second (default: burst per `windowMs`)
   */
  constructor({ client, prefix = "rl:", burst, rate } = {}) {
    if (client === undefined) throw new TbArgumentError("TbStore needs { client }: a TbClient or a Redis client");
    this.client = TbClient.from(client);
    this.prefix = prefix;
    this.localKeys = false;
    this._burst = burst;
    this._rate = rate;
  }

  init(options) {
    const limit = typeof options.limit === "number" ? options.limit : options.max;
    this.burst = this._burst ?? limit;
    if (typeof this.burst !== "number" || !(this.burst > 0)) {
      throw new TbArgumentError(
        "TbStore: express-rate-limit's `limit` is not a number > 0 (a function?): give the store { burst, rate }",
      );
    }
    this.limit = typeof limit === "number" ? limit : this.burst;
    this.rate = this._rate ?? this.burst / (options.windowMs / 1000);
  }

  _key(key) {
    return this.prefix + key;
  }

  _info(reply, cost) {
    const used = Math.ceil(this.burst - reply.remaining);
    if (reply.allowed === false && cost > 0) {
      const waitMs = reply.retryAfterMs >= 0 ? reply.retryAfterMs : reply.resetAfterMs;
      return { totalHits: this.limit + 1, resetTime: new Date(Date.now() + waitMs) };
    }
    const totalHits = cost > 0 ? Math.min(this.limit, Math.max(1, used)) : Math.min(this.limit, used);
    return { totalHits, resetTime: new Date(Date.now() + reply.resetAfterMs) };
  }

  async increment(key) {
    return this._info(await this.client.acquire(this._key(key), this.rate, this.burst, 1), 1);
  }

  async decrement(key) {
    await this.client.refund(this._key(key), this.rate, this.burst, 1);
  }

  async resetKey(key) {
    await this.client.reset(this._key(key));
  }

  async get(key) {
    const reply = await this.client.acquire(this._key(key), this.rate, this.burst, 0);
    return this._info(reply, 0);
  }
}

module.exports = { TbStore };
