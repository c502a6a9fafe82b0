// RateLimiterTB against rate-limiter-flexible: every method, the RateLimiterRes fields and the rejection shape
// compared with the library's own RateLimiterRedis on the same server (swapping the class is the migration), and
// the limiter inside the library's RateLimiterQueue and RLWrapperBlackAndWhite.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  RateLimiterMemory,
  RateLimiterRedis,
  RateLimiterQueue,
  RateLimiterRes as FlexibleRes,
  RLWrapperBlackAndWhite,
} from "rate-limiter-flexible";

import { RateLimiterTB, RateLimiterRes } from "../src/index.mjs";
import { connect } from "./clients.mjs";
import { Server, freshKey } from "./harness.mjs";

/** What an application typically does with a limiter: consume, and read the rejection. */
async function attempt(limiter, key, points = 1) {
  try {
    const res = await limiter.consume(key, points);
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
      const started = performance.now();
      for (let i = 0; i < 4; i++) outcomes.push(await attempt(limiter, "ann"));
      const late = Math.ceil(performance.now() - started); // the most the server's clock moved meanwhile
      assert.deepEqual(outcomes.map((o) => o.ok), [true, true, true, false]);
      const first = outcomes[0].res;
      assert.ok(first instanceof RateLimiterRes);
      assert.deepEqual(first.toJSON(), { remainingPoints: 2, msBeforeNext: 1000, consumedPoints: 1, isFirstInDuration: true });
      const refused = outcomes[3].res;
      assert.equal(refused.remainingPoints, 0);
      assert.equal(refused.consumedPoints, 4);
      assert.ok(refused.msBeforeNext >= 1000 - late && refused.msBeforeNext <= 1000, `${refused.msBeforeNext}: the next point, one second away`);
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
  const refused = [
    [{ execEvenly: true }, /does not implement execEvenly/],
    [{ execEvenlyMinDelayMs: 5 }, /does not implement execEvenlyMinDelayMs: it paces execEvenly/],
    [{ customIncrTtlLuaScript: "return 1" }, /does not implement customIncrTtlLuaScript/],
    [{ points: 5, blockOnConsumed: 10 }, /does not implement blockOnConsumed above points \+ 1: it counts refused requests/],
    [{ duration: 0, blockDuration: 5 }, /duration 0 .* cannot take a block/],
    [{ blockDuration: 86_401 }, /blockDuration must be a number of seconds up to 86400/],
    [{ points: 5, inMemoryBlockOnConsumed: 4 }, /inMemoryBlockOnConsumed option must be greater or equal "points"/],
    [{ inMemoryBlockDuration: 4 }, /inMemoryBlockOnConsumed option must be set up/],
    [{ insuranceLimiter: {} }, /insuranceLimiter must be a limiter/],
    [{ tableName: "x" }, /unknown option tableName/],
    [{ points: Number.NaN }, /points must be a finite number/],
  ];
  for (const [options, message] of refused) assert.throws(() => new RateLimiterTB({ storeClient, ...options }), message);
  assert.throws(() => new RateLimiterTB({}), /needs \{ storeClient \}/);
  const limiter = new RateLimiterTB({ storeClient, useRedisPackage: true, blockOnConsumed: 5, points: 4 });
  assert.throws(() => (limiter.execEvenly = true), /does not implement execEvenly/);
});

describe("RateLimiterTB, the rest of RateLimiterRedis's interface, against it on the same server", () => {
  let redisServer;
  let conn;
  before(async () => {
    redisServer = await Server.start();
    conn = await connect("ioredis", redisServer);
  });
  after(async () => {
    conn?.close();
    await redisServer?.stop();
  });

  /** Both limiters with the same options, on keys of their own. */
  function pair(options) {
    const prefix = freshKey("pair");
    return {
      theirs: new RateLimiterRedis({ storeClient: conn.redis, ...options, keyPrefix: `${prefix}:a` }),
      ours: new RateLimiterTB({ storeClient: conn.redis, ...options, keyPrefix: `${prefix}:b` }),
    };
  }

  test("points 0 refuses everything; string points are points; penalties into debt count in consumedPoints", async () => {
    const zero = pair({ points: 0, duration: 10 });
    for (const limiter of [zero.theirs, zero.ours]) {
      const refused = await attempt(limiter, "k");
      assert.equal(refused.ok, false);
      assert.ok(refused.res.msBeforeNext >= 0, "the window's wait, as the library's");
    }
    const { theirs, ours } = pair({ points: 5, duration: 100 });
    for (const limiter of [theirs, ours]) {
      assert.equal((await limiter.consume("s", "2")).consumedPoints, 2);
      await assert.rejects(limiter.consume("s", "1.5"), /string different than integer values is not supported/);
      await assert.rejects(limiter.consume("s", 1.5), /decimal number of points is not supported/);
    }
    const debt = [];
    for (const limiter of [theirs, ours]) {
      await limiter.consume("d", 5);
      debt.push((await limiter.penalty("d", 3)).consumedPoints, (await limiter.get("d")).consumedPoints);
    }
    assert.deepEqual(debt, [8, 8, 8, 8]);
  });

  test("set() and the points setter, as the library's", async () => {
    const { theirs, ours } = pair({ points: 5, duration: 100 });
    const seen = [];
    for (const limiter of [theirs, ours]) {
      await limiter.set("k", 3, 100);
      seen.push((await limiter.get("k")).consumedPoints, (await limiter.get("k")).remainingPoints);
      await limiter.set("k", 0);
      seen.push((await limiter.get("k"))?.consumedPoints ?? 0);
      await limiter.set("over", 9, 1);
      seen.push((await limiter.get("over")).consumedPoints, (await attempt(limiter, "over")).ok);
      limiter.points = 1;
      await limiter.consume("p");
      seen.push((await attempt(limiter, "p")).ok);
    }
    assert.deepEqual(seen.slice(6), seen.slice(0, 6));
    assert.deepEqual(seen.slice(0, 6), [3, 2, 0, 9, false, false]);
  });

  test("after a block the key starts afresh: all of points pass again, as the library's", async () => {
    const { theirs, ours } = pair({ points: 2, duration: 10, blockDuration: 1 });
    const run = async (limiter) => {
      const outcomes = [];
      for (let i = 0; i < 3; i++) outcomes.push((await attempt(limiter, "k")).ok);
      return outcomes;
    };
    const before = { theirs: await run(theirs), ours: await run(ours) };
    assert.deepEqual(before.theirs, [true, true, false]);
    assert.deepEqual(before.ours, before.theirs);
    await new Promise((resolve) => setTimeout(resolve, 1100));
    const after = { theirs: await run(theirs), ours: await run(ours) };
    assert.deepEqual(after.theirs, [true, true, false], "the library: its window afresh, then a new block");
    assert.deepEqual(after.ours, after.theirs);
  });

  test("block() shorter than a point's refill refuses until the block's end, then the key starts afresh, as the library's", async () => {
    // Without blockDuration: one point is back every 12 s, the block lasts 1 s.
    const { theirs, ours } = pair({ points: 5, duration: 60 });
    const waits = [];
    for (const limiter of [theirs, ours]) {
      await limiter.consume("d", 5);
      await limiter.block("d", 1);
      const refused = await attempt(limiter, "d");
      assert.equal(refused.ok, false);
      waits.push(refused.res.msBeforeNext);
    }
    for (const wait of waits) assert.ok(wait > 900 && wait <= 1001, `${waits}: the block's end, not a point's refill`);
    await new Promise((resolve) => setTimeout(resolve, Math.max(...waits) + 20));
    const outcomes = { theirs: [], ours: [] };
    for (let i = 0; i < 6; i++) {
      outcomes.theirs.push((await attempt(theirs, "d")).ok);
      outcomes.ours.push((await attempt(ours, "d")).ok);
    }
    assert.deepEqual(outcomes.theirs, [true, true, true, true, true, false], "the library: afresh after the block");
    assert.deepEqual(outcomes.ours, outcomes.theirs);
  });

  test("a request above points crosses the limit and blocks the key, as the library's", async () => {
    const { theirs, ours } = pair({ points: 1, duration: 1, blockDuration: 2 });
    const unblocked = pair({ points: 1, duration: 1 });
    for (const limiter of [unblocked.theirs, unblocked.ours]) {
      const { msBeforeNext } = (await attempt(limiter, "k", 2)).res;
      assert.ok(msBeforeNext > 900 && msBeforeNext <= 1000, `${msBeforeNext}: no block, the window's wait`);
    }
    for (const limiter of [theirs, ours]) {
      const refused = await attempt(limiter, "k", 2);
      assert.ok(refused.res.msBeforeNext > 1900 && refused.res.msBeforeNext <= 2001, `${refused.res.msBeforeNext}: the block`);
      assert.equal((await attempt(limiter, "k")).ok, false, "the key is blocked");
    }
  });

  test("duration 0: consumed points never come back (msBeforeNext -1, as the library's)", async () => {
    const { theirs, ours } = pair({ points: 2, duration: 0 });
    for (const limiter of [theirs, ours]) {
      await limiter.consume("k", 2);
      assert.deepEqual([(await limiter.get("k")).consumedPoints, (await limiter.get("k")).msBeforeNext], [2, -1]);
      assert.equal((await attempt(limiter, "k")).ok, false);
    }
  });

  test("duration 0: consumed points never come back; customDuration sets one call's refill", async () => {
    const ours = new RateLimiterTB({ storeClient: conn.redis, points: 2, duration: 0, keyPrefix: freshKey("never") });
    await ours.consume("k", 2);
    const refused = await attempt(ours, "k");
    assert.equal(refused.ok, false);
    assert.equal(refused.res.msBeforeNext, -1, "never");
    const custom = new RateLimiterTB({ storeClient: conn.redis, points: 2, duration: 1, keyPrefix: freshKey("custom") });
    await custom.consume("k", 2, { customDuration: 60 });
    const slow = await attempt(custom, "k");
    assert.ok(slow.res.msBeforeNext > 400 && slow.res.msBeforeNext <= 500, `${slow.res.msBeforeNext}: 2 points a second`);
    await assert.rejects(custom.consume("k", 1, { customDuration: 60 }), (r) => r.msBeforeNext > 25_000);
  });

  test("insuranceLimiter answers when Redis fails, and rejectIfRedisNotReady fails at once when it is not ready", async () => {
    const server = await Server.start();
    const failing = await connect("ioredis", server, { maxRetriesPerRequest: 0, enableOfflineQueue: false });
    try {
      const insuranceLimiter = new RateLimiterMemory({ points: 1, duration: 10 });
      const ours = new RateLimiterTB({ storeClient: failing.redis, points: 5, duration: 1, blockDuration: 3, insuranceLimiter });
      assert.equal(insuranceLimiter.blockDuration, 3, "the library hands its blockDuration to the insurance");
      await server.stop();
      assert.equal((await ours.consume("k")).remainingPoints, 0, "the insurance's answer: 1 point");
      await assert.rejects(ours.consume("k"), (r) => r instanceof RateLimiterRes || r.constructor.name === "RateLimiterRes");
      const lazy = new RateLimiterTB({ storeClient: conn.redis.duplicate({ lazyConnect: true }), rejectIfRedisNotReady: true });
      await assert.rejects(lazy.consume("k"), /Redis connection is not ready/);
    } finally {
      failing.close();
      await server.stop();
    }
  });

  test("a storeClient the application closed fails as its own commands would: the insuranceLimiter answers with the call's options", async () => {
    for (const kind of ["ioredis", "node-redis"]) {
      const closing = await connect(kind, redisServer);
      const key = freshKey("closed");
      const insuranceLimiter = new RateLimiterTB({ storeClient: conn.redis, points: 2, duration: 3 });
      const ours = new RateLimiterTB({ storeClient: closing.redis, points: 1, duration: 2, insuranceLimiter });
      if (kind === "ioredis") await closing.redis.quit();
      else await closing.redis.close();
      const res = await ours.consume(key, 1, { customDuration: 1 });
      assert.equal(res.remainingPoints, 1, `${kind}: the insurance's 2 points, not the closed client's 1`);
      assert.ok(res.msBeforeNext <= 1000, `${kind}: customDuration 1 s, got ${res.msBeforeNext} ms`);
      closing.close();
    }
  });

  test("inMemoryBlockOnConsumed keeps a refused key in memory, sparing Redis, for inMemoryBlockDuration", async () => {
    const { theirs, ours } = pair({ points: 1, duration: 100, inMemoryBlockOnConsumed: 2, inMemoryBlockDuration: 30 });
    for (const limiter of [theirs, ours]) {
      await limiter.consume("k");
      const refused = await attempt(limiter, "k");
      assert.equal(refused.res.msBeforeNext, 30_000);
      await conn.redis.del(limiter.getKey("k"));
      const inMemory = await attempt(limiter, "k");
      assert.equal(inMemory.ok, false, "refused from memory, whatever Redis holds");
      assert.ok(inMemory.res.msBeforeNext > 29_000);
      assert.ok(limiter.getInMemoryBlockMsBeforeExpire(limiter.getKey("k")) > 29_000);
      await limiter.delete("k");
      assert.equal((await attempt(limiter, "k")).ok, true, "delete lifts it");
    }
  });
});
