"use strict";
// The middleware's way to Redis, and its deadlines (docs/clients.md, "Deadlines"): a limiter call that timed out
// is never charged later.
//
//   - A call is written only while the connection is known to answer: never queued in a Redis client's offline
//     queue, never resent after a reconnect. Before the first connection is up, a call waits (unwritten) for it
//     within its deadline; after a fault, calls fail at once until a probe answers.
//   - A call that misses its deadline marks the connection faulty: nothing more is written to it. A standalone
//     client's connection is the middleware's own (a duplicate of the client given, without offline queue or
//     automatic reconnection), so it is reset and dropped, and a probe (PING on a new connection) runs with a
//     backoff (PROBE_DELAYS_MS: 250 ms, 500 ms, then every second) until one answers. A Cluster client is the
//     application's and is kept: calls are held back until a PING through it answers.
//   - At most MAX_IN_FLIGHT calls are written and unanswered at once; the others wait, unwritten, within their own
//     deadline. While a written call has waited longer than a quarter of the deadline, new calls are not written
//     either. When Redis stalls, only the calls written before are on the socket, at most MAX_IN_FLIGHT of them
//     whatever the request rate, and those are the one case left (Redis runs them when it resumes).
//   - The application's client decides whether there is a connection at all: while it is closed (ioredis ended,
//     node-redis not open), calls fail at once as its own commands would, and the middleware's connection is
//     dropped; once the application connects it again, the lane starts afresh.
// The Python package's middleware (redis_tb._guard) and the Rust crate's client use the same delays, bound and hold.

const { TbArgumentError, TbProtocolError, TbReplyError, TbUnavailableError, isReplyError } = require("./errors.cjs");

/** Milliseconds from a failure to the next probe: the first soon, then spaced out; the last repeats. */
const PROBE_DELAYS_MS = [250, 500, 1000];
/** Limiter calls one lane has written and not yet seen answered, at most. */
const MAX_IN_FLIGHT = 64;
/** While a written call has waited this part of the deadline, no new call is written. */
const STALL_FRACTION = 0.25;

/** Rejects with a TbUnavailableError after `ms` unless `promise` settles first. */
function within(promise, ms, what) {
  let timer;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new TbUnavailableError(`redis-tb: ${what}: no reply from Redis within ${ms} ms`)), ms);
    timer.unref();
  });
  return Promise.race([promise, expired]).finally(() => clearTimeout(timer));
}

class Lane {
  /** `tb`: the TbClient over the application's client; `timeoutMs` > 0: each call's deadline. */
  constructor(tb, timeoutMs) {
    this.given = tb;
    this.timeoutMs = timeoutMs;
    this.stallMs = timeoutMs * STALL_FRACTION;
    this.own = !tb._connection.cluster;
    this.state = "idle"; // idle (never used, or the application's client opened again), connecting, up, down, closed
    this.generation = 0; // counts close(): a probe begun before it leaves its result alone
    this.everUp = false;
    this.tb = this.own ? undefined : tb;
    this.connection = undefined;
    this.lastError = undefined;
    this.probes = 0; // failed probes since the connection was last up
    // Calls not yet settled, { startedMs, writtenMs?, send, resolve, reject }: those written, in the order they
    // were written (so the first is the oldest: the stall check is O(1)), and those waiting unwritten.
    this.written = new Set();
    this.held = new Set();
    this.sweeper = undefined;
    if (typeof tb.redis?.on === "function") tb.redis.on("end", () => this.close());
  }

  /** Runs `send(tbClient)` under the rules above; rejects with TbUnavailableError when it is not sent in time. */
  run(send) {
    if (this.given._connection.closed()) {
      this.close();
      return Promise.reject(this._unavailable());
    }
    if (this.state === "closed") this._reopen();
    if (this.state === "idle") this._probe();
    if (this.state === "down" || this.state === "closed" || (this.state === "connecting" && this.everUp)) {
      return Promise.reject(this._unavailable());
    }
    return new Promise((resolve, reject) => {
      const nowMs = performance.now();
      const call = { startedMs: nowMs, writtenMs: undefined, send, resolve, reject };
      if (this.sweeper === undefined) {
        this.sweeper = setInterval(() => this._sweep(), Math.max(1, this.timeoutMs / 4));
        this.sweeper.unref();
      }
      // Nothing waiting before it and room to write (the steady state): written now, without the queue.
      if (this.held.size === 0 && this.state === "up") {
        if (this._writable(nowMs)) {
          this._write(call, nowMs);
          return;
        }
        // The connection was found not ready: the lane is down now, and refuses what it has not written.
        if (this.state !== "up") {
          reject(this._unavailable());
          return;
        }
      }
      this.held.add(call);
      this._release();
    });
  }

  /** Stops probing and drops the middleware's own connection (the application's client has ended). */
  close() {
    if (this.state === "closed") return;
    this.state = "closed";
    this.generation += 1;
    clearTimeout(this.probeTimer);
    this.connection?.drop();
    this.connection = undefined;
    if (this.own) this.tb = undefined;
    this._rejectUnwritten();
  }

  /** The application has connected its client again: the next call waits for a new connection, as the first did. */
  _reopen() {
    this.state = "idle";
    this.everUp = false;
    this.lastError = undefined;
    this.probes = 0;
  }

  _unavailable() {
    if (this.state === "closed") return new TbUnavailableError("redis-tb: not sent: the Redis client is closed");
    // A refusal at connection time (a wrong password, a user without rights) is a configuration error: pass it on
    // as itself, so that it is logged as one.
    if (isReplyError(this.lastError)) return this.lastError;
    return new TbUnavailableError("redis-tb: not sent: Redis has not answered since its last failure; a probe is pending", {
      cause: this.lastError,
    });
  }

  _stalled(nowMs) {
    const oldest = this.written.values().next().value;
    return oldest !== undefined && nowMs - oldest.writtenMs > this.stallMs;
  }

  /**
   * Whether a call may be written at `nowMs`: the connection is up and ready (one that is not faults the lane),
   * not stalled, and fewer than MAX_IN_FLIGHT calls are on it.
   */
  _writable(nowMs) {
    if (this.state !== "up") return false;
    if (!(this.connection === undefined ? this.given._connection.ready() : this.connection.ready())) {
      this._fault(new TbUnavailableError("redis-tb: the connection to Redis is not ready"));
      return false;
    }
    return this.written.size < MAX_IN_FLIGHT && !this._stalled(nowMs);
  }

  /** Writes the calls waiting, if the connection is up, ready and not stalled. */
  _release() {
    if (this.state !== "up" || this.held.size === 0) return;
    const nowMs = performance.now();
    if (!this._writable(nowMs)) return;
    for (const call of this.held) {
      if (this.written.size >= MAX_IN_FLIGHT) return;
      this.held.delete(call);
      this._write(call, nowMs);
    }
  }

  /** Sends `call` and settles it with the answer, unless its deadline answered first. */
  _write(call, nowMs) {
    this.written.add(call);
    call.writtenMs = nowMs;
    call.send(this.tb).then(
      (value) => {
        if (!this.written.delete(call)) return; // its deadline answered first
        call.resolve(value);
        this._release();
      },
      (error) => {
        if (this.written.delete(call)) {
          call.reject(error);
          this._release();
        }
        // An answer from the server (an error reply included) shows the connection works.
        const answered = isReplyError(error) || error instanceof TbReplyError || error instanceof TbArgumentError || error instanceof TbProtocolError;
        if (!answered) this._fault(error);
      },
    );
  }

  _sweep() {
    const nowMs = performance.now();
    let missed;
    for (const calls of [this.written, this.held]) {
      for (const call of calls) {
        if (nowMs - call.startedMs < this.timeoutMs) continue;
        calls.delete(call);
        const written = calls === this.written;
        const error = new TbUnavailableError(`redis-tb: no reply from Redis within ${this.timeoutMs} ms${written ? "" : " (not sent)"}`);
        call.reject(error);
        if (written) missed = error;
      }
    }
    if (missed !== undefined) this._fault(missed);
    if (this.written.size === 0 && this.held.size === 0) {
      clearInterval(this.sweeper);
      this.sweeper = undefined;
    }
  }

  /** The connection failed or missed a deadline: nothing more is written to it, and a probe is scheduled. */
  _fault(error) {
    if (this.state !== "up") return;
    this.state = "down";
    this.lastError = error;
    if (this.own) {
      this.connection?.drop();
      this.connection = undefined;
      this.tb = undefined;
    }
    this._rejectUnwritten();
    this._schedule();
  }

  _rejectUnwritten() {
    for (const call of this.held) {
      this.held.delete(call);
      call.reject(this._unavailable());
    }
  }

  _schedule() {
    if (this.state === "closed") return;
    const delayMs = PROBE_DELAYS_MS[Math.min(this.probes, PROBE_DELAYS_MS.length - 1)];
    this.probes += 1;
    this.probeTimer = setTimeout(() => this._probe(), delayMs);
    this.probeTimer.unref();
  }

  async _probe() {
    if (this.given._connection.closed()) this.close();
    if (this.state === "closed") return;
    const generation = this.generation;
    this.state = "connecting";
    let connection;
    try {
      if (this.own) {
        connection = this.given._connection.openOwn(this.timeoutMs);
        await within(connection.open(), this.timeoutMs, "connecting");
      } else {
        await within(this.given._connection.send("redis-tb:probe", ["PING"]), this.timeoutMs, "PING");
      }
    } catch (error) {
      connection?.drop();
      if (this.generation !== generation) return;
      this.state = "down";
      this.lastError = error;
      this._rejectUnwritten();
      this._schedule();
      return;
    }
    if (this.generation !== generation) {
      connection?.drop();
      return;
    }
    if (this.own) {
      this.connection = connection;
      this.tb = this.given.over(connection.redis);
      connection.onClose(() => {
        if (this.connection === connection) this._fault(new TbUnavailableError("redis-tb: the connection to Redis closed"));
      });
    }
    this.state = "up";
    this.everUp = true;
    this.probes = 0;
    this._release();
  }
}

const lanes = new WeakMap();

/**
 * The lane for calls with deadline `timeoutMs` through `tb`, the TbClient over `client` (what the application
 * gave: a TbClient or a Redis client): one per client and deadline, so the limiters of one application (a
 * Fastify plugin's routes) share one connection.
 */
function laneFor(client, tb, timeoutMs) {
  let byTimeout = lanes.get(client);
  if (byTimeout === undefined) {
    byTimeout = new Map();
    lanes.set(client, byTimeout);
  }
  let lane = byTimeout.get(timeoutMs);
  if (lane === undefined) {
    lane = new Lane(tb, timeoutMs);
    byTimeout.set(timeoutMs, lane);
  }
  return lane;
}

/** The TbClient methods a drop-in calls, each one command (or one round trip) under the deadline. */
const METHODS = ["acquire", "acquireAll", "acquireEach", "acquireAtMost", "reserve", "refund", "charge", "block", "reset"];

/**
 * The calls of the middleware or of a drop-in (TbStore, RateLimiterTB, TbThrottlerStorage) through `tb` (the
 * TbClient over `client`, what the application gave) under the deadline rule: `run(send)` runs `send(tbClient)`
 * through the lane of `client` and `timeoutMs`, or straight through `tb` when `timeoutMs` is 0; the TbClient
 * methods of METHODS and `send(key, args)` (a raw command) each run that way. A drop-in's call of several commands
 * makes each under its own deadline, and the first one missed rejects the call: after it the lane writes nothing.
 */
function callsFor(client, tb, timeoutMs) {
  const lane = timeoutMs > 0 && Number.isFinite(timeoutMs) ? laneFor(client, tb, timeoutMs) : undefined;
  const run = (send) => (lane === undefined ? send(tb) : lane.run(send));
  const calls = { run, send: (key, args) => run((through) => through._connection.send(key, args)) };
  for (const method of METHODS) calls[method] = (...args) => run((through) => through[method](...args));
  return calls;
}

module.exports = { laneFor, callsFor, MAX_IN_FLIGHT, PROBE_DELAYS_MS, STALL_FRACTION };
