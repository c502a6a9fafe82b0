// Compiled by `tsc --noEmit` (make lint), never run: the declarations as an ESM TypeScript user meets them.
import { Redis } from "ioredis";
import { createClient } from "redis";
import express from "express";
import Fastify from "fastify";
import { rateLimit as expressRateLimit } from "express-rate-limit";
import { Registry } from "prom-client";
import tbDefault, {
  TbClient,
  TbReplyError,
  rateLimit,
  fastifyRateLimit,
  TbStore,
  RateLimiterTB,
  RateLimiterRes,
  TbThrottlerStorage,
  rateLimitHeaders,
  ipIdentity,
  SKIP,
  classifyFailure,
  type AcquireResult,
} from "redis-tb";

const tb = new TbClient(new Redis(), { backend: "auto", nowUs: () => Date.now() * 1000, logger: console });
const inUse: "module" | "function" | "script" | undefined = tb.backendInUse;
const viaNodeRedis = new TbClient(createClient());
const result: AcquireResult = await tb.acquire("user:42", 10, 20);
const allowed: boolean = result.allowed;
const each = await viaNodeRedis.acquireEach([{ key: "{a}:x", rate: 1, burst: 2, cost: 1 }]);
const fits: boolean[] = each.buckets.map((bucket) => bucket.fits);
const reserved = await tb.reserve("jobs", 10, 2, 1, 1000);
const waitMs: number = reserved.waitMs;

try {
  await tb.acquire("user:42", 0, 20);
} catch (error) {
  if (error instanceof TbReplyError) console.log(error.code, error.command, error.key);
}

const app = express();
app.use(rateLimit({ client: tb, limits: [{ name: "user", rate: 10, burst: 20 }], key: (req: express.Request) => req.ip }));
app.use(
  rateLimit({
    client: tb,
    limits: { rate: 1, burst: 2 },
    ipv6Subnet: 64,
    fail: "local",
    localCapacity: 50_000,
    logger: console,
    key: (req: express.Request) => (req.path === "/health" ? SKIP : ipIdentity(req.ip, { ipv6Subnet: 64 })),
  }),
);
app.use(
  rateLimit({
    client: tb,
    limits: [{ name: "user", rate: 10, burst: 20 }, { name: "trial", rate: 1, burst: 2, shadow: true }],
    metrics: new Registry(),
    statusCode: 503,
    body: (decision) => ({ limit: decision.buckets[decision.limitingIndex].name }),
    onError: (error: unknown, req: express.Request, failureClass) => console.log(failureClass === "timeout", req.path),
  }),
);
app.use(rateLimit({ client: tb, limits: { rate: 1, burst: 2 }, shadow: true, metrics: false, onError: (error) => console.log(error) }));
app.use(expressRateLimit({ limit: 20, windowMs: 2000, store: new TbStore({ client: tb, timeoutMs: 300 }) }));

const fastify = Fastify();
await fastify.register(fastifyRateLimit, { client: tb, limits: { rate: 10, burst: 20 } });

const limiter = new RateLimiterTB({ storeClient: new Redis(), points: 5, duration: 1, keyPrefix: "login", timeoutMs: 300 });
limiter.consume("ip").then(
  (res: RateLimiterRes) => res.remainingPoints,
  (rejection: RateLimiterRes | Error) => (rejection instanceof Error ? 0 : rejection.msBeforeNext),
);
const insured = new RateLimiterTB({
  storeClient: tb,
  points: 0,
  duration: 0,
  insuranceLimiter: limiter,
  inMemoryBlockOnConsumed: 6,
  inMemoryBlockDuration: 10,
  rejectIfRedisNotReady: true,
});
insured.points = 10;
await insured.set("ip", "3", 60);
await insured.consume("ip", 2, { customDuration: 30 }).catch(() => insured.deleteInMemoryBlockedAll());
await new TbStore({ client: tb, prefix: "rl:" }).resetAll();
const record = await new TbThrottlerStorage({ client: tb, timeoutMs: 300 }).increment("key", 60_000, 10, 60_000, "default");
const blocked: boolean = record.isBlocked;
const headers: Record<string, string> = rateLimitHeaders({
  allowed: true,
  limitingIndex: 0,
  buckets: [{ name: "user", rate: 10, burst: 20, remaining: 19, retryAfterMs: 0, resetAfterMs: 100 }],
});
const configError: boolean = classifyFailure(new Error("x")).action === "error-fail-mode";
console.log(configError, allowed, fits, waitMs, blocked, headers, tbDefault.TbClient === TbClient);
