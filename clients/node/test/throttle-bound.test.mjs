// TbClient.throttle through its fallback (a server without the module: the function library, or the script on
// Redis 6.2) keeps the GCRA bound at every rate the arguments allow. Random limits up to 10^9 a second take calls in
// tight loops (many at one instant) and at random sub-millisecond gaps on a controlled server clock, with now and
// then a few idle milliseconds so that keys expire as Redis expires them; over every window between two allowed
// calls, the requests allowed never exceed L + t / T (L = max_burst + 1, T = period / count_per_period truncated to
// the ns, so at least rate * t).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Redis } from "ioredis";

import { TbClient } from "../src/index.mjs";
import { Clock, CLOCK_2030_US, clockPreload } from "./clock.mjs";
import { Server } from "./harness.mjs";

const START_US = CLOCK_2030_US + 123_456n; // 2030-01-01 00:00:00.123456 UTC
const LIMITS = 16;
const CALLS = 300;

/** mulberry32: a small seeded generator, so that a failing seed replays. */
function generator(seed) {
  let state = seed >>> 0;
  const next = () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (low, high) => low + Math.floor(next() * (high - low + 1));
  return { next, int };
}

/** maxBurst, countPerPeriod, period: half where a key's state lasts under a few ms (maxBurst 0-3, 1,000 to 10^6 a
 * second), the others anywhere (maxBurst 0-19, over every order of magnitude up to 10^9 a second). */
function randomLimit(rng) {
  const period = rng.int(1, 3);
  const [maxBurst, magnitude] = rng.next() < 0.5 ? [rng.int(0, 3), rng.int(3, 6)] : [rng.int(0, 19), rng.int(0, 9)];
  return [maxBurst, Math.min(rng.int(1, 9) * 10 ** magnitude, 1e9 * period), period];
}

/** µs: none (a tight loop), up to the interval (capped at 1 ms), under a millisecond, now and then a few ms. */
function gapUs(rng, intervalNs) {
  const pick = rng.next();
  if (pick < 0.3) return 0;
  if (pick < 0.7) return rng.int(1, Math.max(1, Math.floor(Math.min(intervalNs, 1e6) / 1000)));
  if (pick < 0.9) return rng.int(1, 1000);
  return rng.int(1000, 5000);
}

let clock;
let server;
let conn;
let skip;

before(async () => {
  const preload = await clockPreload();
  if (preload === undefined) {
    skip = "no controlled clock (tests/clock/build.sh needs gcc and libfaketime)";
    return;
  }
  clock = new Clock(START_US);
  server = await Server.start({ module: false, args: ["--jemalloc-bg-thread", "no"], env: clock.env(preload) });
  conn = new Redis({ port: server.port, host: "127.0.0.1" });
  await conn.set("probe", "1", "PX", 1000);
  // Valkey's TIME may run up to 1 ms off the controlled clock (tests/clock/README.md): the script's instants would
  // not be the ones the windows are counted over.
  if ((await conn.pttl("probe")) !== 1000 || (await conn.info("server")).includes("valkey_version")) {
    skip = "this server's clock does not stand at the controlled instant";
  }
});

after(async () => {
  conn?.disconnect();
  await server?.stop();
  clock?.remove();
});

test("throttle keeps the bound at any rate through the fallback", async (t) => {
  if (skip) return t.skip(skip);
  const tb = new TbClient(conn);
  const rng = generator(0xb00d);
  let nowUs = 0; // µs after START_US
  for (let round = 0; round < LIMITS; round++) {
    const [maxBurst, count, period] = randomLimit(rng);
    const key = `bound:${round}`;
    const interval = Math.floor((period * 1e9) / count);
    const tolerance = (maxBurst + 1) * interval;
    const allowed = [];
    for (let call = 0; call < CALLS; call++) {
      nowUs += gapUs(rng, interval);
      clock.setUs(START_US + BigInt(nowUs));
      const quantity = rng.next() < 0.8 ? 1 : rng.next() < 0.5 ? 0 : rng.int(2, 3);
      const reply = await tb.throttle(key, maxBurst, count, period, quantity);
      if (!reply.limited) allowed.push([nowUs * 1000, quantity]);
    }
    for (let first = 0; first < allowed.length; first++) {
      let taken = 0;
      for (let i = first; i < allowed.length; i++) {
        taken += allowed[i][1];
        const window = allowed[i][0] - allowed[first][0];
        assert.ok(
          taken * interval <= tolerance + window,
          `CL.THROTTLE ${key} ${maxBurst} ${count} ${period}: ${taken} allowed in ${window} ns, more than ${maxBurst + 1} + t / ${interval} ns`,
        );
      }
    }
    nowUs += 10_000_000;
  }
  assert.notEqual(tb.backendInUse, "module");
});
