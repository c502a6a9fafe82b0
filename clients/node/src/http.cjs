"use strict";
// What the Express middleware and the Fastify plugin share: from a request to a decision, its headers and, when
// refused, the 429 body. One call to Redis per request: TB.ACQUIRE for one limit, TB.ACQUIREEACH for several
// (all or nothing, and a report on every bucket for the headers). Shadow limits (docs/operating.md, "Watching the
// middleware") take a second call, made only when the enforced limits allow the request: all or nothing among
// themselves, never refusing, never in the headers. Each request and limiter call is counted (metrics.cjs).

const { TbClient } = require("./client.cjs");
const { TbArgumentError, classifyFailure } = require("./errors.cjs");
const { callsFor } = require("./lane.cjs");
const { headersFor, waitMs, FORMATS } = require("./headers.cjs");
const { checkShadow, limitList } = require("./limit.cjs");
const { metricsFor } = require("./metrics.cjs");
const { acquireEachBySlot, giveBack } = require("./slots.cjs");
const { LocalBuckets, CAPACITY } = require("./local.cjs");
const { checkBody, checkCapacity, checkPrefix, checkStatusCode, checkTimeout } = require("./options.cjs");
const { SKIP, DEFAULT_IPV6_SUBNET, bucketKey, checkIpv6Subnet, ipIdentity, isAnonymous } = require("./identity.cjs");

let anonymousWarned = false;

/** Once per process: a request without an identity is limited under the shared anonymous one. */
function warnAnonymous() {
  if (anonymousWarned) return;
  anonymousWarned = true;
  process.emitWarning(
    "redis-tb: a request had no identity (no peer address: a Unix socket, a reset connection, or a key function " +
      "that returned nothing); such requests share one bucket, the anonymous one. Return SKIP from the key " +
      "function to let a request through unlimited.",
    { code: "REDIS_TB_ANONYMOUS" },
  );
}

/** A key function's result as an identity: SKIP, a string, or undefined (none); anything else is refused. */
function identityOf(result, name) {
  if (isAnonymous(result)) return undefined;
  if (result === SKIP || typeof result === "string") return result;
  if (typeof result === "number" || typeof result === "bigint") return String(result);
  throw new TbArgumentError(`the key function of limit ${JSON.stringify(name)} must return a string, nothing or SKIP, got ${typeof result}`);
}

/** The Python package's body: { error, limit, retry_after_ms }, the last left out when waiting never helps. */
function defaultBody(decision) {
  const limiting = decision.buckets[decision.limitingIndex] ?? decision.buckets[0];
  const retryMs = waitMs(decision);
  const body = { error: "rate limit exceeded", limit: limiting.name };
  if (retryMs >= 0) body.retry_after_ms = retryMs;
  return body;
}

/** The decision on one bucket from TB.ACQUIRE's `reply`: each bucket is its limit's fields beside its report. */
function decisionOfOne(bucket, reply) {
  const report = {
    name: bucket.name,
    rate: bucket.rate,
    burst: bucket.burst,
    cost: bucket.cost,
    key: bucket.key,
    shadow: bucket.shadow,
    allowed: reply.allowed,
    remaining: reply.remaining,
    retryAfterMs: reply.retryAfterMs,
    resetAfterMs: reply.resetAfterMs,
    fits: reply.allowed,
  };
  return { allowed: reply.allowed, limitingIndex: 0, buckets: [report] };
}

const FAIL_MODES = ["local", "open", "closed"];
const ERROR_LOG_INTERVAL_MS = 60_000;
const SHADOW_LOG_INTERVAL_MS = 1000;

/**
 * What the limiter logs about Redis failures (docs/clients.md, "When Redis fails"): a warning when a fault
 * begins (then nothing until Redis has answered again, and for the same row at most once a minute, since a fault
 * of one shard or of some calls alternates with answers), and configuration errors (auth, ACL, a key of another
 * type, any unexpected error reply) at error level whatever the fail mode, at most once a minute per row, whether a
 * call or a charge-back of fail "local" (local.cjs) met them. A refund of a request refused in part that failed
 * (slots.cjs) is a warning, at most once a minute per row.
 */
function failureLog(logger, fail) {
  let faulty = false;
  const lastWarningMs = new Map();
  const lastErrorMs = new Map();
  const lastRefundMs = new Map();
  const due = (times, row) => {
    const now = performance.now();
    const last = times.get(row);
    if (last !== undefined && now - last < ERROR_LOG_INTERVAL_MS) return false;
    times.set(row, now);
    return true;
  };
  return {
    failed(error, failure) {
      if (failure.action === "fail-mode") {
        if (faulty) return;
        faulty = true;
        if (!due(lastWarningMs, failure.row)) return;
        logger.warn(`redis-tb: Redis is unavailable (${failure.row}: ${error?.message ?? error}); fail mode "${fail}" until it answers`);
        return;
      }
      faulty = true;
      if (!due(lastErrorMs, failure.row)) return;
      logger.error(`redis-tb: a limiter call failed (${failure.row}, a configuration error: ${error?.message ?? error}); fail mode "${fail}"`);
    },
    answered() {
      faulty = false;
    },
    chargeBackRefused(error, failure, share) {
      if (!due(lastErrorMs, failure.row)) return;
      logger.error(
        `redis-tb: Redis refused a charge-back (${failure.row}, a configuration error: ${error?.message ?? error}); what it ` +
          `covered (${share} admitted in memory) is dropped, and the call goes on to Redis`,
      );
    },
    refundFailed(error, failure, key) {
      if (!due(lastRefundMs, failure.row)) return;
      logger.warn(
        `redis-tb: could not give back what a refused request took from ${JSON.stringify(key)} (${failure.row}: ` +
          `${error?.message ?? error}); the request stays refused and the bucket keeps those tokens (logged at most once a minute)`,
      );
    },
  };
}

/**
 * Options (the Express middleware and the Fastify plugin take the same; the names the Python package's middleware
 * also has mean the same there, and both packages write the same keys, so they share buckets):
 *   client      a TbClient, or an ioredis / node-redis client or cluster to wrap in one
 *   limits      { name, rate, burst, cost?, key? } or an array of them; a limit's `key(req)` replaces the shared
 *               key function and its `cost` the shared cost
 *   key         (req) => string: whose bucket (default: the peer address through ipIdentity). Nothing (undefined,
 *               null, "") limits the request under the shared anonymous identity; SKIP lets it through unlimited
 *   ipv6Subnet  the prefix length the default key groups IPv6 clients by (default 56, 1 to 64)
 *   cost        tokens per request, a number or (req) => number (default 1)
 *   prefix      the Redis key is `${prefix}{${escaped identity}}:${name}` (default "ratelimit:"; no brace, as the
 *               hash tag is the identity's)
 *   standard    which header fields: "both" (default), "draft", "legacy" or "none"
 *   fail        when Redis fails or does not answer in time (docs/clients.md's failure table): "local" (default)
 *               limits with in-memory buckets of the same limits in this process (local.cjs), "open" lets the
 *               request through, "closed" answers 503 with Retry-After: 1
 *   localCapacity  the keys fail "local" keeps in memory (default 10,000, a positive integer); beyond, a limit's
 *               overflow bucket
 *   logger      { warn(message), error(message) } for Redis failures (default: console)
 *   timeoutMs   the deadline of a limiter call (default 1000, a positive finite number), never charged after it
 *               (lane.cjs)
 *   statusCode  for a refusal (default 429, 400 to 599)
 *   body        the refusal's JSON body: an object, or (decision) => object
 *   onError     (error, req, failureClass) => void, called for every failed limiter call (then the fail mode
 *               answers), with the failure table's class of the error ("timeout", "oom", ...)
 *   shadow      true: every limit in shadow mode (a limit's own `shadow: true` puts that one alone): charged as
 *               usual, but a request only shadow limits refuse is served, counted and logged (once a second per
 *               limit), and the headers show the enforced limits only
 *   metrics     a prom-client Registry to count into, false for none (default: prom-client's default registry
 *               where prom-client is installed)
 */
function createHttpLimiter(options) {
  if (options === null || typeof options !== "object") throw new TbArgumentError("options must be an object");
  const { client, cost = 1, prefix = "ratelimit:", standard = "both", ipv6Subnet = DEFAULT_IPV6_SUBNET } = options;
  checkIpv6Subnet(ipv6Subnet);
  const { key = (req) => ipIdentity(req.ip ?? req.socket?.remoteAddress, { ipv6Subnet }) } = options;
  const { fail = "local", timeoutMs = 1000, statusCode = 429, body = defaultBody, onError, logger = console } = options;
  const { localCapacity = CAPACITY } = options;
  checkCapacity(localCapacity);
  if (client === undefined) throw new TbArgumentError("client is required: a TbClient or a Redis client");
  if (!FORMATS.includes(standard)) throw new TbArgumentError(`standard must be one of ${FORMATS.join(", ")}`);
  checkTimeout(timeoutMs);
  if (!FAIL_MODES.includes(fail)) throw new TbArgumentError(`fail must be one of ${FAIL_MODES.join(", ")}, got ${fail}`);
  if (typeof logger?.warn !== "function" || typeof logger?.error !== "function") {
    throw new TbArgumentError("logger must have warn(message) and error(message) methods");
  }
  checkPrefix(prefix);
  checkStatusCode(statusCode);
  checkBody(body);
  if (typeof key !== "function") throw new TbArgumentError("key must be a function of the request");
  const everyShadow = checkShadow(options.shadow, "shadow");
  const limits = limitList(options.limits).map((limit) => (everyShadow ? { ...limit, shadow: true } : limit));
  const anyShadow = limits.some((limit) => limit.shadow);
  if (onError !== undefined && typeof onError !== "function") throw new TbArgumentError("onError must be a function (error, req, failureClass)");
  const metrics = metricsFor(options.metrics);
  // A logger of the application also hears of backend switches; by default those stay warnings (emitWarning).
  const tb = TbClient.from(client, options.logger === undefined ? undefined : { logger });
  // Each call under its deadline through the lane (lane.cjs: never charged after it).
  const { run } = callsFor(client, tb, timeoutMs);
  const failures = failureLog(logger, fail);
  const local = fail === "local" ? new LocalBuckets({ capacity: localCapacity }) : undefined;
  const shadowLoggedMs = new Map();

  /** The buckets `req` takes from (identity and cost found), or an empty list when every limit is skipped. */
  async function bucketsFor(req) {
    let requestCost = typeof cost === "function" ? cost(req) : cost;
    if (typeof requestCost?.then === "function") requestCost = await requestCost;
    const buckets = [];
    for (const limit of limits) {
      let result = (limit.key ?? key)(req);
      if (typeof result?.then === "function") result = await result;
      const identity = identityOf(result, limit.name);
      if (identity === SKIP) continue;
      if (identity === undefined) warnAnonymous();
      buckets.push({ ...limit, key: bucketKey(prefix, identity, limit.name), cost: limit.cost ?? requestCost });
    }
    return buckets;
  }

  /**
   * One call to Redis for `buckets` through `redis`: TB.ACQUIRE for one, TB.ACQUIREEACH for several (on a Cluster,
   * one per slot, slots.cjs). { decision, refunds }: `refunds`, for giveBack, when a part of several refused.
   */
  async function decide(redis, buckets) {
    if (buckets.length === 1) {
      const reply = await redis.acquire(buckets[0].key, buckets[0].rate, buckets[0].burst, buckets[0].cost);
      return { decision: decisionOfOne(buckets[0], reply), refunds: [] };
    }
    const { reply, refunds } = await acquireEachBySlot(redis, buckets);
    const decision = {
      allowed: reply.allowed,
      limitingIndex: reply.limitingIndex,
      buckets: buckets.map((bucket, index) => ({ ...bucket, ...reply.buckets[index] })),
    };
    return { decision, refunds };
  }

  /**
   * One limiter call for `buckets`: { decision } where Redis answered, or { decision?, error } where it failed (a
   * decision when fail "local" decided in memory). Logs and counts it, and tells onError of a failure.
   */
  async function limiterCall(req, buckets) {
    const started = metrics === undefined ? 0 : performance.now();
    let source;
    let refunds = [];
    const call = async (redis) => {
      const decided = await decide(redis, buckets);
      source = redis.backendInUse ?? "module"; // set once a call has answered
      refunds = decided.refunds;
      return decided.decision;
    };
    let outcome;
    if (local !== undefined) {
      // A charge-back (TB.LOWER) for each key Redis has not seen all of, answered before the call is sent, or the
      // in-memory decision (local.cjs).
      // A charge-back refused for a configuration error is logged, counted and given to onError, as a failed
      // call is; the call itself goes on to Redis.
      const refused = (error, share) => {
        const failure = classifyFailure(error);
        failures.chargeBackRefused(error, failure, share);
        metrics?.failed(failure.class);
        report(error, req, failure);
      };
      outcome = await local.decide(buckets, run, call, refused);
    } else {
      try {
        outcome = { decision: await run(call) };
      } catch (error) {
        if (error instanceof TbArgumentError) throw error;
        outcome = { error };
      }
    }
    if (outcome.error === undefined) {
      failures.answered();
      // Redis refused the request: it stays refused, whatever happens to the refunds (slots.cjs).
      if (refunds.length > 0) {
        await giveBack(run, refunds, (error, bucket) => failures.refundFailed(error, classifyFailure(error), bucket.key));
      }
      metrics?.call(source, undefined, (performance.now() - started) / 1000);
      return outcome;
    }
    return failed(req, outcome, started);
  }

  /** A limiter call begun at `started` that failed: logged, counted and given to onError. Returns `outcome`. */
  function failed(req, outcome, started) {
    const failure = classifyFailure(outcome.error);
    failures.failed(outcome.error, failure);
    metrics?.call(fail, failure.class, (performance.now() - started) / 1000);
    report(outcome.error, req, failure);
    return outcome;
  }

  /** Gives a failure to onError, whose own exception is logged and goes no further. */
  function report(error, req, failure) {
    if (onError === undefined) return;
    try {
      onError(error, req, failure.class);
    } catch (hookError) {
      logger.error(`redis-tb: onError threw (${hookError?.message ?? hookError}); the fail mode answers as usual`);
    }
  }

  /** A decision on `buckets` with each bucket's limit (name, rate, burst, cost, key) beside its report. */
  function withLimits(buckets, decision) {
    return { ...decision, buckets: buckets.map((bucket, index) => ({ ...bucket, ...decision.buckets[index] })) };
  }

  /** The answer for the enforced limits' `buckets`: allowed with its headers, refused, or the fail mode's. */
  async function enforce(req, buckets) {
    return answerCall(buckets, await limiterCall(req, buckets));
  }

  /** The answer for the enforced limits' `buckets` once their limiter call has settled. */
  function answerCall(buckets, { decision, error }) {
    if (error === undefined) return answer(decision);
    if (fail === "open") return { action: "allow", headers: {}, error };
    if (fail === "closed") {
      return { action: "unavailable", headers: { "retry-after": "1" }, status: 503, body: { error: "rate limiter unavailable" }, error };
    }
    return { ...answer(withLimits(buckets, decision)), error };
  }

  /**
   * The shadow limits' `buckets`, charged in their own call, as enforced limits would be: { decision, refused }
   * where Redis or fail "local" decided; where the fail mode "open" answered, { refused: false }, and where
   * "closed" did, { refused: true } (enforced, the limits would have had the request refused with a 503).
   */
  async function tryShadow(req, buckets) {
    const { decision, error } = await limiterCall(req, buckets);
    if (decision === undefined) return { refused: fail === "closed" };
    const decided = error === undefined ? decision : withLimits(buckets, decision);
    return { decision: decided, refused: !decided.allowed };
  }

  /**
   * A request that shadow limits refused, logged at most once a second per limit: those of `buckets` that did not
   * fit, or all of them where the fail mode "closed" answered (`decision` undefined).
   */
  function logShadowRefusal(buckets, decision) {
    const now = performance.now();
    for (const bucket of decision?.buckets ?? buckets) {
      if (decision !== undefined && bucket.fits !== false) continue;
      const last = shadowLoggedMs.get(bucket.name);
      if (last !== undefined && now - last < SHADOW_LOG_INTERVAL_MS) continue;
      shadowLoggedMs.set(bucket.name, now);
      let why = "Redis failed and the fail mode is closed";
      if (decision !== undefined) why = bucket.retryAfterMs < 0 ? "a cost above its burst" : `retry after ${bucket.retryAfterMs} ms`;
      logger.warn(
        `redis-tb: shadow limit ${JSON.stringify(bucket.name)} would have refused a request (${why}); it was served ` +
          "(logged at most once a second per limit)",
      );
    }
  }

  /** The outcome of a decision: allowed with its headers, or refused with `statusCode` and the body. */
  function answer(decision) {
    const headerValues = headersFor(decision, standard);
    if (decision.allowed) return { action: "allow", headers: headerValues, decision };
    return { action: "refuse", headers: headerValues, status: statusCode, body: refusalBody(decision), decision };
  }

  /**
   * The body of a refusal. A body function that throws, or returns what JSON cannot hold (a BigInt, a cycle), is
   * logged and the default body answers: a refusal never becomes a 500, as in the Python package.
   */
  function refusalBody(decision) {
    if (typeof body !== "function") return body;
    try {
      const made = body(decision);
      JSON.stringify(made);
      return made;
    } catch (error) {
      const limiting = decision.buckets[decision.limitingIndex] ?? decision.buckets[0];
      logger.error(`redis-tb: the body function failed for limit ${JSON.stringify(limiting?.name)} (${error?.message ?? error}); the default body answers`);
      return defaultBody(decision);
    }
  }

  /** `check` for any limits: each request's buckets listed, enforced, then the shadow limits' tried. */
  async function checkAll(req) {
    const buckets = await bucketsFor(req);
    if (buckets.length === 0) {
      metrics?.request("skipped");
      return { action: "allow", headers: {} };
    }
    if (!anyShadow) {
      const outcome = await enforce(req, buckets);
      count(outcome);
      return outcome;
    }
    const enforced = buckets.filter((bucket) => !bucket.shadow);
    const outcome = enforced.length === 0 ? { action: "allow", headers: {} } : await enforce(req, enforced);
    const tried = enforced.length === buckets.length || outcome.action !== "allow" ? [] : buckets.filter((bucket) => bucket.shadow);
    if (tried.length === 0) {
      count(outcome);
      return outcome;
    }
    const { decision, refused } = await tryShadow(req, tried);
    if (!refused) {
      metrics?.request("allowed");
    } else {
      metrics?.request("shadow_refused");
      if (decision !== undefined) metrics?.refused(decision.buckets);
      logShadowRefusal(tried, decision);
    }
    return decision === undefined ? outcome : { ...outcome, shadow: decision };
  }

  /**
   * checkAll for the common case, one limit and no shadow limit: bucketsFor, enforce and limiterCall for one bucket,
   * the same steps in the same order, without their lists, spreads and layers of promises (one await, the limiter
   * call, where the key and cost functions answer at once). A key that owes Redis a charge-back (fail "local")
   * takes checkAll's way, which sends it.
   */
  async function checkOne(req) {
    const limit = limits[0];
    let requestCost = typeof cost === "function" ? cost(req) : cost;
    if (typeof requestCost?.then === "function") requestCost = await requestCost;
    let result = (limit.key ?? key)(req);
    if (typeof result?.then === "function") result = await result;
    const identity = identityOf(result, limit.name);
    if (identity === SKIP) {
      metrics?.request("skipped");
      return { action: "allow", headers: {} };
    }
    if (identity === undefined) warnAnonymous();
    const bucket = {
      name: limit.name,
      rate: limit.rate,
      burst: limit.burst,
      cost: limit.cost ?? requestCost,
      key: bucketKey(prefix, identity, limit.name),
      shadow: limit.shadow,
    };
    let outcome;
    if (local !== undefined && local.diverged(bucket.key)) {
      outcome = await enforce(req, [bucket]);
      count(outcome);
      return outcome;
    }
    const started = metrics === undefined ? 0 : performance.now();
    let source;
    let reply;
    let decidedHere = false;
    try {
      reply = await run(async (redis) => {
        const answered = await redis.acquire(bucket.key, bucket.rate, bucket.burst, bucket.cost);
        source = redis.backendInUse ?? "module";
        // Remembered as LocalBuckets.decide does: not once the call was decided in memory.
        if (!decidedHere) local?.observeOne(bucket, answered.resetAfterMs);
        return answered;
      });
    } catch (error) {
      if (error instanceof TbArgumentError) throw error;
      decidedHere = true;
      outcome = answerCall([bucket], failed(req, { decision: local?.acquire([bucket]), error }, started));
      count(outcome);
      return outcome;
    }
    failures.answered();
    metrics?.call(source, undefined, (performance.now() - started) / 1000);
    outcome = answer(decisionOfOne(bucket, reply));
    count(outcome);
    return outcome;
  }

  /**
   * { action: "allow" | "refuse" | "unavailable", headers, status?, body?, decision?, error?, shadow? } for `req`.
   * `shadow`: the shadow limits' decision, when they were decided. Never rejects on a Redis failure: the fail mode
   * answers instead (docs/clients.md, "When Redis fails"). An error of the key or cost function, or a
   * TbArgumentError, rejects.
   */
  const check = limits.length === 1 && !anyShadow ? checkOne : checkAll;

  /** Counts a request that no shadow limit took part in deciding. */
  function count(outcome) {
    if (metrics === undefined) return;
    if (outcome.action === "allow") {
      metrics.request("allowed");
      return;
    }
    metrics.request("refused");
    if (outcome.decision !== undefined) metrics.refused(outcome.decision.buckets);
  }

  return { check, client: tb, limits };
}

module.exports = { createHttpLimiter };
