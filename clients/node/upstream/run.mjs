// Runs the test suites of the libraries the npm package's drop-ins plug into, against the drop-ins: express-rate-limit
// (TbStore), rate-limiter-flexible (RateLimiterTB) and @nestjs/throttler (TbThrottlerStorage). Their suites are not
// on the npm registry, so each runs from a checkout of its repository given on the command line:
//
//   node clients/node/upstream/run.mjs express-rate-limit=<checkout> rate-limiter-flexible=<checkout> \
//     nestjs-throttler=<checkout>
//
// Each checkout is copied under target/upstream/node/ (never modified, never committed), the suite's test tools are
// installed there from npm, one adapter of ours replaces the file that builds its store, limiter or storage, and
// the suite runs against a redis-server with the module (TB_MODULE, REDIS_SERVER as for the package's own tests).
// The failures must be exactly those listed in expected.txt, each with its reason; the exit status says whether
// they were. Without the adapters (ADAPT=0) the libraries' own implementations run in the same environment.
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { Server, REPOSITORY } from "../test/harness.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PACKAGE = path.resolve(HERE, "..");
const WORK = path.join(REPOSITORY, "target", "upstream", "node");
const ADAPT = process.env.ADAPT !== "0";

/** Per suite: the adapter and the file it replaces, the test tools, the edits of its test setup, the command. */
const SUITES = {
  "express-rate-limit": {
    adapter: ["erl-memory-store.ts", "source/memory-store.ts"],
    type: "module",
    tools: [
      "jest@30",
      "ts-jest@29",
      "@jest/globals@30",
      "supertest@7",
      "express@5",
      "typescript@5.9",
      "ratelimit-header-parser@0.1",
      "debug@4",
      "ip-address@10",
      "@types/jest@30",
      "@types/supertest",
      "@types/express@5",
      "@types/node",
      "@types/debug",
      "@express-rate-limit/tsconfig",
    ],
    prepare(dir) {
      // Jest compiles the TypeScript as ES modules (the published tsconfig preset it extends may lag), and its fake
      // timers leave the event loop's own queues real so that Redis replies arrive.
      const tsconfig = JSON.parse(fs.readFileSync(path.join(dir, "tsconfig.json"), "utf8"));
      Object.assign(tsconfig.compilerOptions, { module: "NodeNext", moduleResolution: "NodeNext", isolatedModules: true });
      fs.writeFileSync(path.join(dir, "tsconfig.json"), JSON.stringify(tsconfig));
      const jest = JSON.parse(fs.readFileSync(path.join(dir, "jest.config.json"), "utf8"));
      Object.assign(jest, { collectCoverage: false, fakeTimers: { doNotFake: ["nextTick", "queueMicrotask", "setImmediate"] } });
      fs.writeFileSync(path.join(dir, "jest.config.json"), JSON.stringify(jest));
    },
    run(dir, out) {
      const tests = ["middleware-test.ts", "headers-test.ts", "memory-store-test.ts"].map((name) => `test/library/${name}`);
      const args = ["--testTimeout=4000", "--forceExit", "--json", `--outputFile=${out}`, ...tests];
      spawnSync(path.join(dir, "node_modules/.bin/jest"), args, {
        cwd: dir,
        env: { ...process.env, NODE_OPTIONS: "--experimental-vm-modules" },
        stdio: "ignore",
      });
      return jestResults(out);
    },
  },
  "rate-limiter-flexible": {
    adapter: ["rlf-RateLimiterRedis.cjs", "lib/RateLimiterRedis.js"],
    tools: ["mocha@10", "chai@4", "sinon@17", "ioredis@5", "redis@4"],
    prepare(dir, port) {
      // The suite's Redis is 127.0.0.1:6379: ours is on a port of its own.
      for (const file of ["test/RateLimiterRedis.ioredis.test.js", "test/RedisOptions.js"]) {
        const text = fs.readFileSync(path.join(dir, file), "utf8");
        fs.writeFileSync(path.join(dir, file), text.replaceAll("port: 6379", `port: ${port}`));
      }
    },
    run(dir, out) {
      const tests = ["test/RateLimiterRedis.ioredis.test.js", "test/RateLimiterRedis.redis.test.js"];
      const result = spawnSync(path.join(dir, "node_modules/.bin/mocha"), ["--exit", "--reporter", "json", ...tests], {
        cwd: dir,
        env: process.env,
        maxBuffer: 64 * 1024 * 1024,
      });
      fs.writeFileSync(out, result.stdout);
      const report = JSON.parse(result.stdout);
      const name = (test) => `${path.basename(test.file)}: ${test.fullTitle}`;
      return { ran: report.stats.tests, passed: report.passes.map(name), failed: report.failures.map(name) };
    },
  },
  "nestjs-throttler": {
    adapter: ["nest-throttler.service.ts", "src/throttler.service.ts"],
    tools: [
      "jest@29",
      "ts-jest@29",
      "typescript@5.9",
      "@types/jest@29",
      "@types/node",
      "@nestjs/common@11",
      "@nestjs/core@11",
      "@nestjs/platform-express@11",
      "@nestjs/platform-fastify@11",
      "@nestjs/testing@11",
      "reflect-metadata@0.2",
      "rxjs@7",
      "pactum@3",
      "supertest@7",
    ],
    prepare() {},
    run(dir, out) {
      const args = ["--config", "test/jest-e2e.json", "--forceExit", "--json", `--outputFile=${out}`];
      spawnSync(path.join(dir, "node_modules/.bin/jest"), args, { cwd: dir, env: process.env, stdio: "ignore" });
      return jestResults(out);
    },
  },
};

function jestResults(out) {
  const report = JSON.parse(fs.readFileSync(out, "utf8"));
  const passed = [];
  const failed = [];
  for (const file of report.testResults) {
    for (const test of file.assertionResults) {
      const name = `${path.basename(file.name)}: ${test.fullName}`;
      (test.status === "passed" ? passed : failed).push(name);
    }
  }
  return { ran: passed.length + failed.length, passed, failed };
}

/** expected.txt: `suite | test | reason` per line; # comments. */
function expected() {
  const bySuite = {};
  for (const line of fs.readFileSync(path.join(HERE, "expected.txt"), "utf8").split("\n")) {
    if (line.trim() === "" || line.startsWith("#")) continue;
    const [suite, test] = line.split(" | ");
    (bySuite[suite] ??= new Set()).add(test);
  }
  return bySuite;
}

/** A copy of `checkout` (without .git and node_modules) with the suite's tools installed and our adapter in place. */
function prepare(name, suite, checkout, port) {
  const dir = path.join(WORK, name);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.cpSync(checkout, dir, {
    recursive: true,
    filter: (source) => !/(^|\/)(\.git|node_modules)$/.test(source),
  });
  // npm would install every development dependency of the library's package.json: a scratch one installs only the
  // tools its tests use.
  const upstream = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8"));
  const scratch = { name: `${name}-upstream`, private: true, ...(upstream.type ? { type: upstream.type } : {}) };
  fs.writeFileSync(path.join(dir, "package.json"), JSON.stringify(scratch));
  execFileSync("npm", ["install", "--no-save", "--no-package-lock", "--ignore-scripts", "--no-audit", "--no-fund", ...suite.tools], {
    cwd: dir,
    stdio: ["ignore", "ignore", "inherit"],
  });
  suite.prepare(dir, port);
  if (ADAPT) fs.copyFileSync(path.join(HERE, suite.adapter[0]), path.join(dir, suite.adapter[1]));
  return { dir, version: upstream.version };
}

const checkouts = Object.fromEntries(process.argv.slice(2).map((arg) => arg.split("=")));
for (const name of Object.keys(checkouts)) {
  if (!SUITES[name]) throw new Error(`unknown suite ${name}: one of ${Object.keys(SUITES).join(", ")}`);
}
const lists = expected();
const server = await Server.start();
let ok = true;
try {
  process.env.REDIS_TB_PORT = String(server.port);
  process.env.REDIS_TB_PACKAGE = PACKAGE;
  for (const [name, checkout] of Object.entries(checkouts)) {
    const suite = SUITES[name];
    const { dir, version } = prepare(name, suite, path.resolve(checkout), server.port);
    const results = suite.run(dir, path.join(WORK, `${name}.json`));
    const listed = ADAPT ? (lists[name] ?? new Set()) : new Set();
    const unexpected = results.failed.filter((test) => !listed.has(test));
    const fixed = [...listed].filter((test) => !results.failed.includes(test));
    const verdict = unexpected.length === 0 && fixed.length === 0 ? "as listed" : "NOT as listed";
    console.log(`${name} ${version}: ran ${results.ran}, passed ${results.passed.length}, failed ${results.failed.length}; ${verdict}`);
    for (const test of unexpected) console.log(`  failed, not listed: ${test}`);
    for (const test of fixed) console.log(`  listed, did not fail: ${test}`);
    ok &&= verdict === "as listed";
  }
} finally {
  await server.stop();
}
process.exitCode = ok ? 0 : 1;
