// TbStore inside express-rate-limit itself (a real Express app over HTTP): the middleware's own limit check,
// headers and 429 on the store's counts; decrement as a refund (skipFailedRequests); resetKey and get through the
// limiter's own methods.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, test } from "node:test";

import express from "express";
import { MemoryStore, rateLimit } from "express-rate-limit";

import { TbStore } from "../src/index.mjs";
import { connect, connectCluster, CLIENT_KINDS } from "./clients.mjs";
import { Cluster, Server, freshKey } from "./harness.mjs";
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
      assert.equal(await limiter.getKey("cid"), undefined, "no record, as MemoryStore answers");
      assert.equal((await fetch(`${base}/`, { headers: { "x-user": "cid" } })).status, 200);
    });

    test("get answers what MemoryStore answers: undefined for a key never seen or reset, the hits otherwise", async () => {
      const memory = new MemoryStore();
      const ours = new TbStore({ client: conn.redis, prefix: `${freshKey("get")}:` });
      for (const store of [memory, ours]) store.init({ windowMs: 30_000, limit: 3 });
      try {
        const answers = async (store) => {
          const seen = [await store.get("new")];
          await store.increment("k");
          await store.increment("k");
          seen.push((await store.get("k"))?.totalHits);
          await store.resetKey("k");
          seen.push(await store.get("k"));
          return seen;
        };
        assert.deepEqual(await answers(ours), await answers(memory));
        assert.deepEqual(await answers(memory), [undefined, 2, undefined]);
      } finally {
        memory.shutdown();
      }
    });

    test("resetAll deletes every bucket under the store's prefix and nothing else", async () => {
      const prefix = freshKey("all");
      const ours = new TbStore({ client: conn.redis, prefix: `${prefix}:*[x]:` });
      const other = new TbStore({ client: conn.redis, prefix: `${prefix}:y:` });
      for (const store of [ours, other]) store.init({ windowMs: 30_000, limit: 3 });
      for (const key of ["a", "b", "c"]) {
        await ours.increment(key);
        await other.increment(key);
      }
      await ours.resetAll();
      for (const key of ["a", "b", "c"]) {
        assert.equal(await ours.get(key), undefined);
        assert.equal((await other.get(key)).totalHits, 1, "another prefix (matching the glob unescaped) is kept");
      }
    });
  });
}

test("limit 0 refuses every request (429, never a 500), as with the library's own store", async () => {
  const redisServer = await Server.start();
  const conn = await connect("ioredis", redisServer);
  const servers = [];
  try {
    const statuses = {};
    for (const [name, store] of [["memory", new MemoryStore()], ["ours", new TbStore({ client: conn.redis })]]) {
      const app = express();
      app.use(rateLimit({ windowMs: 1000, limit: 0, store, validate: { limit: false } }));
      app.get("/", (req, res) => res.send("ok"));
      const server = http.createServer(app);
      servers.push({ server, store });
      const base = await listen(server);
      statuses[name] = [];
      for (let i = 0; i < 3; i++) statuses[name].push((await fetch(`${base}/`)).status);
    }
    assert.deepEqual(statuses.memory, [429, 429, 429]);
    assert.deepEqual(statuses.ours, statuses.memory);
  } finally {
    for (const { server, store } of servers) {
      await closeServer(server);
      store.shutdown?.();
    }
    conn.close();
    await redisServer.stop();
  }
});

test("rate-limit-redis options a bucket has no use for are refused by name", () => {
  const client = { call() {}, sendCommand() {} };
  assert.throws(() => new TbStore({ client, resetExpiryOnChange: true }), /does not implement resetExpiryOnChange/);
  assert.throws(() => new TbStore({ client, sendCommand() {} }), /does not implement sendCommand/);
  assert.throws(() => new TbStore({ client, windowMs: 5 }), /unknown option windowMs/);
});

test("a limit given as a function: the bucket's refusal is the middleware's whatever the function answers", async () => {
  const redisServer = await Server.start();
  const conn = await connect("ioredis", redisServer);
  const app = express();
  const store = new TbStore({ client: conn.redis, burst: 2, rate: 0.01, prefix: `${freshKey("fn")}:` });
  app.use(rateLimit({ windowMs: 1000, limit: () => 100, store }));
  app.get("/", (req, res) => res.send("ok"));
  const server = http.createServer(app);
  try {
    const base = await listen(server);
    const statuses = [];
    for (let i = 0; i < 3; i++) statuses.push((await fetch(`${base}/`)).status);
    assert.deepEqual(statuses, [200, 200, 429]);
    const unset = new TbStore({ client: conn.redis });
    assert.throws(() => unset.init({ limit: () => 5, windowMs: 1000 }), /give the store \{ burst, rate \}/);
    await assert.rejects(unset.increment("k"), /give the store \{ burst, rate \}/, "every call names the cause");
  } finally {
    await closeServer(server);
    conn.close();
    await redisServer.stop();
  }
});

test("a limit given as a function needs the bucket spelled out", () => {
  const store = new TbStore({ client: { call() {}, sendCommand() {} } });
  assert.throws(() => store.init({ limit: () => 5, windowMs: 1000 }), /give the store \{ burst, rate \}/);
  const explicit = new TbStore({ client: { call() {}, sendCommand() {} }, burst: 5, rate: 2 });
  explicit.init({ limit: () => 5, windowMs: 1000 });
  assert.deepEqual([explicit.burst, explicit.rate], [5, 2]);
});

test("resetAll on a cluster deletes the prefix's buckets on every primary, through both clients", async () => {
  const cluster = await Cluster.start();
  try {
    for (const kind of CLIENT_KINDS) {
      const conn = await connectCluster(kind, cluster);
      try {
        const store = new TbStore({ client: conn.redis, prefix: `${freshKey(`all-${kind}`)}:` });
        store.init({ windowMs: 30_000, limit: 3 });
        // Twenty keys without a hash tag land on every primary.
        const keys = Array.from({ length: 20 }, (_, i) => `user${i}`);
        for (const key of keys) await store.increment(key);
        await store.resetAll();
        for (const key of keys) assert.equal(await store.get(key), undefined, `${kind}: ${key}`);
      } finally {
        await conn.close();
      }
    }
  } finally {
    await cluster.stop();
  }
});
