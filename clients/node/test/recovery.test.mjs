// When Redis answers again after a fault, fail: "local" brings its bucket down to what this process's history
// allows, and no lower (docs/clients.md, "When Redis fails"): a client that kept to the limit meets no refusal
// afterwards, concurrent requests at recovery charge nothing twice, and a charge-back meeting an error is kept
// (a fault: OOM) or dropped and logged (a configuration error: NOPERM), through Express on spawned servers.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, test } from "node:test";

import express from "express";

import { classifyFailure, rateLimit } from "../src/index.mjs";
import { connect } from "./clients.mjs";
import { Server, freshKey, rawCommand } from "./harness.mjs";
import { closeServer, listen } from "./http-helpers.mjs";

/**
 * An Express app limited by `options` (the identity from the x-user header): `get(user)` -> status, and the
 * middleware's `limiter`.
 */
async function expressApp(options) {
  const app = express();
  const middleware = rateLimit({ key: (req) => req.get("x-user"), ...options });
  app.use(middleware);
  app.get("/", (req, res) => res.send("ok"));
  const server = http.createServer(app);
  const base = await listen(server);
  return {
    get: async (user) => (await fetch(base, { headers: { "x-user": user } })).status,
    limiter: middleware.limiter,
    close: () => closeServer(server),
  };
}

/** `CONFIG SET maxmemory` on `server`: 1 refuses every write with OOM (noeviction), 0 lifts it. */
async function outOfMemory(server, on) {
  await rawCommand(server.port, "CONFIG SET maxmemory-policy noeviction");
  assert.equal(await rawCommand(server.port, `CONFIG SET maxmemory ${on ? 1 : 0}`), "+OK\r\n");
}

/** The tokens field of bucket `key` as stored (as of its `ts`: refill only adds to it), or undefined if none. */
async function storedTokens(server, key) {
  const reply = await rawCommand(server.port, `HGET ${key} tokens`);
  return reply.startsWith("$-1") ? undefined : Number(reply.split("\r\n")[1]);
}

/** How many TB.LOWER calls `server` has run (INFO commandstats). */
async function lowers(server) {
  const match = (await rawCommand(server.port, "INFO commandstats")).match(/cmdstat_tb\.lower:calls=(\d+)/);
  return Number(match?.[1] ?? 0);
}

/** Resolves at `atMs` on performance.now()'s clock (at once if that has passed). */
const until = (atMs) => new Promise((resolve) => setTimeout(resolve, Math.max(0, atMs - performance.now())));

/** A logger that keeps what it hears. */
function recorder() {
  const lines = { warn: [], error: [] };
  return { lines, logger: { warn: (message) => lines.warn.push(message), error: (message) => lines.error.push(message) } };
}

describe("recovery after a fault", () => {
  let server;
  let conn;
  before(async () => {
    server = await Server.start();
    conn = await connect("ioredis", server);
  });
  after(async () => {
    await outOfMemory(server, false);
    await conn?.close();
    await server?.stop();
  });

  test("a client paced at the limit's rate through a 10 s OOM and 5 s after it meets no refusal", async () => {
    const rate = 2;
    const burst = 5;
    const failures = [];
    const app = await expressApp({
      client: conn.redis,
      prefix: `${freshKey("paced")}:`,
      limits: { name: "api", rate, burst },
      logger: recorder().logger,
      timeoutMs: 3000, // no deadline missed on a busy machine: every failure is an OOM reply
      onError: (error) => failures.push(classifyFailure(error).class),
    });
    try {
      for (let i = 0; i < burst; i++) assert.equal(await app.get("paced"), 200, `burst request ${i}`);
      // From here exactly `rate` a second, on a fixed schedule (a late request never lets the next one come early):
      // 20 requests during 10 s of OOM, then 10 in the 5 s after it. The schedule starts 50 ms after the burst so
      // that each request finds about 1.1 tokens, never fewer than 1 for lack of refill the limit owes it.
      const startMs = performance.now() + 50;
      await outOfMemory(server, true);
      const statuses = [];
      for (let i = 1; i <= 30; i++) {
        if (i === 21) await outOfMemory(server, false);
        await until(startMs + (i * 1000) / rate);
        statuses.push(await app.get("paced"));
      }
      const [fault, recovered] = [statuses.slice(0, 20), statuses.slice(20)];
      assert.equal(failures.length, 20, `every request of the fault was decided in memory: ${failures}`);
      assert.deepEqual([...new Set(failures)], ["oom"]);
      assert.deepEqual(fault, Array(20).fill(200), "admitted in memory at the limit's rate");
      assert.deepEqual(recovered, Array(10).fill(200), "no refusal after the fault");
    } finally {
      await outOfMemory(server, false);
      await app.close();
    }
  });

  test("8 concurrent requests at recovery leave Redis's bucket no lower than the process's history allows", async (t) => {
    const rate = 10;
    const burst = 5;
    const prefix = `${freshKey("concurrent")}:`;
    const key = `${prefix}{crowd}:api`;
    const app = await expressApp({ client: conn.redis, prefix, limits: { name: "api", rate, burst }, logger: recorder().logger, timeoutMs: 3000 });
    try {
      await outOfMemory(server, true);
      // 2 s of requests at twice the rate: the in-memory bucket admits its burst and its refill (about 25), and
      // refuses the rest; Redis's bucket, meanwhile, stays full (5), refill capped at the burst.
      let admitted = 0;
      const faultEndsMs = performance.now() + 2000;
      for (let i = 0; performance.now() < faultEndsMs; i++) {
        await until(faultEndsMs - 2000 + i * 50);
        if ((await app.get("crowd")) === 200) admitted += 1;
      }
      assert.ok(admitted >= burst + rate, `${admitted} admitted in memory`);
      await outOfMemory(server, false);
      const lowersBefore = await lowers(server);
      // 8 checks begun in one tick (HTTP requests would reach the middleware spread out): each one's charge-back
      // and call are written before any reply comes back.
      const request = { get: () => "crowd" };
      const outcomes = await Promise.all(Array.from({ length: 8 }, () => app.limiter.check(request)));
      const statuses = outcomes.map((outcome) => outcome.action);
      assert.deepEqual(outcomes.filter((outcome) => outcome.error !== undefined), [], "Redis answered every one");
      const sent = (await lowers(server)) - lowersBefore;
      // The in-memory bucket never went below 0 (it admits only what it holds): whatever the order in which the 8
      // charge-backs and calls ran, Redis is brought down to it and takes only what it then holds. Charging what
      // memory admitted (about 25) from Redis's full bucket would leave it about 20 tokens in debt.
      const tokens = await storedTokens(server, key);
      t.diagnostic(`${admitted} admitted in memory; at recovery ${statuses} after ${sent} TB.LOWER; Redis's bucket then holds ${tokens} tokens`);
      assert.ok(tokens >= -1e-9, `Redis's bucket holds ${tokens} tokens after recovery (${statuses})`);
      assert.ok(tokens < 2, `Redis's bucket was brought down: ${tokens} tokens (${statuses})`);
      assert.equal(sent, 8, "every call for the diverged key sends its own floor");
      const served = statuses.filter((action) => action === "allow").length;
      assert.ok(served <= 2, `${served} of 8 served at recovery: at most what the in-memory bucket held (${statuses})`);
    } finally {
      await outOfMemory(server, false);
      await app.close();
    }
  });

  test("a charge-back meeting OOM stays owed and its call is decided in memory; the next one brings Redis down", async () => {
    const rate = 2;
    const burst = 2;
    const prefix = `${freshKey("oomed")}:`;
    const key = `${prefix}{owing}:api`;
    const classes = [];
    const app = await expressApp({
      client: conn.redis,
      prefix,
      limits: { name: "api", rate, burst },
      logger: recorder().logger,
      timeoutMs: 3000,
      onError: (error) => classes.push(classifyFailure(error).class),
    });
    try {
      await outOfMemory(server, true);
      // The burst, then after 1 s (the in-memory bucket full again; Redis's capped at its burst) the burst again.
      assert.deepEqual([await app.get("owing"), await app.get("owing")], [200, 200]);
      await until(performance.now() + 1000);
      assert.deepEqual([await app.get("owing"), await app.get("owing")], [200, 200]);
      // Still OOM: this call's charge-back fails like the fault it is; the call is refused in memory (empty).
      assert.equal(await app.get("owing"), 429);
      assert.deepEqual(classes, ["oom", "oom", "oom", "oom", "oom"]);
      await outOfMemory(server, false);
      // What the OOM'd charge-back covered was kept: this call's charge-back brings Redis (full) down to the
      // in-memory bucket (well under a token), and Redis refuses.
      assert.equal(await app.get("owing"), 429);
      assert.equal(classes.length, 5, "answered by Redis");
      const tokens = await storedTokens(server, key);
      assert.ok(tokens >= -1e-9 && tokens < 1, `Redis's bucket holds ${tokens} tokens: brought down to the in-memory one, no lower`);
    } finally {
      await outOfMemory(server, false);
      await app.close();
    }
  });

  test("a charge-back refused by a configuration error (an ACL user without TB.LOWER) is dropped and logged, and Redis answers", async () => {
    assert.equal(await rawCommand(server.port, "ACL SETUSER nolower on >secret ~* &* +@all -tb.lower"), "+OK\r\n");
    const limited = await connect("ioredis", server, { username: "nolower", password: "secret" });
    const rate = 0.01; // a token a 100 s: nothing refills during the test
    const burst = 3;
    const prefix = `${freshKey("refused")}:`;
    const key = `${prefix}{acl}:api`;
    const { lines, logger } = recorder();
    const classes = [];
    const app = await expressApp({
      client: limited.redis,
      prefix,
      limits: { name: "api", rate, burst },
      logger,
      timeoutMs: 3000,
      onError: (error) => classes.push(classifyFailure(error).class),
    });
    try {
      await outOfMemory(server, true);
      assert.equal(await app.get("acl"), 200, "admitted in memory: 1 owed");
      // The next call's charge-back meets NOPERM (Redis checks the ACL before memory): the 1 it covered is dropped
      // and logged as an error (and given to onError, as a failed call is); its call meets OOM, and is admitted in
      // memory: 1 owed again.
      assert.equal(await app.get("acl"), 200);
      assert.deepEqual(classes, ["oom", "noperm", "oom"]);
      assert.equal(lines.error.length, 1, JSON.stringify(lines.error));
      assert.match(lines.error[0], /refused a charge-back \(NOPERM, a configuration error: .*no permissions to run the 'tb\.lower' command.*\(1 admitted in memory\) is dropped/);
      await outOfMemory(server, false);
      // Its charge-back refused again (not logged again within the minute), the call goes on to Redis, whose
      // bucket never saw the 2 admitted in memory (full: 3), and takes 1.
      assert.equal(await app.get("acl"), 200);
      assert.deepEqual(classes, ["oom", "noperm", "oom", "noperm"], "the charge-back refused, the call answered by Redis");
      const first = await storedTokens(server, key);
      assert.ok(Math.abs(first - 2) < 0.05, `${first} tokens: Redis's full bucket less this call's 1`);
      // Nothing is owed any more: no charge-back, and Redis answers on.
      assert.equal(await app.get("acl"), 200);
      const second = await storedTokens(server, key);
      assert.ok(Math.abs(second - 1) < 0.05, `${second} tokens: 1 and the refill of the time between the calls`);
      assert.equal(lines.error.length, 1);
    } finally {
      await outOfMemory(server, false);
      await app.close();
      await limited.close();
    }
  });
});
