// One Express app for bench/express.mjs, in its own process (so that the load generator does not share its event
// loop): CASE picks the limiter in front of a handler that answers "ok". The limiter middleware is timed from the
// moment it starts to the moment it calls next(), with the process's high-resolution clock; the parent asks for
// the figures over IPC.
import express from "express";
import { rateLimit as erlRateLimit } from "express-rate-limit";
import { Redis } from "ioredis";
import { RedisStore } from "rate-limit-redis";

import { rateLimit, TbClient } from "../src/index.mjs";

const { CASE, REDIS_PORT, RATE, BURST } = process.env;
const redis = new Redis({ host: "127.0.0.1", port: Number(REDIS_PORT) });
const unlimited = { name: "api", rate: 1e9, burst: 1e9 };
const bound = { name: "api", rate: Number(RATE), burst: Number(BURST) };

const limiters = {
  bare: undefined,
  module: () => rateLimit({ client: new TbClient(redis, { backend: "module" }), limits: unlimited, key: () => "latency-module" }),
  script: () => rateLimit({ client: new TbClient(redis, { backend: "script" }), limits: unlimited, key: () => "latency-script" }),
  "express-rate-limit": () =>
    erlRateLimit({
      windowMs: 60_000,
      limit: 1e9,
      keyGenerator: () => "latency-erl",
      validate: false,
      store: new RedisStore({ sendCommand: (...args) => redis.call(...args), prefix: "bench-erl:" }),
    }),
  "bound-module": () => rateLimit({ client: new TbClient(redis, { backend: "module" }), limits: bound, key: () => "bound-module" }),
  "bound-script": () => rateLimit({ client: new TbClient(redis, { backend: "script" }), limits: bound, key: () => "bound-script" }),
};

const samplesNs = [];
let served = 0;
let refused = 0;
const app = express();
app.use((req, res, next) => {
  res.on("finish", () => (res.statusCode === 200 ? (served += 1) : (refused += 1)));
  next();
});
const make = limiters[CASE];
if (make) {
  const middleware = make();
  app.use((req, res, next) => {
    const started = process.hrtime.bigint();
    middleware(req, res, (error) => {
      samplesNs.push(Number(process.hrtime.bigint() - started));
      next(error);
    });
  });
}
app.get("/", (req, res) => res.send("ok"));

const server = app.listen(0, "127.0.0.1", () => process.send({ port: server.address().port }));
process.on("message", (message) => {
  if (message === "reset") {
    samplesNs.length = 0;
    served = 0;
    refused = 0;
    process.send({ reset: true });
  } else if (message === "stats") {
    const sorted = Float64Array.from(samplesNs).sort();
    const at = (q) => (sorted.length === 0 ? null : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] / 1000);
    process.send({ samples: sorted.length, p50Us: at(0.5), p99Us: at(0.99), served, refused });
  } else if (message === "exit") {
    server.close();
    redis.disconnect();
    process.exit(0);
  }
});
