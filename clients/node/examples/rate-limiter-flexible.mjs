// docs/node.md's rate-limiter-flexible example (between the snippet markers, checked by test/examples.test.mjs).
// REDIS_URL=redis://127.0.0.1:7777 node examples/rate-limiter-flexible.mjs
import assert from "node:assert/strict";

// --- snippet: start ---------------------------------------------------------------------------------------------
import { Redis } from "ioredis";
import { RateLimiterTB } from "redis-tb"; // was: import { RateLimiterRedis } from "rate-limiter-flexible";

const redisClient = new Redis(process.env.REDIS_URL);
// was: new RateLimiterRedis({ ... }) with the same options
const limiter = new RateLimiterTB({ storeClient: redisClient, keyPrefix: "login", points: 5, duration: 60 });

async function login(ip) {
  try {
    await limiter.consume(ip); // resolves with a RateLimiterRes
    return 200;
  } catch (rejection) {
    if (rejection instanceof Error) throw rejection; // Redis failed
    return 429; // rejection.msBeforeNext: ms until the next attempt can succeed
  }
}
// --- snippet: end -----------------------------------------------------------------------------------------------

try {
  const ip = `198.51.100.${process.pid % 250}:${Date.now()}`;
  const statuses = [];
  for (let i = 0; i < 6; i++) statuses.push(await login(ip));
  assert.deepEqual(statuses, [200, 200, 200, 200, 200, 429]);
  await limiter.delete(ip);
  console.log("rate-limiter-flexible example: ok");
} finally {
  redisClient.disconnect();
}
