// The README's and docs/node.md's Express example: the part between the snippet markers is shown there verbatim
// (test/examples.test.mjs and tests/readme.rs check it); the rest drives it over HTTP and checks what it served.
// Run it against a server with the module: REDIS_URL=redis://127.0.0.1:7777 node examples/express.mjs
import assert from "node:assert/strict";

// --- snippet: start ---------------------------------------------------------------------------------------------
import express from "express";
import { Redis } from "ioredis";
import { rateLimit } from "redis-tb";

const redis = new Redis(process.env.REDIS_URL);
const app = express();
// Per client address: 10 requests a second, bursts of 20. Every response carries the RateLimit headers; beyond
// the limit the answer is 429 with Retry-After and a small JSON body.
app.use(rateLimit({ client: redis, limits: { name: "api", rate: 10, burst: 20 } }));
app.get("/", (req, res) => res.send("hello"));
// --- snippet: end -----------------------------------------------------------------------------------------------

const server = app.listen(0, "127.0.0.1");
await new Promise((resolve) => server.once("listening", resolve));
const url = `http://127.0.0.1:${server.address().port}/`;
try {
  // A burst of 20 from a full bucket, and the refill while the requests go out: the first 429 comes after at least
  // 20. The bucket (this client address's) is deleted at the end, so the next run starts full too.
  let served = 0;
  let last;
  while ((last = await fetch(url)).status === 200 && served < 1000) served += 1;
  assert.equal(last.status, 429);
  console.log(`HTTP ${last.status}`);
  for (const name of ["ratelimit-policy", "ratelimit", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "retry-after"]) {
    console.log(`${name}: ${last.headers.get(name)}`);
  }
  console.log(await last.text());
  console.log("node express example: ok");
  await redis.del("ratelimit:{127.0.0.1}:api"); // the drained bucket is this run's alone
} finally {
  server.close();
  redis.disconnect();
}
