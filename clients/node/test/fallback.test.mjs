// fail: "local" keeps the limit's bound on real servers (docs/clients.md, "When Redis fails"): one process admits
// at most burst + rate * t per key (plus the call in flight) however Redis fails, when one shard of a cluster
// refuses writes while another answers, when a server flaps, and when more identities come than the table holds.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, test } from "node:test";

import express from "express";
import { Redis } from "ioredis";

import { classifyFailure, rateLimit } from "../src/index.mjs";
import { CLIENT_KINDS, connect, connectCluster } from "./clients.mjs";
import { Cluster, Server, freshKey, rawCommand } from "./harness.mjs";
import { closeServer, listen } from "./http-helpers.mjs";

const SILENT = { warn() {}, error() {} };

/** An Express app limited by `options` (the identity from the x-user header), and `get(user)` -> status. */
async function expressApp(options) {
  const app = express();
  app.use(rateLimit({ key: (req) => req.get("x-user"), logger: SILENT, ...options }));
  app.get("/", (req, res) => res.send("ok"));
  const server = http.createServer(app);
  const base = await listen(server);
  return {
    get: async (user) => (await fetch(base, { headers: { "x-user": user } })).status,
    close: () => closeServer(server),
  };
}

/** The node of `cluster` that owns `key`: the one that answers for it instead of redirecting. */
async function ownerOf(cluster, key) {
  for (const node of cluster.nodes) if ((await rawCommand(node.port, `EXISTS ${key}`)).startsWith(":")) return node;
  throw new Error(`no node owns ${key}`);
}

/** `CONFIG SET maxmemory` on `server`: 1 refuses every write with OOM (noeviction), 0 lifts it. */
async function outOfMemory(server, on) {
  await rawCommand(server.port, "CONFIG SET maxmemory-policy noeviction");
  const reply = await rawCommand(server.port, `CONFIG SET maxmemory ${on ? 1 : 0}`);
  assert.equal(reply, "+OK\r\n");
}

describe("a shard out of memory while another answers", () => {
  let cluster;
  before(async () => {
    cluster = await Cluster.start();
  });
  after(async () => {
    await cluster?.stop();
  });

  for (const kind of CLIENT_KINDS) {
    test(`${kind}: alice's shard answers OOM, bob's answers; alternating requests admit alice at most burst + rate * t`, async () => {
      const prefix = `${freshKey("shard")}:`;
      const rate = 0.5;
      const burst = 5;
      const alice = await ownerOf(cluster, `${prefix}{alice}:api`);
      // bob: an identity on another shard.
      let bob;
      for (let i = 0; bob === undefined; i++) {
        if ((await ownerOf(cluster, `${prefix}{bob-${i}}:api`)) !== alice) bob = `bob-${i}`;
      }
      const conn = await connectCluster(kind, cluster);
      const rows = [];
      const app = await expressApp({
        client: conn.redis,
        prefix,
        limits: { name: "api", rate, burst },
        timeoutMs: 3000, // no deadline missed on a busy machine: every failure is an OOM reply
        onError: (error) => rows.push(classifyFailure(error).row),
      });
      try {
        await outOfMemory(alice, true);
        const statuses = { alice: [], bob: [] };
        const started = performance.now();
        for (let i = 0; i < 20; i++) {
          statuses.alice.push(await app.get("alice"));
          statuses.bob.push(await app.get(bob));
        }
        const seconds = (performance.now() - started) / 1000;
        const admitted = statuses.alice.filter((status) => status === 200).length;
        assert.ok(admitted <= burst + rate * seconds, `alice admitted ${admitted} in ${seconds.toFixed(2)} s: ${statuses.alice}`);
        assert.ok(admitted >= burst, `alice's in-memory bucket started full: ${statuses.alice}`);
        assert.deepEqual([...new Set(rows)], ["OOM"], "only alice's calls failed, each with its own OOM");
        assert.equal(rows.length, 20);
        assert.deepEqual(statuses.bob.slice(0, burst), Array(burst).fill(200), "bob's shard answered");
        // Once alice's shard takes writes again, her next call first brings her bucket there (full: Redis never saw
        // her requests) down to her in-memory one, which the 5 admitted emptied: refused.
        await outOfMemory(alice, false);
        assert.equal(await app.get("alice"), 429);
        const tokens = Number((await rawCommand(alice.port, `HGET ${prefix}{alice}:api tokens`)).split("\r\n")[1]);
        assert.ok(tokens < 1, `alice's bucket holds ${tokens} tokens after the charge-back`);
      } finally {
        await outOfMemory(alice, false);
        await app.close();
        await conn.close();
      }
    });
  }
});

test("OOM on and off every 0.5 s for 6 s: one identity's requests every ~15 ms admitted at most burst + rate * t (+1 in flight)", async () => {
  const server = await Server.start();
  const conn = await connect("ioredis", server);
  const rate = 5;
  const burst = 10;
  const app = await expressApp({ client: conn.redis, prefix: `${freshKey("flap")}:`, limits: { name: "api", rate, burst } });
  let flapping = true;
  let faults = 0;
  const flapper = (async () => {
    for (let on = true; flapping; on = !on) {
      await outOfMemory(server, on);
      if (on) faults += 1;
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  })();
  try {
    const statuses = [];
    const started = performance.now();
    while (performance.now() - started < 6000) {
      statuses.push(await app.get("flapper"));
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    const seconds = (performance.now() - started) / 1000;
    const admitted = statuses.filter((status) => status === 200).length;
    assert.ok(faults >= 4, `${faults} OOM periods`);
    assert.ok(statuses.length >= 50, `${statuses.length} requests`);
    assert.ok(admitted <= burst + rate * seconds + 1, `${admitted} of ${statuses.length} admitted in ${seconds.toFixed(2)} s`);
  } finally {
    flapping = false;
    await flapper;
    await outOfMemory(server, false);
    await app.close();
    await conn.close();
    await server.stop();
  }
});

test("Redis down: 10,001 identities cycled 3 times at burst 1 take the table (10,000) and the overflow bucket's one", async () => {
  // A port nothing listens on: the middleware's own connection is refused, and every call is decided in memory.
  const server = await Server.start({ module: false });
  const { port } = server;
  await server.stop();
  const redis = new Redis({ host: "127.0.0.1", port, lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => null });
  redis.on("error", () => {});
  const { limiter } = rateLimit({
    client: redis,
    limits: { name: "api", rate: 0.001, burst: 1 },
    key: (req) => req.user,
    logger: SILENT,
  });
  let admitted = 0;
  let calls = 0;
  const started = performance.now();
  for (let round = 0; round < 3; round++) {
    for (let user = 0; user <= 10_000; user++) {
      const outcome = await limiter.check({ user: `user-${user}` });
      assert.notEqual(outcome.error, undefined, "decided in memory");
      if (outcome.action === "allow") admitted += 1;
      calls += 1;
    }
  }
  const seconds = (performance.now() - started) / 1000;
  assert.equal(calls, 30_003);
  // 10,000 places, each admitting its burst of 1 and then owing it (never evicted), and the overflow bucket's 1,
  // which refills 0.001 a second.
  assert.ok(admitted <= 10_001 + 0.001 * seconds, `${admitted} admitted of 30,003`);
  assert.ok(admitted >= 10_001, `${admitted} admitted: the first round takes every place and the overflow's token`);
  redis.disconnect();
});
