// The package's two backends against each other, as the Python package's differential test does: the same random
// sequences of calls at the same frozen instants, on a server with the module (the command) and one without it
// (the shared lua/tb.lua, called with the keys and arguments this package's script backend derives from the
// command's own arguments), must give identical replies (errors included), identical hashes (CL.THROTTLE's strings)
// and identical expiries.
// Both servers run under one controlled clock (tests/clock/). The script runs in each of its forms, each on its own
// keys of one server: EVALSHA, and where the server has FUNCTION the library generated from the same file (FCALL),
// each on the server's clock (TIME) and on the caller's (`@<µs>`, the frozen instant; there the clock never steps
// back: the module rebases a bucket on a step back, the caller's clock stands still). Valkey's clock in a script
// cannot see the frozen instant: the comparison is skipped there.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Redis } from "ioredis";

import script from "../src/script.cjs";
import { Clock, CLOCK_2030_US, clockPreload } from "./clock.mjs";
import { Server } from "./harness.mjs";

const SEEDS = 8;
const STEPS = 250;
const KEYS = ["a", "b", "c", "d"];
// CL.THROTTLE's keys (strings); now and then it is sent a bucket's key, and refused with WRONGTYPE.
const THROTTLE_KEYS = ["t", "u"];
const RATES = ["10", "0.5", "1000", "3.3", "7e-1", "25", "0.001", "123456.789"];
const BURSTS = ["20", "1", "5.5", "100", "2", "0.5", "1e3", "33.3"];
const COSTS = ["1", "0", "2.5", "0.1", "5", "20", "1e-3", "7", "100"];
// TB.LOWER's floors: above and below a bucket's tokens, in debt, and (with a slow rate) beyond a day of debt.
const FLOORS = ["0", "1", "2.5", "-3", "100", "0.5", "-0.001", "1e3", "-250"];
const BAD_NUMBERS = ["abc", "0", "-1", "inf", "nan", "1e400", "0x10", " 1", "1 ", "", "-0", "+2.5e-3", ".5", "5.", "1E2"];
// CL.THROTTLE's largest reply, i64::MAX (an interval under 1 µs makes `remaining` saturate), as the script sends it:
// the largest double below 2^63 (documented in lua/tb.lua). Integer replies are read as strings (stringNumbers),
// exact where a JavaScript number is not.
const I64_MAX = "9223372036854775807";
const I64_MAX_FROM_SCRIPT = "9223372036854774784";
// Any name will do for the test; the packages name it after their version (lua/tb.lua's header).
const LIBRARY = "tb_test";
const librarySource = (name) => `#!lua name=${name}\nlocal TB_LIBRARY = '${name}'\n${script.source()}`;

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
  const pick = (list) => list[int(0, list.length - 1)];
  return { next, int, pick };
}

function randomCall(rng, commands, params, keyOf) {
  const name = rng.pick(commands);
  const number = (choices) => (rng.next() < 0.03 ? rng.pick(BAD_NUMBERS) : rng.pick(choices));
  const bucket = (key) => {
    if (rng.next() < 0.1) params[key] = [rng.pick(RATES), rng.pick(BURSTS)];
    if (rng.next() < 0.03) return [number(RATES), number(BURSTS)];
    return params[key];
  };
  if (name === "TB.ACQUIREALL" || name === "TB.ACQUIREEACH") {
    const keys = [...KEYS].sort(() => rng.next() - 0.5).slice(0, rng.int(1, 3));
    if (rng.next() < 0.02) keys.push(keys[0]);
    const args = name === "TB.ACQUIREALL" ? [number(COSTS)] : [];
    for (const key of keys) {
      if (name === "TB.ACQUIREALL") args.push(keyOf(key), ...bucket(key));
      else args.push(keyOf(key), ...bucket(key), number(COSTS));
    }
    return [name, args];
  }
  if (name === "CL.THROTTLE") {
    const key = rng.next() < 0.95 ? rng.pick(THROTTLE_KEYS) : rng.pick(KEYS);
    const args = [rng.pick(["0", "1", "4", "10", "100"]), rng.pick(["1", "3", "10", "1000", "1000000000"]), rng.pick(["1", "7", "60", "3600"])];
    if (rng.next() < 0.03) args[rng.int(0, 2)] = rng.pick(["-1", "0", "x", "9223372036854775807", "1.5"]);
    if (rng.next() < 0.7) args.push(rng.pick(["0", "1", "2", "5", "20", "-1"]));
    return [name, [keyOf(key), ...args]];
  }
  const key = rng.pick(KEYS);
  const args = [keyOf(key), ...bucket(key)];
  if (name === "TB.ACQUIRE") {
    if (rng.next() < 0.8) args.push(number(COSTS));
  } else if (name === "TB.ACQUIREATMOST") {
    args.push(rng.pick(["1", "2", "5", "100", "0", "9007199254740993", "1.5"]));
  } else if (name === "TB.RESERVE") {
    args.push(number(COSTS), rng.next() < 0.95 ? rng.pick(["0", "100", "1000", "5000", "86400000"]) : rng.pick(["-1", "86400001", "5.5", "x"]));
  } else if (name === "TB.REFUND" || name === "TB.CHARGE") {
    args.push(number(COSTS));
  } else if (name === "TB.LOWER") {
    args.push(rng.next() < 0.97 ? rng.pick(FLOORS) : rng.pick(["x", "inf", "nan", "", "-1e12"]));
  } else if (name === "TB.BLOCK") {
    args.push(rng.pick(["1", "250", "5000", "0", "86400001"]));
  }
  return [name, args];
}

/** Mostly small steps, sometimes millisecond edges, now and then long enough to expire keys, or a step back. */
function advanceUs(rng) {
  const roll = rng.next();
  if (roll < 0.04) return -BigInt(rng.pick([1, 1000, rng.int(1, 5_000_000), 3_600_000_000]));
  if (roll < 0.15) return BigInt(rng.pick([0, 1, 999, 1000, 1001]));
  if (roll < 0.85) return BigInt(rng.int(1, 200_000));
  if (roll < 0.97) return BigInt(rng.int(1, 5_000_000));
  return BigInt(rng.int(1, 300_000_000));
}

async function outcome(promise) {
  try {
    return await promise;
  } catch (error) {
    return ["error", error.message];
  }
}

/** The library's function for `command`, as the package names it (script.functionName) in the test's library. */
const functionName = (command) => LIBRARY + script.functionName(command).slice(script.libraryName().length);

/** Whether the server knows `name`: called bare, a known command is refused for its arity. */
async function commandKnown(conn, name) {
  const reply = await outcome(conn.call(name));
  return !(reply[0] === "error" && reply[1].toLowerCase().includes("unknown command"));
}

/**
 * Each key's hash (a CL.THROTTLE key's string) and expiry (PEXPIRETIME, or PTTL on Redis 6.2: exact under a frozen
 * clock), in two round trips (the types, then the values). A key whose expiry is the clock's own millisecond counts as
 * gone: Redis reads it as live until that millisecond ends, but its background expiry cycle deletes it within that
 * millisecond when it samples it, so whether it is still there depends on when the cycle ran.
 */
async function snapshot(conn, prefix, keyOf, exact, nowMs) {
  const keys = [...KEYS, ...THROTTLE_KEYS].map((key) => prefix + keyOf(key));
  const kinds = conn.pipeline();
  for (const key of keys) kinds.type(key);
  const types = (await kinds.exec()).map(([error, reply]) => error?.message ?? reply);
  const pipeline = conn.pipeline();
  keys.forEach((key, i) => {
    if (types[i] === "string") pipeline.get(key);
    else pipeline.hgetall(key);
    if (exact) pipeline.call("PEXPIRETIME", key);
    else pipeline.pttl(key);
  });
  const replies = (await pipeline.exec()).map(([error, reply]) => error?.message ?? reply);
  const state = [];
  for (let i = 0; i < replies.length; i += 2) {
    const missing = replies[i] === null || (typeof replies[i] === "object" && Object.keys(replies[i]).length === 0);
    const expiry = replies[i + 1];
    const atItsEnd = exact ? expiry >= 0 && BigInt(expiry) <= nowMs : Number(expiry) === 0;
    state.push(missing || atItsEnd ? [null, -2] : [replies[i], expiry]);
  }
  return state;
}

describe("module and script backends agree", () => {
  let clock;
  let servers = [];
  let moduleConn;
  let scriptConn;
  let skip;
  let forms;
  let commands;
  before(async () => {
    const preload = await clockPreload();
    if (preload === undefined) {
      skip = "no controlled clock (tests/clock/build.sh needs gcc and libfaketime)";
      return;
    }
    clock = new Clock(CLOCK_2030_US);
    const options = { args: ["--jemalloc-bg-thread", "no"], env: clock.env(preload) };
    servers = [await Server.start({ ...options, module: true }), await Server.start({ ...options, module: false })];
    moduleConn = new Redis({ port: servers[0].port, host: "127.0.0.1", stringNumbers: true });
    scriptConn = new Redis({ port: servers[1].port, host: "127.0.0.1", stringNumbers: true });
    await moduleConn.call("TB.ACQUIRE", "probe", "1", "1");
    const info = await scriptConn.info("server");
    if ((await moduleConn.hget("probe", "ts")) !== String(CLOCK_2030_US)) skip = "the module does not follow the controlled clock here";
    // Valkey's clock in a script is not exact under the controlled clock (tests/clock/README.md), and on the
    // caller's clock the script sets expiries relative to it (PEXPIRE).
    else if (info.includes("valkey_version")) skip = "Valkey's TIME is not exact under the controlled clock (tests/clock/README.md)";
    forms = ["eval", "eval@"];
    if ((await outcome(scriptConn.call("FUNCTION", "LIST")))[0] !== "error") {
      await scriptConn.call("FUNCTION", "LOAD", "REPLACE", librarySource(LIBRARY));
      forms.push("fcall", "fcall@");
    }
    await moduleConn.del("probe");
    commands = [];
    for (const command of script.commands()) if (await commandKnown(moduleConn, command)) commands.push(command);
  });
  after(async () => {
    moduleConn?.disconnect();
    scriptConn?.disconnect();
    await Promise.all(servers.map((server) => server.stop()));
    clock?.remove();
  });

  for (let seed = 0; seed < SEEDS; seed++) {
    for (const callerClock of [false, true]) {
      test(`seed ${seed}, ${callerClock ? "caller" : "server"} clock: identical replies, hashes and expiries`, async (t) => {
        if (skip) return t.skip(skip);
        const formsHere = forms.filter((form) => form.endsWith("@") === callerClock);
        const rng = generator(seed);
        const sha = await scriptConn.script("LOAD", script.source());
        const exact = Number((await scriptConn.info("server")).match(/redis_version:(\d+)/)[1]) >= 7;
        const keyOf = (key) => `{d${seed}${callerClock ? "c" : ""}}:${key}`;
        const params = Object.fromEntries(KEYS.map((key) => [key, [rng.pick(RATES), rng.pick(BURSTS)]]));
        // Every seed and clock starts on its own day, far from the others' buckets (and has its own keys).
        let nowUs = CLOCK_2030_US + BigInt(seed) * 10n ** 12n + (callerClock ? 10n ** 11n : 0n);
        for (let step = 0; step < STEPS; step++) {
          const stepUs = advanceUs(rng);
          // The module rebases a bucket on a step back; on the caller's clock the bucket's time stands still.
          nowUs += callerClock && stepUs < 0n ? 0n : stepUs;
          clock.setUs(nowUs);
          const [name, args] = randomCall(rng, commands, params, keyOf);
          const { keys, argv } = script.arguments(name, args);
          let fromModule = await outcome(moduleConn.call(name, ...args));
          if (name === "CL.THROTTLE" && fromModule[0] !== "error") {
            fromModule = fromModule.map((value) => (value === I64_MAX ? I64_MAX_FROM_SCRIPT : value));
          }
          const moduleState = await snapshot(moduleConn, "", keyOf, exact, nowUs / 1000n);
          for (const form of formsHere) {
            // Each form on its own keys, in the same slot: the form's name before the hash tag.
            const formKeys = keys.map((key) => form + key);
            const clockArg = form.endsWith("@") ? [`@${nowUs}`] : [];
            const fromForm = form.startsWith("eval")
              ? await outcome(scriptConn.evalsha(sha, keys.length, ...formKeys, ...clockArg, ...argv))
              : await outcome(scriptConn.call("FCALL", functionName(name), keys.length, ...formKeys, ...clockArg, ...argv.slice(1)));
            const context = `${form}: seed ${seed} step ${step} at ${nowUs}: ${name} ${JSON.stringify(args)}`;
            assert.deepEqual(fromForm, fromModule, context);
            assert.deepEqual(await snapshot(scriptConn, form, keyOf, exact, nowUs / 1000n), moduleState, context);
          }
        }
      });
    }
  }
});
