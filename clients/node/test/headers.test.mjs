// The header formats, from decisions built by hand (no server): every field, rounding, several buckets, the
// limiting bucket in the older fields, Retry-After only when waiting helps.
import assert from "node:assert/strict";
import { test } from "node:test";

import { rateLimitHeaders } from "../src/index.mjs";

const user = { name: "user", rate: 10, burst: 20 };
const tenant = { name: "tenant", rate: 3, burst: 100 };

test("an allowed single-bucket call gets both formats and no Retry-After", () => {
  const decision = { allowed: true, limitingIndex: 0, buckets: [{ ...user, remaining: 19, retryAfterMs: 0, resetAfterMs: 100 }] };
  assert.deepEqual(rateLimitHeaders(decision), {
    "RateLimit-Policy": '"user";q=20;w=2',
    RateLimit: '"user";r=19;t=1',
    "RateLimit-Limit": "20",
    "RateLimit-Remaining": "19",
    "RateLimit-Reset": "1",
  });
});

test("a refusal rounds Retry-After up to whole seconds", () => {
  const decision = { allowed: false, limitingIndex: 0, buckets: [{ ...user, remaining: 0, retryAfterMs: 1001, resetAfterMs: 2000, fits: false }] };
  const headers = rateLimitHeaders(decision);
  assert.equal(headers["Retry-After"], "2");
  assert.equal(headers.RateLimit, '"user";r=0;t=2');
});

test("a cost above the burst (retry -1, never) has no Retry-After", () => {
  const decision = { allowed: false, limitingIndex: 0, buckets: [{ ...user, remaining: 5, retryAfterMs: -1, resetAfterMs: 1500, fits: false }] };
  assert.equal(rateLimitHeaders(decision)["Retry-After"], undefined);
});

test("several buckets: one item per bucket; the older fields and Retry-After from the limiting one", () => {
  const decision = {
    allowed: false,
    limitingIndex: 1,
    buckets: [
      { ...user, remaining: 7, retryAfterMs: 0, resetAfterMs: 1300, fits: true },
      { ...tenant, remaining: 0, retryAfterMs: 2500, resetAfterMs: 33_334, fits: false },
    ],
  };
  assert.deepEqual(rateLimitHeaders(decision), {
    "RateLimit-Policy": '"user";q=20;w=2, "tenant";q=100;w=34',
    RateLimit: '"user";r=7;t=2, "tenant";r=0;t=34',
    "RateLimit-Limit": "100",
    "RateLimit-Remaining": "0",
    "RateLimit-Reset": "34",
    "Retry-After": "3",
  });
});

test("formats: draft only, legacy only, none; a quote in a name is escaped", () => {
  const decision = { allowed: true, limitingIndex: 0, buckets: [{ ...user, name: 'a"b', remaining: 1, retryAfterMs: 0, resetAfterMs: 0 }] };
  assert.deepEqual(Object.keys(rateLimitHeaders(decision, "draft")), ["RateLimit-Policy", "RateLimit"]);
  assert.equal(rateLimitHeaders(decision, "draft").RateLimit, '"a\\"b";r=1;t=0');
  assert.deepEqual(Object.keys(rateLimitHeaders(decision, "legacy")), ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]);
  assert.deepEqual(rateLimitHeaders(decision, "none"), {});
  assert.throws(() => rateLimitHeaders(decision, "ietf"), /standard must be one of both, draft, legacy, none/);
});
