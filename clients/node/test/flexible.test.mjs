// RateLimiterTB against rate-limiter-flexible: every method, the RateLimiterRes fields and the rejection shape
// compared with the library's own RateLimiterRedis on the same server (swapping the class is the migration), and
// the limiter inside the library's RateLimiterQueue and RLWrapperBlackAndWhite.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  RateLimiterRedis,
  RateLimiterQueue,
  RateLimiterRes as FlexibleRes,
  RLWrapperBlackAndWhite,
} from "rate-limiter-flexible";

import { RateLimiterTB, RateLimiterRes } from "../src/index.mjs";
import { connect } from "./clients.mjs";
import { Server, freshKey } from "./harness.mjs";

/** What an application typically does with a limiter: consume, and read the rejection. */
async function attempt(limiter, key) {
  try {
    const res = await limiter.consume(key);
    return { ok: true, res };
  } catch (rejection) {
    if (rejection instanceof Error) throw rejection;
    return { ok: false, res: rejection };
  }
}

for (const backend of [{ name: "module", module: true }, { name: "script", module: false }]) {
  describe(`RateLimiterTB, ${backend.name}`, () => {
    let redisServer;
    let conn;
    before(async () => {
      redisServer = await Server.start({ module: backend.module });
      conn = await connect("ioredis", redisServer);
    });
    after(async () => {
      conn?.close();
      await redisServer?.stop();
    });

    test("consume resolves, then rejects with a RateLimiterRes (not an Error), the fields of the library's", async () => {
      const limiter = new RateLimiterTB({ storeClient: conn.redis, points: 3, duration: 3, keyPrefix: freshKey("rlf") });
      const outcomes = [];
      for (let i = 0; i < 4; i++) outcomes.push(await attempt(limiter, "ann"));
      assert.deepEqual(outcomes.map((o) => o.ok), [true, true, true, false]);
      const first = outcomes[0].res;
      assert.ok(first instanceof RateLimiterRes);
      assert.deepEqual(first.toJSON(), { remainingPoints: 2, msBeforeNext: 1000, consumedPoints: 1, isFirstInDuration: true });
      const refused = outcomes[3].res;
      assert.equal(refused.remainingPoints, 0);
      assert.equal(refused.consumedPoints, 4);
      assert.ok(refused.msBeforeNext > 900 && refused.msBeforeNext <= 1000, `${refused.msBeforeNext}: the next point, one second away`);
      assert.deepEqual(Object.keys(refused.toJSON()), Object.keys(new FlexibleRes().toJSON()));
      assert.equal(String(refused), JSON.stringify(refused.toJSON()));
    });

    test("swapping RateLimiterRedis for RateLimiterTB keeps the application's outcomes", async () => {
      const prefix = freshKey("swap");
      const theirs = new RateLimiterRedis({ storeClient: conn.redis, points: 2, duration: 10, keyPrefix: `${prefix}:a` });
      const ours = new RateLimiterTB({ storeClient: conn.redis, points: 2, duration: 10, keyPrefix: `${prefix}:b` });
      const run = async (limiter) => {
        const outcomes = [];
        for (let i = 0; i < 3; i++) outcomes.push(await attempt(limiter, "user"));
        return outcomes.map(({ ok, res }) => [ok, res.remainingPoints, res.consumedPoints, Object.keys(res.toJSON())]);
      };
      assert.deepEqual(await run(ours), await run(theirs));
      assert.equal(await theirs.delete("user"), true);
      assert.equal(await ours.delete("user"), true);
      assert.equal(await ours.delete("user"), false);
      assert.equal(await ours.get("user"), null, "a deleted key has no record, as with the library");
      assert.equal(await theirs.get("user"), null);
    });

    test("reward gives points back; get peeks without consuming", async () => {
      const limiter = new RateLimiterTB({ storeClient: conn.redis, points: 5, duration: 5, keyPrefix: freshKey("reward") });
      await limiter.consume("k", 4);
      assert.equal((await limiter.get("k")).remainingPoints, 1);
      const rewarded = await limiter.reward("k", 2);
      assert.equal(rewarded.remainingPoints, 3);
      assert.equal((await limiter.get("k")).consumedPoints, 2);
    });

    test("penalty takes points into debt and block refuses for its duration", async () => {
      const limiter = new RateLimiterTB({ storeClient: conn.redis, points: 5, duration: 1, keyPrefix: freshKey("penalty") });
      const penalised = await limiter.penalty("k", 8);
      assert.equal(penalised.remainingPoints, 0);
      const refused = await attempt(limiter, "k");
      assert.equal(refused.ok, false);
      assert.ok(refused.res.msBeforeNext > 600, `${refused.res.msBeforeNext}: 3 points of debt and one more at 5/s`);
      const blocked = await limiter.block("b", 2);
      assert.equal(blocked.remainingPoints, 0);
      assert.ok(blocked.msBeforeNext > 1990 && blocked.msBeforeNext <= 2001, `${blocked.msBeforeNext}: the block, as the library's`);
      const during = await attempt(limiter, "b");
      assert.equal(during.ok, false);
      assert.ok(during.res.msBeforeNext > 1900);
    });

    test("blockDuration blocks a key on its first refusal", async () => {
      const limiter = new RateLimiterTB({ storeClient: conn.redis, points: 1, duration: 1, blockDuration: 5, keyPrefix: freshKey("blockDuration") });
      assert.equal((await attempt(limiter, "k")).ok, true);
      const refused = await attempt(limiter, "k");
      assert.equal(refused.ok, false);
      assert.ok(refused.res.msBeforeNext > 4990 && refused.res.msBeforeNext <= 5001, `${refused.res.msBeforeNext}: the block`);
      const again = await attempt(limiter, "k");
      assert.ok(again.res.msBeforeNext <= refused.res.msBeforeNext, "a refusal inside the block does not extend it");
    });

    test("a client retrying every 600 ms is admitted after the block when RateLimiterRedis admits it", async () => {
      // The library blocks on the refusal that crosses the limit, refusals inside the block do not extend it, and
      // the first retry after it is admitted. Both limiters get each attempt at the same instant.
      const prefix = freshKey("retry");
      const options = { storeClient: conn.redis, points: 1, duration: 1, blockDuration: 2 };
      const theirs = new RateLimiterRedis({ ...options, keyPrefix: `${prefix}:a` });
      const ours = new RateLimiterTB({ ...options, keyPrefix: `${prefix}:b` });
      const outcomes = { theirs: [], ours: [] };
      const started = Date.now();
      for (let i = 0; i < 7; i++) {
        await new Promise((resolve) => setTimeout(resolve, started + i * 600 - Date.now()));
        outcomes.theirs.push((await attempt(theirs, "user")).ok);
        outcomes.ours.push((await attempt(ours, "user")).ok);
      }
      // Admitted at 0 ms, blocked by the attempt at 600 ms until 2,600 ms, admitted again at 3,000 ms (a stalled
      // machine may shift that by one attempt, for both alike).
      assert.deepEqual(outcomes.theirs.slice(0, 4), [true, false, false, false], "the library's block");
      assert.ok(outcomes.theirs.slice(4).includes(true), "the library admits after the block");
      assert.deepEqual(outcomes.ours, outcomes.theirs);
    });

    test("inside the library's RateLimiterQueue: waits for each next point instead of a whole window", async () => {
      const limiter = new RateLimiterTB({ storeClient: conn.redis, points: 2, duration: 0.2, keyPrefix: freshKey("queue") });
      const queue = new RateLimiterQueue(limiter, { maxQueueSize: 10 });
      const started = Date.now();
      const remaining = await Promise.all([1, 2, 3, 4].map(() => queue.removeTokens(1)));
      const elapsed = Date.now() - started;
      assert.equal(remaining.length, 4);
      assert.ok(elapsed >= 150 && elapsed < 2000, `4 points at 10/s with a burst of 2 took ${elapsed} ms`);
    });

    test("inside the library's RLWrapperBlackAndWhite: a whitelisted key never reaches Redis", async () => {
      const limiter = new RateLimiterTB({ storeClient: conn.redis, points: 1, duration: 10, keyPrefix: freshKey("bw") });
      const wrapped = new RLWrapperBlackAndWhite({ limiter, whiteList: ["admin"] });
      for (let i = 0; i < 3; i++) await wrapped.consume("admin");
      await wrapped.consume("user");
      await assert.rejects(wrapped.consume("user"), (rejection) => rejection instanceof RateLimiterRes);
    });
  });
}

test("Redis failures reject with an Error, as the library's limiters do", async () => {
  const redisServer = await Server.start();
  const conn = await connect("ioredis", redisServer, { maxRetriesPerRequest: 0, enableOfflineQueue: false });
  try {
    const limiter = new RateLimiterTB({ storeClient: conn.redis, points: 1, duration: 1 });
    await redisServer.stop();
    await assert.rejects(limiter.consume("k"), (error) => error instanceof Error);
  } finally {
    conn.close();
  }
});

test("options rate-limiter-flexible has and a token bucket cannot honour are refused by name", () => {
  const storeClient = { call() {}, sendCommand() {} };
  assert.throws(() => new RateLimiterTB({ storeClient, execEvenly: true }), /does not implement execEvenly/);
  assert.throws(() => new RateLimiterTB({ storeClient, points: 0 }), /points must be a finite number > 0/);
  assert.throws(() => new RateLimiterTB({}), /needs \{ storeClient \}/);
});
