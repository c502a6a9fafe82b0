// The header mapping (docs/headers.md) against the fixture the Python suite and tb-rls read too
// (fixtures/headers.json): exact fields for decisions built by hand (no server), numbers kept within RFC 8941,
// names the sf-string cannot hold refused when the middleware is built and by rateLimitHeaders.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";

import { rateLimit, rateLimitHeaders, TbArgumentError } from "../src/index.mjs";
import { MAX_INTEGER } from "../src/headers.cjs";
import { REPOSITORY } from "./harness.mjs";

/** A Redis client to build middleware with: never called, since no request is made. */
const UNUSED_CLIENT = { call() {}, sendCommand() {} };
const FIXTURE = JSON.parse(fs.readFileSync(path.join(REPOSITORY, "fixtures", "headers.json"), "utf8"));

function decisionOf(item) {
  return {
    allowed: item.allowed,
    limitingIndex: item.limiting_index,
    buckets: item.buckets.map((b) => ({
      name: b.name,
      // "NaN", "Infinity" and "-Infinity" (strings: JSON has no such numbers) stand for those numbers.
      rate: Number(b.rate),
      burst: Number(b.burst),
      fits: b.fits,
      remaining: b.remaining,
      retryAfterMs: b.retry_after_ms,
      resetAfterMs: b.reset_after_ms,
    })),
  };
}

test("fixtures/headers.json: every decision gets exactly the fields listed, in order", () => {
  assert.equal(MAX_INTEGER, FIXTURE.max_integer);
  for (const item of FIXTURE.cases) {
    assert.deepEqual(Object.entries(rateLimitHeaders(decisionOf(item), item.standard)), item.headers, item.about);
  }
});

test("fixtures/headers.json: the standards accepted and refused, by rateLimitHeaders and when the middleware is built", () => {
  const decision = decisionOf(FIXTURE.cases[0]);
  for (const standard of FIXTURE.standards.accepted) {
    rateLimitHeaders(decision, standard);
    rateLimit({ client: UNUSED_CLIENT, limits: { name: "a", rate: 1, burst: 1 }, standard });
  }
  for (const standard of FIXTURE.standards.refused) {
    assert.throws(() => rateLimitHeaders(decision, standard), /standard must be one of both, draft, legacy, none/, String(standard));
    assert.throws(() => rateLimit({ client: {}, limits: { name: "a", rate: 1, burst: 1 }, standard }), TbArgumentError, String(standard));
  }
});

test("fixtures/headers.json: names an sf-string holds are accepted, the others refused before any request", () => {
  const decision = (name) => ({ allowed: true, limitingIndex: 0, buckets: [{ name, rate: 1, burst: 1, remaining: 1, retryAfterMs: 0, resetAfterMs: 0 }] });
  for (const name of FIXTURE.names.accepted) {
    rateLimit({ client: UNUSED_CLIENT, limits: { name, rate: 1, burst: 1 } });
    const escaped = name.replace(/[\\"]/g, (c) => `\\${c}`);
    assert.equal(rateLimitHeaders(decision(name), "draft")["RateLimit-Policy"], `"${escaped}";q=1;w=1`);
  }
  const refused = /name must be a non-empty string of the characters 0x20 to 0x7E/;
  for (const name of [...FIXTURE.names.refused, ...FIXTURE.names.refused_types]) {
    assert.throws(() => rateLimit({ client: {}, limits: [{ name, rate: 1, burst: 1 }] }), (e) => e instanceof TbArgumentError && refused.test(e.message), JSON.stringify(name));
    assert.throws(() => rateLimitHeaders(decision(name)), (e) => e instanceof TbArgumentError && refused.test(e.message), JSON.stringify(name));
  }
});
