// What a limit accepts (docs/clients.md, "Limits"), against the fixture the Python suite reads too
// (fixtures/limits.json): each case's limits given to the Express middleware and the Fastify plugin's shared
// construction, accepted, or refused when built with a TbArgumentError naming the limit and the field.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";

import { createHttpLimiter, rateLimit, TbArgumentError } from "../src/index.mjs";
import { REPOSITORY } from "./harness.mjs";

const FIXTURE = JSON.parse(fs.readFileSync(path.join(REPOSITORY, "fixtures", "limits.json"), "utf8"));
const NON_FINITE = { Infinity: Infinity, "-Infinity": -Infinity, NaN: NaN };
/** A Redis client to build middleware with: never called, since no request is made. */
const UNUSED_CLIENT = { call() {}, sendCommand() {} };

/** The fixture's limits, with its stand-ins for the numbers JSON lacks as those numbers. */
function limitsOf(item) {
  return item.limits.map((entry) =>
    Object.fromEntries(Object.entries(entry).map(([field, value]) => [field, typeof value === "string" && field !== "name" && value in NON_FINITE ? NON_FINITE[value] : value])),
  );
}

test("fixtures/limits.json: each case accepted, or refused when the middleware is built with an error naming the field", () => {
  for (const item of FIXTURE.cases) {
    const limits = limitsOf(item);
    const build = () => {
      rateLimit({ client: UNUSED_CLIENT, limits });
      createHttpLimiter({ client: UNUSED_CLIENT, limits });
    };
    if (item.refused === null) {
      build();
      continue;
    }
    const where = item.refused.index === null ? "limits" : `limits[${item.refused.index}].${item.refused.field}`;
    assert.throws(build, (error) => error instanceof TbArgumentError && error.message.startsWith(where), item.about);
  }
});
