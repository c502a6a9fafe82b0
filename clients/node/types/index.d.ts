// Type declarations for redis-tb (hand-written; `tsc --noEmit` checks them with test/types.ts in `make lint`).

/** Any Redis client the package accepts: an ioredis `Redis` or `Cluster`, a node-redis client or cluster. */
export type RedisLike = object;

export type Backend = "auto" | "module" | "function" | "script";
/** Which backend serves the calls: the module, the Redis Functions library (FCALL) or the Lua script (EVALSHA). */
export type BackendInUse = "module" | "function" | "script";
export type ClientKind = "ioredis" | "ioredis-cluster" | "node-redis" | "node-redis-cluster";

/** TB.ACQUIRE's reply. `retryAfterMs` is -1 when the cost exceeds the burst (never succeeds). */
export interface AcquireResult {
  allowed: boolean;
  remaining: number;
  retryAfterMs: number;
  resetAfterMs: number;
}

/** TB.ACQUIREALL's reply: `limitingIndex` is the bucket that decided it (0-based). */
export interface AcquireAllResult extends AcquireResult {
  limitingIndex: number;
}

export interface BucketReport {
  /** Whether this bucket could pay its cost. */
  fits: boolean;
  remaining: number;
  retryAfterMs: number;
  resetAfterMs: number;
}

/** TB.ACQUIREEACH's reply: one report per bucket, in the order given. */
export interface AcquireEachResult {
  allowed: boolean;
  limitingIndex: number;
  buckets: BucketReport[];
}

/** TB.ACQUIREATMOST's reply: `granted` whole tokens, 0 to max. */
export interface AcquireAtMostResult {
  granted: number;
  remaining: number;
  retryAfterMs: number;
  resetAfterMs: number;
}

/** TB.RESERVE's reply: when granted, act after `waitMs`; when refused, the wait a grant would have needed. */
export interface ReserveResult {
  granted: boolean;
  waitMs: number;
  remaining: number;
  resetAfterMs: number;
}

export interface RefundResult {
  refunded: boolean;
  remaining: number;
  resetAfterMs: number;
}

/** TB.CHARGE's, TB.LOWER's and TB.BLOCK's reply. */
export interface ChargeResult {
  remaining: number;
  retryAfterMs: number;
  resetAfterMs: number;
}

/** CL.THROTTLE's reply, redis-cell's five integers by name. */
export interface ThrottleResult {
  /** True when the call was refused. */
  limited: boolean;
  /** maxBurst + 1. */
  limit: number;
  /** Requests of quantity 1 the key admits now, after this call. */
  remaining: number;
  /** Seconds until this call would be allowed; -1 when allowed, and when quantity exceeds the limit (never). */
  retryAfter: number;
  /** Seconds until the key is empty again. */
  resetAfter: number;
}

export interface Bucket {
  key: string;
  /** Tokens per second, > 0. */
  rate: number;
  /** Capacity in tokens, > 0. */
  burst: number;
}

export interface CostedBucket extends Bucket {
  /** Tokens this call takes from the bucket, >= 0 (default 1). */
  cost?: number;
}

export interface TbClientOptions {
  /**
   * "auto" (default): the module; else the Redis Functions library, loaded by the client where missing; else the
   * Lua script where functions are unavailable (Redis 6.2, an ACL user without FCALL or FUNCTION).
   */
  backend?: Backend;
  /**
   * The caller's clock, integer Unix microseconds (default Date.now() * 1000), sent only where the server refuses
   * TIME inside scripts; the bound then becomes burst + rate * (t + skew).
   */
  nowUs?: () => number;
  /**
   * Each backend switch, once, with its reason: `info` for a first detection, `warn` when a backend that had
   * answered goes away or the caller's clock is taken (default: warnings through process.emitWarning with code
   * REDIS_TB_BACKEND; notices dropped). `console` fits.
   */
  logger?: { warn(message: string): void; info?(message: string): void };
}

export class TbClient {
  constructor(redis: RedisLike, options?: TbClientOptions);
  /** `client` itself if it is a TbClient, else a new TbClient wrapping it with `options`. */
  static from(client: TbClient | RedisLike, options?: TbClientOptions): TbClient;
  /** A TbClient with this one's options over `redis`, another connection to the same server. */
  over(redis: RedisLike): TbClient;
  readonly redis: RedisLike;
  /** Which backend serves the calls; undefined before the first call in auto mode. */
  readonly backendInUse: BackendInUse | undefined;
  /** backendInUse, or "auto" before the first call. */
  readonly backend: Backend;
  readonly clientKind: ClientKind;
  acquire(key: string, rate: number, burst: number, cost?: number): Promise<AcquireResult>;
  acquireAll(cost: number, buckets: Bucket[]): Promise<AcquireAllResult>;
  acquireEach(buckets: CostedBucket[]): Promise<AcquireEachResult>;
  acquireAtMost(key: string, rate: number, burst: number, max: number): Promise<AcquireAtMostResult>;
  reserve(key: string, rate: number, burst: number, cost: number, maxWaitMs: number): Promise<ReserveResult>;
  refund(key: string, rate: number, burst: number, amount: number): Promise<RefundResult>;
  charge(key: string, rate: number, burst: number, cost: number): Promise<ChargeResult>;
  /** TB.LOWER: brings the bucket (refilled to now) down to `tokens` where it holds more; never raises it. */
  lower(key: string, rate: number, burst: number, tokens: number): Promise<ChargeResult>;
  block(key: string, rate: number, burst: number, ms: number): Promise<ChargeResult>;
  /** CL.THROTTLE, redis-cell's command: `countPerPeriod` per `period` seconds, `maxBurst + 1` at once. */
  throttle(key: string, maxBurst: number, countPerPeriod: number, period: number, quantity?: number): Promise<ThrottleResult>;
  /** Deletes the bucket; true if it existed. */
  reset(key: string): Promise<boolean>;
}

/** The server refused a call; `code` is its reply's first word (ERR, WRONGTYPE, NOPERM, ...). */
export class TbReplyError extends Error {
  readonly command: string;
  readonly key: string;
  readonly code: string;
}
/** An argument refused before anything was sent; the message names it. */
export class TbArgumentError extends TypeError {}
/** A limiter call that missed its deadline, or was not sent while the connection was down. */
export class TbUnavailableError extends Error {}

/** The failure table's row of a limiter call's error, and what the middleware does about it. */
export interface Failure {
  row: string;
  /** The row's short name (fixtures/failures.json's `class`), the label of `redis_tb_redis_failures_total`. */
  class: FailureClass;
  action: "fail-mode" | "error-fail-mode" | "reload-retry" | "script-retry";
}
export type FailureClass =
  | "connection" | "timeout" | "cluster_unreachable" | "max_clients" | "clusterdown" | "masterdown" | "loading"
  | "busy" | "readonly" | "oom" | "noreplicas" | "misconf" | "moved" | "tryagain" | "crossslot" | "noscript"
  | "function_missing" | "unknown_command" | "noauth" | "wrongpass" | "noperm" | "wrongtype" | "other";
export function classifyFailure(error: unknown): Failure;

/** A reply of an unexpected shape. */
export class TbProtocolError extends Error {
  readonly command: string;
}

export type HeaderFormat = "both" | "draft" | "legacy" | "none";

export interface DecisionBucket {
  name: string;
  rate: number;
  burst: number;
  remaining: number;
  retryAfterMs: number;
  resetAfterMs: number;
  fits?: boolean;
}

export interface Decision {
  allowed: boolean;
  limitingIndex: number;
  buckets: DecisionBucket[];
}

/** RateLimit-Policy / RateLimit (one item per bucket), RateLimit-Limit / -Remaining / -Reset, Retry-After. */
export function rateLimitHeaders(decision: Decision, standard?: HeaderFormat): Record<string, string>;

/** What a key function returns to let a request through unlimited (`Symbol.for("redis-tb.skip")`). */
export const SKIP: unique symbol;

/**
 * A key function's result: the identity (a non-empty string); nothing (undefined, null, ""), which limits the
 * request under the shared anonymous identity; or SKIP.
 */
export type Identity = string | undefined | null | typeof SKIP;

/**
 * The identity of a peer address: IPv4 as is, IPv4-mapped IPv6 as IPv4, other IPv6 as its /`ipv6Subnet` network
 * (default 56, 1 to 64) in RFC 5952 form followed by the prefix length; undefined for anything else.
 */
export function ipIdentity(address: string | undefined | null, options?: { ipv6Subnet?: number }): string | undefined;

export interface Limit<Req = any> {
  /**
   * Names the bucket (in its key) and the policy (in the headers): the characters 0x20 to 0x7E only, unique among
   * the limits; optional for a single limit ("default"). Anything else is refused when the middleware is built.
   */
  name?: string;
  /** Tokens per second: a finite number > 0. */
  rate: number;
  /** The bucket's capacity: a finite number > 0. */
  burst: number;
  /** Tokens per request for this limit, a finite number >= 0 (default: the shared `cost`). */
  cost?: number;
  /** Whose bucket, for this limit only (default: the shared `key`). */
  key?: (req: Req) => Identity | Promise<Identity>;
  /**
   * Shadow mode for this limit (default false): its bucket is charged as usual, but a request it refuses is served,
   * counted (`shadow_refused`) and logged; the headers leave it out (docs/operating.md).
   */
  shadow?: boolean;
}

/**
 * Where the middleware counts (docs/operating.md, "Watching the middleware"): a prom-client `Registry` (any object
 * with its `getSingleMetric` and `registerMetric`), or false for no metrics.
 */
export interface MetricsRegistry {
  getSingleMetric(name: string): unknown;
  registerMetric(metric: any): void;
}

export interface HttpLimiterOptions<Req = any> {
  client: TbClient | RedisLike;
  limits: Limit<Req> | Limit<Req>[];
  /** Whose bucket (default: `ipIdentity` of the peer address). Nothing: the anonymous bucket; SKIP: unlimited. */
  key?: (req: Req) => Identity | Promise<Identity>;
  /** The prefix length the default key groups IPv6 clients by (default 56, 1 to 64). */
  ipv6Subnet?: number;
  /** Tokens per request (default 1). */
  cost?: number | ((req: Req) => number | Promise<number>);
  /** The Redis key of a limit is `${prefix}{${escaped identity}}:${name}` (default "ratelimit:"; no `{` or `}`). */
  prefix?: string;
  /** Which header fields (default "both"). */
  standard?: HeaderFormat;
  /**
   * When Redis fails (docs/clients.md's failure table): "local" (default) limits with in-memory buckets of the
   * same limits in this process; "open" lets the request through; "closed" answers 503 with Retry-After: 1.
   */
  fail?: "local" | "open" | "closed";
  /**
   * With fail "local": how many keys the in-memory buckets keep (default 10000, a positive integer); a key that
   * finds no place shares its limit's overflow bucket (docs/clients.md, "When Redis fails").
   */
  localCapacity?: number;
  /** Where Redis failures are logged: a warning when a fault begins, configuration errors (default: console). */
  logger?: { warn(message: string): void; error(message: string): void };
  /** The deadline of a limiter call, in ms (default 1000, a positive finite number); the fail mode answers after it. */
  timeoutMs?: number;
  /** The status of a refusal (default 429): an integer from 400 to 599. */
  statusCode?: number;
  /** The refusal's JSON body (default `{ error: "rate limit exceeded", limit, retry_after_ms }`). */
  body?: object | ((decision: Decision) => object);
  /** Called for every failed limiter call (the fail mode then answers), with the failure table's class. */
  onError?: (error: unknown, req: Req, failureClass: FailureClass) => void;
  /** Every limit in shadow mode (default false): see `Limit.shadow`. */
  shadow?: boolean;
  /**
   * The registry of the metrics (default: prom-client's default registry where prom-client is installed, else
   * none); false for none. Middlewares over one registry count into the same series.
   */
  metrics?: MetricsRegistry | false;
}

export interface HttpOutcome {
  action: "allow" | "refuse" | "unavailable";
  headers: Record<string, string>;
  status?: number;
  body?: object;
  decision?: Decision;
  error?: unknown;
  /** The shadow limits' decision, where they were decided (the enforced limits allowed the request). */
  shadow?: Decision;
}

export interface HttpLimiter<Req = any> {
  check(req: Req): Promise<HttpOutcome>;
  readonly client: TbClient;
}

export function createHttpLimiter<Req = any>(options: HttpLimiterOptions<Req>): HttpLimiter<Req>;

/** Express middleware (Express 4 and 5). */
export function rateLimit<Req = any>(
  options: HttpLimiterOptions<Req>,
): ((req: Req, res: any, next: (error?: unknown) => void) => Promise<void>) & { limiter: HttpLimiter<Req> };

export interface FastifyRateLimitOptions extends HttpLimiterOptions {
  /** true (default): every route; false: only routes with `config.rateLimit`. */
  global?: boolean;
}

/** A Fastify plugin; a route overrides it with `config: { rateLimit: { ...options } }` or opts out with `false`. */
export function fastifyRateLimit(fastify: any, options: FastifyRateLimitOptions): Promise<void>;

export interface TbStoreOptions {
  client: TbClient | RedisLike;
  /** Prepended to the key (default "rl:"). */
  prefix?: string;
  /** The bucket's capacity (default: express-rate-limit's `limit`). */
  burst?: number;
  /** Tokens per second (default: burst per `windowMs`). */
  rate?: number;
  /** The deadline of each call in ms (default 1000, a positive finite number): it then rejects, and is never charged later. */
  timeoutMs?: number;
}

export interface ClientRateLimitInfo {
  totalHits: number;
  resetTime: Date | undefined;
}

/** An express-rate-limit Store backed by a token bucket. */
export class TbStore {
  constructor(options: TbStoreOptions);
  readonly client: TbClient;
  prefix: string;
  localKeys: boolean;
  init(options: { limit?: unknown; max?: unknown; windowMs: number }): void;
  increment(key: string): Promise<ClientRateLimitInfo>;
  decrement(key: string): Promise<void>;
  resetKey(key: string): Promise<void>;
  /** undefined for a full bucket (no hits to refill), as MemoryStore answers for a key it does not hold. */
  get(key: string): Promise<ClientRateLimitInfo | undefined>;
  /** Deletes every bucket under the prefix (on every primary of a cluster); refused with an empty prefix. */
  resetAll(): Promise<void>;
}

/** rate-limiter-flexible's result, field for field. */
export class RateLimiterRes {
  constructor(remainingPoints?: number, msBeforeNext?: number, consumedPoints?: number, isFirstInDuration?: boolean);
  msBeforeNext: number;
  remainingPoints: number;
  consumedPoints: number;
  isFirstInDuration: boolean;
  toString(): string;
  toJSON(): {
    remainingPoints: number;
    msBeforeNext: number;
    consumedPoints: number;
    isFirstInDuration: boolean;
  };
}

export interface RateLimiterTBOptions {
  storeClient: TbClient | RedisLike;
  /** The burst (default 4); 0 or less refuses every consume. */
  points?: number;
  /** Seconds to refill `points` (default 1); 0: consumed points never come back. */
  duration?: number;
  /** Seconds to block a key on the refusal that crosses the limit (default 0; at most 86400). */
  blockDuration?: number;
  /** Default "rlflx"; the Redis key is `${keyPrefix}:${key}`. */
  keyPrefix?: string;
  /** Only false: pacing is TbClient.reserve's. */
  execEvenly?: false;
  /** At most points + 1 (the default's meaning): a bucket keeps no count of refused requests. */
  blockOnConsumed?: number;
  /** Answers in place of Redis when a call fails (an Error, not a refusal). */
  insuranceLimiter?: RateLimiterLike;
  /** Keep a key in memory, refused without asking Redis, once its consumedPoints reach this (>= points). */
  inMemoryBlockOnConsumed?: number;
  /** Seconds of that in-memory block (default: until Redis would admit the key again). */
  inMemoryBlockDuration?: number;
  /** Fail at once (or ask the insuranceLimiter) while the Redis client is not ready. */
  rejectIfRedisNotReady?: boolean;
  /** Accepted for RateLimiterRedis's sake: the client's kind is found from the client itself. */
  useRedisPackage?: boolean;
  useRedis3AndLowerPackage?: boolean;
  /** The deadline of each call in ms (default 1000, a positive finite number): it then rejects (or the insuranceLimiter answers), and is never charged later. */
  timeoutMs?: number;
}

/** The methods rate-limiter-flexible's limiters share (what an insuranceLimiter needs). */
export interface RateLimiterLike {
  consume(key: string | number, points?: number, options?: object): Promise<unknown>;
  penalty(key: string | number, points?: number, options?: object): Promise<unknown>;
  reward(key: string | number, points?: number, options?: object): Promise<unknown>;
  get(key: string | number, options?: object): Promise<unknown>;
  set(key: string | number, points: number, secDuration: number, options?: object): Promise<unknown>;
  block(key: string | number, secDuration: number, options?: object): Promise<unknown>;
  delete(key: string | number, options?: object): Promise<unknown>;
  blockDuration?: number;
  execEvenly?: boolean;
}

/** Per-call options, as the library's: `customDuration` (seconds, 0 = never) refills this call's bucket. */
export interface RateLimiterCallOptions {
  customDuration?: number;
}

/** A limiter with rate-limiter-flexible's interface over a token bucket. */
export class RateLimiterTB {
  constructor(options: RateLimiterTBOptions);
  readonly client: TbClient;
  points: number;
  duration: number;
  readonly msDuration: number;
  blockDuration: number;
  readonly msBlockDuration: number;
  execEvenly: boolean;
  keyPrefix: string;
  insuranceLimiter: RateLimiterLike | undefined;
  inMemoryBlockOnConsumed: number;
  inMemoryBlockDuration: number;
  readonly msInMemoryBlockDuration: number;
  /** Tokens per second. */
  readonly rate: number;
  getKey(key: string | number): string;
  parseKey(rlKey: string): string;
  getInMemoryBlockMsBeforeExpire(rlKey: string): number;
  deleteInMemoryBlockedAll(): void;
  /** Rejects with a RateLimiterRes when refused, with an Error when Redis fails. */
  consume(key: string | number, pointsToConsume?: number | string, options?: RateLimiterCallOptions): Promise<RateLimiterRes>;
  penalty(key: string | number, points?: number | string, options?: RateLimiterCallOptions): Promise<RateLimiterRes>;
  reward(key: string | number, points?: number | string, options?: RateLimiterCallOptions): Promise<RateLimiterRes>;
  block(key: string | number, secDuration: number, options?: object): Promise<RateLimiterRes>;
  set(key: string | number, points: number | string, secDuration?: number, options?: object): Promise<RateLimiterRes>;
  get(key: string | number, options?: RateLimiterCallOptions): Promise<RateLimiterRes | null>;
  delete(key: string | number, options?: object): Promise<boolean>;
}

export interface ThrottlerStorageRecord {
  totalHits: number;
  timeToExpire: number;
  isBlocked: boolean;
  timeToBlockExpire: number;
}

/** A @nestjs/throttler ThrottlerStorage backed by a token bucket of `limit` tokens refilling `limit` per `ttl`. */
export class TbThrottlerStorage {
  /** `timeoutMs`: the deadline of each call in ms (default 1000, a positive finite number), never charged after it. */
  constructor(options: { client: TbClient | RedisLike; prefix?: string; timeoutMs?: number });
  readonly client: TbClient;
  prefix: string;
  increment(key: string, ttl: number, limit: number, blockDuration: number, throttlerName: string): Promise<ThrottlerStorageRecord>;
}

/** The shared Lua script the package runs where the module is not loaded, and the function library built from it. */
export const luaScript: {
  source(): string;
  sha1(): string;
  file(): string;
  /** `tb_` and the package version with underscores (`tb_0_5_0`). */
  libraryName(): string;
  /** The text FUNCTION LOAD takes: a header naming the library, then the script. */
  library(): string;
};
