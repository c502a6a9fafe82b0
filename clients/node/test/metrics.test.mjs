// The middleware's metrics, shadow mode and refusal options (docs/operating.md, "Watching the middleware") on real
// servers: after a known sequence of requests (allowed, refused, refused by a shadow limit only, skipped, decided in
// memory while Redis is stopped), every value scraped from the registry is the one expected.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { describe, test } from "node:test";

import express from "express";
import Fastify from "fastify";
import { Redis } from "ioredis";
import { Registry, register as defaultRegistry } from "prom-client";

import { fastifyRateLimit, rateLimit, SKIP, TbClient } from "../src/index.mjs";
import { FAILURE_CLASSES } from "../src/errors.cjs";
import { connect } from "./clients.mjs";
import { REPOSITORY, Server, WITHOUT_MODULE, freshKey, rawCommand, waitUntil } from "./harness.mjs";
import { closeServer, limitHeaders, listen } from "./http-helpers.mjs";

const OUTCOMES = ["allowed", "refused", "shadow_refused", "skipped"];
const SOURCES = ["module", "function", "script", "local", "open", "closed"];

/** The counters of `registry` as { 'name{label="value"}': number }, histogram series included. */
async function scrape(registry) {
  const values = {};
  for (const line of (await registry.metrics()).split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    values[line.slice(0, at)] = Number(line.slice(at + 1));
  }
  return values;
}

/**
 * The counter series a registry holds after the counts given: every outcome and source from 0, a limit's and a
 * class's series from their first count.
 */
function expectedCounters({ requests = {}, refusals = {}, decisions = {}, failures = {} }) {
  const values = {};
  for (const outcome of OUTCOMES) values[`redis_tb_requests_total{outcome="${outcome}"}`] = requests[outcome] ?? 0;
  for (const [name, count] of Object.entries(refusals)) values[`redis_tb_refusals_total{limit="${name}"}`] = count;
  for (const source of SOURCES) values[`redis_tb_decisions_total{source="${source}"}`] = decisions[source] ?? 0;
  for (const [name, count] of Object.entries(failures)) values[`redis_tb_redis_failures_total{class="${name}"}`] = count;
  return values;
}

/** The scraped series of the counters only (the histogram's depend on timing). */
function counters(scraped) {
  return Object.fromEntries(Object.entries(scraped).filter(([name]) => !name.startsWith("redis_tb_call_duration_seconds")));
}

/** The whole tokens `key`'s bucket holds on `server` (a bucket refills a little between the calls). */
async function tokens(server, key) {
  return Math.floor(Number((await rawCommand(server.port, `HGET ${key} tokens`)).split("\r\n")[1]));
}

/** A logger that keeps what it is told. */
function recorder() {
  const lines = { warn: [], error: [] };
  return { lines, warn: (message) => lines.warn.push(message), error: (message) => lines.error.push(message) };
}

/** An Express app with `middleware` in front of "ok", and `get(user, path?)` -> { status, headers, body }. */
async function expressApp(middleware) {
  const app = express();
  app.use(middleware);
  app.get(["/", "/health"], (req, res) => res.send("ok"));
  const server = http.createServer(app);
  const base = await listen(server);
  return {
    async get(user, route = "/") {
      const response = await fetch(`${base}${route}`, { headers: { "x-user": user } });
      return { status: response.status, headers: limitHeaders(response), body: await response.text() };
    },
    close: () => closeServer(server),
  };
}

test("every class of the failure table is one of fixtures/failures.json's, and each of those is one", () => {
  const fixture = JSON.parse(fs.readFileSync(path.join(REPOSITORY, "fixtures", "failures.json"), "utf8"));
  assert.deepEqual(new Set(FAILURE_CLASSES), new Set(fixture.cases.map((row) => row.class)));
});

describe("metrics after a known sequence of requests", () => {
  test("allowed, refused, shadow-refused, skipped, then Redis stopped (local answers) and back: exact counts", async () => {
    const server = await Server.start();
    const conn = await connect("ioredis", server);
    const registry = new Registry();
    const logger = recorder();
    const hooked = [];
    const prefix = `${freshKey("metrics")}:`;
    const timeoutMs = 200;
    const limits = [
      { name: "api", rate: 0.001, burst: 3 },
      { name: "trial", rate: 0.001, burst: 1, shadow: true },
    ];
    const key = (req) => (req.path === "/health" ? SKIP : req.get("x-user"));
    const options = { client: conn.redis, prefix, limits, key, timeoutMs, logger };
    const app = await expressApp(rateLimit({ ...options, metrics: registry, onError: (error, req, failureClass) => hooked.push([req.path, failureClass]) }));
    // The same limits over the same client without metrics: it shares the middleware's connection, so it tells
    // when Redis answers again without counting anything.
    const { limiter: watcher } = rateLimit({ ...options, metrics: false });
    let stopped = false;
    try {
      assert.equal((await app.get("alice", "/health")).status, 200); // skipped
      const first = await app.get("alice"); // api 2 left, trial 0 left: allowed
      assert.equal(first.status, 200);
      assert.deepEqual(first.headers, {
        "ratelimit-policy": '"api";q=3;w=3000',
        ratelimit: '"api";r=2;t=1000',
        "ratelimit-limit": "3",
        "ratelimit-remaining": "2",
        "ratelimit-reset": "1000",
      });
      for (const remaining of [1, 0]) {
        // api allows, trial refuses: served, and the headers show api alone.
        const response = await app.get("alice");
        assert.equal(response.status, 200);
        assert.equal(response.headers["ratelimit-policy"], '"api";q=3;w=3000');
        assert.equal(response.headers["ratelimit-remaining"], String(remaining));
        assert.equal(response.headers["retry-after"], undefined);
      }
      const refused = await app.get("alice"); // api refuses: trial is not called
      assert.equal(refused.status, 429);
      const refusal = JSON.parse(refused.body);
      assert.deepEqual({ ...refusal, retry_after_ms: undefined }, { error: "rate limit exceeded", limit: "api", retry_after_ms: undefined });
      assert.ok(refusal.retry_after_ms > 990_000 && refusal.retry_after_ms <= 1_000_000, String(refusal.retry_after_ms));
      assert.equal(refused.headers["retry-after"], "1000");
      assert.equal(await tokens(server, `${prefix}{alice}:trial`), 0, "trial charged once");

      server.child.kill("SIGSTOP");
      stopped = true;
      // bob, in memory: the enforced call misses its deadline, the shadow call fails at once (the connection is down).
      assert.equal((await app.get("bob")).status, 200); // api 2 left, trial 0 left
      assert.equal((await app.get("bob")).status, 200); // api 1 left, trial refuses: served
      server.child.kill("SIGCONT");
      stopped = false;
      await waitUntil(async () => (await watcher.check({ path: "/", get: () => "watcher" })).error === undefined, 10_000, "Redis answers");
      assert.equal((await app.get("alice")).status, 429); // Redis decides again

      assert.deepEqual(
        counters(await scrape(registry)),
        expectedCounters({
          requests: { allowed: 2, refused: 2, shadow_refused: 3, skipped: 1 },
          refusals: { api: 2, trial: 3 },
          decisions: { module: 8, local: 4 },
          failures: { timeout: 4 },
        }),
      );
      const scraped = await scrape(registry);
      assert.equal(scraped.redis_tb_call_duration_seconds_count, 12);
      assert.equal(scraped['redis_tb_call_duration_seconds_bucket{le="+Inf"}'], 12);
      assert.ok(scraped['redis_tb_call_duration_seconds_bucket{le="0.1"}'] <= 11, "the call that missed its deadline took 0.2 s");
      assert.ok(scraped.redis_tb_call_duration_seconds_sum >= timeoutMs / 1000);
      assert.equal(scraped['redis_tb_call_duration_seconds_bucket{le="0.0005"}'] >= 0, true, "buckets from 0.5 ms");
      assert.equal(scraped['redis_tb_call_duration_seconds_bucket{le="2.5"}'], 12, "buckets to 2.5 s");

      assert.deepEqual(hooked, [["/", "timeout"], ["/", "timeout"], ["/", "timeout"], ["/", "timeout"]]);
      // One shadow refusal logged of alice's two in a row (once a second per limit), and bob's if a second passed.
      const shadowLines = logger.lines.warn.filter((line) => line.includes("shadow limit"));
      assert.ok(shadowLines.length >= 1 && shadowLines.length <= 2, shadowLines.join("\n"));
      assert.match(shadowLines[0], /shadow limit "trial" would have refused a request \(retry after \d+ ms\); it was served/);
    } finally {
      if (stopped) server.child.kill("SIGCONT");
      await app.close();
      await conn.close();
      await server.stop();
    }
  });

  test("shadow refusals are logged at most once a second per limit", async () => {
    const server = await Server.start();
    const conn = await connect("ioredis", server);
    const logger = recorder();
    const { limiter } = rateLimit({
      client: conn.redis,
      prefix: `${freshKey("shadow-log")}:`,
      limits: [{ name: "a", rate: 0.001, burst: 1 }, { name: "b", rate: 0.001, burst: 1 }],
      key: (req) => req.get("x-user"),
      shadow: true,
      logger,
      metrics: false,
    });
    try {
      const outcomes = [];
      for (let i = 0; i < 5; i++) outcomes.push(await limiter.check({ get: () => "carol" }));
      assert.deepEqual(outcomes.map((outcome) => outcome.action), Array(5).fill("allow"));
      assert.deepEqual(outcomes.map((outcome) => outcome.headers), Array(5).fill({}), "no header for limits being tried");
      assert.deepEqual(outcomes.map((outcome) => outcome.shadow.allowed), [true, false, false, false, false]);
      assert.deepEqual(logger.lines.warn.map((line) => line.match(/"(\w)"/)[1]), ["a", "b"]);
      const started = performance.now();
      await waitUntil(async () => {
        await limiter.check({ get: () => "carol" });
        return logger.lines.warn.length > 2;
      }, 5000, "the next log line");
      assert.ok(performance.now() - started >= 900, "not within the second");
    } finally {
      await conn.close();
      await server.stop();
    }
  });

  test("a shadow limit takes exactly what it would enforced: all or nothing among the shadow limits, never the enforced ones' tokens", async () => {
    const server = await Server.start();
    const conn = await connect("ioredis", server);
    const prefix = `${freshKey("shadow-charge")}:`;
    const limits = [
      { name: "enforced", rate: 0.001, burst: 2 },
      { name: "small", rate: 0.001, burst: 1, shadow: true },
      { name: "large", rate: 0.001, burst: 5, shadow: true },
    ];
    const { limiter } = rateLimit({ client: conn.redis, prefix, limits, key: () => "dave", metrics: false, logger: recorder() });
    const held = (name) => tokens(server, `${prefix}{dave}:${name}`);
    try {
      assert.equal((await limiter.check({})).action, "allow");
      assert.deepEqual([await held("enforced"), await held("small"), await held("large")], [1, 0, 4]);
      // small refuses: the shadow call takes nothing from large either, as an enforced call would not.
      assert.equal((await limiter.check({})).action, "allow");
      assert.deepEqual([await held("enforced"), await held("small"), await held("large")], [0, 0, 4]);
      // enforced refuses: no shadow call.
      const refused = await limiter.check({});
      assert.equal(refused.action, "refuse");
      assert.equal(refused.shadow, undefined);
      assert.deepEqual(refused.decision.buckets.map((bucket) => bucket.name), ["enforced"]);
      assert.deepEqual([await held("enforced"), await held("small"), await held("large")], [0, 0, 4]);
    } finally {
      await conn.close();
      await server.stop();
    }
  });
});

describe("decisions by source", () => {
  test("module, function and script: the backend that answered", async () => {
    const withModule = await Server.start();
    const without = await Server.start({ module: false });
    const registry = new Registry();
    const conns = [await connect("ioredis", withModule), await connect("ioredis", without), await connect("ioredis", without)];
    const clients = [conns[0].redis, conns[1].redis, new TbClient(conns[2].redis, { backend: "script" })];
    try {
      for (const client of clients) {
        const { limiter } = rateLimit({ client, limits: { name: "api", rate: 10, burst: 10 }, key: () => freshKey("source"), metrics: registry });
        for (let i = 0; i < 2; i++) assert.equal((await limiter.check({})).action, "allow");
      }
      const scraped = await scrape(registry);
      const sources = Object.fromEntries(SOURCES.map((source) => [source, scraped[`redis_tb_decisions_total{source="${source}"}`]]));
      const expected = { module: 2, function: 0, script: 2, local: 0, open: 0, closed: 0 };
      expected[WITHOUT_MODULE] += 2;
      assert.deepEqual(sources, expected);
    } finally {
      for (const conn of conns) await conn.close();
      await withModule.stop();
      await without.stop();
    }
  });

  test('fail "open" and "closed": the fail mode answers, the failure is counted by class, onError hears it; a shadow limit "closed" would refuse', async () => {
    // A port nothing listens on: every call is refused a connection.
    const gone = await Server.start({ module: false });
    await gone.stop();
    const redis = new Redis({ host: "127.0.0.1", port: gone.port, lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => null });
    redis.on("error", () => {});
    const registry = new Registry();
    const hooked = [];
    const twoArguments = [];
    const shared = { client: redis, limits: { name: "api", rate: 1, burst: 1 }, key: () => "erin", metrics: registry, logger: recorder() };
    const open = rateLimit({ ...shared, fail: "open", onError: (error, req, failureClass) => hooked.push(failureClass) }).limiter;
    const closed = rateLimit({ ...shared, fail: "closed", onError: (error, req) => twoArguments.push(req.id) }).limiter;
    const shadowOpen = rateLimit({ ...shared, fail: "open", shadow: true }).limiter;
    const closedLog = recorder();
    const shadowClosed = rateLimit({ ...shared, fail: "closed", shadow: true, logger: closedLog }).limiter;
    try {
      for (const limiter of [shadowOpen, shadowClosed]) {
        const served = await limiter.check({});
        assert.deepEqual([served.action, served.headers, served.shadow], ["allow", {}, undefined]);
      }
      assert.deepEqual(
        closedLog.lines.warn.filter((line) => line.includes("shadow limit")),
        ['redis-tb: shadow limit "api" would have refused a request (Redis failed and the fail mode is closed); it was served (logged at most once a second per limit)'],
      );
      assert.equal((await open.check({ id: 1 })).action, "allow");
      assert.equal((await open.check({ id: 2 })).action, "allow");
      const refused = await closed.check({ id: 3 });
      assert.equal(refused.action, "unavailable");
      assert.equal(refused.status, 503);
      assert.deepEqual(hooked, ["connection", "connection"]);
      assert.deepEqual(twoArguments, [3]);
      assert.deepEqual(
        counters(await scrape(registry)),
        expectedCounters({
          requests: { allowed: 3, refused: 1, shadow_refused: 1 },
          decisions: { open: 3, closed: 2 },
          failures: { connection: 5 },
        }),
      );
    } finally {
      redis.disconnect();
    }
  });

  test("an onError that throws is logged, and the fail mode still answers (never a 500)", async () => {
    const gone = await Server.start({ module: false });
    await gone.stop();
    const redis = new Redis({ host: "127.0.0.1", port: gone.port, lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => null });
    redis.on("error", () => {});
    const logger = recorder();
    const app = await expressApp(
      rateLimit({
        client: redis,
        limits: { rate: 1, burst: 5 },
        logger,
        metrics: false,
        onError: () => {
          throw new Error("hook broke");
        },
      }),
    );
    try {
      assert.equal((await app.get("frank")).status, 200);
      assert.ok(logger.lines.error.some((line) => line.includes("onError threw (hook broke)")), logger.lines.error.join("\n"));
    } finally {
      await app.close();
      redis.disconnect();
    }
  });
});

describe("registries", () => {
  test("middlewares over one registry (Express and Fastify) count into the same series, registered once", async () => {
    const server = await Server.start();
    const conn = await connect("ioredis", server);
    const registry = new Registry();
    const prefix = `${freshKey("shared")}:`;
    const shared = { client: conn.redis, prefix, key: () => "gina", metrics: registry };
    const app = await expressApp(rateLimit({ ...shared, limits: { name: "api", rate: 0.001, burst: 1 } }));
    const fastify = Fastify();
    await fastify.register(fastifyRateLimit, { ...shared, limits: [{ name: "api", rate: 0.001, burst: 1 }, { name: "fastify", rate: 0.001, burst: 1 }] });
    fastify.get("/", async () => "ok");
    const base = await fastify.listen({ port: 0, host: "127.0.0.1" });
    try {
      assert.equal((await app.get("gina")).status, 200);
      assert.equal((await fetch(base)).status, 429); // the shared bucket api is empty
      assert.equal((await app.get("gina")).status, 429);
      assert.equal((await registry.getMetricsAsJSON()).length, 5, "five metrics, each registered once");
      assert.deepEqual(
        counters(await scrape(registry)),
        expectedCounters({ requests: { allowed: 1, refused: 2 }, refusals: { api: 2 }, decisions: { module: 3 } }),
      );
      // prom-client's reset starts the series afresh: what follows is counted from 0.
      registry.resetMetrics();
      assert.equal((await app.get("gina")).status, 429);
      assert.deepEqual(
        counters(await scrape(registry)),
        expectedCounters({ requests: { refused: 1 }, refusals: { api: 1 }, decisions: { module: 1 } }),
      );
    } finally {
      await app.close();
      await fastify.close();
      await conn.close();
      await server.stop();
    }
  });

  test("by default prom-client's default registry; false counts nowhere; anything else is refused", async () => {
    const limits = { rate: 1, burst: 1 };
    const gone = await Server.start({ module: false });
    await gone.stop();
    const client = new Redis({ host: "127.0.0.1", port: gone.port, lazyConnect: true });
    rateLimit({ client, limits });
    const requests = defaultRegistry.getSingleMetric("redis_tb_requests_total");
    assert.notEqual(requests, undefined);
    const before = JSON.stringify(await defaultRegistry.getMetricsAsJSON());
    const { limiter } = rateLimit({ client, limits, key: () => SKIP, metrics: false });
    await limiter.check({});
    assert.equal(JSON.stringify(await defaultRegistry.getMetricsAsJSON()), before);
    for (const bad of [true, null, "registry", {}]) {
      assert.throws(() => rateLimit({ client, limits, metrics: bad }), /metrics must be a prom-client Registry or false/, String(bad));
    }
    const other = new Registry();
    other.registerMetric(new (await import("prom-client")).Gauge({ name: "redis_tb_requests_total", help: "not ours", registers: [] }));
    assert.throws(() => rateLimit({ client, limits, metrics: other }), /holds another metric named redis_tb_requests_total/);
    for (const bad of [{ shadow: "yes" }, { limits: { ...limits, shadow: 1 } }]) {
      assert.throws(() => rateLimit({ client, limits, ...bad }), /shadow must be true or false/, JSON.stringify(bad));
    }
    assert.throws(() => rateLimit({ client, limits, onError: "log" }), /onError must be a function/);
  });
});

describe("refusal options", () => {
  test("statusCode and body (an object, or a function of the decision)", async () => {
    const server = await Server.start();
    const conn = await connect("ioredis", server);
    const prefix = `${freshKey("refusal")}:`;
    const shared = { client: conn.redis, prefix, limits: { name: "api", rate: 0.001, burst: 1 }, metrics: false };
    const fixed = await expressApp(rateLimit({ ...shared, key: () => "henry", statusCode: 403, body: { denied: true } }));
    const computed = await expressApp(
      rateLimit({ ...shared, key: () => "ida", body: (decision) => ({ limit: decision.buckets[decision.limitingIndex].name, allowed: decision.allowed }) }),
    );
    try {
      assert.equal((await fixed.get("x")).status, 200);
      assert.deepEqual(await fixed.get("x").then(({ status, body }) => [status, JSON.parse(body)]), [403, { denied: true }]);
      assert.equal((await computed.get("x")).status, 200);
      assert.deepEqual(await computed.get("x").then(({ status, body }) => [status, JSON.parse(body)]), [429, { limit: "api", allowed: false }]);
    } finally {
      await fixed.close();
      await computed.close();
      await conn.close();
      await server.stop();
    }
  });
});
