// One Express app for bench/peers.mjs, in its own process: VARIANT picks the limiter (none, redis-tb's rateLimit,
// express-rate-limit + rate-limit-redis, rate-limiter-flexible's RateLimiterRedis), KEYING picks its key (the peer
// address, or the x-user header). Every limit is far above the load, so every request is allowed. The parent asks
// over IPC for the requests served and this process's own CPU time (process.cpuUsage), before and after a round.
import express from "express";
import { rateLimit as erlRateLimit } from "express-rate-limit";
import { Redis } from "ioredis";
import { RedisStore } from "rate-limit-redis";
import { RateLimiterRedis } from "rate-limiter-flexible";

import { rateLimit, TbClient } from "../src/index.mjs";

const { VARIANT, KEYING, REDIS_PORT } = process.env;
const redis = new Redis({ host: "127.0.0.1", port: Number(REDIS_PORT), enableOfflineQueue: true });
const byHeader = KEYING === "header";
const keyOf = byHeader ? (req) => req.headers["x-user"] ?? "none" : (req) => req.ip;

const variants = {
  bare: () => undefined,
  "redis-tb": () =>
    rateLimit({
      client: new TbClient(redis, { backend: "module" }),
      limits: { name: "api", rate: 1e9, burst: 1e9 },
      ...(byHeader ? { key: keyOf } : {}),
    }),
  "express-rate-limit": () =>
    erlRateLimit({
      windowMs: 60_000,
      limit: 1e9,
      ...(byHeader ? { keyGenerator: keyOf } : {}),
      standardHeaders: "draft-8",
      legacyHeaders: false,
      validate: false,
      store: new RedisStore({ sendCommand: (...args) => redis.call(...args), prefix: "erl:" }),
    }),
  "rate-limiter-flexible": () => {
    const limiter = new RateLimiterRedis({ storeClient: redis, points: 1e9, duration: 60, keyPrefix: "rlf" });
    // The middleware its README shows: consume, headers on success, 429 on refusal.
    return (req, res, next) => {
      limiter
        .consume(keyOf(req))
        .then((result) => {
          res.setHeader("RateLimit-Limit", 1e9);
          res.setHeader("RateLimit-Remaining", result.remainingPoints);
          res.setHeader("RateLimit-Reset", Math.ceil(result.msBeforeNext / 1000));
          next();
        })
        .catch((rejection) => {
          if (rejection instanceof Error) next(rejection);
          else res.status(429).send("Too Many Requests");
        });
    };
  },
};

let served = 0;
const app = express();
app.set("etag", false);
app.set("x-powered-by", false);
const middleware = variants[VARIANT]();
if (middleware) app.use(middleware);
app.get("/", (req, res) => {
  served += 1;
  res.send("ok");
});

const server = app.listen(0, "127.0.0.1", () => process.send({ port: server.address().port, pid: process.pid }));
process.on("message", (message) => {
  if (message === "stats") {
    const { user, system } = process.cpuUsage();
    process.send({ served, cpuUs: user + system });
  } else if (message === "exit") {
    server.close();
    redis.disconnect();
    process.exit(0);
  }
});
