// docs/node.md's client example (between the snippet markers, checked by test/examples.test.mjs).
// REDIS_URL=redis://127.0.0.1:7777 node examples/client.mjs
import assert from "node:assert/strict";

// --- snippet: start ---------------------------------------------------------------------------------------------
import { createClient } from "redis";
import { TbClient } from "redis-tb";

const redis = await createClient({ url: process.env.REDIS_URL }).connect();
const tb = new TbClient(redis); // or an ioredis Redis / Cluster, or a node-redis cluster

const reply = await tb.acquire("api:user:42", 10, 20); // rate 10/s, burst 20, cost 1
console.log(reply); // { allowed: true, remaining: 19, retryAfterMs: 0, resetAfterMs: 100 }

const slot = await tb.reserve("jobs:partner", 10, 2, 1, 1000); // wait at most 1 s for a slot
if (slot.granted) setTimeout(() => console.log("calling the partner API now"), slot.waitMs);

console.log(tb.backendInUse); // "module"; without it "function" (Redis 7.0+, Valkey) or "script" (Redis 6.2)
// --- snippet: end -----------------------------------------------------------------------------------------------

assert.equal(reply.allowed, true);
assert.equal(slot.granted, true);
await new Promise((resolve) => setTimeout(resolve, slot.waitMs + 10));
redis.destroy();
