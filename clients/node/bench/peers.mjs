// `make bench-middleware`: redis-tb's Express middleware beside the libraries it replaces, one Express 5 app per
// variant, each in its own process, all against one spawned redis-server with the module:
//   bare, redis-tb (rateLimit, module backend), express-rate-limit + rate-limit-redis, rate-limiter-flexible's
//   RateLimiterRedis as middleware.
// Every limit is far above the load (every request allowed). Two keyings: the peer address (one identity) and an
// x-user header cycling 1,000 identities (wrk with a Lua script). ROUNDS interleaved rounds; in each round every
// variant gets SECONDS of wrk (CONNECTIONS connections, 1 thread), after a short warm-up. Per variant and round:
// requests/s, its ratio to the bare app of the same round, the app's own CPU µs per request (process.cpuUsage
// over the measured window / requests served) and Redis's CPU µs per request (INFO cpu, used_cpu_user +
// used_cpu_sys, over the same window). The table shows the median of the rounds and the min-max spread; the last
// lines say where redis-tb stands against each peer. With two CPUs or more (and taskset), the app runs alone on
// CPU 1 and wrk and Redis share CPU 0: unpinned, the three moved between two cores and each app's CPU per request
// spread across rounds by more than the differences measured.
//   REDIS_SERVER=/usr/bin/redis-server TB_MODULE=$PWD/target/release/libredis_tb.so node clients/node/bench/peers.mjs
import { execFileSync, spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { rawCommand, Server, SERVER } from "../test/harness.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROUNDS = Number(process.env.BENCH_ROUNDS || 5);
const SECONDS = Number(process.env.BENCH_SECONDS || 5);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS || 10);
const WRK = process.env.WRK || "/usr/bin/wrk";
const VARIANTS = ["bare", "redis-tb", "express-rate-limit", "rate-limiter-flexible"];
const KEYINGS = (process.env.BENCH_KEYINGS || "peer,header").split(",");
// Pinned only where both CPUs can be used (a container may be given fewer than os.cpus() lists).
const PINNED = os.cpus().length >= 2 && [0, 1].every((cpu) => spawnSync("taskset", ["-c", String(cpu), "true"]).status === 0);
/** `command` and its arguments, to run on `cpu` alone when PINNED. */
const on = (cpu, command, args) => (PINNED ? ["taskset", ["-c", String(cpu), command, ...args]] : [command, args]);

// wrk's script: an x-user header cycling 1,000 identities.
const script = path.join(os.tmpdir(), `peers-${process.pid}.lua`);
fs.writeFileSync(
  script,
  'local i = 0\nrequest = function()\n  i = (i + 1) % 1000\n  return wrk.format("GET", "/", { ["x-user"] = "user-" .. i })\nend\n',
);

function ask(child, message, field) {
  return new Promise((resolve) => {
    const listener = (reply) => {
      if (reply[field] !== undefined) {
        child.off("message", listener);
        resolve(reply);
      }
    };
    child.on("message", listener);
    child.send(message);
  });
}

function wrk(url, seconds, keying) {
  const args = ["-t1", `-c${CONNECTIONS}`, `-d${seconds}s`, "--latency"];
  if (keying === "header") args.push("-s", script);
  return new Promise((resolve, reject) => {
    const child = spawn(...on(0, WRK, [...args, url]), { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (chunk) => (out += chunk));
    child.on("error", reject);
    child.on("exit", () => {
      const requests = Number(out.match(/(\d+) requests in/)?.[1] ?? 0);
      const non2xx = Number(out.match(/Non-2xx or 3xx responses: (\d+)/)?.[1] ?? 0);
      resolve({ requests, non2xx });
    });
  });
}

async function redisCpuUs(port) {
  const info = await rawCommand(port, "INFO cpu");
  const field = (name) => Number(String(info).match(new RegExp(`${name}:([\\d.]+)`))?.[1] ?? 0);
  return (field("used_cpu_user") + field("used_cpu_sys")) * 1e6;
}

async function round(variant, keying, redisPort) {
  const child = spawn(...on(1, process.execPath, [path.join(HERE, "peer-app.mjs")]), {
    env: { ...process.env, VARIANT: variant, KEYING: keying, REDIS_PORT: String(redisPort) },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  const { port } = await new Promise((resolve) => child.once("message", resolve));
  const url = `http://127.0.0.1:${port}/`;
  try {
    await wrk(url, 2, keying); // warm-up: JIT, connections, the script cache
    const before = await ask(child, "stats", "served");
    const redisBefore = await redisCpuUs(redisPort);
    const started = process.hrtime.bigint();
    const { non2xx } = await wrk(url, SECONDS, keying);
    const elapsedS = Number(process.hrtime.bigint() - started) / 1e9;
    const redisAfter = await redisCpuUs(redisPort);
    const after = await ask(child, "stats", "served");
    const served = after.served - before.served;
    if (non2xx > 0) throw new Error(`${variant}/${keying}: ${non2xx} responses were not 2xx`);
    return {
      rps: served / elapsedS,
      appUs: (after.cpuUs - before.cpuUs) / served,
      redisUs: variant === "bare" ? 0 : (redisAfter - redisBefore) / served,
    };
  } finally {
    child.send("exit");
    await new Promise((resolve) => child.once("exit", resolve));
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const spread = (xs, digits) => `${Math.min(...xs).toFixed(digits)}-${Math.max(...xs).toFixed(digits)}`;

const server = await Server.start();
if (PINNED) execFileSync("taskset", ["-a", "-p", "-c", "0", String(server.child.pid)], { stdio: "ignore" });
const lines = [];
try {
  const version = execFileSync(SERVER, ["--version"], { encoding: "utf8" }).split(" ").slice(0, 3).join(" ");
  lines.push(`Node ${process.version}, ${version}, ${os.cpus().length} vCPU ${os.cpus()[0].model.trim()}`);
  lines.push(
    `wrk -t1 -c${CONNECTIONS}, ${SECONDS} s per variant, ${ROUNDS} interleaved rounds, every request allowed, ` +
      `${PINNED ? "the app on CPU 1, wrk and Redis on CPU 0" : "unpinned"}; ` +
      `${new Date().toISOString().slice(0, 16)} UTC`,
  );
  for (const keying of KEYINGS) {
    const results = Object.fromEntries(VARIANTS.map((v) => [v, []]));
    for (let r = 0; r < ROUNDS; r += 1) {
      // A different order each round, so that no variant always runs first or last.
      const order = VARIANTS.map((_, i) => VARIANTS[(i + r) % VARIANTS.length]);
      const got = {};
      for (const variant of order) got[variant] = await round(variant, keying, server.port);
      for (const variant of VARIANTS) results[variant].push({ ...got[variant], ratio: got[variant].rps / got.bare.rps });
      process.stderr.write(`${keying} round ${r + 1}/${ROUNDS} done\n`);
    }
    const label = keying === "header" ? "key = x-user header, 1,000 identities" : "key = peer address";
    lines.push("");
    lines.push(`| ${label} | requests/s | x bare (spread) | app CPU µs/request (spread) | Redis CPU µs/request (spread) |`);
    lines.push("|---|--:|--:|--:|--:|");
    const summary = {};
    for (const variant of VARIANTS) {
      const rs = results[variant];
      const pick = (f) => rs.map((x) => x[f]);
      summary[variant] = { rps: median(pick("rps")), ratio: median(pick("ratio")), appUs: median(pick("appUs")), redisUs: median(pick("redisUs")) };
      const s = summary[variant];
      lines.push(
        `| ${variant} | ${s.rps.toFixed(0)} | ${s.ratio.toFixed(2)} (${spread(pick("ratio"), 2)}) | ` +
          `${s.appUs.toFixed(1)} (${spread(pick("appUs"), 1)}) | ` +
          (variant === "bare" ? "— |" : `${s.redisUs.toFixed(1)} (${spread(pick("redisUs"), 1)}) |`),
      );
    }
    const ours = summary["redis-tb"];
    lines.push("");
    for (const peer of ["express-rate-limit", "rate-limiter-flexible"]) {
      const p = summary[peer];
      const through = ours.ratio / p.ratio - 1;
      const cpu = ours.appUs / p.appUs - 1;
      lines.push(
        `- against ${peer} (${label}): throughput ${through >= 0 ? "ahead" : "behind"} by ${Math.abs(through * 100).toFixed(1)}%, ` +
          `app CPU per request ${cpu <= 0 ? "lower" : "higher"} by ${Math.abs(cpu * 100).toFixed(1)}%, ` +
          `Redis CPU per request ${ours.redisUs / p.redisUs <= 1 ? "lower" : "higher"} by ` +
          `${Math.abs((ours.redisUs / p.redisUs - 1) * 100).toFixed(1)}%`,
      );
    }
  }
} finally {
  await server.stop();
  fs.rmSync(script, { force: true });
}
console.log(lines.join("\n"));
