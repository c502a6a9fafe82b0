// fixtures/leases.json through the package's lease rule (src/lease.cjs): each case's steps at their instants, each
// decision as the fixture says, as the Rust workspace's core replays it.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";

import { Lease } from "../src/lease.cjs";
import { REPOSITORY } from "./harness.mjs";

const FIXTURE = JSON.parse(fs.readFileSync(path.join(REPOSITORY, "fixtures", "leases.json"), "utf8"));

/** A fixture's milliseconds as the rule's microseconds. */
const micros = (ms) => Math.round(Number(ms) * 1_000);

/** The decision a step expects: "spent", "wait", "direct", { call }, { refused }, or null. */
function expected(value) {
  if (value === null || typeof value === "string") return value;
  if ("call" in value) return { call: value.call };
  if ("refused" in value) return { refused: value.refused };
  throw new Error(`an expected decision: ${JSON.stringify(value)}`);
}

test("fixtures/leases.json has cases", () => assert.ok(FIXTURE.cases.length > 0));

for (const testCase of FIXTURE.cases) {
  test(`fixtures/leases.json: ${testCase.about}`, () => {
    const lease = new Lease(Number(testCase.rate), Number(testCase.burst), 0);
    testCase.steps.forEach((step, index) => {
      const now = micros(step.at_ms);
      const at = `step ${index}`;
      if ("admit" in step) {
        assert.deepEqual(lease.admit(now, Number(step.admit)), expected(step.expect), at);
      } else if ("admit_again" in step) {
        assert.deepEqual(lease.admitAgain(now, Number(step.admit_again)), expected(step.expect), at);
      } else if ("answered" in step) {
        const [granted, , retryAfterMs, resetAfterMs] = step.answered;
        const decision = lease.answered(micros(step.sent_ms), now, granted, retryAfterMs, resetAfterMs);
        assert.deepEqual(decision, expected(step.expect), at);
      } else if ("observed" in step) {
        const [allowed, , retryAfterMs, resetAfterMs] = step.observed;
        lease.observed(micros(step.sent_ms), now, allowed === 1, retryAfterMs, resetAfterMs);
      } else if ("failed" in step) {
        lease.failed();
      } else if ("dropped" in step) {
        lease.dropped();
      } else if ("spendable" in step) {
        const spendable = lease.spendable(now);
        assert.ok(Math.abs(spendable - Number(step.spendable)) < 1e-9, `${at}: ${spendable}`);
      } else if ("refund_due" in step) {
        assert.equal(lease.refundDue(now), step.refund_due, at);
      } else if ("give_back" in step) {
        const amount = lease.giveBack(now, step.give_back);
        assert.ok(Math.abs(amount - Number(step.expect)) < 1e-9, `${at}: ${amount}`);
      } else {
        throw new Error(`${at}: an unknown step ${JSON.stringify(step)}`);
      }
    });
  });
}
