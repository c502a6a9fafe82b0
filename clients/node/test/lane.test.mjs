// The deadline gate's constants and probe schedule against fixtures/deadlines.json, which the Python package and
// the Rust crate read too: Lane (src/lane.cjs) driven on mocked timers, with a probe that always fails.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { mock, test } from "node:test";

import { MAX_IN_FLIGHT, PROBE_DELAYS_MS, STALL_FRACTION, laneFor } from "../src/lane.cjs";
import { REPOSITORY } from "./harness.mjs";

const FIXTURE = JSON.parse(fs.readFileSync(path.join(REPOSITORY, "fixtures", "deadlines.json"), "utf8"));

test("fixtures/deadlines.json: the lane's probe delays, bound of calls in flight and stall fraction", () => {
  assert.deepEqual(PROBE_DELAYS_MS, FIXTURE.probe_delays_ms);
  assert.equal(MAX_IN_FLIGHT, FIXTURE.max_in_flight);
  assert.equal(STALL_FRACTION, FIXTURE.stall_fraction);
});

test("fixtures/deadlines.json: failing probes come after each delay in turn, the last repeating", async () => {
  mock.timers.enable({ apis: ["setTimeout", "setInterval"] });
  try {
    const probes = [];
    let now = 0;
    // A cluster client's lane probes with PING through the application's client (no connection of its own).
    const tb = {
      redis: { on() {} },
      _connection: {
        cluster: true,
        closed: () => false,
        ready: () => true,
        send: () => {
          probes.push(now);
          return Promise.reject(new Error("connect ECONNREFUSED"));
        },
      },
    };
    const lane = laneFor({}, tb, 1000);
    await assert.rejects(lane.run(() => Promise.resolve()));
    const flush = () => new Promise((resolve) => setImmediate(resolve));
    await flush();
    const delays = [...FIXTURE.probe_delays_ms, ...FIXTURE.probe_delays_ms.slice(-1).flatMap((d) => [d, d])];
    for (let step = 0; step < 5000; step += 5) {
      now += 5;
      mock.timers.tick(5);
      await flush();
    }
    lane.close();
    const gaps = probes.slice(1).map((at, index) => at - probes[index]);
    assert.deepEqual(gaps.slice(0, delays.length), delays, `probes at ${probes.join(", ")} ms`);
  } finally {
    mock.timers.reset();
  }
});
