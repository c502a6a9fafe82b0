// Rate limiting an HTTP endpoint with TB.ACQUIRE from Node (ioredis).
//
// docs/clients.md shows `rateLimit` below; `make test` installs ioredis
// into examples/node_modules and runs this file against a server it spawned (`node examples/ratelimit.js --port N`),
// so the snippet cannot rot. It serves HTTP on a free loopback port and sends itself requests.
"use strict";

const http = require("node:http");
const Redis = require("ioredis");

// --- snippet: start ---------------------------------------------------------------------------------------------
// Sets the RateLimit-Policy and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-11 for the limit named
// `policy` (mapped as docs/headers.md says), and answers 429 with Retry-After when refused.
async function rateLimit(redis, res, key, rate, burst, cost = 1, policy = "default") {
  const [allowed, remaining, retryAfterMs, resetAfterMs] =
    await redis.call("TB.ACQUIRE", key, rate, burst, cost);
  res.setHeader("RateLimit-Policy", `"${policy}";q=${Math.floor(burst)};w=${Math.ceil(burst / rate)}`);
  res.setHeader("RateLimit", `"${policy}";r=${remaining};t=${Math.ceil(resetAfterMs / 1000)}`);
  if (allowed === 1) return true;
  if (retryAfterMs >= 0) res.setHeader("Retry-After", Math.ceil(retryAfterMs / 1000)); // -1: never
  res.statusCode = 429;
  res.end("Too Many Requests");
  return false;
}
// --- snippet: end -----------------------------------------------------------------------------------------------

function check(condition, what) {
  if (!condition) throw new Error(`check failed: ${what}`);
}

async function main() {
  const at = process.argv.indexOf("--port");
  const port = Number(process.argv[at + 1]);
  check(at >= 0 && Number.isInteger(port) && port > 0, "usage: node ratelimit.js --port N");
  const redis = new Redis({ host: "127.0.0.1", port, maxRetriesPerRequest: 1 });

  // burst 3 at 1 token/s on /, and a cost above the burst (never allowed) on /big. Keys of this run only, so
  // that it can run again at once against the same server.
  const prefix = `example:node:${process.pid}:${Date.now()}`;
  const server = http.createServer(async (req, res) => {
    try {
      const [key, cost] = req.url === "/big" ? [`${prefix}:user:7`, 5] : [`${prefix}:user:42`, 1];
      if (await rateLimit(redis, res, key, 1, 3, cost, "user")) res.end("ok");
    } catch (err) {
      res.statusCode = 500;
      res.end(String(err));
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const base = `http://127.0.0.1:${server.address().port}`;
  try {
    const statuses = [];
    for (let i = 0; i < 4; i++) statuses.push((await fetch(`${base}/`)).status);
    check(JSON.stringify(statuses) === "[200,200,200,429]", `statuses ${statuses}`);
    const refused = await fetch(`${base}/`);
    check(refused.status === 429, "fifth request refused");
    check(refused.headers.get("retry-after") === "1", "Retry-After: 1");
    check(refused.headers.get("ratelimit-policy") === '"user";q=3;w=3', "RateLimit-Policy");
    check(refused.headers.get("ratelimit") === '"user";r=0;t=3', "RateLimit");

    const big = await fetch(`${base}/big`);
    check(big.status === 429 && !big.headers.has("retry-after"), "cost > burst: 429 without Retry-After");
  } finally {
    server.closeAllConnections();
    server.close();
    redis.disconnect();
  }
  console.log("node client example: ok");
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
