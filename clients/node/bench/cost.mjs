// The Express middlewares' own work per request, without HTTP, counted in instructions (valgrind's callgrind, steady
// on a busy machine where CPU time is not): redis-tb's rateLimit (defaults: fail "local", the deadline lane,
// metrics into prom-client's registry), express-rate-limit + rate-limit-redis, rate-limiter-flexible's
// RateLimiterRedis as middleware, and a raw ioredis TB.ACQUIRE (the floor: the Redis call alone), each in a node
// process of its own under callgrind, against one spawned redis-server with the module (not counted). A run warms
// up (WARM requests), switches instrumentation on, drives N requests (fake req/res, 16 at a time, a header key
// cycling 1,000 identities) and exits; a run of a middleware that only calls next() is subtracted, so the figure is
// the middleware's own instructions per request (the Redis client's included).
//   REDIS_SERVER=/usr/bin/redis-server TB_MODULE=$PWD/target/release/libredis_tb.so node bench/cost.mjs
//   COST_BEFORE=<a copy of src/> adds redis-tb from that copy (the code before a change).
import { execFileSync, spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

import { Redis } from "ioredis";
import { rateLimit as erlRateLimit } from "express-rate-limit";
import { RedisStore } from "rate-limit-redis";
import { RateLimiterRedis } from "rate-limiter-flexible";

const HERE = fileURLToPath(import.meta.url);
const N = Number(process.env.COST_REQUESTS || 4000);
const WARM = Number(process.env.COST_WARM || 4000);
const IDENTITIES = 1000;
const key = (req) => req.headers["x-user"];

async function middlewareOf(name, redis) {
  const limits = { name: "api", rate: 1e9, burst: 1e9 };
  if (name === "bare") return (req, res, next) => next();
  if (name === "ioredis TB.ACQUIRE") return (req, res, next) => redis.call("TB.ACQUIRE", `ratelimit:{${key(req)}}:api`, 1e9, 1e9, 1).then(() => next());
  if (name.startsWith("redis-tb")) {
    const tb = await import(name.endsWith("before") ? `${process.env.COST_BEFORE}/index.mjs` : "../src/index.mjs");
    return tb.rateLimit({ client: new tb.TbClient(redis, { backend: "module" }), limits, key });
  }
  if (name === "express-rate-limit") {
    const store = new RedisStore({ sendCommand: (...args) => redis.call(...args), prefix: "erl:" });
    return erlRateLimit({ windowMs: 60_000, limit: 1e9, keyGenerator: key, standardHeaders: "draft-8", legacyHeaders: false, validate: false, store });
  }
  const limiter = new RateLimiterRedis({ storeClient: redis, points: 1e9, duration: 60, keyPrefix: "rlf" });
  return (req, res, next) =>
    limiter.consume(key(req)).then((result) => {
      res.setHeader("RateLimit-Limit", 1e9);
      res.setHeader("RateLimit-Remaining", result.remainingPoints);
      res.setHeader("RateLimit-Reset", Math.ceil(result.msBeforeNext / 1000));
      next();
    }, next);
}

async function drive(middleware, n) {
  const reqs = Array.from({ length: IDENTITIES }, (_, i) => ({ headers: { "x-user": `user-${i}` }, ip: "127.0.0.1", socket: {}, app: { get() {} } }));
  const res = { setHeader() {}, getHeader() {}, append() {}, status() { return this; }, json() {}, send() {}, headersSent: false, on() {} };
  let i = 0;
  const worker = async () => {
    while (i < n) {
      const req = reqs[i++ % IDENTITIES];
      await new Promise((resolve, reject) => middleware(req, res, (error) => (error ? reject(error) : resolve())));
    }
  };
  await Promise.all(Array.from({ length: 16 }, worker));
}

if (process.env.COST_CHILD) {
  const redis = new Redis({ host: "127.0.0.1", port: Number(process.env.COST_PORT) });
  const middleware = await middlewareOf(process.env.COST_CHILD, redis);
  await drive(middleware, WARM);
  execFileSync("callgrind_control", ["--instr=on", String(process.pid)]);
  await drive(middleware, N);
  process.exit(0);
}

const { Server } = await import("../test/harness.mjs");
const server = await Server.start();
function counted(name) {
  const env = { ...process.env, COST_CHILD: name, COST_PORT: String(server.port) };
  const args = ["--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null", process.execPath, "--predictable", HERE];
  const { stderr, status } = spawnSync("valgrind", args, { env, encoding: "utf8" });
  const collected = stderr.match(/Collected : (\d+)/);
  if (status !== 0 || collected === null) throw new Error(`callgrind failed:\n${stderr}`);
  return Number(collected[1]);
}
const names = (process.env.COST_ONLY || "ioredis TB.ACQUIRE,redis-tb,express-rate-limit,rate-limiter-flexible").split(",");
if (process.env.COST_BEFORE) names.splice(names.indexOf("redis-tb"), 0, "redis-tb before");
try {
  const bare = counted("bare");
  console.log(`| ${N} requests after ${WARM} of warm-up, a header key over 1,000 identities | instructions / request |\n|---|--:|`);
  for (const name of names) console.log(`| ${name} | ${((counted(name) - bare) / N).toFixed(0)} |`);
} finally {
  await server.stop();
}
