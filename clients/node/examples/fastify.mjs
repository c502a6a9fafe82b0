// docs/node.md's Fastify example (between the snippet markers, checked by test/examples.test.mjs).
// REDIS_URL=redis://127.0.0.1:7777 node examples/fastify.mjs
import assert from "node:assert/strict";

// --- snippet: start ---------------------------------------------------------------------------------------------
import Fastify from "fastify";
import { Redis } from "ioredis";
import { fastifyRateLimit, ipIdentity } from "redis-tb";

const redis = new Redis(process.env.REDIS_URL);
const customers = new Map([["k-7f3a9c", "acme"]]); // your API keys, and whose each one is
const fastify = Fastify();
await fastify.register(fastifyRateLimit, {
  client: redis,
  limits: { name: "api", rate: 10, burst: 20 },
  // A known API key takes from its customer's bucket; anything else (no key, a made-up one) from its address's,
  // so a client cannot pick a fresh bucket by sending a header of its choosing.
  key: (request) => {
    const customer = customers.get(request.headers["x-api-key"]);
    return customer === undefined ? ipIdentity(request.ip) : `customer:${customer}`;
  },
});
fastify.get("/", async () => "hello");
fastify.get("/health", { config: { rateLimit: false } }, async () => "ok");
fastify.post("/search", { config: { rateLimit: { limits: { name: "search", rate: 1, burst: 5 } } } }, async () => []);
// --- snippet: end -----------------------------------------------------------------------------------------------

const base = await fastify.listen({ port: 0, host: "127.0.0.1" });
const buckets = ["{customer:acme}:search", "{customer:acme}:api", "{127.0.0.1}:search"].map((bucket) => `ratelimit:${bucket}`);
try {
  await redis.del(...buckets); // so that the example can run again at once
  const key = { "x-api-key": "k-7f3a9c" };
  const statuses = [];
  for (let i = 0; i < 6; i++) statuses.push((await fetch(`${base}/search`, { method: "POST", headers: key })).status);
  assert.deepEqual(statuses, [200, 200, 200, 200, 200, 429]);
  const madeUp = await fetch(`${base}/search`, { method: "POST", headers: { "x-api-key": "anything" } });
  assert.equal(madeUp.headers.get("ratelimit-remaining"), "4", "a made-up key takes from its address's bucket");
  assert.equal((await fetch(`${base}/health`)).headers.has("ratelimit"), false);
  assert.equal((await fetch(`${base}/`, { headers: key })).headers.get("ratelimit-remaining"), "19");
  await redis.del(...buckets);
  console.log("fastify example: ok");
} finally {
  await fastify.close();
  redis.disconnect();
}
