// The Express middleware in a real Express app driven over HTTP: headers on every response, 429 with Retry-After
// and a JSON body, several limits on one route, per-route limits, and fail open / closed with Redis stopped.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, test } from "node:test";

import express from "express";

import { rateLimit, TbClient } from "../src/index.mjs";
import { connect, CLIENT_KINDS } from "./clients.mjs";
import { Server, freshKey } from "./harness.mjs";
import { closeServer, limitHeaders, listen } from "./http-helpers.mjs";

// Slow refills (one token per 4 s), so that a busy machine cannot refill a bucket between a test's requests.
function app(client, run) {
  const server = express();
  server.get("/", rateLimit({ client, prefix: `${run}:`, limits: { name: "user", rate: 0.25, burst: 3 }, key: (req) => req.get("x-user") }), (req, res) => res.send("ok"));
  server.get(
    "/multi",
    rateLimit({
      client,
      prefix: `${run}:`,
      key: (req) => req.get("x-user"),
      limits: [
        { name: "user", rate: 0.25, burst: 3 },
        { name: "tenant", rate: 0.25, burst: 4, key: () => "acme" },
      ],
    }),
    (req, res) => res.send("ok"),
  );
  server.get("/heavy", rateLimit({ client, prefix: `${run}:`, limits: { name: "heavy", rate: 1, burst: 2 }, cost: 5, key: () => "all" }), (req, res) => res.send("ok"));
  // Body functions with a bug: one throws, one returns what JSON cannot hold.
  const bodies = { throws: () => { throw new Error("a bug"); }, bigint: () => ({ wait: 1n }) };
  for (const [name, body] of Object.entries(bodies)) {
    const logger = { warn() {}, error: (message) => bodyErrors.push(message) };
    server.get(`/${name}`, rateLimit({ client, prefix: `${run}:`, limits: { name, rate: 0.25, burst: 1 }, key: (req) => req.get("x-user"), body, logger }), (req, res) => res.send("ok"));
  }
  // A response already begun before the limiter: its headers cannot be set, and the error goes to Express.
  server.get(
    "/begun",
    (req, res, next) => {
      res.writeHead(200, { "content-type": "text/plain" });
      res.write("begun\n");
      next();
    },
    rateLimit({ client, prefix: `${run}:`, limits: { name: "begun", rate: 0.25, burst: 3 }, key: () => "all" }),
    (req, res) => res.end("not reached\n"),
  );
  server.use((error, req, res, next) => {
    expressErrors.push(error.code);
    res.end();
  });
  return http.createServer(server);
}

const bodyErrors = [];
const expressErrors = [];

for (const backend of [{ name: "module", module: true }, { name: "script", module: false }]) {
  describe(`Express middleware, ${backend.name}`, () => {
    let redisServer;
    let conn;
    let httpServer;
    let base;
    before(async () => {
      redisServer = await Server.start({ module: backend.module });
      conn = await connect("ioredis", redisServer);
      httpServer = app(new TbClient(conn.redis), freshKey("express"));
      base = await listen(httpServer);
    });
    after(async () => {
      if (httpServer) await closeServer(httpServer);
      conn?.close();
      await redisServer?.stop();
    });

    test("a body function that throws or returns what JSON cannot hold is logged, and the default body answers", async () => {
      for (const name of ["throws", "bigint"]) {
        bodyErrors.length = 0;
        const statuses = [];
        let refused;
        for (let i = 0; i < 2; i++) {
          const response = await fetch(`${base}/${name}`, { headers: { "x-user": "bo" } });
          statuses.push(response.status);
          if (response.status === 429) refused = await response.json();
          else await response.arrayBuffer();
        }
        assert.deepEqual(statuses, [200, 429], name);
        assert.deepEqual({ ...refused, retry_after_ms: undefined }, { error: "rate limit exceeded", limit: name, retry_after_ms: undefined });
        assert.equal(bodyErrors.length, 1, name);
        assert.match(bodyErrors[0], new RegExp(`the body function failed for limit "${name}"`));
      }
    });

    test("an error setting the headers (the response already begun) goes to Express's error handler", async () => {
      expressErrors.length = 0;
      const response = await fetch(`${base}/begun`);
      assert.equal(await response.text(), "begun\n");
      assert.deepEqual(expressErrors, ["ERR_HTTP_HEADERS_SENT"]);
    });

    test("every response carries the headers; the fourth is refused with 429, Retry-After and a JSON body", async () => {
      const responses = [];
      for (let i = 0; i < 4; i++) responses.push(await fetch(`${base}/`, { headers: { "x-user": "ann" } }));
      assert.deepEqual(responses.map((r) => r.status), [200, 200, 200, 429]);
      assert.deepEqual(limitHeaders(responses[0]), {
        "ratelimit-policy": '"user";q=3;w=12',
        ratelimit: '"user";r=2;t=4',
        "ratelimit-limit": "3",
        "ratelimit-remaining": "2",
        "ratelimit-reset": "4",
      });
      const refused = responses[3];
      assert.equal(refused.headers.get("retry-after"), "4");
      assert.equal(refused.headers.get("ratelimit-remaining"), "0");
      assert.match(refused.headers.get("content-type"), /application\/json/);
      const body = await refused.json();
      assert.deepEqual({ ...body, retry_after_ms: undefined }, { error: "rate limit exceeded", limit: "user", retry_after_ms: undefined });
      assert.ok(body.retry_after_ms > 3000 && body.retry_after_ms <= 4000, `${body.retry_after_ms}`);
      const other = await fetch(`${base}/`, { headers: { "x-user": "bob" } });
      assert.equal(other.status, 200, "another key has its own bucket");
    });

    test("several limits on one route: one policy per bucket, and the tenant limit refuses for everyone", async () => {
      const statuses = [];
      let last;
      for (const user of ["u1", "u1", "u2", "u2", "u3"]) {
        last = await fetch(`${base}/multi`, { headers: { "x-user": user } });
        statuses.push(last.status);
        if (statuses.length === 1) {
          assert.equal(last.headers.get("ratelimit-policy"), '"user";q=3;w=12, "tenant";q=4;w=16');
          assert.equal(last.headers.get("ratelimit"), '"user";r=2;t=4, "tenant";r=3;t=4');
        }
      }
      assert.deepEqual(statuses, [200, 200, 200, 200, 429]);
      assert.equal(last.headers.get("ratelimit"), '"user";r=3;t=0, "tenant";r=0;t=16');
      assert.equal(last.headers.get("ratelimit-limit"), "4", "the older fields follow the limiting bucket");
      assert.equal((await last.json()).limit, "tenant");
    });

    test("a cost above the burst is refused without Retry-After (waiting never helps)", async () => {
      const response = await fetch(`${base}/heavy`);
      assert.equal(response.status, 429);
      assert.equal(response.headers.has("retry-after"), false);
      assert.deepEqual(await response.json(), { error: "rate limit exceeded", limit: "heavy" });
    });

    test("limits of extreme numbers are served with every header number within 15 digits", async () => {
      // burst / rate overflows to Infinity (rate 1e-300, burst 1e300), and 1e21 is `1e+21` as JavaScript text.
      const extreme = express();
      const limits = [{ name: "slow", rate: 1e-300, burst: 1e300 }, { name: "huge", rate: 1, burst: 1e21 }];
      extreme.get("/", rateLimit({ client: new TbClient(conn.redis), prefix: `${freshKey("extreme")}:`, limits, key: () => "all" }), (req, res) => res.send("ok"));
      const server = http.createServer(extreme);
      try {
        const response = await fetch(await listen(server));
        assert.equal(response.status, 200);
        const most = "999999999999999";
        assert.equal(response.headers.get("ratelimit-policy"), `"slow";q=${most};w=${most}, "huge";q=${most};w=${most}`);
        assert.equal(response.headers.get("ratelimit"), `"slow";r=${most};t=0, "huge";r=${most};t=0`);
      } finally {
        await closeServer(server);
      }
    });
  });
}

describe("Express middleware with Redis stopped", () => {
  for (const kind of CLIENT_KINDS) {
    test(`${kind}: fails open (request served, no headers) or closed (503), as configured`, async () => {
      const redisServer = await Server.start();
      const conn = await connect(kind, redisServer);
      const errors = [];
      const server = express();
      const shared = { client: conn.redis, limits: { rate: 1, burst: 5 }, timeoutMs: 300, onError: (error) => errors.push(error), logger: { warn() {}, error() {} } };
      server.get("/open", rateLimit({ ...shared, fail: "open" }), (req, res) => res.send("ok"));
      server.get("/closed", rateLimit({ ...shared, fail: "closed" }), (req, res) => res.send("ok"));
      const httpServer = http.createServer(server);
      const base = await listen(httpServer);
      try {
        assert.equal((await fetch(`${base}/open`)).status, 200);
        assert.equal((await fetch(`${base}/open`)).headers.get("ratelimit-remaining"), "3");
        await redisServer.stop();
        const open = await fetch(`${base}/open`);
        assert.equal(open.status, 200);
        assert.deepEqual(limitHeaders(open), {});
        const closed = await fetch(`${base}/closed`);
        assert.equal(closed.status, 503);
        assert.equal(closed.headers.get("retry-after"), "1");
        assert.deepEqual(await closed.json(), { error: "rate limiter unavailable" });
        assert.equal(errors.length, 2, "onError saw both failures");
      } finally {
        await closeServer(httpServer);
        conn.close();
        await redisServer.stop();
      }
    });
  }
});
