// docs/node.md's express-rate-limit example (between the snippet markers, checked by test/examples.test.mjs).
// REDIS_URL=redis://127.0.0.1:7777 node examples/express-rate-limit.mjs
import assert from "node:assert/strict";

// --- snippet: start ---------------------------------------------------------------------------------------------
import express from "express";
import { rateLimit } from "express-rate-limit";
import { Redis } from "ioredis";
import { TbStore } from "redis-tb";

const redis = new Redis(process.env.REDIS_URL);
const app = express();
// 100 requests per 15 minutes, as before; the bucket holds 100 and refills 100 per 15 minutes, steadily.
app.use(rateLimit({ windowMs: 15 * 60 * 1000, limit: 100, standardHeaders: "draft-8", store: new TbStore({ client: redis }) }));
app.get("/", (req, res) => res.send("hello"));
// --- snippet: end -----------------------------------------------------------------------------------------------

const server = app.listen(0, "127.0.0.1");
await new Promise((resolve) => server.once("listening", resolve));
try {
  const response = await fetch(`http://127.0.0.1:${server.address().port}/`);
  assert.equal(response.status, 200);
  assert.match(response.headers.get("ratelimit"), /^"100-in-15min"; r=\d+; t=\d+$/);
  console.log("express-rate-limit example: ok");
} finally {
  server.close();
  redis.disconnect();
}
