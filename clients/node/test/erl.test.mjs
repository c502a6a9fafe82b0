// TbStore inside express-rate-limit itself (a real Express app over HTTP): the middleware's own limit check,
// headers and 429 on the store's counts; decrement as a refund (skipFailedRequests); resetKey and get through the
// limiter's own methods.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, test } from "node:test";

import express from "express";
import { rateLimit } from "express-rate-limit";

import { TbStore } from "../src/index.mjs";
import { connect, CLIENT_KINDS } from "./clients.mjs";
import { Server, freshKey } from "./harness.mjs";
import { closeServer, listen } from "./http-helpers.mjs";

for (const kind of CLIENT_KINDS) {
  describe(`express-rate-limit with TbStore over ${kind}`, () => {
    let redisServer;
    let conn;
    let httpServer;
    let base;
    let limiter;
    let store;
    before(async () => {
      redisServer = await Server.start();
      conn = await connect(kind, redisServer);
      store = new TbStore({ client: conn.redis, prefix: `${freshKey("erl")}:` });
      // 3 requests per 30 s: a bucket of 3 refilling one token every 10 s.
      limiter = rateLimit({
        windowMs: 30_000,
        limit: 3,
        standardHeaders: "draft-8",
        legacyHeaders: false,
        skipFailedRequests: true,
        keyGenerator: (req) => req.get("x-user"),
        store,
      });
      const app = express();
      app.use(limiter);
      app.get("/", (req, res) => res.send("ok"));
      app.get("/fail", (req, res) => res.status(500).send("failed"));
      httpServer = http.createServer(app);
      base = await listen(httpServer);
    });
    after(async () => {
      if (httpServer) await closeServer(httpServer);
      conn?.close();
      await redisServer?.stop();
    });

    test("the store derives the bucket from limit and windowMs", () => {
      assert.equal(store.burst, 3);
      assert.equal(store.rate, 0.1);
    });

    test("express-rate-limit refuses the fourth request and sends its own headers from the store's counts", async () => {
      const responses = [];
      for (let i = 0; i < 4; i++) responses.push(await fetch(`${base}/`, { headers: { "x-user": "ann" } }));
      assert.deepEqual(responses.map((r) => r.status), [200, 200, 200, 429]);
      assert.match(responses[0].headers.get("ratelimit"), /^"3-in-30sec"; r=2; t=\d+$/);
      const retryAfter = Number(responses[3].headers.get("retry-after"));
      assert.ok(retryAfter >= 1 && retryAfter <= 10, `Retry-After ${retryAfter}: the next token, not the whole window`);
    });

    test("skipFailedRequests gives the token back through decrement (a refund)", async () => {
      for (let i = 0; i < 5; i++) assert.equal((await fetch(`${base}/fail`, { headers: { "x-user": "bob" } })).status, 500);
      assert.equal((await fetch(`${base}/`, { headers: { "x-user": "bob" } })).status, 200);
      const info = await limiter.getKey("bob");
      assert.equal(info.totalHits, 1);
      assert.ok(info.resetTime instanceof Date && info.resetTime > new Date());
    });

    test("resetKey and get through the limiter", async () => {
      for (let i = 0; i < 3; i++) await fetch(`${base}/`, { headers: { "x-user": "cid" } });
      assert.equal((await limiter.getKey("cid")).totalHits, 3);
      await limiter.resetKey("cid");
      assert.equal((await limiter.getKey("cid")).totalHits, 0);
      assert.equal((await fetch(`${base}/`, { headers: { "x-user": "cid" } })).status, 200);
    });
  });
}

test("a limit given as a function needs the bucket spelled out", () => {
  const store = new TbStore({ client: { call() {}, sendCommand() {} } });
  assert.throws(() => store.init({ limit: () => 5, windowMs: 1000 }), /give the store \{ burst, rate \}/);
  const explicit = new TbStore({ client: { call() {}, sendCommand() {} }, burst: 5, rate: 2 });
  explicit.init({ limit: () => 5, windowMs: 1000 });
  assert.deepEqual([explicit.burst, explicit.rate], [5, 2]);
});
