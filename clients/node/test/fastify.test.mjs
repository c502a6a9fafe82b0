// The Fastify plugin in a real Fastify app driven over HTTP: global limits, a route with its own limits, a route
// opted out, several limits on one route, and fail open / closed with Redis stopped.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import Fastify from "fastify";

import { fastifyRateLimit, TbClient } from "../src/index.mjs";
import { connect } from "./clients.mjs";
import { Server, freshKey } from "./harness.mjs";
import { limitHeaders } from "./http-helpers.mjs";

async function start(options, routes) {
  const fastify = Fastify();
  await fastify.register(fastifyRateLimit, options);
  routes(fastify);
  const base = await fastify.listen({ port: 0, host: "127.0.0.1" });
  return { fastify, base };
}

describe("Fastify plugin", () => {
  let redisServer;
  let conn;
  let app;
  before(async () => {
    redisServer = await Server.start();
    conn = await connect("node-redis", redisServer);
    const client = new TbClient(conn.redis);
    app = await start(
      { client, prefix: `${freshKey("fastify")}:`, limits: { name: "user", rate: 0.25, burst: 2 }, key: (req) => req.headers["x-user"] },
      (fastify) => {
        fastify.get("/", async () => ({ ok: true }));
        fastify.get("/health", { config: { rateLimit: false } }, async () => ({ ok: true }));
        fastify.get("/search", { config: { rateLimit: { limits: { name: "search", rate: 0.25, burst: 1 }, standard: "draft" } } }, async () => ({ ok: true }));
        fastify.get(
          "/multi",
          { config: { rateLimit: { limits: [{ name: "user", rate: 0.25, burst: 2 }, { name: "tenant", rate: 0.25, burst: 3, key: () => "acme" }] } } },
          async () => ({ ok: true }),
        );
      },
    );
  });
  after(async () => {
    await app?.fastify.close();
    await conn?.close();
    await redisServer?.stop();
  });

  test("global limit: headers on every response, then 429 with Retry-After and a JSON body", async () => {
    const responses = [];
    for (let i = 0; i < 3; i++) responses.push(await fetch(`${app.base}/`, { headers: { "x-user": "ann" } }));
    assert.deepEqual(responses.map((r) => r.status), [200, 200, 429]);
    assert.deepEqual(limitHeaders(responses[0]), {
      "ratelimit-policy": '"user";q=2;w=8',
      ratelimit: '"user";r=1;t=4',
      "ratelimit-limit": "2",
      "ratelimit-remaining": "1",
      "ratelimit-reset": "4",
    });
    assert.equal(responses[2].headers.get("retry-after"), "4");
    const body = await responses[2].json();
    assert.equal(body.limit, "user");
    assert.ok(body.retry_after_ms > 3000 && body.retry_after_ms <= 4000, `${body.retry_after_ms}`);
  });

  test("a route that opts out is never limited and has no headers", async () => {
    for (let i = 0; i < 4; i++) {
      const response = await fetch(`${app.base}/health`, { headers: { "x-user": "ann" } });
      assert.equal(response.status, 200);
      assert.deepEqual(limitHeaders(response), {});
    }
  });

  test("a route's own limits and header format replace the plugin's", async () => {
    const first = await fetch(`${app.base}/search`, { headers: { "x-user": "cat" } });
    assert.deepEqual(limitHeaders(first), { "ratelimit-policy": '"search";q=1;w=4', ratelimit: '"search";r=0;t=4' });
    const second = await fetch(`${app.base}/search`, { headers: { "x-user": "cat" } });
    assert.equal(second.status, 429);
    assert.equal(second.headers.get("retry-after"), "4");
  });

  test("several limits on one route, all or nothing", async () => {
    const statuses = [];
    for (const user of ["m1", "m1", "m1", "m2", "m3"]) statuses.push((await fetch(`${app.base}/multi`, { headers: { "x-user": user } })).status);
    // m1's third request is refused by its own limit and takes nothing from the tenant's; m2 then gets the last.
    assert.deepEqual(statuses, [200, 200, 429, 200, 429]);
  });
});

describe("Fastify plugin with Redis stopped", () => {
  for (const fail of ["open", "closed"]) {
    test(`fail: "${fail}"`, async () => {
      const redisServer = await Server.start();
      const conn = await connect("ioredis", redisServer);
      const app = await start({ client: conn.redis, limits: { rate: 1, burst: 5 }, timeoutMs: 300, fail, logger: { warn() {}, error() {} } }, (fastify) => {
        fastify.get("/", async () => ({ ok: true }));
      });
      try {
        assert.equal((await fetch(`${app.base}/`)).status, 200);
        await redisServer.stop();
        const response = await fetch(`${app.base}/`);
        assert.equal(response.status, fail === "open" ? 200 : 503);
        assert.deepEqual(limitHeaders(response), fail === "open" ? {} : { "retry-after": "1" });
      } finally {
        await app.fastify.close();
        conn.close();
        await redisServer.stop();
      }
    });
  }
});
