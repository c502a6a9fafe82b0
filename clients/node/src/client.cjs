"use strict";
// The typed client: one method per module command, each one round trip, each reply turned into an object with
// named fields (the README's command reference documents every field). Where the module is not loaded, the
// commands the shared Lua script implements run as EVALSHA instead; which one a server has is found out from the
// first call's reply, never by an extra round trip (see `backend`).

const { connect } = require("./connection.cjs");
const { TbReplyError, TbArgumentError, TbProtocolError, isReplyError } = require("./errors.cjs");
const script = require("./script.cjs");

const BACKENDS = ["auto", "module", "script"];

function number(name, value) {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new TbArgumentError(`${name} must be a finite number, got ${describe(value)}`);
  }
  return String(value);
}

function keyName(name, value) {
  if (typeof value !== "string" || value.length === 0) {
    throw new TbArgumentError(`${name} must be a non-empty string, got ${describe(value)}`);
  }
  return value;
}

function describe(value) {
  return typeof value === "string" ? JSON.stringify(value) : typeof value === "number" ? String(value) : typeof value;
}

function integers(command, reply, length) {
  if (!Array.isArray(reply) || reply.length !== length || !reply.every(Number.isInteger)) {
    throw new TbProtocolError(command, reply);
  }
  return reply;
}

function bucketList(name, buckets, withCost) {
  if (!Array.isArray(buckets) || buckets.length === 0) {
    throw new TbArgumentError(`${name} must be a non-empty array of buckets, got ${describe(buckets)}`);
  }
  const args = [];
  buckets.forEach((bucket, index) => {
    const where = `${name}[${index}]`;
    if (bucket === null || typeof bucket !== "object") {
      throw new TbArgumentError(`${where} must be an object { key, rate, burst${withCost ? ", cost" : ""} }`);
    }
    args.push(keyName(`${where}.key`, bucket.key), number(`${where}.rate`, bucket.rate));
    args.push(number(`${where}.burst`, bucket.burst));
    if (withCost) args.push(number(`${where}.cost`, bucket.cost ?? 1));
  });
  return args;
}

function isUnknownCommand(error) {
  return isReplyError(error) && /unknown command/i.test(error.message);
}

class TbClient {
  /**
   * @param redis an ioredis `Redis` or `Cluster`, or a node-redis client or cluster (already connecting).
   * @param options.backend "auto" (default): the module, or the Lua script if the server answers "unknown command";
   *   "module" or "script" to choose.
   */
  constructor(redis, { backend = "auto" } = {}) {
    if (!BACKENDS.includes(backend)) {
      throw new TbArgumentError(`backend must be one of ${BACKENDS.join(", ")}, got ${describe(backend)}`);
    }
    this.redis = redis;
    this._connection = connect(redis);
    this._backend = backend;
    this._detect = backend === "auto";
  }

  /**
   * The TbClient itself if given one, else a new TbClient (default options) wrapping the given Redis client: what
   * the adapters (TbStore, RateLimiterTB, TbThrottlerStorage, createHttpLimiter) do with their `client` option.
   */
  static from(client) {
    return client instanceof TbClient ? client : new TbClient(client);
  }

  /** "module" or "script" once known; "auto" until the first call has answered. */
  get backend() {
    return this._backend;
  }

  /** Which Redis client this wraps: "ioredis", "ioredis-cluster", "node-redis" or "node-redis-cluster". */
  get clientKind() {
    return this._connection.kind;
  }

  async _call(command, key, args) {
    if (this._backend === "script") return this._script(command, key, args);
    try {
      const reply = await this._connection.send(key, [command, ...args]);
      if (this._detect) {
        this._detect = false;
        this._backend = "module";
      }
      return reply;
    } catch (error) {
      // Calls sent before the first answer all meet "unknown command": each of them moves to the script. Once the
      // module has answered, an unknown command is an older module build's, and is reported as such.
      if (this._detect && isUnknownCommand(error) && script.supports(command)) {
        this._backend = "script";
        return this._script(command, key, args);
      }
      throw isReplyError(error) ? new TbReplyError(command, key, error) : error;
    }
  }

  async _script(command, key, args) {
    if (!script.supports(command)) {
      throw new TbArgumentError(
        `${command} needs the redis-tb module: the Lua script serves only ${script.commands().join(", ")}`,
      );
    }
    const { keys, argv } = script.arguments(command, args);
    const evalArgs = [String(keys.length), ...keys, ...argv];
    try {
      try {
        return await this._connection.send(key, ["EVALSHA", script.sha1(), ...evalArgs]);
      } catch (error) {
        // A restarted or failed-over server has forgotten the script: EVAL sends it and caches it again.
        if (!(isReplyError(error) && /^NOSCRIPT/.test(error.message))) throw error;
        return await this._connection.send(key, ["EVAL", script.source(), ...evalArgs]);
      }
    } catch (error) {
      throw isReplyError(error) ? new TbReplyError(command, key, error) : error;
    }
  }

  /** TB.ACQUIRE: takes `cost` tokens if the bucket holds them. */
  async acquire(key, rate, burst, cost = 1) {
    const args = [keyName("key", key), number("rate", rate), number("burst", burst), number("cost", cost)];
    const [allowed, remaining, retryAfterMs, resetAfterMs] = integers(
      "TB.ACQUIRE",
      await this._call("TB.ACQUIRE", key, args),
      4,
    );
    return { allowed: allowed === 1, remaining, retryAfterMs, resetAfterMs };
  }

  /** TB.ACQUIREALL: takes `cost` from every bucket, or from none. `buckets`: [{ key, rate, burst }]. */
  async acquireAll(cost, buckets) {
    const args = [number("cost", cost), ...bucketList("buckets", buckets, false)];
    const reply = await this._call("TB.ACQUIREALL", buckets[0].key, args);
    const [allowed, remaining, retryAfterMs, resetAfterMs, limitingIndex] = integers("TB.ACQUIREALL", reply, 5);
    return { allowed: allowed === 1, remaining, retryAfterMs, resetAfterMs, limitingIndex };
  }

  /**
   * TB.ACQUIREEACH: takes each bucket's own `cost` from every bucket, or nothing from any, and reports every
   * bucket. `buckets`: [{ key, rate, burst, cost = 1 }].
   */
  async acquireEach(buckets) {
    const args = bucketList("buckets", buckets, true);
    const reply = await this._call("TB.ACQUIREEACH", buckets[0].key, args);
    if (!Array.isArray(reply) || reply.length !== 2 + buckets.length) throw new TbProtocolError("TB.ACQUIREEACH", reply);
    const [allowed, limitingIndex] = integers("TB.ACQUIREEACH", reply.slice(0, 2), 2);
    const each = reply.slice(2).map((entry) => {
      const [fits, remaining, retryAfterMs, resetAfterMs] = integers("TB.ACQUIREEACH", entry, 4);
      return { fits: fits === 1, remaining, retryAfterMs, resetAfterMs };
    });
    return { allowed: allowed === 1, limitingIndex, buckets: each };
  }

  /** TB.ACQUIREATMOST: takes as many whole tokens as the bucket holds, up to `max`. */
  async acquireAtMost(key, rate, burst, max) {
    const args = [keyName("key", key), number("rate", rate), number("burst", burst), number("max", max)];
    const reply = await this._call("TB.ACQUIREATMOST", key, args);
    const [granted, remaining, retryAfterMs, resetAfterMs] = integers("TB.ACQUIREATMOST", reply, 4);
    return { granted, remaining, retryAfterMs, resetAfterMs };
  }

  /** TB.RESERVE: takes `cost` now (into debt if need be) when the wait is at most `maxWaitMs`. */
  async reserve(key, rate, burst, cost, maxWaitMs) {
    const args = [keyName("key", key), number("rate", rate), number("burst", burst), number("cost", cost)];
    args.push(number("maxWaitMs", maxWaitMs));
    const reply = await this._call("TB.RESERVE", key, args);
    const [granted, waitMs, remaining, resetAfterMs] = integers("TB.RESERVE", reply, 4);
    return { granted: granted === 1, waitMs, remaining, resetAfterMs };
  }

  /** TB.REFUND: gives `amount` tokens back (nothing while the bucket is in debt). */
  async refund(key, rate, burst, amount) {
    const args = [keyName("key", key), number("rate", rate), number("burst", burst), number("amount", amount)];
    const [refunded, remaining, resetAfterMs] = integers("TB.REFUND", await this._call("TB.REFUND", key, args), 3);
    return { refunded: refunded === 1, remaining, resetAfterMs };
  }

  /** TB.CHARGE: takes `cost` whatever the bucket holds, into debt if need be (a penalty). */
  async charge(key, rate, burst, cost) {
    const args = [keyName("key", key), number("rate", rate), number("burst", burst), number("cost", cost)];
    const [remaining, retryAfterMs, resetAfterMs] = integers("TB.CHARGE", await this._call("TB.CHARGE", key, args), 3);
    return { remaining, retryAfterMs, resetAfterMs };
  }

  /** TB.BLOCK: empties the bucket for `ms` milliseconds (into debt), after which it refills as usual. */
  async block(key, rate, burst, ms) {
    const args = [keyName("key", key), number("rate", rate), number("burst", burst), number("ms", ms)];
    const [remaining, retryAfterMs, resetAfterMs] = integers("TB.BLOCK", await this._call("TB.BLOCK", key, args), 3);
    return { remaining, retryAfterMs, resetAfterMs };
  }

  /** Deletes the bucket (a missing bucket is a full one). Resolves true if it existed. */
  async reset(key) {
    keyName("key", key);
    try {
      return (await this._connection.send(key, ["DEL", key])) === 1;
    } catch (error) {
      throw isReplyError(error) ? new TbReplyError("DEL", key, error) : error;
    }
  }
}

module.exports = { TbClient };
