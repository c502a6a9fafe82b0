// A limiter call is never charged after its deadline (docs/clients.md, "Deadlines"): Redis stalled with SIGSTOP,
// 30 requests answered by the fail mode, then SIGCONT. Only the call already on the socket when Redis stopped
// may take its cost when it resumes; the 29 made during the stall are never sent, and fail at once instead of
// each waiting for the deadline. The drop-ins (TbStore, RateLimiterTB, TbThrottlerStorage) keep the same rule.
import assert from "node:assert/strict";
import http from "node:http";
import { describe, test } from "node:test";

import express from "express";

import { RateLimiterTB, TbStore, TbThrottlerStorage, TbUnavailableError, rateLimit } from "../src/index.mjs";
import { CLIENT_KINDS, connect } from "./clients.mjs";
import { Server, freshKey, rawCommand, waitUntil } from "./harness.mjs";
import { closeServer, listen } from "./http-helpers.mjs";

const TIMEOUT_MS = 300;
const BURST = 5;

describe("a Redis stall (SIGSTOP) is never charged later", () => {
  for (const kind of CLIENT_KINDS) {
    test(`${kind}: 30 requests during a stall take at most the one call in flight`, async () => {
      const server = await Server.start();
      const conn = await connect(kind, server);
      const prefix = `${freshKey("stall")}:`;
      const bucket = `${prefix}{stalled}:api`;
      const app = express();
      const silent = { warn() {}, error() {} };
      const limits = { name: "api", rate: 0.001, burst: BURST };
      app.use(rateLimit({ client: conn.redis, prefix, limits, key: () => "stalled", fail: "closed", timeoutMs: TIMEOUT_MS, logger: silent }));
      app.get("/", (req, res) => res.send("ok"));
      const httpServer = http.createServer(app);
      const base = await listen(httpServer);
      let stopped = false;
      try {
        assert.equal((await fetch(base)).status, 200);
        server.child.kill("SIGSTOP");
        stopped = true;
        const statuses = [];
        const durations = [];
        for (let i = 0; i < 30; i++) {
          const started = performance.now();
          statuses.push((await fetch(base)).status);
          durations.push(performance.now() - started);
        }
        assert.deepEqual(new Set(statuses), new Set([503]));
        // The first waits for its deadline; the others are answered at once, not after a deadline each (30
        // deadlines, 9 s). The median, not the total, so that a busy machine starving a few answers does not count.
        const median = [...durations].sort((a, b) => a - b)[durations.length >> 1];
        assert.ok(median < TIMEOUT_MS, `answers took ${durations.map(Math.round).join(", ")} ms`);
        server.child.kill("SIGCONT");
        stopped = false;
        // Redis runs what was on the socket as soon as it resumes; the limiter is back once a probe answers.
        await waitUntil(async () => (await rawCommand(server.port, "PING")).startsWith("+PONG"), 5000, "Redis back");
        let first;
        await waitUntil(async () => (first = await fetch(base)).status === 200, 5000, "the limiter back");
        const tokens = Number((await rawCommand(server.port, `HGET ${bucket} tokens`)).split("\r\n")[1]);
        // 5 - the first request - the call in flight when Redis stopped - the request that found it back.
        assert.ok(tokens >= BURST - 3, `${tokens} tokens left: calls made during the stall were charged`);
        assert.equal(first.headers.get("ratelimit-remaining"), String(Math.floor(tokens)));
      } finally {
        if (stopped) server.child.kill("SIGCONT");
        await closeServer(httpServer);
        await conn.close();
        await server.stop();
      }
    });
  }

  /**
   * Runs `during(limiter)` while Redis is stopped (SIGSTOP), over a limiter of burst `burst` that one check has
   * used once; resolves with the tokens its bucket holds once Redis resumed and a check was allowed again.
   */
  async function tokensAfterStall(burst, during) {
    const server = await Server.start();
    const conn = await connect("ioredis", server);
    const prefix = `${freshKey("gate")}:`;
    const limiter = rateLimit({
      client: conn.redis,
      prefix,
      limits: { name: "api", rate: 0.001, burst },
      key: () => "gated",
      fail: "closed",
      timeoutMs: TIMEOUT_MS,
      logger: { warn() {}, error() {} },
    }).limiter;
    let stopped = false;
    try {
      assert.equal((await limiter.check({})).action, "allow");
      server.child.kill("SIGSTOP");
      stopped = true;
      await during(limiter);
      server.child.kill("SIGCONT");
      stopped = false;
      await waitUntil(async () => (await limiter.check({})).action === "allow", 5000, "the limiter back");
      return Number((await rawCommand(server.port, `HGET ${prefix}{gated}:api tokens`)).split("\r\n")[1]);
    } finally {
      if (stopped) server.child.kill("SIGCONT");
      await conn.close();
      await server.stop();
    }
  }

  test("calls made once a written call has waited a quarter of the deadline are not written", async () => {
    const tokens = await tokensAfterStall(20, async (limiter) => {
      const first = limiter.check({}); // written: the one case left
      await new Promise((resolve) => setTimeout(resolve, TIMEOUT_MS / 2));
      const later = await Promise.all(Array.from({ length: 10 }, () => limiter.check({})));
      assert.deepEqual(new Set(later.map((outcome) => outcome.action)), new Set(["unavailable"]));
      assert.equal((await first).action, "unavailable");
    });
    // 20 - the first check - the one written before the stall showed - the check that found it back.
    assert.ok(tokens >= 17, `${tokens} tokens left: the 10 held calls were written`);
  });

  test("a stall charges at most MAX_IN_FLIGHT (64) calls later, however many were made at once", async () => {
    const burst = 1000;
    const tokens = await tokensAfterStall(burst, async (limiter) => {
      // 200 calls in one turn of the event loop: none has waited yet, so only the bound keeps them off the socket.
      const outcomes = await Promise.all(Array.from({ length: 200 }, () => limiter.check({})));
      assert.deepEqual(new Set(outcomes.map((outcome) => outcome.action)), new Set(["unavailable"]));
    });
    // burst - the first check - at most 64 written before the stall showed - the check that found it back.
    assert.ok(tokens >= burst - 1 - 64 - 1, `${tokens} tokens left: more than 64 calls were written during the stall`);
    assert.ok(tokens < burst - 2, `${tokens} tokens left: no call was on the socket when Redis stopped`);
  });
});

/**
 * The drop-ins, each as its library calls it: `take(key)` takes one token (rejecting when Redis fails) and
 * `bucket(key)` is the Redis key of its bucket, burst 20 refilling a token every 1000 s.
 */
const DROP_INS = {
  TbStore: (redis, timeoutMs, prefix) => {
    const store = new TbStore({ client: redis, prefix, timeoutMs });
    store.init({ limit: 20, windowMs: 20_000_000 });
    return { take: (key) => store.increment(key), bucket: (key) => `${prefix}${key}` };
  },
  RateLimiterTB: (redis, timeoutMs, prefix) => {
    const limiter = new RateLimiterTB({ storeClient: redis, keyPrefix: prefix, points: 20, duration: 20_000, timeoutMs });
    return { take: (key) => limiter.consume(key), bucket: (key) => `${prefix}:${key}` };
  },
  TbThrottlerStorage: (redis, timeoutMs, prefix) => {
    const storage = new TbThrottlerStorage({ client: redis, prefix, timeoutMs });
    return { take: (key) => storage.increment(key, 20_000_000, 20, 0, "default"), bucket: (key) => `${prefix}${key}` };
  },
};

describe("a drop-in's call that missed its deadline is never charged later", () => {
  test("a drop-in's timeoutMs is checked when it is built", () => {
    const client = { call() {}, sendCommand() {} };
    for (const timeoutMs of [0, -1, Infinity, NaN, "300"]) {
      assert.throws(() => new TbStore({ client, timeoutMs }), /TbStore: timeoutMs must be a positive finite number/);
      assert.throws(() => new RateLimiterTB({ storeClient: client, timeoutMs }), /RateLimiterTB: timeoutMs must be a positive finite number/);
      assert.throws(() => new TbThrottlerStorage({ client, timeoutMs }), /TbThrottlerStorage: timeoutMs must be a positive finite number/);
    }
  });

  for (const [name, make] of Object.entries(DROP_INS)) {
    for (const kind of CLIENT_KINDS) {
      test(`${name}, ${kind}: 10 calls during a stall (SIGSTOP) answer within the deadline and take at most the one in flight`, async () => {
        const server = await Server.start();
        const conn = await connect(kind, server);
        const dropIn = make(conn.redis, TIMEOUT_MS, `${freshKey("dropin")}:`);
        let stopped = false;
        try {
          await dropIn.take("stalled");
          server.child.kill("SIGSTOP");
          stopped = true;
          const outcomes = [];
          for (let i = 0; i < 10; i++) {
            const started = performance.now();
            // The test's own limit, well past the deadline: a call the Redis client queues would wait for SIGCONT.
            let timer;
            const late = new Promise((resolve) => (timer = setTimeout(() => resolve("no answer"), TIMEOUT_MS + 1500)));
            const answer = dropIn.take("stalled").then(() => "granted", (error) => error);
            outcomes.push({ answer: await Promise.race([answer, late]), ms: performance.now() - started });
            clearTimeout(timer);
          }
          const late = outcomes.filter((outcome) => !(outcome.answer instanceof TbUnavailableError));
          assert.deepEqual(late, [], "every call rejects with TbUnavailableError within its deadline");
          server.child.kill("SIGCONT");
          stopped = false;
          await waitUntil(async () => (await rawCommand(server.port, "PING")).startsWith("+PONG"), 5000, "Redis back");
          await waitUntil(() => dropIn.take("stalled").then(() => true, () => false), 5000, "the drop-in back");
          const tokens = Number((await rawCommand(server.port, `HGET ${dropIn.bucket("stalled")} tokens`)).split("\r\n")[1]);
          // 20 - the first call - the call in flight when Redis stopped - the call that found it back.
          assert.ok(tokens >= 17, `${tokens} tokens left: calls made during the stall were charged when Redis resumed`);
        } finally {
          if (stopped) server.child.kill("SIGCONT");
          await conn.close();
          await server.stop();
        }
      });
    }
  }
});

/** Closes the application's client `redis` of `kind` as an application does, until it says so itself. */
async function closeClient(kind, redis) {
  if (kind === "ioredis") {
    redis.disconnect();
    await waitUntil(() => redis.status === "end", 5000, "ioredis ended");
  } else {
    await redis.close();
  }
}

describe("a drop-in over a Redis client the application closed", () => {
  for (const [name, make] of Object.entries(DROP_INS)) {
    for (const kind of CLIENT_KINDS) {
      test(`${name}, ${kind}: calls fail as the client's own commands would and write nothing, until it is connected again`, async () => {
        const server = await Server.start();
        const conn = await connect(kind, server);
        const prefix = `${freshKey("closed")}:`;
        // `used` takes a token before the client closes; `fresh` (another deadline, so another lane) is first
        // called after it closed: neither may reach Redis through a connection of the package's own meanwhile.
        const used = make(conn.redis, TIMEOUT_MS, prefix);
        const fresh = make(conn.redis, TIMEOUT_MS + 1, prefix);
        // HGET's reply, "" for none.
        const tokens = async (key) => (await rawCommand(server.port, `HGET ${used.bucket(key)} tokens`)).split("\r\n")[1];
        try {
          await used.take("used");
          await closeClient(kind, conn.redis);
          const closed = (error) => error instanceof TbUnavailableError && /the Redis client is closed/.test(error.message);
          await assert.rejects(used.take("used"), closed);
          await assert.rejects(fresh.take("fresh"), closed);
          assert.equal(await tokens("used"), "19", "a call made while the client was closed was charged");
          assert.equal(await tokens("fresh"), "", "a call made while the client was closed was charged");
          await conn.redis.connect();
          await waitUntil(() => used.take("used").then(() => true, () => false), 5000, `${name} back after connect()`);
          await waitUntil(() => fresh.take("fresh").then(() => true, () => false), 5000, `${name} back after connect()`);
        } finally {
          await conn.close();
          await server.stop();
        }
      });
    }
  }
});
