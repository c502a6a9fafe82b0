"use strict";
// An express-rate-limit `Store` over a token bucket: `rateLimit({ limit, windowMs, store: new TbStore({ client }) })`.
// express-rate-limit counts hits and refuses above `limit`; the bucket holds `limit` tokens (the burst) and
// refills `limit` of them per `windowMs`, so the hit count the store reports is what the bucket has used:
//   increment   TB.ACQUIRE 1: allowed -> the tokens in use (1..limit); refused -> limit + 1, so the middleware refuses
//   decrement   TB.REFUND 1 (skipFailedRequests / skipSuccessfulRequests give the token back)
//   get         TB.ACQUIRE 0 (a peek): undefined for a full bucket, as MemoryStore answers for a key it does not hold
//   resetKey    DEL            resetAll   SCAN for the prefix on every primary, and DEL what it finds
// `resetTime` is when the refused request could succeed (refused) or when the bucket is full again (allowed).
// `limit: 0` refuses every request (express-rate-limit 7 and later) without asking Redis.

const { TbClient } = require("./client.cjs");
const { TbArgumentError } = require("./errors.cjs");
const { checkOptions, checkTimeout } = require("./options.cjs");
const { callsFor } = require("./lane.cjs");

const OPTIONS = ["client", "prefix", "burst", "rate", "timeoutMs"];
const REFUSED = {
  sendCommand: "give the Redis client itself as { client } (an ioredis or node-redis client or cluster)",
  resetExpiryOnChange: "a bucket's expiry is always the time it takes to refill (it moves with every change)",
};

/** `text` as a SCAN MATCH pattern that matches only itself. */
function globEscape(text) {
  return text.replace(/[\\*?[\]]/g, "\\$&");
}

class TbStore {
  /**
   * @param options.client   a TbClient, or an ioredis / node-redis client or cluster
   * @param options.prefix   prepended to the key (default "rl:")
   * @param options.burst    the bucket's capacity (default: express-rate-limit's `limit`, which must then be a number)
   * @param options.rate     tokens per second (default: burst per `windowMs`)
   * @param options.timeoutMs  the deadline of each call (default 1000, a positive finite number), after which it
   *   rejects and is never charged later, as the middleware's (lane.cjs)
   */
  constructor(options = {}) {
    checkOptions("TbStore", options, OPTIONS, REFUSED);
    const { client, prefix = "rl:", burst, rate, timeoutMs = 1000 } = options;
    if (client === undefined) throw new TbArgumentError("TbStore needs { client }: a TbClient or a Redis client");
    this.client = TbClient.from(client);
    this._calls = callsFor(client, this.client, checkTimeout(timeoutMs, "TbStore"));
    this.prefix = prefix;
    this.localKeys = false;
    this._burst = burst;
    this._rate = rate;
  }

  init(options) {
    const limit = typeof options.limit === "number" ? options.limit : options.max;
    this.burst = this._burst ?? limit;
    if (typeof this.burst !== "number" || !(this.burst >= 0)) {
      // express-rate-limit logs an init error and goes on: every call then fails with it, not with a stray one.
      this._initError = new TbArgumentError(
        "TbStore: express-rate-limit's `limit` is not a number >= 0 (a function?): give the store { burst, rate }",
      );
      throw this._initError;
    }
    this._initError = undefined;
    // A limit given as a function is known only to the middleware, per request: a refusal then reports more hits
    // than any limit, so the middleware refuses whatever the function answers.
    this.limit = typeof limit === "number" ? limit : Number.MAX_SAFE_INTEGER - 1;
    this.windowMs = options.windowMs;
    this.rate = this._rate ?? this.burst / (options.windowMs / 1000);
  }

  _ready() {
    if (this._initError) throw this._initError;
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
    this._ready();
    // A bucket of 0 tokens holds nothing to take: every request is over the limit, as the library means `limit: 0`.
    if (this.burst === 0) return { totalHits: this.limit + 1, resetTime: new Date(Date.now() + this.windowMs) };
    return this._info(await this._calls.acquire(this._key(key), this.rate, this.burst, 1), 1);
  }

  async decrement(key) {
    this._ready();
    if (this.burst === 0) return;
    await this._calls.refund(this._key(key), this.rate, this.burst, 1);
  }

  async resetKey(key) {
    await this._calls.reset(this._key(key));
  }

  async get(key) {
    this._ready();
    if (this.burst === 0) return undefined;
    const reply = await this._calls.acquire(this._key(key), this.rate, this.burst, 0);
    // A full bucket is one with no hits left to refill: MemoryStore holds no record for such a key.
    if (reply.resetAfterMs === 0) return undefined;
    return this._info(reply, 0);
  }

  /** Deletes every bucket under the store's prefix, on every primary of a cluster. */
  async resetAll() {
    if (this.prefix === "") throw new TbArgumentError("TbStore.resetAll needs a prefix: it would empty the database");
    const pattern = `${globEscape(this.prefix)}*`;
    for (const send of await this.client._connection.primaries()) {
      let cursor = "0";
      do {
        const [next, keys] = await send(["SCAN", cursor, "MATCH", pattern, "COUNT", "1000"]);
        // One DEL per key: keys found together may sit in different slots of a cluster node.
        await Promise.all(keys.map((found) => send(["DEL", String(found)])));
        cursor = String(next);
      } while (cursor !== "0");
    }
  }
}

module.exports = { TbStore };
