// docs/clients.md's failure table, row by row: the classifier against fixtures/failures.json (shared with the
// Python package), then each row that a test can bring about on a real server, met by Express and Fastify in each
// fail mode: "local" limits in memory, "open" lets through without headers, "closed" answers 503 with
// Retry-After: 1; configuration errors are logged at error level, faults as one warning.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { describe, test } from "node:test";

import express from "express";
import Fastify from "fastify";
import { Redis, Cluster as IoCluster, ReplyError } from "ioredis";
import { ErrorReply } from "redis";

import { classifyFailure, fastifyRateLimit, rateLimit, TbClient, TbReplyError, TbUnavailableError } from "../src/index.mjs";
import { isUnknownCommand } from "../src/errors.cjs";
import { connect } from "./clients.mjs";
import { REPOSITORY, Server, rawCommand, waitUntil } from "./harness.mjs";
import { closeServer, limitHeaders, listen } from "./http-helpers.mjs";

const FIXTURE = JSON.parse(fs.readFileSync(path.join(REPOSITORY, "fixtures", "failures.json"), "utf8"));

// The errors ioredis, node-redis and this package raise for the fixture's conditions (its rows without a reply).
const CONDITIONS = {
  "connection refused": [Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:6379"), { code: "ECONNREFUSED" })],
  "connection reset": [new Error("Connection is closed."), new Error("The client is closed"), Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }), new Error("Socket closed unexpectedly"), new TbUnavailableError("redis-tb: the connection to Redis closed"), Object.assign(new Error("getaddrinfo ENOTFOUND redis"), { code: "ENOTFOUND" })],
  timeout: [new TbUnavailableError("redis-tb: no reply from Redis within 300 ms"), new Error("Connection timeout")],
  "cluster unreachable": [new Error("None of startup nodes is available"), new Error("Failed to refresh slots cache."), new Error("Cluster isn't ready and enableOfflineQueue options is false")],
  "any other error": [new TypeError("Cannot read properties of undefined (reading 'length')"), new Error("an unexpected error")],
};

describe("the failure table's classifier", () => {
  test("fail, timeoutMs, logger, prefix and localCapacity are checked when the middleware is built", () => {
    const limits = { rate: 1, burst: 1 };
    const bads = [{ fail: "maybe" }, { timeoutMs: -1 }, { timeoutMs: "1000" }, { logger: { warn() {} } }, { prefix: "rl{}:" }, { localCapacity: -1 }, { localCapacity: 0.5 }];
    for (const bad of bads) {
      assert.throws(() => rateLimit({ client: {}, limits, ...bad }), new RegExp(Object.keys(bad)[0]), JSON.stringify(bad));
    }
  });

  test("every case of fixtures/failures.json has a snake_case class, one per row", () => {
    const classOf = new Map();
    for (const row of FIXTURE.cases) {
      assert.match(row.class ?? "", /^[a-z][a-z_]*$/, row.row);
      assert.equal(classOf.get(row.row) ?? row.class, row.class, `every case of ${row.row} has one class`);
      classOf.set(row.row, row.class);
    }
  });

  test("every reply of fixtures/failures.json falls in its row, from either client", () => {
    for (const row of FIXTURE.cases.filter((c) => c.reply !== undefined)) {
      const expected = { row: row.row, class: row.class, action: row.action };
      assert.deepEqual(classifyFailure(new TbReplyError("TB.ACQUIRE", "k", new ReplyError(row.reply))), expected, row.reply);
      assert.deepEqual(classifyFailure(new ErrorReply(row.reply)), expected, row.reply);
    }
  });

  test("every condition of fixtures/failures.json has Node errors that fall in its row", () => {
    for (const row of FIXTURE.cases.filter((c) => c.reply === undefined)) {
      assert.ok(CONDITIONS[row.row], `a Node error for ${row.row}`);
      for (const error of CONDITIONS[row.row]) {
        assert.deepEqual(classifyFailure(error), { row: row.row, class: row.class, action: row.action }, error.message);
      }
    }
  });
});

/** A logger that keeps what it is told. */
function recorder() {
  const lines = { warn: [], error: [] };
  return { lines, warn: (message) => lines.warn.push(message), error: (message) => lines.error.push(message) };
}

async function expressApp(shared) {
  const app = express();
  for (const fail of ["local", "open", "closed"]) app.get(`/${fail}`, rateLimit({ ...shared, fail }), (req, res) => res.send("ok"));
  const server = http.createServer(app);
  return { base: await listen(server), close: () => closeServer(server) };
}

async function fastifyApp(shared) {
  const fastify = Fastify();
  await fastify.register(fastifyRateLimit, { ...shared, global: false });
  for (const fail of ["local", "open", "closed"]) fastify.get(`/${fail}`, { config: { rateLimit: { fail } } }, async () => "ok");
  return { base: await fastify.listen({ port: 0, host: "127.0.0.1" }), close: () => fastify.close() };
}

/**
 * Express and Fastify over `client`, which fails every limiter call with one of `rows`: each fail mode answers as the
 * table says, and the failure is logged as a configuration error (`configError`) or as one warning.
 */
async function meetsFailModes(client, { rows, configError }) {
  for (const framework of [expressApp, fastifyApp]) {
    const logger = recorder();
    const seen = [];
    const app = await framework({
      client,
      limits: { name: "api", rate: 0.001, burst: 2 },
      key: () => "failing",
      timeoutMs: 300,
      logger,
      onError: (error) => seen.push(classifyFailure(error).row),
    });
    try {
      const local = [];
      for (let i = 0; i < 3; i++) local.push(await fetch(`${app.base}/local`));
      assert.deepEqual(local.map((r) => r.status), [200, 200, 429], `${framework.name}: local limits in memory`);
      assert.equal(local[0].headers.get("ratelimit-remaining"), "1");
      const open = await fetch(`${app.base}/open`);
      assert.equal(open.status, 200);
      assert.deepEqual(limitHeaders(open), {});
      const closed = await fetch(`${app.base}/closed`);
      assert.equal(closed.status, 503);
      assert.equal(closed.headers.get("retry-after"), "1");
      assert.deepEqual(await closed.json(), { error: "rate limiter unavailable" });
      assert.ok(seen.length > 0 && seen.every((row) => rows.includes(row)), `${framework.name}: calls met ${seen}, not ${rows}`);
      if (configError) {
        assert.ok(logger.lines.error.length >= 1 && logger.lines.error.every((line) => rows.some((row) => line.includes(row))), logger.lines.error.join("\n"));
        assert.ok(logger.lines.error.length <= 3, "at most once a minute per limiter");
      } else {
        assert.equal(logger.lines.error.length, 0, logger.lines.error.join("\n"));
        assert.ok(logger.lines.warn.length >= 1 && logger.lines.warn.length <= 3, "one warning per limiter for the fault");
      }
    } finally {
      await app.close();
    }
  }
}

/** A client of `kind` on `server`, closed after `body`. */
async function withClient(kind, server, options, body) {
  const conn = await connect(kind, server, options);
  try {
    await body(conn.redis);
  } finally {
    await conn.close();
  }
}

/** A server for `body`, stopped after it. */
async function withServer(options, body) {
  const server = await Server.start(options);
  try {
    await body(server);
  } finally {
    await server.stop();
  }
}

test("one check decides both: a reply of fixtures/backends.json is the unknown command row exactly when it moves calls to the script", () => {
  const { cases } = JSON.parse(fs.readFileSync(path.join(REPOSITORY, "fixtures", "backends.json"), "utf8"));
  let checked = 0;
  for (const item of cases.filter((item) => item.reply !== undefined)) {
    const error = new ReplyError(item.reply);
    const row = classifyFailure(error).class === "unknown_command";
    assert.equal(row, isUnknownCommand(error), item.reply);
    assert.equal(row, item.class === "unknown-command", item.reply);
    checked += 1;
  }
  assert.ok(checked >= 10, `${checked} replies`);
});

describe("each row on a real server", () => {
  for (const kind of ["ioredis", "node-redis"]) {
    test(`connection refused (${kind}): Redis stopped under a connected client`, async () => {
      const server = await Server.start();
      const conn = await connect(kind, server);
      try {
        await server.stop();
        await meetsFailModes(conn.redis, { rows: ["timeout", "connection reset", "connection refused"], configError: false });
      } finally {
        await conn.close();
      }
    });
  }

  for (const module of [true, false]) {
    test(`OOM (maxmemory with noeviction), ${module ? "module" : "script"}`, async () => {
      await withServer({ module, args: ["--maxmemory-policy", "noeviction"] }, async (server) => {
        await rawCommand(server.port, "CONFIG SET maxmemory 1");
        await withClient("ioredis", server, {}, (redis) => meetsFailModes(new TbClient(redis), { rows: ["OOM"], configError: false }));
      });
    });
  }

  test("READONLY: a replica", async () => {
    await withServer({}, async (primary) => {
      await withServer({ args: ["--replicaof", "127.0.0.1", String(primary.port)] }, async (replica) => {
        await withClient("ioredis", replica, {}, (redis) => meetsFailModes(redis, { rows: ["READONLY"], configError: false }));
      });
    });
  });

  test("MASTERDOWN: a writable replica whose primary is gone, with replica-serve-stale-data no", async () => {
    const gone = await Server.start();
    await gone.stop();
    await withServer({}, async (replica) => {
      await rawCommand(replica.port, "CONFIG SET replica-serve-stale-data no");
      await rawCommand(replica.port, "CONFIG SET replica-read-only no"); // else a write meets READONLY first
      await rawCommand(replica.port, `REPLICAOF 127.0.0.1 ${gone.port}`);
      await withClient("node-redis", replica, {}, (redis) => meetsFailModes(redis, { rows: ["MASTERDOWN"], configError: false }));
    });
  });

  test("NOREPLICAS: min-replicas-to-write without replicas", async () => {
    await withServer({ args: ["--min-replicas-to-write", "1"] }, async (server) => {
      await withClient("ioredis", server, {}, (redis) => meetsFailModes(redis, { rows: ["NOREPLICAS"], configError: false }));
    });
  });

  test("BUSY: a long script holds the server", async () => {
    await withServer({ args: ["--lua-time-limit", "50"] }, async (server) => {
      const busy = new Redis({ port: server.port, host: "127.0.0.1" });
      busy.on("error", () => {});
      await withClient("ioredis", server, {}, async (redis) => {
        const spinning = busy.eval("while true do end", 0).catch(() => {});
        try {
          await waitUntil(async () => (await rawCommand(server.port, "PING").catch((e) => e.message)).startsWith("-BUSY"), 5000, "BUSY");
          await meetsFailModes(redis, { rows: ["BUSY"], configError: false });
        } finally {
          await rawCommand(server.port, "SCRIPT KILL");
          await spinning;
          busy.disconnect();
        }
      });
    });
  });

  test("CLUSTERDOWN: a cluster node that serves no slot", async () => {
    await withServer({ args: ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"], clusterBus: true }, async (server) => {
      await withClient("ioredis", server, {}, (redis) => meetsFailModes(redis, { rows: ["CLUSTERDOWN"], configError: false }));
    });
  });

  test("cluster unreachable: no startup node answers", async () => {
    const gone = await Server.start();
    await gone.stop();
    const cluster = new IoCluster([{ host: "127.0.0.1", port: gone.port }], { lazyConnect: true });
    cluster.on("error", () => {});
    try {
      await meetsFailModes(cluster, { rows: ["timeout"], configError: false });
    } finally {
      cluster.disconnect();
    }
  });

  test("NOAUTH: a password set after the application connected (the middleware opens its own connection)", async () => {
    await withServer({}, async (server) => {
      await withClient("ioredis", server, {}, async (redis) => {
        await rawCommand(server.port, "CONFIG SET requirepass s3cret");
        await meetsFailModes(redis, { rows: ["NOAUTH"], configError: true });
      });
    });
  });

  for (const kind of ["ioredis", "node-redis"]) {
    test(`WRONGPASS (${kind}): the user's password changed after the application connected`, async () => {
      await withServer({}, async (server) => {
        await rawCommand(server.port, "ACL SETUSER limiter on >pw ~* +@all");
        await withClient(kind, server, { username: "limiter", password: "pw" }, async (redis) => {
          await rawCommand(server.port, "ACL SETUSER limiter resetpass >changed");
          await meetsFailModes(redis, { rows: ["WRONGPASS", "NOAUTH"], configError: true });
        });
      });
    });
  }

  for (const kind of ["ioredis", "node-redis"]) {
    test(`NOPERM (${kind}): an ACL user without the limiter's commands`, async () => {
      await withServer({}, async (server) => {
        await rawCommand(server.port, "ACL SETUSER limiter on >pw ~* +@all -tb.acquire -evalsha -eval");
        const auth = { username: "limiter", password: "pw" };
        await withClient(kind, server, auth, (redis) => meetsFailModes(redis, { rows: ["NOPERM"], configError: true }));
      });
    });
  }

  test("WRONGTYPE: the bucket's key holds a string", async () => {
    await withServer({}, async (server) => {
      await withClient("ioredis", server, {}, async (redis) => {
        await redis.set("ratelimit:{failing}:api", "not a bucket");
        await meetsFailModes(redis, { rows: ["WRONGTYPE"], configError: true });
      });
    });
  });
});
