// The in-memory buckets of fail: "local" (docs/clients.md, "When Redis fails"): every case of fixtures/local.json
// run through LocalBuckets.decide on a clock the test sets, with a Redis that answers or fails as each step says;
// then what the fixture does not hold: a charge-back Redis refuses, and charge-backs made before a call.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";

import { ReplyError } from "ioredis";

import { LocalBuckets } from "../src/local.cjs";
import { TbArgumentError, TbReplyError, TbUnavailableError } from "../src/errors.cjs";
import { REPOSITORY } from "./harness.mjs";

const FIXTURE = JSON.parse(fs.readFileSync(path.join(REPOSITORY, "fixtures", "local.json"), "utf8"));

/** A fixture step's buckets: [{ key, name, rate, burst, cost }]. */
function bucketsOf(testCase, step) {
  return step.call.map(({ key, limit, cost }) => ({ key, name: limit, ...testCase.limits[limit], cost }));
}

/** A fixture reply ({ allowed, buckets: [{ remaining, retry_after_ms, reset_after_ms }] }) in the package's shape. */
function decisionOf(reply) {
  return {
    allowed: reply.allowed,
    limitingIndex: 0,
    buckets: reply.buckets.map((b) => ({ fits: reply.allowed, remaining: b.remaining, retryAfterMs: b.retry_after_ms, resetAfterMs: b.reset_after_ms })),
  };
}

/** A decision in the fixture's shape. */
function fixtureShape(decision) {
  return {
    allowed: decision.allowed,
    buckets: decision.buckets.map((b) => ({ remaining: b.remaining, retry_after_ms: b.retryAfterMs, reset_after_ms: b.resetAfterMs })),
  };
}

/** A Redis that answers (charge-backs recorded, then `reply`) or fails everything with a lost connection. */
function fakeRedis(step) {
  const charged = [];
  const lost = () => new TbUnavailableError("redis-tb: the connection to Redis closed");
  const tb = {
    async charge(key, rate, burst, cost) {
      if (step.redis === "fails") throw lost();
      charged.push({ key, rate, burst, cost });
      return { remaining: 0, retryAfterMs: 0, resetAfterMs: 0 };
    },
  };
  const call = async () => {
    if (step.redis === "fails") throw lost();
    return decisionOf(step.reply);
  };
  return { run: (work) => work(tb), call, charged };
}

for (const testCase of FIXTURE.cases) {
  test(`fixtures/local.json: ${testCase.name}`, async () => {
    let nowMs = 0;
    const local = new LocalBuckets({ capacity: testCase.capacity ?? 10_000, now: () => nowMs });
    for (const [index, step] of testCase.steps.entries()) {
      nowMs = step.at_ms;
      const where = `step ${index}${step.note ? ` (${step.note})` : ""}`;
      const redis = fakeRedis(step);
      const { decision, error } = await local.decide(bucketsOf(testCase, step), redis.run, redis.call);
      if (step.redis === "answers") {
        assert.equal(error, undefined, where);
        assert.deepEqual(redis.charged, step.charge_back, `${where}: charge-backs`);
        assert.deepEqual(fixtureShape(decision), step.reply, where);
      } else {
        assert.ok(error instanceof TbUnavailableError, where);
        assert.deepEqual(fixtureShape(decision), step.expect, where);
      }
    }
  });
}

const api = { key: "ratelimit:{u}:api", name: "api", rate: 1, burst: 5, cost: 1 };

test("a charge-back Redis refuses (beyond the debt it allows) is dropped and logged, and the call goes on", async () => {
  let nowMs = 0;
  const warnings = [];
  const local = new LocalBuckets({ now: () => nowMs, logger: { warn: (message) => warnings.push(message) } });
  const failing = { run: () => Promise.reject(new TbUnavailableError("redis-tb: no reply from Redis within 300 ms")) };
  for (let i = 0; i < 3; i++) await local.decide([api], failing.run, () => assert.fail("not called"));
  const refusal = new ReplyError("ERR charge would put the bucket more than 24 hours of refill into debt");
  const charges = [];
  const tb = {
    async charge(...args) {
      charges.push(args);
      throw new TbReplyError("TB.CHARGE", api.key, refusal);
    },
  };
  const answered = { allowed: true, limitingIndex: 0, buckets: [{ fits: true, remaining: 4, retryAfterMs: 0, resetAfterMs: 1000 }] };
  const first = await local.decide([api], (work) => work(tb), async () => answered);
  assert.equal(first.error, undefined);
  assert.deepEqual(charges, [[api.key, 1, 5, 3]]);
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /refused the charge-back of 3/);
  await local.decide([api], (work) => work(tb), async () => answered);
  assert.equal(charges.length, 1, "nothing owed any more");
});

test("an error reply to a charge-back (OOM) keeps it owed, and the call is decided in memory", async () => {
  const local = new LocalBuckets({ now: () => 0 });
  const fail = () => Promise.reject(new TbUnavailableError("lost"));
  await local.decide([api], fail, () => assert.fail("not called"));
  const oom = new TbReplyError("TB.CHARGE", api.key, new ReplyError("OOM command not allowed when used memory > 'maxmemory'."));
  let calls = 0;
  const tb = { charge: () => Promise.reject(oom) };
  const outcome = await local.decide([api], (work) => work(tb), async () => calls++);
  assert.equal(outcome.error, oom);
  assert.equal(calls, 0, "the call was not sent");
  assert.deepEqual(outcome.decision.buckets[0].remaining, 3);
  assert.equal(local.entries.get(api.key).owed, 2);
});

test("a TbArgumentError is not a Redis failure: it rejects", async () => {
  const local = new LocalBuckets();
  await assert.rejects(local.decide([api], () => Promise.reject(new TbArgumentError("rate must be a finite number")), () => {}), TbArgumentError);
});

test("localCapacity must be an integer >= 0", () => {
  for (const bad of [-1, 1.5, "10", Infinity]) assert.throws(() => new LocalBuckets({ capacity: bad }), /localCapacity/);
  assert.equal(new LocalBuckets({ capacity: 0 }).capacity, 0);
});

test("a table of 0 keys limits every key with its limit's overflow bucket", () => {
  const local = new LocalBuckets({ capacity: 0, now: () => 0 });
  const results = ["a", "b", "c", "d", "e", "f"].map((key) => local.acquire([{ ...api, key }]).allowed);
  assert.deepEqual(results, [true, true, true, true, true, false]);
  assert.equal(local.entries.size, 0);
});

test("waits saturate at the module's longest (2^63 - 1 ms) where a double cannot count the refill", () => {
  const local = new LocalBuckets({ now: () => 0 });
  const slow = { key: "slow", name: "slow", rate: 1e-300, burst: 1e10, cost: 1 };
  assert.equal(local.acquire([slow]).buckets[0].resetAfterMs, 2 ** 63 - 1);
  const tiny = { ...slow, key: "tiny", burst: 1 };
  assert.equal(local.acquire([tiny]).allowed, true);
  assert.deepEqual(local.acquire([tiny]).buckets[0], { fits: false, remaining: 0, retryAfterMs: 2 ** 63 - 1, resetAfterMs: 2 ** 63 - 1 });
});
