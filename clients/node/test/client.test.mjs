// Every TbClient method through both Redis clients, on a server with the module and on one without it (where the
// shared Lua script serves every call), plus the errors a caller can meet.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { TbClient, TbReplyError, TbArgumentError, luaScript } from "../src/index.mjs";
import { connect, CLIENT_KINDS } from "./clients.mjs";
import { Server, freshKey, WITHOUT_MODULE } from "./harness.mjs";

// Real time since it started, in whole milliseconds rounded up: the most the server's clock can have moved between
// the calls made meanwhile. A wait computed from a bucket first touched after the start is its value at that first
// call less at most ms(): the bound follows the machine's load instead of a fixed margin.
function stopwatch() {
  const start = performance.now();
  return { ms: () => Math.ceil(performance.now() - start) };
}

const BACKENDS = [
  { name: "module", module: true },
  { name: WITHOUT_MODULE, module: false },
];

for (const backend of BACKENDS) {
  for (const kind of CLIENT_KINDS) {
    describe(`TbClient over ${kind}, ${backend.name}`, () => {
      let server;
      let conn;
      let tb;
      before(async () => {
        server = await Server.start({ module: backend.module });
        conn = await connect(kind, server);
        tb = new TbClient(conn.redis);
      });
      after(async () => {
        await conn?.close();
        await server?.stop();
      });

      test("the backend is found from the first call's reply", async () => {
        const fresh = new TbClient(conn.redis);
        assert.equal(fresh.backend, "auto");
        assert.equal(fresh.backendInUse, undefined);
        await fresh.acquire(freshKey("detect"), 10, 20);
        assert.equal(fresh.backend, backend.name);
        assert.equal(fresh.backendInUse, backend.name);
        assert.equal(fresh.clientKind, kind);
      });

      test("acquire takes tokens, refuses with the exact wait, and never for a cost above the burst", async () => {
        const key = freshKey("acquire");
        // A token a 100 s: the exact counts hold however slowly the calls go.
        const watch = stopwatch();
        assert.deepEqual(await tb.acquire(key, 0.01, 20), { allowed: true, remaining: 19, retryAfterMs: 0, resetAfterMs: 100_000 });
        const taken = await tb.acquire(key, 0.01, 20, 15);
        assert.equal(taken.allowed, true);
        assert.equal(taken.remaining, 4);
        const refused = await tb.acquire(key, 0.01, 20, 10);
        assert.equal(refused.allowed, false);
        assert.ok(refused.retryAfterMs >= 600_000 - watch.ms() && refused.retryAfterMs <= 600_000, `${refused.retryAfterMs}`);
        const never = await tb.acquire(key, 0.01, 20, 25);
        assert.equal(never.allowed, false);
        assert.equal(never.retryAfterMs, -1);
        const peek = await tb.acquire(key, 0.01, 20, 0);
        assert.equal(peek.allowed, true);
        assert.equal(peek.remaining, 4);
      });

      test("acquireAll takes from every bucket or none, and names the limiting one", async () => {
        const tag = freshKey("all");
        const buckets = [
          { key: `{${tag}}:user`, rate: 0.01, burst: 5 },
          { key: `{${tag}}:tenant`, rate: 0.01, burst: 2 },
        ];
        const first = await tb.acquireAll(2, buckets);
        assert.deepEqual({ ...first, resetAfterMs: undefined }, {
          allowed: true, remaining: 0, retryAfterMs: 0, resetAfterMs: undefined, limitingIndex: 1,
        });
        const second = await tb.acquireAll(1, buckets);
        assert.equal(second.allowed, false);
        assert.equal(second.limitingIndex, 1);
        assert.equal((await tb.acquire(`{${tag}}:user`, 0.01, 5, 0)).remaining, 3, "the refused call took nothing");
      });

      test("acquireEach reports every bucket and takes each one's own cost, or nothing", async () => {
        const tag = freshKey("each");
        const buckets = [
          { key: `{${tag}}:user`, rate: 0.01, burst: 5, cost: 2 },
          { key: `{${tag}}:tenant`, rate: 0.01, burst: 10, cost: 1 },
        ];
        const first = await tb.acquireEach(buckets);
        assert.equal(first.allowed, true);
        assert.deepEqual(first.buckets.map((b) => [b.fits, b.remaining]), [[true, 3], [true, 9]]);
        const refused = await tb.acquireEach([{ ...buckets[0], cost: 4 }, buckets[1]]);
        assert.equal(refused.allowed, false);
        assert.equal(refused.limitingIndex, 0);
        assert.deepEqual(refused.buckets.map((b) => b.fits), [false, true]);
        assert.ok(refused.buckets[0].retryAfterMs > 0);
        assert.equal((await tb.acquire(`{${tag}}:tenant`, 0.01, 10, 0)).remaining, 9, "the refused call took nothing");
      });

      test("acquireAtMost grants what is there, up to max", async () => {
        const key = freshKey("atmost");
        assert.deepEqual((await tb.acquireAtMost(key, 0.01, 5, 3)).granted, 3);
        const rest = await tb.acquireAtMost(key, 0.01, 5, 3);
        assert.equal(rest.granted, 2);
        assert.equal(rest.remaining, 0);
        const none = await tb.acquireAtMost(key, 0.01, 5, 3);
        assert.equal(none.granted, 0);
        assert.ok(none.retryAfterMs > 0);
      });

      test("reserve grants slots into debt up to max_wait_ms; refund gives back only outside debt", async () => {
        const key = freshKey("reserve");
        const watch = stopwatch();
        const first = await tb.reserve(key, 10, 2, 1, 1000);
        assert.deepEqual(first, { granted: true, waitMs: 0, remaining: 1, resetAfterMs: 100 });
        await tb.reserve(key, 10, 2, 1, 1000);
        const queued = await tb.reserve(key, 10, 2, 1, 1000);
        assert.equal(queued.granted, true);
        assert.ok(queued.waitMs >= 100 - watch.ms() && queued.waitMs <= 100, `${queued.waitMs}`);
        const tooLong = await tb.reserve(key, 10, 2, 1, 10);
        assert.equal(tooLong.granted, false);
        assert.deepEqual((await tb.refund(key, 10, 2, 1)).refunded, false, "a bucket in debt refunds nothing");
        const other = freshKey("refund");
        await tb.acquire(other, 0.01, 10, 5);
        const refund = await tb.refund(other, 0.01, 10, 2);
        assert.equal(refund.refunded, true);
        assert.equal(refund.remaining, 7);
      });

      test("charge lands into debt; block keeps the bucket empty for the given time, then it refills", async () => {
        const key = freshKey("charge");
        const charged = await tb.charge(key, 10, 5, 8);
        assert.equal(charged.remaining, 0);
        assert.equal(charged.retryAfterMs, 400, "one call: one instant, 3 tokens of debt and 1 more at 10/s");
        assert.equal((await tb.acquire(key, 10, 5)).allowed, false);
        const blocked = freshKey("block");
        const reply = await tb.block(blocked, 10, 5, 2000);
        assert.equal(reply.remaining, 0);
        // Empty for 2000 ms, then one token takes 100 ms at 10/s.
        assert.equal(reply.retryAfterMs, 2100);
        const during = await tb.acquire(blocked, 10, 5);
        assert.equal(during.allowed, false);
        assert.ok(during.retryAfterMs > 2000, `${during.retryAfterMs}`);
      });

      test("lower brings a bucket down to the floor and never raises it, on this backend and on the script", async () => {
        for (const through of [tb, new TbClient(conn.redis, { backend: "script" })]) {
          const key = freshKey("lower");
          // A token a 100 s: a whole token never refills between the calls.
          const watch = stopwatch();
          assert.deepEqual(await through.lower(key, 0.01, 5, 2.5), { remaining: 2, retryAfterMs: 0, resetAfterMs: 250_000 });
          const kept = await through.lower(key, 0.01, 5, 4);
          assert.equal(kept.remaining, 2, "never raised");
          assert.ok(kept.resetAfterMs >= 250_000 - watch.ms() && kept.resetAfterMs <= 250_000, `${kept.resetAfterMs}: refilled only`);
          const inDebt = await through.lower(key, 0.01, 5, -1);
          assert.deepEqual(inDebt, { remaining: 0, retryAfterMs: 200_000, resetAfterMs: 600_000 });
          assert.equal((await through.acquire(key, 0.01, 5)).allowed, false);
          await assert.rejects(through.lower(key, 0.01, 5, -865), (error) => error instanceof TbReplyError && /tokens/.test(error.message));
          await assert.rejects(through.lower(key, 0.01, 5, NaN), TbArgumentError);
        }
      });

      test("reset deletes the bucket", async () => {
        const key = freshKey("reset");
        await tb.acquire(key, 1, 3, 3);
        assert.equal(await tb.reset(key), true);
        assert.equal((await tb.acquire(key, 1, 3, 0)).remaining, 3);
        assert.equal(await tb.reset(key), false);
      });

      test("a server's refusal names the command, the key and the server's text", async () => {
        const key = freshKey("errors");
        await assert.rejects(tb.acquire(key, 0, 20), (error) => {
          assert.ok(error instanceof TbReplyError);
          assert.equal(error.code, "ERR");
          assert.equal(error.command, "TB.ACQUIRE");
          assert.equal(error.message, `TB.ACQUIRE ${JSON.stringify(key)}: ERR rate must be a positive number`);
          return true;
        });
        const stringKey = freshKey("string");
        if (kind === "ioredis") await conn.redis.set(stringKey, "x");
        else await conn.redis.set(stringKey, "x");
        await assert.rejects(tb.acquire(stringKey, 1, 1), (error) => error instanceof TbReplyError && error.code === "WRONGTYPE");
        await assert.rejects(tb.reserve(key, 1, 1, 1, -5), /ERR max_wait_ms must be an integer from 0 to 86400000/);
      });

      test("arguments that are not numbers are refused before anything is sent, by name", async () => {
        await assert.rejects(tb.acquire("k", "10", 20), (error) => {
          assert.ok(error instanceof TbArgumentError);
          assert.equal(error.message, 'rate must be a finite number, got "10"');
          return true;
        });
        await assert.rejects(tb.acquire("", 1, 1), /key must be a non-empty string/);
        await assert.rejects(tb.acquireEach([{ key: "a", rate: 1, burst: NaN }]), /buckets\[0\]\.burst must be a finite number, got NaN/);
        await assert.rejects(tb.acquireAll(1, []), /buckets must be a non-empty array/);
      });

      if (!backend.module) {
        test("a server that forgot the script (SCRIPT FLUSH) gets it again through EVAL", async () => {
          const scripted = new TbClient(conn.redis, { backend: "script" });
          await scripted.acquire(freshKey("flush"), 1, 5);
          if (kind === "ioredis") await conn.redis.call("SCRIPT", "FLUSH");
          else await conn.redis.sendCommand(["SCRIPT", "FLUSH"]);
          assert.equal((await scripted.acquire(freshKey("flush"), 1, 5)).remaining, 4);
          const loaded = kind === "ioredis"
            ? await conn.redis.call("SCRIPT", "EXISTS", luaScript.sha1())
            : await conn.redis.sendCommand(["SCRIPT", "EXISTS", luaScript.sha1()]);
          assert.deepEqual(loaded, [1]);
        });

        test("backend 'module' on a server without it says the command is unknown", async () => {
          const forced = new TbClient(conn.redis, { backend: "module" });
          await assert.rejects(forced.acquire(freshKey("forced"), 1, 1), (error) => {
            assert.ok(error instanceof TbReplyError);
            assert.match(error.message, /unknown command/);
            return true;
          });
        });
      }
    });
  }
}

test("an object that is no Redis client is refused with what was expected", () => {
  assert.throws(() => new TbClient({}), /expected an ioredis or node-redis client/);
  assert.throws(() => new TbClient(null), /expected an ioredis or node-redis client/);
  assert.throws(() => new TbClient({ call() {}, sendCommand() {} }, { backend: "lua" }), /backend must be one of auto, module, function, script/);
});
