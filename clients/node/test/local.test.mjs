// The in-memory buckets of fail: "local" (docs/clients.md, "When Redis fails"): every case of fixtures/local.json
// run through LocalBuckets.decide on a clock the test sets, with a Redis that answers or fails as each step says
// (calls in parallel held open between their begin and end steps); then what the fixture does not hold: the
// log of a refused charge-back, charge-backs in parallel settling out of order, the floor's bound, and the order
// of a charge-back and its call.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";

import { ReplyError } from "ioredis";

import { LocalBuckets, chargeBackOutcome } from "../src/local.cjs";
import { TbArgumentError, TbReplyError, TbUnavailableError, classifyFailure } from "../src/errors.cjs";
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

const lost = () => new TbUnavailableError("redis-tb: the connection to Redis closed");

/** An error reply to `command` for `key`, as TbClient rejects with it. */
const replyError = (command, key, text) => new TbReplyError(command, key, new ReplyError(text));

/**
 * A Redis for one limiter call: `tb.lower` records each charge-back, and it and `call` wait until `finish(how)`
 * settles them: the charge-backs accepted, failed like a lost connection (`lowerFails`) or answered with the error
 * `lowerError`; then the call (sent before `finish` or after) failed like a lost connection (`fails`) or answered
 * with `reply`.
 */
function fakeRedis() {
  const charged = [];
  const lowers = [];
  let sent = false;
  let answer;
  let settleCall;
  const tb = {
    lower(key, rate, burst, tokens) {
      charged.push({ key, rate, burst, tokens });
      return new Promise((resolve, reject) => lowers.push({ key, resolve, reject }));
    },
  };
  const answered = new Promise((resolve, reject) => (answer = { resolve, reject }));
  const call = () => {
    sent = true;
    settleCall?.();
    return answered;
  };
  function finish({ lowerFails = false, lowerError, fails, reply }) {
    for (const lower of lowers) {
      if (lowerError !== undefined) lower.reject(replyError("TB.LOWER", lower.key, lowerError));
      else if (lowerFails) lower.reject(lost());
      else lower.resolve({ remaining: 0, retryAfterMs: 0, resetAfterMs: 0 });
    }
    settleCall = () => (fails ? answer.reject(lost()) : answer.resolve(decisionOf(reply)));
    if (sent) settleCall();
  }
  return { run: (work) => work(tb), call, charged, finish, called: () => sent };
}

/** The charge-backs sent equal the fixture's, floors within 1e-9. */
function assertChargeBacks(actual, expected, where) {
  assert.equal(actual.length, expected.length, `${where}: charge-backs ${JSON.stringify(actual)}`);
  expected.forEach((want, index) => {
    const { tokens, ...rest } = actual[index];
    const { tokens: wantTokens, ...wantRest } = want;
    assert.deepEqual(rest, wantRest, `${where}: charge-back ${index}`);
    assert.ok(Math.abs(tokens - wantTokens) <= 1e-9, `${where}: charge-back ${index} floor ${tokens}, expected ${wantTokens}`);
  });
}

/** The outcome of a step that finishes a call (a plain one, or an end): answered as `reply`, or decided as `expect`. */
function assertOutcome(step, { decision, error }, where) {
  if (step.redis === "answers") {
    assert.equal(error, undefined, where);
    assert.deepEqual(fixtureShape(decision), step.reply, where);
  } else {
    assert.notEqual(error, undefined, where);
    assert.equal(classifyFailure(error).action, "fail-mode", `${where}: ${error.message}`);
    assert.deepEqual(fixtureShape(decision), step.expect, where);
  }
}

for (const testCase of FIXTURE.cases) {
  test(`fixtures/local.json: ${testCase.name}`, async () => {
    let nowMs = 0;
    const refusals = [];
    const refused = (error, share) => refusals.push({ error, share });
    const local = new LocalBuckets({ capacity: testCase.capacity ?? 10_000, now: () => nowMs, refused });
    const open = new Map();
    for (const [index, step] of testCase.steps.entries()) {
      nowMs = step.at_ms;
      const where = `step ${index}${step.note ? ` (${step.note})` : ""}`;
      if (step.end !== undefined) {
        const started = open.get(step.end);
        assert.ok(started !== undefined, `${where}: no call ${step.end} begun`);
        open.delete(step.end);
        started.redis.finish({ lowerFails: step.charge_back_outcome === "failed", fails: step.redis === "fails", reply: step.reply });
        assertOutcome(step, await started.outcome, where);
        continue;
      }
      const redis = fakeRedis();
      const outcome = local.decide(bucketsOf(testCase, step), redis.run, redis.call);
      // A call with charge-backs waits for their answers: sent beside them, it could reach Redis first.
      const charging = redis.charged.length > 0;
      assert.equal(redis.called(), !charging, `${where}: the call is sent ${charging ? "once its charge-backs are answered" : "at once"}`);
      if (step.charge_back !== undefined) assertChargeBacks(redis.charged, step.charge_back, where);
      if (step.begin !== undefined) {
        open.set(step.begin, { redis, outcome });
        continue;
      }
      const heard = refusals.length;
      const lowerError = step.charge_back_error;
      redis.finish({ lowerError, lowerFails: step.redis === "fails", fails: step.redis === "fails", reply: step.reply });
      assertOutcome(step, await outcome, where);
      const dropped = lowerError !== undefined && step.redis === "answers";
      assert.equal(refusals.length, heard + (dropped ? step.charge_back.length : 0), `${where}: each refused charge-back is heard of`);
      if (dropped) assert.match(refusals.at(-1).error.message, new RegExp(`^TB\\.LOWER .*: ${lowerError.split(" ")[0]}`));
    }
    assert.deepEqual([...open.keys()], [], "every call begun ends");
  });
}

const api = { key: "ratelimit:{u}:api", name: "api", rate: 1, burst: 5, cost: 1 };
const answered = { allowed: true, limitingIndex: 0, buckets: [{ fits: true, remaining: 4, retryAfterMs: 0, resetAfterMs: 1000 }] };
const failing = () => Promise.reject(new TbUnavailableError("redis-tb: no reply from Redis within 300 ms"));

test("a charge-back's outcome follows the failure table: a fault stays owed, a configuration error is dropped", () => {
  assert.equal(chargeBackOutcome(undefined), "accepted");
  for (const text of ["OOM command not allowed", "READONLY You can't write", "LOADING Redis is loading", "MOVED 3999 127.0.0.1:6381", "ERR user_script:1: OOM command not allowed"]) {
    assert.equal(chargeBackOutcome(replyError("TB.LOWER", "k", text)), "owed", text);
  }
  assert.equal(chargeBackOutcome(lost()), "owed");
  assert.equal(chargeBackOutcome(new Error("connect ECONNREFUSED 127.0.0.1:1")), "owed");
  for (const text of ["NOPERM User limiter has no permissions to run the 'tb.lower' command", "WRONGTYPE Operation against a key", "ERR tokens must be a finite number", "NOAUTH Authentication required."]) {
    assert.equal(chargeBackOutcome(replyError("TB.LOWER", "k", text)), "dropped", text);
  }
  assert.equal(chargeBackOutcome(new TbArgumentError("tokens must be a finite number")), "owed", "nothing was sent");
});

test("each refused charge-back is heard of with the share it dropped, and the call goes on to Redis", async () => {
  const refusals = [];
  const local = new LocalBuckets({ now: () => 0, refused: (error, share) => refusals.push([error.code, share]) });
  const noperm = { lower: (key) => Promise.reject(replyError("TB.LOWER", key, "NOPERM User limiter has no permissions to run the 'tb.lower' command")) };
  for (const owed of [1, 2]) {
    const key = `k${owed}`;
    for (let i = 0; i < owed; i++) await local.decide([{ ...api, key }], failing, () => assert.fail("not called"));
    const outcome = await local.decide([{ ...api, key }], (work) => work(noperm), async () => answered);
    assert.equal(outcome.error, undefined, "the call goes on to Redis");
    assert.deepEqual([local.entries.get(key).owed, local.entries.get(key).charging], [0, 0], "dropped");
  }
  assert.deepEqual(refusals, [["NOPERM", 1], ["NOPERM", 2]]);
});

test("an error reply to a charge-back (OOM) keeps it owed, and the call is decided in memory", async () => {
  const local = new LocalBuckets({ now: () => 0 });
  await local.decide([api], failing, () => assert.fail("not called"));
  const oom = replyError("TB.LOWER", api.key, "OOM command not allowed when used memory > 'maxmemory'.");
  const tb = { lower: () => Promise.reject(oom) };
  let sent = false;
  const outcome = await local.decide([api], (work) => work(tb), async () => {
    sent = true;
    return answered;
  });
  assert.equal(outcome.error, oom, "the charge-back's fault");
  assert.equal(sent, false, "the call is not sent");
  assert.deepEqual(outcome.decision.buckets[0].remaining, 3);
  assert.equal(local.entries.get(api.key).owed, 2);
  assert.equal(local.entries.get(api.key).charging, 0);
});

test("charge-backs in parallel each send the floor; one that fails gives back only its own share", async () => {
  let nowMs = 0;
  const local = new LocalBuckets({ now: () => nowMs });
  for (let i = 0; i < 3; i++) await local.decide([api], failing, () => assert.fail("not called"));
  const entry = local.entries.get(api.key);
  assert.equal(entry.owed, 3);
  nowMs = 500;
  const first = fakeRedis();
  const one = local.decide([api], first.run, first.call);
  assert.deepEqual(entry, { ...entry, owed: 0, charging: 3, inFlight: 1 });
  // Decided in memory while the first is in flight: 1 more owed, covered by the next charge-back's share.
  await local.decide([api], failing, () => assert.fail("not called"));
  assert.equal(entry.owed, 1);
  const second = fakeRedis();
  const two = local.decide([api], second.run, second.call);
  assert.deepEqual(first.charged, [{ key: api.key, rate: 1, burst: 5, tokens: 2.5 }]);
  assert.deepEqual(second.charged, [{ key: api.key, rate: 1, burst: 5, tokens: 1.5 }]);
  assert.deepEqual([entry.owed, entry.charging, entry.inFlight], [0, 4, 2]);
  second.finish({ fails: false, reply: { allowed: true, buckets: [{ remaining: 0, retry_after_ms: 0, reset_after_ms: 4500 }] } });
  assert.equal((await two).error, undefined);
  assert.deepEqual([entry.owed, entry.charging], [0, 3], "the second's share (1) is in Redis; the first's (3) is not yet");
  assert.equal(entry.tokens, 5 - 4.5, "Redis's answer as it is: the second's floor (1.5) covered the first's share too");
  first.finish({ lowerFails: true, fails: true });
  assert.notEqual((await one).error, undefined);
  assert.deepEqual([entry.owed, entry.charging, entry.inFlight], [3, 0, 0], "the first's share is owed again, and only it");
});

/** The entries of `local` that owe Redis or have a charge-back in flight, counted one by one. */
function counted(local) {
  return [...local.entries.values()].filter((entry) => entry.owed > 0 || entry.charging > 0).length;
}

test("the count of diverged keys follows every change: no key is looked up while none owes Redis", async () => {
  const local = new LocalBuckets({ now: () => 0 });
  const other = { ...api, key: `${api.key}:other` };
  const check = (expected, about) => {
    assert.equal(local.divergedKeys, counted(local), about);
    assert.equal(local.divergedKeys, expected, about);
  };
  check(0, "a new table");
  await local.decide([api, other], failing, () => assert.fail("not called"));
  check(2, "both keys owe what they admitted in memory");
  const first = fakeRedis();
  const one = local.decide([api], first.run, first.call);
  check(2, "a charge-back in flight keeps its key diverged");
  first.finish({ reply: { allowed: true, buckets: [{ remaining: 3, retry_after_ms: 0, reset_after_ms: 2000 }] } });
  await one;
  check(1, "the charge-back taken: only the other key owes");
  assert.equal(local.diverged(api.key), false);
  assert.equal(local.diverged(other.key), true);
  const second = fakeRedis();
  const two = local.decide([other], second.run, second.call);
  second.finish({ lowerFails: true, fails: true });
  await two;
  check(1, "a charge-back that met a fault is owed again");
  const third = fakeRedis();
  const three = local.decide([other], third.run, third.call);
  third.finish({ reply: { allowed: true, buckets: [{ remaining: 3, retry_after_ms: 0, reset_after_ms: 2000 }] } });
  await three;
  check(0, "every charge-back taken");
});

test("two charge-backs of one key in flight at once, settled in order, leave the other key's debt counted", async () => {
  const local = new LocalBuckets({ now: () => 0 });
  const other = { ...api, key: `${api.key}:other` };
  await local.decide([api, other], failing, () => assert.fail("not called"));
  const [first, second] = [fakeRedis(), fakeRedis()];
  const one = local.decide([api], first.run, first.call);
  // The second finds the key diverged (its charge-back in flight) and sends a share of 0.
  const two = local.decide([api], second.run, second.call);
  assert.deepEqual([local.entries.get(api.key).charging, local.entries.get(api.key).inFlight], [1, 2]);
  const reply = { allowed: true, buckets: [{ remaining: 3, retry_after_ms: 0, reset_after_ms: 2000 }] };
  first.finish({ reply });
  await one;
  assert.equal(local.divergedKeys, counted(local));
  second.finish({ reply });
  await two;
  assert.equal(local.divergedKeys, counted(local));
  assert.equal(local.divergedKeys, 1, "the other key still owes Redis");
  assert.equal(local.diverged(other.key), true);
});

test("charging is exactly 0 once no charge-back is in flight, whatever the float sums left", async () => {
  const local = new LocalBuckets({ now: () => 0 });
  const tenth = { ...api, cost: 0.1 };
  await local.decide([tenth], failing, () => assert.fail("not called"));
  const [first, second] = [fakeRedis(), fakeRedis()];
  const one = local.decide([tenth], first.run, first.call);
  await local.decide([{ ...api, cost: 0.2 }], failing, () => assert.fail("not called"));
  const two = local.decide([tenth], second.run, second.call);
  const reply = { allowed: true, buckets: [{ remaining: 4, retry_after_ms: 0, reset_after_ms: 1000 }] };
  first.finish({ reply });
  second.finish({ reply });
  await Promise.all([one, two]);
  const entry = local.entries.get(api.key);
  assert.deepEqual([entry.owed, entry.charging, entry.inFlight], [0, 0, 0]);
  const third = fakeRedis();
  const three = local.decide([tenth], third.run, third.call);
  third.finish({ reply });
  await three;
  assert.deepEqual(third.charged, [], "not diverged: no charge-back");
});

test("the floor is at most a day of refill in debt (TB.LOWER's bound)", async () => {
  const local = new LocalBuckets({ now: () => 0 });
  const slow = { ...api, rate: 0.001 };
  await local.decide([slow], failing, () => assert.fail("not called"));
  const entry = local.entries.get(slow.key);
  entry.tokens = -1000;
  const redis = fakeRedis();
  const outcome = local.decide([slow], redis.run, redis.call);
  assert.deepEqual(redis.charged, [{ key: slow.key, rate: 0.001, burst: 5, tokens: -86.4 }]);
  redis.finish({ reply: { allowed: false, buckets: [{ remaining: 0, retry_after_ms: 1, reset_after_ms: 1 }] } });
  await outcome;
});

test("a TbArgumentError is not a Redis failure: it rejects", async () => {
  const local = new LocalBuckets();
  await assert.rejects(local.decide([api], () => Promise.reject(new TbArgumentError("rate must be a finite number")), () => {}), TbArgumentError);
});

test("a table of 1 key limits every other key with its limit's overflow bucket", () => {
  const local = new LocalBuckets({ capacity: 1, now: () => 0 });
  const results = ["a", "b", "c", "d", "e", "f", "g"].map((key) => local.acquire([{ ...api, key }]).allowed);
  assert.deepEqual(results, [true, true, true, true, true, true, false]);
  assert.deepEqual([...local.entries.keys()], ["a"]);
});

test("keys stay in the order of their last use, the most recent one left in place, even once evicted", () => {
  const local = new LocalBuckets({ capacity: 2, now: () => 0 });
  const answer = (key) => local.observeOne({ ...api, key }, 0);
  answer("a");
  answer("b");
  answer("b");
  assert.deepEqual([...local.entries.keys()], ["a", "b"]);
  answer("a");
  assert.deepEqual([...local.entries.keys()], ["b", "a"]);
  // Full again and owing nothing, so a new key takes the least recently used one's place.
  answer("c");
  assert.deepEqual([...local.entries.keys()], ["a", "c"]);
  const one = new LocalBuckets({ capacity: 1, now: () => 0 });
  one.observeOne({ ...api, key: "a" }, 0);
  one.observeOne({ ...api, key: "b" }, 0);
  one.observeOne({ ...api, key: "a" }, 0);
  assert.deepEqual([...one.entries.keys()], ["a"]);
  assert.equal(one.newest, "a");
});

test("waits saturate at the module's longest (2^63 - 1 ms) where a double cannot count the refill", () => {
  const local = new LocalBuckets({ now: () => 0 });
  const slow = { key: "slow", name: "slow", rate: 1e-300, burst: 1e10, cost: 1 };
  assert.equal(local.acquire([slow]).buckets[0].resetAfterMs, 2 ** 63 - 1);
  const tiny = { ...slow, key: "tiny", burst: 1 };
  assert.equal(local.acquire([tiny]).allowed, true);
  assert.deepEqual(local.acquire([tiny]).buckets[0], { fits: false, remaining: 0, retryAfterMs: 2 ** 63 - 1, resetAfterMs: 2 ** 63 - 1 });
});

test("an answer that arrives after its call's deadline is not remembered: the call was decided in memory", async () => {
  let nowMs = 0;
  const local = new LocalBuckets({ now: () => nowMs });
  // Redis answered with 1 token left, then the key's calls fail: 1 admitted here, 0 left, 1 owed.
  local.observe([api], decisionOf({ allowed: true, buckets: [{ remaining: 1, retry_after_ms: 0, reset_after_ms: 4000 }] }));
  await local.decide([api], failing, () => assert.fail("not called"));
  const entry = local.entries.get(api.key);
  assert.deepEqual([entry.tokens, entry.owed], [0, 1]);
  // A call the deadline gives up on: its charge-back and its call stay unanswered, and it is decided in memory.
  let answer;
  const late = new Promise((resolve) => (answer = resolve));
  let expire;
  const run = (work) => {
    work({ lower: () => late.then(() => ({ remaining: 5 })) });
    return new Promise((_, reject) => (expire = reject));
  };
  let sent = false;
  const call = () => {
    sent = true;
    return late.then(() => decisionOf({ allowed: true, buckets: [{ remaining: 4, retry_after_ms: 0, reset_after_ms: 1000 }] }));
  };
  const decided = local.decide([api], run, call);
  expire(new TbUnavailableError("redis-tb: no reply from Redis within 1000 ms"));
  const outcome = await decided;
  assert.equal(outcome.decision.allowed, false, "nothing left in memory");
  // The answer comes, from a replica that took over without the primary's last writes (a full bucket): the
  // charge-back is settled, but the in-memory bucket stays where this process's history puts it.
  answer();
  await new Promise((resolve) => setImmediate(resolve));
  assert.deepEqual([entry.owed, entry.charging, entry.inFlight], [0, 0, 0], "the charge-back settled");
  assert.equal(sent, false, "the call, past its deadline, is not sent after its charge-back");
  assert.equal(entry.tokens, 0, "not raised by a late answer");
});

test("a call is sent once its charge-back is answered: sent beside it, it could reach the key's node first", async () => {
  const local = new LocalBuckets({ now: () => 0 });
  // Redis answered with 1 token left, then the key's calls fail: 1 admitted here, 0 left, 1 owed.
  local.observe([api], decisionOf({ allowed: true, buckets: [{ remaining: 1, retry_after_ms: 0, reset_after_ms: 4000 }] }));
  await local.decide([api], failing, () => assert.fail("not called"));
  // The replica that took over holds a full bucket (the primary's last writes were lost with it), and runs each
  // command as it arrives; the charge-back arrives late, after a MOVED redirection the call did not meet.
  let tokens = api.burst;
  const ran = [];
  let arrive;
  const tb = {
    lower: (key, rate, burst, floor) =>
      new Promise((resolve) => {
        arrive = () => {
          ran.push("TB.LOWER");
          tokens = Math.min(tokens, floor);
          resolve({ remaining: Math.floor(tokens), retryAfterMs: 0, resetAfterMs: ((api.burst - tokens) / api.rate) * 1000 });
        };
      }),
  };
  const call = async () => {
    ran.push("TB.ACQUIRE");
    const allowed = tokens >= api.cost;
    if (allowed) tokens -= api.cost;
    const wait = allowed ? 0 : ((api.cost - tokens) / api.rate) * 1000;
    return decisionOf({ allowed, buckets: [{ remaining: Math.floor(tokens), retry_after_ms: wait, reset_after_ms: ((api.burst - tokens) / api.rate) * 1000 }] });
  };
  const decided = local.decide([api], (work) => work(tb), call);
  await new Promise((resolve) => setImmediate(resolve));
  arrive();
  const { decision, error } = await decided;
  assert.equal(error, undefined);
  assert.deepEqual(ran, ["TB.LOWER", "TB.ACQUIRE"]);
  assert.equal(decision.allowed, false, "this process's history leaves nothing");
  assert.equal(local.entries.get(api.key).tokens, 0, "the in-memory bucket continues from the lowered bucket, not the full one");
});
