// The in-memory buckets of fail: "local", at instants the test sets: they start full, refill at the rate, take
// several limits all or nothing, report like TB.ACQUIREEACH, and hold at most their bound of buckets.
import assert from "node:assert/strict";
import { test } from "node:test";

import { LocalBuckets } from "../src/local.cjs";

const user = { key: "ratelimit:{u}:user", rate: 1, burst: 2, cost: 1 };
const tenant = { key: "ratelimit:{u}:tenant", rate: 0.5, burst: 3, cost: 1 };

test("a bucket starts full, refuses when empty with the exact wait, and refills at its rate", () => {
  const local = new LocalBuckets();
  assert.deepEqual(local.acquire([user], 0).buckets[0], { fits: true, remaining: 1, retryAfterMs: 0, resetAfterMs: 1000 });
  assert.equal(local.acquire([user], 0).allowed, true);
  assert.deepEqual(local.acquire([user], 0), {
    allowed: false,
    limitingIndex: 0,
    buckets: [{ fits: false, remaining: 0, retryAfterMs: 1000, resetAfterMs: 2000 }],
  });
  assert.equal(local.acquire([user], 999).allowed, false);
  assert.equal(local.acquire([user], 1000).allowed, true);
  assert.equal(local.acquire([{ ...user, key: "other", cost: 3 }], 0).buckets[0].retryAfterMs, -1, "cost above the burst");
});

test("several limits are taken all or nothing; the refusing one is the limiting one", () => {
  const local = new LocalBuckets();
  local.acquire([user, tenant], 0);
  local.acquire([user, tenant], 0);
  const refused = local.acquire([user, tenant], 0);
  assert.equal(refused.allowed, false);
  assert.equal(refused.limitingIndex, 0);
  assert.deepEqual(refused.buckets.map((bucket) => bucket.remaining), [0, 1], "the tenant's token was not taken");
  local.clear();
  assert.equal(local.acquire([user], 0).buckets[0].remaining, 1, "Redis answered again: buckets start over");
});

test("at most maxBuckets buckets are kept, the least recently used going first", () => {
  const local = new LocalBuckets(3);
  for (const name of ["a", "b", "c"]) local.acquire([{ ...user, key: name }], 0);
  local.acquire([{ ...user, key: "a" }], 0); // a is now the most recently used
  local.acquire([{ ...user, key: "d" }], 0); // b goes
  assert.equal(local.buckets.size, 3);
  assert.deepEqual([...local.buckets.keys()].sort(), ["a", "c", "d"]);
});
