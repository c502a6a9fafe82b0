// Which Redis client the package was given (ioredis or node-redis, a Cluster or not) is known in one place,
// src/connection.cjs: the other source files ask the object its connect() returns, never the client itself.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

import { connect } from "../src/connection.cjs";

const SOURCES = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "src");

// What only code that knows the client's kind reads or calls: its kind's name, its readiness fields, its cluster
// nodes, its way of sending a command or of making another connection.
const CLIENT_SPECIFIC =
  /\bisReady\b|\bisOpen\b|\.status\s*[!=]==|\.masters\b|\.nodes\(|\.nodeClient\(|\.duplicate\(|\.sendCommand\(|\.call\(\.\.\.|-cluster["']|["'](ioredis|node-redis)["']/;

test("no source file but connection.cjs reads or calls what depends on the Redis client's kind", () => {
  const found = [];
  for (const file of fs.readdirSync(SOURCES).filter((name) => /\.c?js$|\.mjs$/.test(name))) {
    if (file === "connection.cjs") continue;
    const lines = fs.readFileSync(path.join(SOURCES, file), "utf8").split("\n");
    lines.forEach((line, index) => {
      const code = line.replace(/\/\/.*$/, "");
      if (/^\s*(\*|\/\*\*)/.test(code)) return; // a doc comment
      if (CLIENT_SPECIFIC.test(code)) found.push(`${file}:${index + 1}: ${line.trim()}`);
    });
  }
  assert.deepEqual(found, []);
});

test("connect(): the kind, cluster or not, closed and ready, as each client says it", async () => {
  const ioredis = { call: async () => "PONG", sendCommand() {}, status: "ready" };
  const ioredisCluster = { ...ioredis, isCluster: true, nodes: () => [{ call: async () => "a" }, { call: async () => "b" }] };
  const nodeRedis = { sendCommand: async () => "PONG", isReady: true, isOpen: true };
  const nodeRedisCluster = {
    sendCommand: async () => "PONG",
    isOpen: true,
    masters: [{ id: 1 }, { id: 2 }, { id: 3 }],
    nodeClient: async () => ({ sendCommand: async () => "n" }),
  };
  const cases = [
    [ioredis, "ioredis", false, 1],
    [ioredisCluster, "ioredis-cluster", true, 2],
    [nodeRedis, "node-redis", false, 1],
    [nodeRedisCluster, "node-redis-cluster", true, 3],
  ];
  for (const [redis, kind, cluster, primaries] of cases) {
    const connection = connect(redis);
    assert.equal(connection.kind, kind);
    assert.equal(connection.cluster, cluster, kind);
    assert.equal(connection.closed(), false, kind);
    assert.equal(connection.ready(), true, kind);
    assert.equal((await connection.primaries()).length, primaries, kind);
  }
  ioredis.status = "end";
  nodeRedis.isOpen = false;
  nodeRedis.isReady = false;
  nodeRedisCluster.isOpen = false;
  for (const redis of [ioredis, nodeRedis, nodeRedisCluster]) {
    assert.equal(connect(redis).closed(), true);
    assert.equal(connect(redis).ready(), false);
  }
  assert.throws(() => connect(ioredisCluster).openOwn(1000), /never duplicated/);
});
