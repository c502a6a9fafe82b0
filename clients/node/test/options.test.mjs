// The middleware options every package checks alike (docs/clients.md, "Options"), against the fixture the Python
// and Rust suites read too (fixtures/options.json): each value given to the Express middleware, the Fastify plugin
// and createHttpLimiter, accepted, or refused when built with a TbArgumentError holding the shared message.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";

import Fastify from "fastify";

import { createHttpLimiter, fastifyRateLimit, rateLimit, RateLimiterTB, TbArgumentError, TbStore, TbThrottlerStorage } from "../src/index.mjs";
import { REPOSITORY } from "./harness.mjs";

const { options: OPTIONS } = JSON.parse(fs.readFileSync(path.join(REPOSITORY, "fixtures", "options.json"), "utf8"));
const NON_FINITE = { Infinity: Infinity, "-Infinity": -Infinity, NaN: NaN };
/** A Redis client to build middleware with: never called, since no request is made. */
const UNUSED_CLIENT = { call() {}, sendCommand() {} };
const LIMITS = { name: "api", rate: 1, burst: 1 };

/** The fixture's value, with its stand-ins for the numbers JSON lacks as those numbers where the option takes numbers. */
function valueOf(option, value) {
  return option.numbers && typeof value === "string" && value in NON_FINITE ? NON_FINITE[value] : value;
}

/** Each public way to build the middleware, with `options` (and a client, limits, no metrics). */
const BUILDERS = {
  rateLimit: async (options) => rateLimit({ client: UNUSED_CLIENT, limits: LIMITS, metrics: false, ...options }),
  createHttpLimiter: async (options) => createHttpLimiter({ client: UNUSED_CLIENT, limits: LIMITS, metrics: false, ...options }),
  fastifyRateLimit: async (options) => {
    const app = Fastify();
    try {
      await app.register(fastifyRateLimit, { client: UNUSED_CLIENT, limits: LIMITS, metrics: false, ...options });
      await app.ready();
    } finally {
      await app.close();
    }
  },
};

test("the fixture covers every option the middlewares share", () => {
  assert.deepEqual(
    OPTIONS.map((option) => option.names.node),
    ["localCapacity", "timeoutMs", "prefix", "statusCode", "body"],
  );
});

for (const option of OPTIONS) {
  const name = option.names.node;
  describe(`fixtures/options.json: ${name}`, () => {
    for (const [builder, build] of Object.entries(BUILDERS)) {
      test(`${builder} accepts ${option.accepted.map((value) => JSON.stringify(value)).join(", ")}`, async () => {
        for (const value of option.accepted) await build({ [name]: valueOf(option, value) });
      });

      test(`${builder} refuses each refused value with "${name} ${option.message}"`, async () => {
        for (const value of option.refused) {
          await assert.rejects(
            build({ [name]: valueOf(option, value) }),
            (error) => error instanceof TbArgumentError && error.message.includes(`${name} ${option.message}`),
            `${name}: ${JSON.stringify(value)}`,
          );
        }
      });
    }
  });
}

test("a body function is accepted, and a body JSON cannot hold (a cycle, a BigInt, a Map) is refused", async () => {
  await BUILDERS.rateLimit({ body: (decision) => ({ limit: decision.buckets[0].name }) });
  const cycle = { error: "slow down" };
  cycle.self = cycle;
  for (const body of [cycle, { error: 1n }, new Map([["error", "slow down"]])]) {
    await assert.rejects(BUILDERS.rateLimit({ body }), /body must be a JSON object or a function returning one/);
  }
});

test("a timeout of 0 is no setting without a deadline, in the middleware and in every drop-in", async () => {
  const why = /must be a positive finite number of milliseconds, got 0: every limiter call has a deadline/;
  await assert.rejects(BUILDERS.rateLimit({ timeoutMs: 0 }), why);
  assert.throws(() => new TbStore({ client: UNUSED_CLIENT, timeoutMs: 0 }), why);
  assert.throws(() => new RateLimiterTB({ storeClient: UNUSED_CLIENT, timeoutMs: 0 }), why);
  assert.throws(() => new TbThrottlerStorage({ client: UNUSED_CLIENT, timeoutMs: 0 }), why);
});
