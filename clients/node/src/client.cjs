"use strict";
// The typed client: one method per module command, each one round trip, each reply turned into an object with
// named fields (the README's command reference documents every field). Which backend serves the calls is found
// out from the replies, never by an extra round trip (see `backendInUse`): the module while its commands answer;
// else the Redis Functions library built from the shared Lua script (FCALL, loaded with FUNCTION LOAD where a
// server lacks it); else the script itself (EVALSHA) where functions are unavailable (Redis 6.2, an ACL user
// without FCALL or FUNCTION). A switch moves down that order, is reported once with its reason, and the call that
// met it is retried once on the next backend, so a failover to a primary without the module costs no call; a
// client that left a module that had answered tries it again once a minute, and goes back after a failback.
// Where the server refuses TIME inside scripts, the library and the script take the caller's clock instead.

const { connect } = require("./connection.cjs");
const { TbReplyError, TbArgumentError, TbProtocolError, isReplyError, isUnknownCommand } = require("./errors.cjs");
const script = require("./script.cjs");

/** The backends in the order they are tried. */
const ORDER = ["module", "function", "script"];
const BACKENDS = ["auto", ...ORDER];
const DESCRIBED = {
  module: () => "the redis-tb module",
  function: () => `the Redis Functions library ${script.libraryName()} (FCALL)`,
  script: () => "the Lua script (EVALSHA)",
};

/**
 * How often a client that left the module after a failover tries it again (one call's module command), in ms: a
 * failback to a primary with the module then brings the calls back to it. A property of TbClient for tests.
 */
const MODULE_RETRY_MS = 60_000;

/** The caller's clock: integer microseconds since the Unix epoch. */
function wallClockUs() {
  return Date.now() * 1000;
}

/** Warnings go to process.emitWarning (code REDIS_TB_BACKEND); notices are dropped unless a `logger` takes them. */
const DEFAULT_LOGGER = { warn: (message) => process.emitWarning(message, { code: "REDIS_TB_BACKEND" }) };

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

/** TB.ACQUIRE's reply as { allowed, remaining, retryAfterMs, resetAfterMs }. */
function acquireReply(reply) {
  if (!Array.isArray(reply) || reply.length !== 4) throw new TbProtocolError("TB.ACQUIRE", reply);
  const [allowed, remaining, retryAfterMs, resetAfterMs] = reply;
  if (!(Number.isInteger(allowed) && Number.isInteger(remaining) && Number.isInteger(retryAfterMs) && Number.isInteger(resetAfterMs))) {
    throw new TbProtocolError("TB.ACQUIRE", reply);
  }
  return { allowed: allowed === 1, remaining, retryAfterMs, resetAfterMs };
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

/** An error's text for a log line, without the arguments a server quotes after it (they hold keys, so identities). */
function summary(error) {
  return error.message.split(", with args beginning with")[0];
}

/** FCALL of a function the server does not hold: never loaded, or lost (FUNCTION FLUSH, a restart, a failover). */
function isFunctionMissing(error) {
  return /function not found/i.test(error.message);
}

/** FUNCTION LOAD refused because another client loaded the same library first. */
function isLibraryLoaded(error) {
  return /already exists/i.test(error.message);
}

/** Redis Functions cannot serve this client: no FCALL/FUNCTION, or its ACL user may not run them. */
function isFunctionsUnavailable(error) {
  return isUnknownCommand(error) || /permissions to run the '(fcall|function)/i.test(error.message) || error.libraryRefused === true;
}

// What a script's `redis.call('TIME')` meets where TIME is refused, by server (the same table as the Python
// package's `_protocol.py`, both checked against fixtures/backends.json):
//   a provider that forbids it (ElastiCache Serverless)    ERR This Redis command is not allowed from script
//   TIME renamed (rename-command), Redis 6.2                ... Unknown Redis command called from Lua script
//   TIME renamed, Redis 7.0+                                ERR Unknown Redis command called from script ...
//   TIME renamed, Valkey                                    ERR Unknown command called from script ...
//   an ACL user without TIME, Redis 6.2 and 7.0             ERR The user executing the script can't run this command
//   an ACL user without TIME, Redis 7.2+ and Valkey         ERR ACL failure in script: ... the 'time' command ...
// The script calls TIME before any write, so such a call wrote nothing and is retried once with the caller's
// clock; if that fails the same way, the refused command was another one (an ACL that is too narrow).
function isTimeRefused(error) {
  return /not allowed from script|unknown (redis )?command called from|user executing the script can't run|acl failure in script/i.test(
    error.message,
  );
}

/**
 * The class of fixtures/backends.json (docs/clients.md, "Which backend runs the calls") an error reply falls in,
 * the first in the order the client acts on them: "time-refused" (retry with the caller's clock),
 * "unknown-command" (the next backend), "functions-unavailable" (the script), "function-missing" (load the
 * library), "library-loaded" (another client loaded it: retry), else "other" (the error goes to the caller).
 */
function backendErrorClass(error) {
  if (isTimeRefused(error)) return "time-refused";
  if (isUnknownCommand(error)) return "unknown-command";
  if (isFunctionsUnavailable(error)) return "functions-unavailable";
  if (isFunctionMissing(error)) return "function-missing";
  if (isLibraryLoaded(error)) return "library-loaded";
  return "other";
}

class TbClient {
  /**
   * @param redis an ioredis `Redis` or `Cluster`, or a node-redis client or cluster (already connecting).
   * @param options.backend "auto" (default): the module, else the function library, else the Lua script, each
   *   where the server answers that the one before is unavailable; "module", "function" or "script" to choose.
   * @param options.nowUs the caller's clock, integer Unix microseconds (default from Date.now()), sent only where
   *   the server refuses TIME inside scripts: the bound over a window t becomes burst + rate * (t + skew), skew
   *   being the largest difference between the callers' clocks.
   * @param options.logger { warn(message), info?(message) }, as the middleware's `logger` option (console fits):
   *   each backend switch, once, with its reason; `info` for a first detection, `warn` when a backend that had
   *   answered goes away or the caller's clock is taken (default: warnings through process.emitWarning with code
   *   REDIS_TB_BACKEND, notices dropped).
   */
  constructor(redis, { backend = "auto", nowUs = wallClockUs, logger = DEFAULT_LOGGER } = {}) {
    if (!BACKENDS.includes(backend)) {
      throw new TbArgumentError(`backend must be one of ${BACKENDS.join(", ")}, got ${describe(backend)}`);
    }
    if (typeof nowUs !== "function") throw new TbArgumentError(`nowUs must be a function, got ${describe(nowUs)}`);
    if (typeof logger?.warn !== "function") throw new TbArgumentError("logger must have a warn(message) method");
    this.redis = redis;
    this._connection = connect(redis);
    this._mode = backend;
    this._inUse = backend === "auto" ? undefined : backend;
    this._answered = false;
    this._callerTime = false;
    this._nowUs = nowUs;
    /** When (performance.now()) the next call tries the module again; undefined: never (it never answered here). */
    this._moduleRetryAt = undefined;
    this._logger = logger;
  }

  /**
   * The TbClient itself if given one, else a new TbClient wrapping the given Redis client with `options`: what the
   * adapters (TbStore, RateLimiterTB, TbThrottlerStorage, createHttpLimiter) do with their `client` option.
   */
  static from(client, options) {
    return client instanceof TbClient ? client : new TbClient(client, options);
  }

  _log(level, message) {
    if (level === "warn") this._logger.warn(message);
    else this._logger.info?.(message);
  }

  /** A TbClient with this one's options over `redis`, another connection to the same server (the middleware's own). */
  over(redis) {
    return new TbClient(redis, { backend: this._mode, nowUs: this._nowUs, logger: this._logger });
  }

  /** "module", "function" or "script": which backend serves the calls; undefined before the first call (auto). */
  get backendInUse() {
    return this._inUse;
  }

  /** backendInUse, or "auto" before the first call. */
  get backend() {
    return this._inUse ?? "auto";
  }

  /** Which Redis client this wraps: "ioredis", "ioredis-cluster", "node-redis" or "node-redis-cluster". */
  get clientKind() {
    return this._connection.kind;
  }

  /**
   * One command on the backend in use, as `_callAny`; while the module is known to answer (and not due for a
   * retry), its command straight through the connection, without the loop's await, which is every call of a
   * steady client. An error reply goes through `_callAny`'s handling: a fall-back resends the call there.
   */
  _call(command, key, args) {
    if (this._inUse !== "module" || !this._answered || this._moduleRetryAt !== undefined) return this._callAny(command, key, args);
    return this._connection.send(key, [command, ...args]).then(undefined, (error) => this._moduleFailed(command, key, args, error));
  }

  /** An error of the module's command sent by `_call`: the loop's rule for the module backend. */
  _moduleFailed(command, key, args, error) {
    if (!isReplyError(error)) throw error;
    if (this._fallBack("module", command, error, backendErrorClass(error))) return this._callAny(command, key, args);
    throw new TbReplyError(command, key, error);
  }

  async _callAny(command, key, args) {
    if (this._moduleRetryAt !== undefined && performance.now() >= this._moduleRetryAt) {
      const again = await this._moduleAgain(command, key, args);
      if (again !== undefined) return again.reply;
    }
    let callerTime = this._callerTime;
    let refusal;
    for (;;) {
      const backend = this._inUse ?? "module";
      const callerUs = callerTime ? this._nowUs() : undefined;
      let reply;
      try {
        if (backend === "module") reply = await this._connection.send(key, [command, ...args]);
        else if (backend === "function") reply = await this._fcall(command, key, args, callerUs);
        else reply = await this._eval(command, key, args, callerUs);
      } catch (error) {
        if (!isReplyError(error)) throw error;
        const kind = backendErrorClass(error);
        if (backend !== "module" && !callerTime && kind === "time-refused") {
          callerTime = true; // retried once with the caller's clock; kept if that answers
          refusal = error;
          continue;
        }
        if (this._fallBack(backend, command, error, kind)) continue;
        throw new TbReplyError(command, key, error);
      }
      if (refusal !== undefined && !this._callerTime) {
        this._callerTime = true;
        this._log(
          "warn",
          `redis-tb: the server refuses TIME inside scripts (${summary(refusal)}); calls now send this process's ` +
            "clock, so the bound is burst + rate * (t + skew), skew the largest clock difference between the callers",
        );
      }
      if (this._inUse === undefined) {
        this._log("info", `redis-tb: calls go to ${DESCRIBED[backend]()}`);
        this._inUse = backend;
      }
      this._answered = true;
      return reply;
    }
  }

  /** Once a minute after a failover left the module: `{ reply }` if the module answers this call again. */
  async _moduleAgain(command, key, args) {
    this._moduleRetryAt = performance.now() + TbClient.moduleRetryMs;
    let reply;
    try {
      reply = await this._connection.send(key, [command, ...args]);
    } catch (error) {
      if (isReplyError(error) && backendErrorClass(error) === "unknown-command") return undefined;
      throw isReplyError(error) ? new TbReplyError(command, key, error) : error;
    }
    this._log("warn", `redis-tb: the redis-tb module answers again; calls now go to it instead of ${DESCRIBED[this._inUse]()}`);
    this._inUse = "module";
    this._answered = true;
    this._moduleRetryAt = undefined;
    return { reply };
  }

  /** Whether `error` (of the class `kind`) means `backend` cannot run here; if so, moves to the next backend (auto mode only). */
  _fallBack(backend, command, error, kind) {
    if (this._mode !== "auto") return false;
    if (backend === "module" && kind === "unknown-command" && script.supports(command)) {
      this._switch("function", `the server does not know ${command} (${summary(error)})`);
      return true;
    }
    if (backend === "function" && (kind === "unknown-command" || kind === "functions-unavailable")) {
      const what = error.libraryRefused ? "the server refused the library" : "Redis Functions are unavailable";
      this._switch("script", `${what} (${summary(error)})`);
      return true;
    }
    return false;
  }

  /** Moves to `to` and says why, once: a warning if the backend left had been answering, else a notice. */
  _switch(to, reason) {
    const left = this._inUse ?? "module";
    if (ORDER.indexOf(to) <= ORDER.indexOf(left)) return; // another call switched first
    if (this._answered) {
      this._log("warn", `redis-tb: ${reason}; calls now go to ${DESCRIBED[to]()} instead of ${DESCRIBED[left]()}`);
      if (left === "module") this._moduleRetryAt = performance.now() + TbClient.moduleRetryMs;
    } else {
      this._log("info", `redis-tb: ${reason}; calls go to ${DESCRIBED[to]()}`);
    }
    this._inUse = to;
    this._answered = false;
  }

  /** FCALL, loading the library first where the server lacks it: one load and one retry. */
  async _fcall(command, key, args, callerUs) {
    const fcall = script.fcallArguments(command, args, callerUs);
    try {
      return await this._connection.send(key, fcall);
    } catch (error) {
      if (!(isReplyError(error) && backendErrorClass(error) === "function-missing")) throw error;
    }
    try {
      await this._connection.send(key, ["FUNCTION", "LOAD", script.library()]);
    } catch (error) {
      if (!isReplyError(error)) throw error;
      if (backendErrorClass(error) === "library-loaded") return this._connection.send(key, fcall); // another client loaded it first
      // A plain ERR refuses the library itself (it does not compile or register there): no passing state (those
      // have their own codes: LOADING, BUSY, OOM, READONLY, MASTERDOWN, ...) and no permission (NOPERM).
      if (/^ERR /.test(error.message)) error.libraryRefused = true;
      throw error;
    }
    return this._connection.send(key, fcall);
  }

  /** EVALSHA; on NOSCRIPT (a restart, a failover, SCRIPT FLUSH), EVAL, which runs the script and caches it. */
  async _eval(command, key, args, callerUs) {
    const evalArgs = script.evalArguments(command, args, callerUs);
    try {
      return await this._connection.send(key, ["EVALSHA", script.sha1(), ...evalArgs]);
    } catch (error) {
      if (!(isReplyError(error) && /^NOSCRIPT/.test(error.message))) throw error;
      return this._connection.send(key, ["EVAL", script.source(), ...evalArgs]);
    }
  }

  /** TB.ACQUIRE: takes `cost` tokens if the bucket holds them. */
  async acquire(key, rate, burst, cost = 1) {
    const args = [keyName("key", key), number("rate", rate), number("burst", burst), number("cost", cost)];
    return acquireReply(await this._call("TB.ACQUIRE", key, args));
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

  /**
   * TB.LOWER: refills the bucket to now, then brings it down to `tokens` where it holds more (negative: into debt,
   * at most a day of refill); never raises it. What fail "local" sends when Redis answers again (local.cjs).
   */
  async lower(key, rate, burst, tokens) {
    const args = [keyName("key", key), number("rate", rate), number("burst", burst), number("tokens", tokens)];
    const [remaining, retryAfterMs, resetAfterMs] = integers("TB.LOWER", await this._call("TB.LOWER", key, args), 3);
    return { remaining, retryAfterMs, resetAfterMs };
  }

  /** TB.BLOCK: empties the bucket for `ms` milliseconds (into debt), after which it refills as usual. */
  async block(key, rate, burst, ms) {
    const args = [keyName("key", key), number("rate", rate), number("burst", burst), number("ms", ms)];
    const [remaining, retryAfterMs, resetAfterMs] = integers("TB.BLOCK", await this._call("TB.BLOCK", key, args), 3);
    return { remaining, retryAfterMs, resetAfterMs };
  }

  /**
   * CL.THROTTLE: redis-cell's GCRA limit, `countPerPeriod` per `period` seconds and `maxBurst + 1` at once, on a key
   * of its own (a string, not a token bucket). The waits are in seconds; `retryAfter` is -1 when allowed.
   */
  async throttle(key, maxBurst, countPerPeriod, period, quantity = 1) {
    const args = [keyName("key", key), number("maxBurst", maxBurst), number("countPerPeriod", countPerPeriod)];
    args.push(number("period", period), number("quantity", quantity));
    const reply = await this._call("CL.THROTTLE", key, args);
    const [limited, limit, remaining, retryAfter, resetAfter] = integers("CL.THROTTLE", reply, 5);
    return { limited: limited === 1, limit, remaining, retryAfter, resetAfter };
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

TbClient.moduleRetryMs = MODULE_RETRY_MS;

module.exports = { TbClient, backendErrorClass, isUnknownCommand, isFunctionMissing, isFunctionsUnavailable, isTimeRefused };
