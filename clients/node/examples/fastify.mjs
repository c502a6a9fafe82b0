// docs/node.md's Fastify example (between the snippet markers, checked by test/examples.test.mjs).
// REDIS_URL=redis://127.0.0.1:7777 node examples/fastify.mjs
import assert from "node:assert/strict";

// --- snippet: start ---------------------------------------------------------------------------------------------
import Fastify from "fastify";
import { Redis } from "ioredis";
import { fastifyRateLimit } from "redis-tb";

const redis = new Redis(process.env.REDIS_URL);
const fastify = Fastify();
await fastify.register(fastifyRateLimit, {
  client: redis,
  limits: { name: "api", rate: 10, burst: 20 },
  key: (request) => request.headers["x-api-key"] ?? request.ip,
});
fastify.get("/", async () => "hello");
fastify.get("/health", { config: { rateLimit: false } }, async () => "ok");
fastify.post("/search", { config: { rateLimit: { limits: { name: "search", rate: 1, burst: 5 } } } }, async () => []);
// --- snippet: end -----------------------------------------------------------------------------------------------

const base = await fastify.listen({ port: 0, host: "127.0.0.1" });
try {
  const key = { "x-api-key": `example-${process.pid}-${Date.now()}` };
  const statuses = [];
  for (let i = 0; i < 6; i++) statuses.push((await fetch(`${base}/search`, { method: "POST", headers: key })).status);
  assert.deepEqual(statuses, [200, 200, 200, 200, 200, 429]);
  assert.equal((await fetch(`${base}/health`)).headers.has("ratelimit"), false);
  assert.equal((await fetch(`${base}/`, { headers: key })).headers.get("ratelimit-remaining"), "19");
  console.log("fastify example: ok");
} finally {
  await fastify.close();
  redis.disconnect();
}
