"use strict";
// A limiter with rate-limiter-flexible's interface over a token bucket, so that moving from `RateLimiterRedis`
// is a change of class: same options (`storeClient`, `points`, `duration`, `blockDuration`, `keyPrefix`), same
// methods, same `RateLimiterRes` fields, and the same rejection shape (a RateLimiterRes when refused, an Error when
// Redis fails). The bucket holds `points` tokens and refills `points` per `duration` seconds, so instead of a
// window that empties at once the limit recovers steadily. Each method is one module command:
//   consume   TB.ACQUIRE       penalty  TB.CHARGE (into debt if need be)     reward  TB.REFUND
//   block     TB.BLOCK         get      TB.ACQUIRE with cost 0 (a peek)      delete  DEL
// `msBeforeNext` is the wait before `points` more would be granted when refused, else the time until the bucket is
// full again; `consumedPoints` is the tokens in use (burst - remaining), plus the refused request's points.

const { TbClient } = require("./client.cjs");
const { TbArgumentError } = require("./errors.cjs");
const { Blocker } = require("./block.cjs");

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

function positive(name, value) {
  if (typeof value !== "number" || !Number.isFinite(value) || !(value > 0)) {
    throw new TbArgumentError(`${name} must be a finite number > 0, got ${value}`);
  }
  return value;
}

class RateLimiterTB {
  /**
   * @param options.storeClient  an ioredis or node-redis client or cluster (or a TbClient), as for RateLimiterRedis
   * @param options.points       the burst (default 4, as rate-limiter-flexible)
   * @param options.duration     seconds to refill `points` tokens (default 1)
   * @param options.blockDuration seconds to block a key on its first refusal (default 0: no block)
   * @param options.keyPrefix    default "rlflx"; the Redis key is `${keyPrefix}:${key}`
   */
  constructor({ storeClient, points = 4, duration = 1, blockDuration = 0, keyPrefix = "rlflx", execEvenly } = {}) {
    if (storeClient === undefined) throw new TbArgumentError("RateLimiterTB needs { storeClient }: a Redis client");
    if (execEvenly) throw new TbArgumentError("RateLimiterTB does not implement execEvenly: use TbClient.reserve");
    this.client = TbClient.from(storeClient);
    this._blocker = new Blocker(this.client);
    this._points = positive("points", points);
    this._duration = positive("duration", duration);
    this._blockDuration = blockDuration;
    this._keyPrefix = keyPrefix;
  }

  get points() {
    return this._points;
  }

  get duration() {
    return this._duration;
  }

  get msDuration() {
    return this._duration * 1000;
  }

  get blockDuration() {
    return this._blockDuration;
  }

  set blockDuration(seconds) {
    this._blockDuration = seconds;
  }

  get msBlockDuration() {
    return this._blockDuration * 1000;
  }

  get execEvenly() {
    return false;
  }

  get keyPrefix() {
    return this._keyPrefix;
  }

  /** Tokens per second. */
  get rate() {
    return this._points / this._duration;
  }

  getKey(key) {
    return this._keyPrefix.length > 0 ? `${this._keyPrefix}:${key}` : String(key);
  }

  parseKey(rlKey) {
    return rlKey.substring(this._keyPrefix.length > 0 ? this._keyPrefix.length + 1 : 0);
  }

  _res(reply, msBeforeNext, extra = 0) {
    const consumed = Math.max(0, Math.ceil(this._points - reply.remaining)) + extra;
    return new RateLimiterRes(reply.remaining, msBeforeNext, consumed, false);
  }

  /** Resolves with a RateLimiterRes when granted; rejects with one when refused, with an Error when Redis fails. */
  async consume(key, pointsToConsume = 1) {
    const rlKey = this.getKey(key);
    const reply = await this.client.acquire(rlKey, this.rate, this._points, pointsToConsume);
    if (reply.allowed) {
      const res = this._res(reply, reply.resetAfterMs);
      res.isFirstInDuration = res.consumedPoints === pointsToConsume;
      return res;
    }
    // As the library's: the refusal that crosses the limit blocks the key; refusals inside the block do not
    // extend it, and the request after it is admitted (block.cjs).
    const waitMs = await this._blocker.afterRefusal(rlKey, this.rate, this._points, pointsToConsume, this.msBlockDuration, reply);
    throw this._res(reply, waitMs, pointsToConsume);
  }

  /** Takes `points` whatever the bucket holds (into debt). */
  async penalty(key, points = 1) {
    const reply = await this.client.charge(this.getKey(key), this.rate, this._points, points);
    return this._res(reply, reply.resetAfterMs);
  }

  /** Gives `points` back (nothing while the bucket is in debt). */
  async reward(key, points = 1) {
    const reply = await this.client.refund(this.getKey(key), this.rate, this._points, points);
    return this._res(reply, reply.resetAfterMs);
  }

  /** Refuses the key for `secDuration` seconds (0, rate-limiter-flexible's "forever", is refused: a bucket refills). */
  async block(key, secDuration) {
    positive("secDuration", secDuration);
    const waitMs = await this._blocker.block(this.getKey(key), this.rate, this._points, 1, secDuration * 1000);
    return new RateLimiterRes(0, waitMs, this._points + 1, false);
  }

  /** The key's state, or null when its bucket is full (nothing consumed that has not refilled). */
  async get(key) {
    const reply = await this.client.acquire(this.getKey(key), this.rate, this._points, 0);
    if (reply.resetAfterMs === 0) return null;
    return this._res(reply, reply.resetAfterMs);
  }

  /** Deletes the key's bucket; resolves true if it existed. */
  async delete(key) {
    await this._blocker.forget(this.getKey(key));
    return this.client.reset(this.getKey(key));
  }
}

module.exports = { RateLimiterTB, RateLimiterRes };
