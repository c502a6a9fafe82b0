// `make bench`'s Node part: an Express app under autocannon (a real HTTP load generator), against one spawned
// redis-server with the module.
//   1. Exactness: one key, rate RATE/s, burst BURST, 20 s of load, once through the module and once through the
//      Lua script: the app may serve at most burst + rate * t (t the load's own duration) and should serve close
//      to it.
//   2. Added latency: the same app with no limiter, then with each limiter set never to refuse (one key): the
//      limiter middleware's own time per request (from its start to its next(), measured inside the app with
//      the high-resolution clock) at p50 and p99 with one connection (requests one after the other, so the time
//      is the limiter's, not a queue's), then the app's throughput with 10 connections, for redis-tb on the
//      module, redis-tb on the script, and express-rate-limit with rate-limit-redis on the same server.
// Prints a Markdown table (docs/performance.md keeps the latest) and exits non-zero if the bound was exceeded.
//   REDIS_SERVER=/usr/bin/redis-server TB_MODULE=$PWD/target/release/libredis_tb.so node clients/node/bench/express.mjs
import { fork } from "node:child_process";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

import autocannon from "autocannon";

import { Server, SERVER } from "../test/harness.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BOUND_SECONDS = Number(process.env.BENCH_BOUND_SECONDS || 20);
const LATENCY_SECONDS = Number(process.env.BENCH_LATENCY_SECONDS || 8);
const CONNECTIONS = 10;
const RATE = 100;
const BURST = 200;

function ask(child, message, key) {
  return new Promise((resolve) => {
    const listener = (reply) => {
      if (reply[key] !== undefined) {
        child.off("message", listener);
        resolve(reply);
      }
    };
    child.on("message", listener);
    child.send(message);
  });
}

async function runCase(name, redisPort, seconds, connections = CONNECTIONS) {
  const child = fork(path.join(HERE, "app.mjs"), {
    env: { ...process.env, CASE: name, REDIS_PORT: String(redisPort), RATE: String(RATE), BURST: String(BURST) },
  });
  const { port } = await new Promise((resolve) => child.once("message", resolve));
  const url = `http://127.0.0.1:${port}/`;
  try {
    if (!name.startsWith("bound")) {
      await autocannon({ url, connections, duration: 2 }); // warm-up: JIT, connections, script cache
      await ask(child, "reset", "reset");
    }
    const result = await autocannon({ url, connections, duration: seconds });
    const stats = await ask(child, "stats", "samples");
    const elapsedS = (new Date(result.finish) - new Date(result.start)) / 1000;
    return { name, result, stats, elapsedS };
  } finally {
    child.send("exit");
    await new Promise((resolve) => child.once("exit", resolve));
  }
}

const server = await Server.start();
const lines = [];
let exceeded = false;
try {
  const version = (await import("node:child_process")).execFileSync(SERVER, ["--version"], { encoding: "utf8" }).trim();
  lines.push(`Node ${process.version}, ${version.split(" ").slice(0, 3).join(" ")}, ${os.cpus().length} vCPU ${os.cpus()[0].model.trim()}`);
  lines.push(`autocannon against an Express 5 app in its own process, one key; ${new Date().toISOString().slice(0, 16)} UTC`);
  lines.push("");
  lines.push(`| one key, rate ${RATE}/s, burst ${BURST} | t (s) | served (200) | refused (429) | bound burst + rate * t | served / bound |`);
  lines.push("|---|--:|--:|--:|--:|--:|");
  for (const name of ["bound-module", "bound-script"]) {
    const { stats, elapsedS } = await runCase(name, server.port, BOUND_SECONDS);
    const bound = BURST + RATE * elapsedS;
    if (stats.served > bound) exceeded = true;
    const label = name === "bound-module" ? "redis-tb, module" : "redis-tb, Lua script";
    lines.push(`| ${label} | ${elapsedS.toFixed(2)} | ${stats.served} | ${stats.refused} | ${bound.toFixed(1)} | ${(stats.served / bound).toFixed(4)} |`);
  }
  lines.push("");
  lines.push(`| limiter (never refusing) | middleware p50 µs | middleware p99 µs | req/s, 1 connection | req/s, ${CONNECTIONS} connections |`);
  lines.push("|---|--:|--:|--:|--:|");
  const labels = {
    bare: "none (Express alone)",
    module: "redis-tb, module",
    script: "redis-tb, Lua script",
    "express-rate-limit": "express-rate-limit + rate-limit-redis",
  };
  for (const name of Object.keys(labels)) {
    const sequential = await runCase(name, server.port, LATENCY_SECONDS, 1);
    const concurrent = await runCase(name, server.port, LATENCY_SECONDS, CONNECTIONS);
    const us = (value) => (value === null ? "-" : value.toFixed(0));
    const { p50Us, p99Us } = sequential.stats;
    const rps = (run) => run.result.requests.average.toFixed(0);
    lines.push(`| ${labels[name]} | ${us(p50Us)} | ${us(p99Us)} | ${rps(sequential)} | ${rps(concurrent)} |`);
  }
} finally {
  await server.stop();
}
lines.push("");
lines.push(`load average (1 min) at the end: ${os.loadavg()[0].toFixed(1)} on ${os.cpus().length} vCPU (other work on the machine shows in the p99s)`);
console.log(lines.join("\n"));
if (exceeded) {
  console.error("bench: the app served more than burst + rate * t");
  process.exit(1);
}
