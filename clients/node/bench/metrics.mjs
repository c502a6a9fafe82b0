// What the middleware's metrics and shadow mode add to its own time per request (docs/operating.md, "Watching the
// middleware"). The limiter of the Express middleware (`rateLimit(...).limiter.check(req)`), one request after the
// other, with one never-refusing limit, in four cases:
//   bare          metrics: false
//   metrics       metrics into a Registry (what an app with prom-client installed gets by default)
//   shadow        metrics, and the limit in shadow mode (shadow: true: one call, as when enforced)
//   shadow-limit  metrics, and a second, shadow limit beside the enforced one (a second call, by design)
// and, with BENCH_BASELINE=<another checkout>/clients/node/src/index.mjs, the bare case on that code ("baseline":
// the code before a change). Two measures:
//   1. The middleware's own work, without the network: a Redis client whose every call answers at once with an
//      allowing TB.ACQUIRE reply (no deadline lane), so each check is the package's code alone (key, bucket, call,
//      decision, headers, metrics). Instructions per check counted by valgrind's callgrind (node --predictable,
//      after 20,000 checks of warm-up; other work on the machine barely changes them, though runs of a
//      JIT-compiled process still differ by a few percent), and nanoseconds per check (the fastest of ROUNDS interleaved rounds, the figure least
//      disturbed by other work).
//   2. On a spawned redis-server with the module: microseconds per check, wall clock, median of ROUNDS interleaved
//      rounds (the loopback round trip included, and on a busy machine the wait for a core).
//   REDIS_SERVER=/usr/bin/redis-server TB_MODULE=$PWD/target/release/libredis_tb.so node clients/node/bench/metrics.mjs
import { execFileSync, spawnSync } from "node:child_process";
import os from "node:os";
import { fileURLToPath } from "node:url";

import { Redis } from "ioredis";
import { Registry } from "prom-client";

const HERE = fileURLToPath(import.meta.url);
const ROUNDS = Number(process.env.BENCH_ROUNDS || 9);
const CASES = ["bare", "metrics", "shadow", "shadow-limit"];
const unlimited = { name: "api", rate: 1e9, burst: 1e9 };

/** The limiter of case `name` over `redis`, from the package at `source` (default: this checkout's). */
async function limiterOf(name, redis, source) {
  const tb = await import(source ?? "../src/index.mjs");
  const client = new tb.TbClient(redis, { backend: "module" });
  const options = {
    bare: { metrics: false },
    metrics: { metrics: new Registry() },
    shadow: { shadow: true, metrics: new Registry() },
    "shadow-limit": { limits: [unlimited, { ...unlimited, name: "tried", shadow: true }], metrics: new Registry() },
  }[name];
  return tb.rateLimit({ client, limits: unlimited, key: () => `bench-${name}`, ...options }).limiter;
}

/**
 * A Redis client (as ioredis looks) whose every call answers at once: PING's PONG, TB.ACQUIRE's and TB.ACQUIREEACH's
 * allowing replies. Its duplicate, the connection the middleware's deadline lane opens of its own, is another.
 */
function answeringAtOnce() {
  const client = {
    status: "ready",
    call: (command, ...args) => {
      if (command === "PING") return Promise.resolve("PONG");
      return Promise.resolve(command === "TB.ACQUIRE" ? [1, 1e9, 0, 0] : [1, 0, ...Array.from({ length: args.length / 4 }, () => [1, 1e9, 0, 0])]);
    },
    sendCommand() {},
    duplicate: () => answeringAtOnce(),
    connect: () => Promise.resolve(),
    on: () => client,
    once: () => client,
  };
  return client;
}

async function checks(limiter, count) {
  for (let i = 0; i < count; i++) {
    const outcome = await limiter.check({});
    if (outcome.action !== "allow" || outcome.error !== undefined) throw new Error(`a check was not allowed by Redis: ${outcome.error}`);
  }
}

const cases = CASES.map((name) => ({ label: name, name, source: undefined }));
if (process.env.BENCH_BASELINE) cases.unshift({ label: "baseline", name: "bare", source: process.env.BENCH_BASELINE });

if (process.env.BENCH_CHILD) {
  // Under callgrind: warm up, switch instrumentation on (vgdb interrupts this synchronous call to deliver it), run
  // the checks, exit. The count covers the checks and the exit.
  const limiter = await limiterOf(process.env.BENCH_CHILD, answeringAtOnce(), process.env.BENCH_SOURCE || undefined);
  await checks(limiter, 20_000);
  execFileSync("callgrind_control", ["--instr=on", String(process.pid)]);
  await checks(limiter, Number(process.env.BENCH_CHECKS));
  process.exit(0);
}

/** The instructions callgrind counts for `count` checks of `entry` (and what a run counts besides them). */
function counted(entry, count) {
  const env = { ...process.env, BENCH_CHILD: entry.name, BENCH_SOURCE: entry.source ?? "", BENCH_CHECKS: String(count) };
  const args = ["--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null", process.execPath, "--predictable", HERE];
  const { stderr, status } = spawnSync("valgrind", args, { env, encoding: "utf8" });
  const collected = stderr.match(/Collected : (\d+)/);
  if (status !== 0 || collected === null) throw new Error(`callgrind failed:\n${stderr}`);
  return Number(collected[1]);
}

/**
 * Instructions per check of each entry: what a run of 12,000 checks counts, less what a run counts besides its
 * checks (the bare case's 12,000 checks less its 2,000, each run once).
 */
function instructionsPerCheck(entries) {
  const bare = entries.find((entry) => entry.label === "bare");
  const bareLong = counted(bare, 12_000);
  const perCheck = (bareLong - counted(bare, 2_000)) / 10_000;
  const besides = bareLong - 12_000 * perCheck;
  for (const entry of entries) entry.instructions = ((entry === bare ? bareLong : counted(entry, 12_000)) - besides) / 12_000;
}

const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
const percent = (value, base) => `${value >= base ? "+" : ""}${(((value - base) / base) * 100).toFixed(1)}%`;
const lines = [`Node ${process.version}, ${os.cpus().length} vCPU; ${new Date().toISOString().slice(0, 16)} UTC`, ""];

// 1. The middleware's own work.
const hasCallgrind = spawnSync("valgrind", ["--version"]).status === 0;
const fake = [];
for (const entry of cases) fake.push({ ...entry, limiter: await limiterOf(entry.name, answeringAtOnce(), entry.source), ns: [] });
for (const entry of fake) await checks(entry.limiter, 20_000);
for (let round = 0; round < ROUNDS; round++) {
  for (const entry of fake) {
    const started = process.hrtime.bigint();
    await checks(entry.limiter, 20_000);
    entry.ns.push(Number(process.hrtime.bigint() - started) / 20_000);
  }
}
if (hasCallgrind) instructionsPerCheck(fake);
for (const entry of fake) {
  console.error(`${entry.label}: ${entry.instructions?.toFixed(0) ?? "-"} instructions, ${Math.min(...entry.ns).toFixed(0)} ns per check`);
}
const bareFake = fake.find((entry) => entry.label === "bare");
lines.push("| the middleware's own work (Redis answering at once) | instructions / check | vs bare | ns / check, fastest round | vs bare |");
lines.push("|---|--:|--:|--:|--:|");
for (const entry of fake) {
  const ns = Math.min(...entry.ns);
  const bareNs = Math.min(...bareFake.ns);
  const counted = entry.instructions === undefined ? ["-", "-"] : [entry.instructions.toFixed(0), percent(entry.instructions, bareFake.instructions)];
  lines.push(`| ${entry.label} | ${counted[0]} | ${counted[1]} | ${ns.toFixed(0)} | ${percent(ns, bareNs)} |`);
}

// 2. On a real server.
const { Server } = await import("../test/harness.mjs");
const server = await Server.start();
const redis = new Redis({ host: "127.0.0.1", port: server.port });
try {
  const real = [];
  for (const entry of cases) real.push({ ...entry, limiter: await limiterOf(entry.name, redis, entry.source), us: [] });
  for (const entry of real) await checks(entry.limiter, 1000);
  for (let round = 0; round < ROUNDS; round++) {
    for (const entry of real) {
      const started = performance.now();
      await checks(entry.limiter, 2000);
      entry.us.push(((performance.now() - started) * 1000) / 2000);
    }
  }
  const bareUs = median(real.find((entry) => entry.label === "bare").us);
  lines.push("");
  lines.push("| on redis-server with the module | µs / check, median round | vs bare |");
  lines.push("|---|--:|--:|");
  for (const entry of real) lines.push(`| ${entry.label} | ${median(entry.us).toFixed(1)} | ${percent(median(entry.us), bareUs)} |`);
} finally {
  redis.disconnect();
  await server.stop();
}
lines.push("");
lines.push(`${ROUNDS} rounds; load average (1 min) at the end: ${os.loadavg()[0].toFixed(1)} on ${os.cpus().length} vCPU`);
console.log(lines.join("\n"));
