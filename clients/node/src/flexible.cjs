"use strict";
// A limiter with rate-limiter-flexible's interface over a token bucket, so that moving from `RateLimiterRedis`
// is a change of class: the same options (each one RateLimiterRedis takes is implemented with its meaning or
// refused at construction, by name), the same methods and setters, the same `RateLimiterRes` fields, and the same
// rejection shape (a RateLimiterRes when refused, an Error when Redis fails and no insuranceLimiter answers). The
// bucket holds `points` tokens and refills `points` per `duration` seconds, so instead of a window that empties
// at once the limit recovers steadily. Each method is one module command:
//   consume   TB.ACQUIRE       penalty  TB.CHARGE (into debt if need be)     reward  TB.REFUND
//   block     TB.BLOCK         get      TB.ACQUIRE with cost 0 (a peek)      delete  DEL
//   set       DEL, then TB.CHARGE
// `msBeforeNext` is the wait before the points asked would be granted when refused, else the time until the bucket
// is full again; `consumedPoints` is the tokens in use (points - tokens, more than `points` in debt), plus the
// refused request's points.

const { TbClient } = require("./client.cjs");
const { TbArgumentError } = require("./errors.cjs");
const { Blocker, refillMs } = require("./block.cjs");
const { checkOptions, checkTimeout } = require("./options.cjs");
const { callsFor } = require("./lane.cjs");

/** rate-limiter-flexible's result object, field for field (its getters, toJSON, toString and inspect output). */
class RateLimiterRes {
  constructor(remainingPoints, msBeforeNext, consumedPoints, isFirstInDuration) {
    this.remainingPoints = remainingPoints ?? 0;
    this.msBeforeNext = msBeforeNext ?? 0;
    this.consumedPoints = consumedPoints ?? 0;
    this.isFirstInDuration = isFirstInDuration ?? false;
  }

  get msBeforeNext() {
    return this._msBeforeNext;
  }

  set msBeforeNext(ms) {
    this._msBeforeNext = ms;
  }

  get remainingPoints() {
    return this._remainingPoints;
  }

  set remainingPoints(points) {
    this._remainingPoints = points;
  }

  get consumedPoints() {
    return this._consumedPoints;
  }

  set consumedPoints(points) {
    this._consumedPoints = points;
  }

  get isFirstInDuration() {
    return this._isFirstInDuration;
  }

  set isFirstInDuration(value) {
    this._isFirstInDuration = Boolean(value);
  }

  _getDecoratedProperties() {
    return {
      remainingPoints: this.remainingPoints,
      msBeforeNext: this.msBeforeNext,
      consumedPoints: this.consumedPoints,
      isFirstInDuration: this.isFirstInDuration,
    };
  }

  [Symbol.for("nodejs.util.inspect.custom")]() {
    return this._getDecoratedProperties();
  }

  toString() {
    return JSON.stringify(this._getDecoratedProperties());
  }

  toJSON() {
    return this._getDecoratedProperties();
  }
}

const OPTIONS = [
  "storeClient",
  "points",
  "duration",
  "blockDuration",
  "keyPrefix",
  "execEvenly",
  "blockOnConsumed",
  "insuranceLimiter",
  "inMemoryBlockOnConsumed",
  "inMemoryBlockDuration",
  "rejectIfRedisNotReady",
  // redis-tb's own: the deadline of each call, never charged after it (lane.cjs).
  "timeoutMs",
  // Which client API RateLimiterRedis should call; the package finds that out from the client itself.
  "useRedisPackage",
  "useRedis3AndLowerPackage",
];
const REFUSED = {
  customIncrTtlLuaScript: "the bucket is kept by the module's commands (or the package's Lua script), not by a counter script",
  execEvenlyMinDelayMs: "it paces execEvenly, which is not implemented (TbClient.reserve paces requests)",
};
/** The longest block TB.BLOCK takes, in seconds (a day). */
const MAX_BLOCK_S = 86_400;
/** `duration: 0` (points that never come back) as a bucket: one refilling `points` per ten years. */
const NEVER_S = 10 * 365 * 86_400;

/** rate-limiter-flexible's in-memory block list (`inMemoryBlockOnConsumed`): key -> the time its block ends. */
class BlockedKeys {
  constructor() {
    this._ends = new Map();
  }

  addMs(key, ms) {
    this._ends.set(key, Date.now() + ms);
    if (this._ends.size > 999) {
      const now = Date.now();
      for (const [blocked, end] of this._ends) if (end <= now) this._ends.delete(blocked);
    }
  }

  msBeforeExpire(key) {
    const end = this._ends.get(key);
    return end !== undefined && end >= Date.now() ? end - Date.now() : 0;
  }

  delete(key) {
    if (key === undefined) this._ends.clear();
    else this._ends.delete(key);
  }
}

/** The points argument of a call, as the library takes it: an integer, or a string of digits (`"2"`). */
function pointsArgument(name, value) {
  if (typeof value === "string") {
    if (!/^[1-9][0-9]*$/.test(value)) {
      throw new TbArgumentError("Consuming string different than integer values is not supported by this package");
    }
    return Number(value);
  }
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new TbArgumentError(`${name} must be a finite number, got ${typeof value === "number" ? value : typeof value}`);
  }
  // The library's refusal, kept although a bucket could take fractions (TbClient takes them).
  if (!Number.isInteger(value)) {
    throw new TbArgumentError("Consuming decimal number of points is not supported by this package");
  }
  return value;
}

const LIMITER_METHODS = ["consume", "penalty", "reward", "get", "set", "block", "delete"];

class RateLimiterTB {
  /**
   * @param options.storeClient  an ioredis or node-redis client or cluster (or a TbClient), as for RateLimiterRedis
   * @param options.points       the burst (default 4, as rate-limiter-flexible); 0 or less refuses everything
   * @param options.duration     seconds to refill `points` tokens (default 1); 0: they never come back
   * @param options.blockDuration seconds to block a key on the refusal that crosses the limit (default 0: no block)
   * @param options.keyPrefix    default "rlflx"; the Redis key is `${keyPrefix}:${key}`
   * @param options.timeoutMs    the deadline of each call (default 1000, a positive finite number), after which it
   *   rejects with an Error (or the insuranceLimiter answers) and is never charged later, as the middleware's
   * The library's other options: see docs/node.md ("differs from rate-limiter-flexible").
   */
  constructor(options = {}) {
    checkOptions("RateLimiterTB", options, OPTIONS, REFUSED);
    if (options.storeClient === undefined) throw new TbArgumentError("RateLimiterTB needs { storeClient }: a Redis client");
    // The client is wrapped on first use, as the library touches its storeClient only when a call needs Redis
    // (so `rejectIfRedisNotReady` can refuse before that, whatever the object is).
    this._storeClient = options.storeClient;
    this._timeoutMs = checkTimeout(options.timeoutMs ?? 1000, "RateLimiterTB");
    this.points = options.points ?? 4;
    this.duration = options.duration ?? 1;
    this.blockDuration = options.blockDuration;
    this.execEvenly = options.execEvenly;
    this.keyPrefix = options.keyPrefix;
    this._checkBlockOnConsumed(options.blockOnConsumed);
    this._inMemoryBlockedKeys = new BlockedKeys();
    this.inMemoryBlockOnConsumed = options.inMemoryBlockOnConsumed;
    this.inMemoryBlockDuration = options.inMemoryBlockDuration;
    this._rejectIfRedisNotReady = Boolean(options.rejectIfRedisNotReady);
    this.insuranceLimiter = options.insuranceLimiter;
  }

  /** The TbClient over `storeClient`. */
  get client() {
    this._client ??= TbClient.from(this._storeClient);
    return this._client;
  }

  /** The client's calls under the deadline rule (lane.cjs). */
  get _calls() {
    this._callsOfClient ??= callsFor(this._storeClient, this.client, this._timeoutMs);
    return this._callsOfClient;
  }

  get _blocker() {
    this._blockerOfClient ??= new Blocker(this._calls);
    return this._blockerOfClient;
  }

  get points() {
    return this._points;
  }

  /** The library's meaning: any finite number; 0 or less refuses every consume. */
  set points(value) {
    if (!Number.isFinite(value)) throw new TbArgumentError(`points must be a finite number, got ${value}`);
    this._points = value;
  }

  get duration() {
    return this._duration;
  }

  /** Seconds to refill `points`; 0 (the library's "never expires"): consumed points never come back. */
  set duration(value) {
    if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
      throw new TbArgumentError(`duration must be a finite number >= 0, got ${value}`);
    }
    if (value === 0 && this._blockDuration > 0) throw this._neverWithBlock();
    this._duration = value;
  }

  get msDuration() {
    return this._duration * 1000;
  }

  get blockDuration() {
    return this._blockDuration;
  }

  set blockDuration(seconds) {
    seconds = seconds ?? 0;
    if (typeof seconds !== "number" || !(seconds <= MAX_BLOCK_S)) {
      throw new TbArgumentError(`blockDuration must be a number of seconds up to ${MAX_BLOCK_S} (TB.BLOCK's day), got ${seconds}`);
    }
    if (seconds > 0 && this._duration === 0) throw this._neverWithBlock();
    this._blockDuration = seconds;
    if (this._insuranceLimiter) this._insuranceLimiter.blockDuration = seconds;
  }

  get msBlockDuration() {
    return this._blockDuration * 1000;
  }

  get execEvenly() {
    return false;
  }

  set execEvenly(value) {
    if (value) throw new TbArgumentError("RateLimiterTB does not implement execEvenly: TbClient.reserve paces requests");
  }

  get keyPrefix() {
    return this._keyPrefix;
  }

  set keyPrefix(value) {
    value = value ?? "rlflx";
    if (typeof value !== "string") throw new TbArgumentError("keyPrefix must be a string");
    this._keyPrefix = value;
  }

  get insuranceLimiter() {
    return this._insuranceLimiter;
  }

  /** A limiter answering in place of Redis when a call fails (an Error, not a refusal), as the library's. */
  set insuranceLimiter(limiter) {
    if (limiter !== undefined && !LIMITER_METHODS.every((method) => typeof limiter?.[method] === "function")) {
      throw new TbArgumentError(`insuranceLimiter must be a limiter with ${LIMITER_METHODS.join(", ")}`);
    }
    this._insuranceLimiter = limiter;
    if (limiter) {
      limiter.blockDuration = this._blockDuration;
      limiter.execEvenly = false;
    }
  }

  get inMemoryBlockOnConsumed() {
    return this._inMemoryBlockOnConsumed;
  }

  set inMemoryBlockOnConsumed(value) {
    this._inMemoryBlockOnConsumed = value ? Number.parseInt(value, 10) : 0;
    if (this._inMemoryBlockOnConsumed > 0 && this._points > this._inMemoryBlockOnConsumed) {
      throw new TbArgumentError('inMemoryBlockOnConsumed option must be greater or equal "points" option');
    }
  }

  get inMemoryBlockDuration() {
    return this._inMemoryBlockDuration;
  }

  set inMemoryBlockDuration(value) {
    this._inMemoryBlockDuration = value ? Number.parseInt(value, 10) : 0;
    if (this._inMemoryBlockDuration > 0 && this._inMemoryBlockOnConsumed === 0) {
      throw new TbArgumentError("inMemoryBlockOnConsumed option must be set up");
    }
  }

  get msInMemoryBlockDuration() {
    return this._inMemoryBlockDuration * 1000;
  }

  /** Tokens per second. */
  get rate() {
    return this._points / (this._duration === 0 ? NEVER_S : this._duration);
  }

  getKey(key) {
    return this._keyPrefix.length > 0 ? `${this._keyPrefix}:${key}` : String(key);
  }

  parseKey(rlKey) {
    return rlKey.substring(this._keyPrefix.length > 0 ? this._keyPrefix.length + 1 : 0);
  }

  getInMemoryBlockMsBeforeExpire(rlKey) {
    return this._inMemoryBlockOnConsumed > 0 ? this._inMemoryBlockedKeys.msBeforeExpire(rlKey) : 0;
  }

  deleteInMemoryBlockedAll() {
    this._inMemoryBlockedKeys.delete();
  }

  /** Resolves with a RateLimiterRes when granted; rejects with one when refused, with an Error when Redis fails. */
  consume(key, pointsToConsume = 1, options = {}) {
    return this._insured("consume", [key, pointsToConsume, options], () => this._consume(key, pointsToConsume, options));
  }

  /** Takes `points` whatever the bucket holds (into debt). */
  penalty(key, points = 1, options = {}) {
    return this._insured("penalty", [key, points, options], async () => {
      points = pointsArgument("points", points);
      if (this._points <= 0) return new RateLimiterRes(0, this._windowMs(options), points, false);
      const rate = this._rate(options);
      const reply = await this._command(key, (rlKey) => this._calls.charge(rlKey, rate, this._points, points));
      return this._res(reply, this._untilFull(reply, options), 0, rate);
    });
  }

  /** Gives `points` back (nothing while the bucket is in debt). */
  reward(key, points = 1, options = {}) {
    return this._insured("reward", [key, points, options], async () => {
      points = pointsArgument("points", points);
      if (this._points <= 0) return new RateLimiterRes(0, this._windowMs(options), 0, false);
      const rate = this._rate(options);
      const reply = await this._command(key, (rlKey) => this._calls.refund(rlKey, rate, this._points, points));
      return this._res(reply, this._untilFull(reply, options), 0, rate);
    });
  }

  /**
   * Refuses the key for `secDuration` seconds (up to a day), after which the next request is admitted. 0, the
   * library's "forever", is refused: a bucket refills.
   */
  block(key, secDuration, options = {}) {
    return this._insured("block", [key, secDuration, options], async () => {
      this._checkBlock("block(key, secDuration)", secDuration);
      const waitMs = await this._command(key, (rlKey) =>
        this._blocker.block(rlKey, this.rate, this._points, 1, secDuration * 1000),
      );
      return new RateLimiterRes(0, waitMs, this._points + 1, false);
    });
  }

  /**
   * Sets the key's consumed points, as the library's `set`: 0 or less empties the record (a full bucket); more
   * leaves that many in use (above `points`, the bucket in debt), refilling at the bucket's rate; above `points`
   * the key is also refused for at least `secDuration` (default `duration`), after which the next request passes.
   */
  set(key, points, secDuration, options = {}) {
    return this._insured("set", [key, points, secDuration, options], async () => {
      points = pointsArgument("points", points);
      const seconds = secDuration >= 0 ? secDuration : this._duration;
      if (points > this._points) this._checkBlock("set(key, points, secDuration) above points", seconds);
      const rlKey = this.getKey(key);
      await this._delete(key);
      if (points <= 0 || this._points <= 0) return new RateLimiterRes(0, seconds > 0 ? seconds * 1000 : -1, points);
      await this._command(key, () => this._calls.charge(rlKey, this.rate, this._points, points));
      if (points <= this._points) return new RateLimiterRes(0, refillMs(this.rate, points), points);
      const waitMs = await this._command(key, () => this._blocker.block(rlKey, this.rate, this._points, 1, seconds * 1000));
      return new RateLimiterRes(0, waitMs, points);
    });
  }

  /** The key's state, or null when its bucket is full (nothing consumed that has not refilled). */
  get(key, options = {}) {
    return this._insured("get", [key, options], async () => {
      if (this._points <= 0) return null;
      const rate = this._rate(options);
      const reply = await this._command(key, (rlKey) => this._calls.acquire(rlKey, rate, this._points, 0));
      if (reply.resetAfterMs === 0) return null;
      return this._res(reply, this._untilFull(reply, options), 0, rate);
    });
  }

  /** Deletes the key's bucket (and any block on it); resolves true if it existed. */
  delete(key, options = {}) {
    return this._insured("delete", [key, options], () => this._delete(key));
  }

  async _delete(key) {
    const rlKey = this.getKey(key);
    const existed = await this._command(key, async () => {
      await this._blocker.forget(rlKey);
      return this._calls.reset(rlKey);
    });
    this._inMemoryBlockedKeys.delete(rlKey);
    return existed;
  }

  async _consume(key, pointsToConsume, options) {
    pointsToConsume = pointsArgument("pointsToConsume", pointsToConsume);
    const rlKey = this.getKey(key);
    const inMemoryMs = this.getInMemoryBlockMsBeforeExpire(rlKey);
    if (inMemoryMs > 0) throw new RateLimiterRes(0, inMemoryMs);
    if (this._points <= 0) throw new RateLimiterRes(0, this._windowMs(options), pointsToConsume, false);
    const rate = this._rate(options);
    const reply = await this._command(key, () => this._calls.acquire(rlKey, rate, this._points, pointsToConsume));
    // As the library's: the refusal that crosses the limit blocks the key, refusals inside the block do not extend
    // it, and after it the key starts afresh (block.cjs). A block set by block() or set() is read with or without
    // blockDuration: one shorter than a point's refill leaves the bucket empty past its end.
    const blocks = this.msBlockDuration;
    if (reply.allowed) {
      const afresh = await this._blocker.afterGrant(rlKey, rate, this._points, pointsToConsume, blocks, reply, true);
      return this._granted(rlKey, rate, pointsToConsume, options, afresh);
    }
    const { granted, waitMs } = await this._blocker.afterRefusal(
      rlKey, rate, this._points, pointsToConsume, blocks, reply, true,
    );
    if (granted) return this._granted(rlKey, rate, pointsToConsume, options, granted);
    // More than `points` never fits (wait -1): as the library, the wait is the window's (where no block is set).
    const windowMs = this._windowMs(options);
    const res = this._res(reply, windowMs === -1 ? -1 : waitMs < 0 ? windowMs : waitMs, pointsToConsume, rate);
    if (this._reachesInMemoryBlock(res)) {
      if (this._inMemoryBlockDuration > 0) res.msBeforeNext = this.msInMemoryBlockDuration;
      if (res.msBeforeNext > 0) this._inMemoryBlockedKeys.addMs(rlKey, res.msBeforeNext);
    }
    throw res;
  }

  /** The RateLimiterRes of a granted consume (and the in-memory block it may start). */
  _granted(rlKey, rate, pointsToConsume, options, reply) {
    const res = this._res(reply, this._untilFull(reply, options), 0, rate);
    res.isFirstInDuration = res.consumedPoints === pointsToConsume;
    // Without inMemoryBlockDuration the library keeps the key in memory while Redis would refuse it anyway: for
    // a bucket, until its next point is back.
    if (this._reachesInMemoryBlock(res) && !(this._inMemoryBlockDuration > 0)) {
      const nextPointMs = reply.resetAfterMs - ((this._points - 1) / rate) * 1000;
      if (nextPointMs > 0) this._inMemoryBlockedKeys.addMs(rlKey, nextPointMs);
    }
    return res;
  }

  _reachesInMemoryBlock(res) {
    return this._inMemoryBlockOnConsumed > 0 && res.consumedPoints >= this._inMemoryBlockOnConsumed;
  }

  /** The library's msBeforeNext for a window of the call's duration: its length, or -1 (never) for 0. */
  _windowMs(options) {
    const seconds = options?.customDuration >= 0 ? options.customDuration : this._duration;
    return seconds === 0 ? -1 : seconds * 1000;
  }

  /** msBeforeNext of a granted call: until the bucket is full again; -1 (never) where points never come back. */
  _untilFull(reply, options) {
    return this._windowMs(options) === -1 ? -1 : reply.resetAfterMs;
  }

  /** Tokens per second for a call: `options.customDuration` (seconds, 0 = never) in place of `duration`. */
  _rate(options) {
    const seconds = options?.customDuration >= 0 ? options.customDuration : this._duration;
    return this._points / (seconds === 0 ? NEVER_S : seconds);
  }

  /** Runs `call(rlKey)`, refused at once with the library's Error when `rejectIfRedisNotReady` finds it not ready. */
  async _command(key, call) {
    const rlKey = this.getKey(key);
    if (this._rejectIfRedisNotReady && !this.client._connection.ready(rlKey)) {
      throw new Error("Redis connection is not ready");
    }
    return call(rlKey);
  }

  /** `run()`, with a failure (an Error, never a refusal) answered by the insuranceLimiter's `method`, if any. */
  async _insured(method, args, run) {
    try {
      return await run();
    } catch (error) {
      if (error instanceof RateLimiterRes || error instanceof TbArgumentError || !this._insuranceLimiter) throw error;
      return this._insuranceLimiter[method](...args);
    }
  }

  _res(reply, msBeforeNext, refusedPoints, rate) {
    // In use: points - tokens. `remaining` stops at 0, so a debt (penalty, block) is read from the time to full.
    const inUse = Math.max(
      Math.ceil(this._points - reply.remaining),
      Math.ceil(((reply.resetAfterMs - 1) * rate) / 1000),
    );
    return new RateLimiterRes(reply.remaining, msBeforeNext, Math.max(0, inUse) + refusedPoints, false);
  }

  _checkBlock(what, seconds) {
    if (typeof seconds !== "number" || !(seconds > 0 && seconds <= MAX_BLOCK_S)) {
      throw new TbArgumentError(
        `${what}: seconds must be > 0 and at most ${MAX_BLOCK_S} (TB.BLOCK's day; the library's 0, "forever", cannot be a bucket's: it refills), got ${seconds}`,
      );
    }
    if (this._duration === 0) throw this._neverWithBlock();
  }

  _checkBlockOnConsumed(value) {
    const threshold = value ? Number.parseInt(value, 10) : 0;
    if (threshold > this._points + 1) {
      throw new TbArgumentError(
        "RateLimiterTB does not implement blockOnConsumed above points + 1: it counts refused requests, which a token bucket does not keep",
      );
    }
  }

  _neverWithBlock() {
    return new TbArgumentError(
      "RateLimiterTB: duration 0 (points never come back) cannot take a block: the block would end with the key still refused",
    );
  }
}

module.exports = { RateLimiterTB, RateLimiterRes };
