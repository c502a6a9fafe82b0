// docs/node.md's metrics and shadow mode example: the part between the snippet markers is shown there verbatim
// (test/examples.test.mjs checks it); the rest sends 8 requests and prints what /metrics then shows.
// Run it against a server with the module: REDIS_URL=redis://127.0.0.1:7777 node examples/metrics.mjs
import assert from "node:assert/strict";

// --- snippet: start ---------------------------------------------------------------------------------------------
import express from "express";
import { Redis } from "ioredis";
import { register } from "prom-client";
import { rateLimit } from "redis-tb";

const redis = new Redis(process.env.REDIS_URL);
const app = express();
// prom-client's default registry, where the middleware counts when prom-client is installed.
app.get("/metrics", async (req, res) => res.type(register.contentType).send(await register.metrics()));
// Enforced: 10 requests a second, bursts of 20. Tried in shadow mode: 1 a second, bursts of 5, whose bucket is
// charged and whose refusals are counted and logged, but which refuses nothing and shows in no header.
app.use(
  rateLimit({
    client: redis,
    limits: [
      { name: "api", rate: 10, burst: 20 },
      { name: "api-strict", rate: 1, burst: 5, shadow: true },
    ],
  }),
);
app.get("/", (req, res) => res.send("hello"));
// --- snippet: end -----------------------------------------------------------------------------------------------

const server = app.listen(0, "127.0.0.1");
await new Promise((resolve) => server.once("listening", resolve));
const base = `http://127.0.0.1:${server.address().port}`;
// This address's buckets of both limits: another example of the same server may have just drained "api".
const buckets = ["{127.0.0.1}:api", "{127.0.0.1}:api-strict"].map((bucket) => `ratelimit:${bucket}`);
try {
  await redis.del(...buckets); // so that the example starts from full buckets and can run again at once
  for (let i = 0; i < 8; i++) {
    const response = await fetch(`${base}/`);
    assert.equal(response.status, 200, "the shadow limit refuses nothing");
    assert.equal(response.headers.get("ratelimit-policy"), '"api";q=20;w=2', "the headers show the enforced limit only");
  }
  const scraped = await (await fetch(`${base}/metrics`)).text();
  const lines = scraped.split("\n").filter((line) => line.startsWith("redis_tb_") && !line.includes("_bucket{"));
  const count = (outcome) => Number(lines.find((line) => line.startsWith(`redis_tb_requests_total{outcome="${outcome}"}`)).split(" ")[1]);
  assert.equal(count("allowed") + count("shadow_refused"), 8);
  console.log(lines.join("\n"));
  console.log("node metrics example: ok");
  await redis.del(...buckets);
} finally {
  server.close();
  redis.disconnect();
}
