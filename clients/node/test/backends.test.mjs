// Which backend serves the calls, and the switches between them, on real servers through both Redis clients: the
// module while it answers, else the Redis Functions library (loaded by the client, reloaded after a FUNCTION
// FLUSH, a failover or a restart), else the script where functions are unavailable (Redis 6.2, an ACL user
// without them); the caller's clock where the server refuses TIME inside scripts. Each switch is reported once,
// with its reason, through the `logger` option. The Python package's tests/test_backends.py checks the same.
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { createRequire } from "node:module";
import { after, before, describe, test } from "node:test";

import { TbClient, luaScript } from "../src/index.mjs";
import { backendErrorClass, isFunctionsUnavailable, isTimeRefused, isUnknownCommand } from "../src/client.cjs";
import { connect, connectCluster, CLIENT_KINDS } from "./clients.mjs";
import { Cluster, REPOSITORY, Server, WITHOUT_MODULE, freshKey, rawCommand, waitUntil } from "./harness.mjs";

const script = createRequire(import.meta.url)("../src/script.cjs");
const FUNCTIONS = WITHOUT_MODULE === "function";
const LIBRARY = luaScript.libraryName();

/** A `logger` that keeps what it is told. */
function recorder() {
  const lines = [];
  const logger = { info: (message) => lines.push({ level: "info", message }), warn: (message) => lines.push({ level: "warn", message }) };
  return { lines, logger };
}

/** One command through either client kind. */
function send(conn, args) {
  return conn.redis.call ? conn.redis.call(...args) : conn.redis.sendCommand(args);
}

/** `INFO commandstats` calls of `command` (e.g. "function|load") on a server. */
async function calls(port, command) {
  const info = await rawCommand(port, "INFO commandstats");
  const found = info.match(new RegExp(`cmdstat_${command.replace("|", "\\|")}:calls=(\\d+)`));
  return found ? Number(found[1]) : 0;
}

async function libraries(port) {
  return [...(await rawCommand(port, "FUNCTION LIST")).matchAll(/library_name\r\n\$\d+\r\n([^\r]+)\r\n/g)].map((m) => m[1]);
}

/**
 * A TCP forwarder standing for the address clients know a primary by (Sentinel, a DNS name, a cloud endpoint):
 * `moveTo` points it at another server and cuts the open connections, as a failover does.
 */
class Forwarder {
  static async start(targetPort) {
    const forwarder = new Forwarder(targetPort);
    await new Promise((resolve) => forwarder.server.listen(0, "127.0.0.1", resolve));
    forwarder.port = forwarder.server.address().port;
    return forwarder;
  }

  constructor(targetPort) {
    this.targetPort = targetPort;
    this.sockets = new Set();
    this.server = net.createServer((client) => {
      const upstream = net.connect(this.targetPort, "127.0.0.1");
      for (const socket of [client, upstream]) {
        this.sockets.add(socket);
        socket.on("error", () => {});
        socket.on("close", () => {
          this.sockets.delete(socket);
          client.destroy();
          upstream.destroy();
        });
      }
      client.pipe(upstream).pipe(client);
    });
  }

  moveTo(port) {
    this.targetPort = port;
    for (const socket of this.sockets) socket.destroy();
  }

  async stop() {
    for (const socket of this.sockets) socket.destroy();
    await new Promise((resolve) => this.server.close(resolve));
  }
}

const FAST_SYNC = ["--repl-diskless-sync-delay", "0"];

async function replicaOf(primary) {
  const replica = await Server.start({ module: false, args: ["--replicaof", "127.0.0.1", String(primary.port)] });
  await waitUntil(async () => (await rawCommand(replica.port, "INFO replication")).includes("master_link_status:up"), 20_000, "the replica's sync");
  return replica;
}

const replOffset = async (port) => Number((await rawCommand(port, "INFO replication")).match(/master_repl_offset:(\d+)/)[1]);

/**
 * A primary (with or without the module), its replica without it, and a `kind` client reaching the primary through
 * a Forwarder; `failOver()` promotes the replica once it has everything the primary wrote (WAIT on another
 * connection would not wait for the client's writes), stops the primary, moves the address to the new one, and
 * waits for the client to reconnect (a command written before the client sees its socket close fails as a reset:
 * the failure table's row, not these tests').
 */
async function startFailover(kind, module, cleanups) {
  const primary = await Server.start({ module, args: FAST_SYNC });
  const replica = await replicaOf(primary);
  const forwarder = await Forwarder.start(primary.port);
  cleanups.push(() => replica.stop(), () => primary.stop(), () => forwarder.stop());
  const conn = await connect(kind, { port: forwarder.port, url: `redis://127.0.0.1:${forwarder.port}` });
  cleanups.push(() => conn.close());
  const failOver = async () => {
    const written = await replOffset(primary.port);
    await waitUntil(async () => (await replOffset(replica.port)) >= written, 5000, "the replica to catch up");
    assert.equal(await rawCommand(replica.port, "REPLICAOF NO ONE"), "+OK\r\n");
    await primary.stop();
    forwarder.moveTo(replica.port);
    await waitUntil(() => send(conn, ["PING"]).then(() => true, () => false), 10_000, "the client to reconnect");
  };
  /** The address moves to `server` (a failback), once the client has reconnected. */
  const moveTo = async (server) => {
    forwarder.moveTo(server.port);
    await waitUntil(() => send(conn, ["PING"]).then(() => true, () => false), 10_000, "the client to reconnect");
  };
  return { conn, failOver, moveTo };
}

for (const kind of CLIENT_KINDS) {
  describe(`backends through ${kind}`, () => {
    const cleanups = [];
    after(async () => {
      for (const cleanup of cleanups.reverse()) await cleanup();
    });
    /** A fresh server without the module (no library, no cached script) and a client on it. */
    async function fresh({ args = [], user } = {}) {
      const server = await Server.start({ module: false, args });
      cleanups.push(() => server.stop());
      if (user) {
        assert.equal(await rawCommand(server.port, `ACL SETUSER tb on >pw ~* &* +@all ${user}`), "+OK\r\n");
      }
      const conn = await connect(kind, server, user ? { username: "tb", password: "pw" } : {});
      cleanups.push(() => conn.close());
      return { server, conn };
    }

    test("the first call on an empty server loads the library, and says so once", async () => {
      const { server, conn } = await fresh();
      const { lines, logger } = recorder();
      const tb = new TbClient(conn.redis, { logger });
      const key = freshKey("first");
      assert.equal((await tb.acquire(key, 0.01, 20)).remaining, 19);
      assert.equal((await tb.acquire(key, 0.01, 20, 0)).remaining, 19);
      assert.equal(tb.backendInUse, WITHOUT_MODULE);
      if (FUNCTIONS) {
        assert.deepEqual(await libraries(server.port), [LIBRARY]);
        assert.equal(await calls(server.port, "function|load"), 1);
      }
      assert.match(lines[0].message, /does not know TB\.ACQUIRE/);
      assert.equal(lines.length, FUNCTIONS ? 1 : 2); // 6.2: no FCALL either
      assert.ok(lines.every((line) => line.level === "info"), "a first detection is no failover");
    });

    test("once the backend is known, each call is one command: no load, no detection", async () => {
      const { server, conn } = await fresh();
      const tb = new TbClient(conn.redis);
      const key = freshKey("steady");
      await tb.acquire(key, 1, 5);
      const counted = ["fcall", "function|load", "evalsha", "eval", "script|load", "command"];
      const before = await Promise.all(counted.map((command) => calls(server.port, command)));
      for (let i = 0; i < 3; i++) await tb.acquire(key, 1, 5);
      const after = await Promise.all(counted.map((command) => calls(server.port, command)));
      const used = FUNCTIONS ? "fcall" : "evalsha";
      assert.deepEqual(after.map((n, i) => n - before[i]), counted.map((command) => (command === used ? 3 : 0)));
    });

    test("FUNCTION FLUSH mid-run costs one reload, and the bucket is kept", { skip: !FUNCTIONS && "no Redis Functions" }, async () => {
      const { server, conn } = await fresh();
      const tb = new TbClient(conn.redis);
      const key = freshKey("flush");
      await tb.acquire(key, 0.01, 5, 2);
      await send(conn, ["FUNCTION", "FLUSH"]);
      assert.equal((await tb.acquire(key, 0.01, 5, 2)).remaining, 1);
      assert.equal(await calls(server.port, "function|load"), 2);
      assert.equal(tb.backendInUse, "function");
    });

    for (const refused of ["-function", "-fcall"]) {
      test(`an ACL user without ${refused.slice(1).toUpperCase()} falls back to the script`, { skip: !FUNCTIONS && "no Redis Functions" }, async () => {
        const { conn } = await fresh({ user: refused });
        const { lines, logger } = recorder();
        const tb = new TbClient(conn.redis, { logger });
        const key = freshKey("acl");
        assert.equal((await tb.acquire(key, 0.01, 20)).remaining, 19);
        assert.equal((await tb.acquire(key, 0.01, 20)).remaining, 18);
        assert.equal(tb.backendInUse, "script");
        assert.ok(lines.some((line) => /Redis Functions are unavailable \(NOPERM .*no permissions to run the/.test(line.message)), JSON.stringify(lines));
      });
    }

    test("a library the server refuses is no outage: the calls go to the script, and the log says why", { skip: !FUNCTIONS && "no Redis Functions" }, async (t) => {
      const { conn } = await fresh();
      t.mock.method(script, "library", () => `#!lua name=${LIBRARY}\nthis is not Lua`);
      const { lines, logger } = recorder();
      const tb = new TbClient(conn.redis, { logger });
      assert.equal((await tb.acquire(freshKey("refused"), 10, 20)).remaining, 19);
      assert.equal(tb.backendInUse, "script");
      assert.match(lines.at(-1).message, /the server refused the library \(ERR Error compiling function/);
    });

    test("an ACL user without FUNCTION runs a library an administrator loaded", { skip: !FUNCTIONS && "no Redis Functions" }, async () => {
      const { server, conn } = await fresh({ user: "-function" });
      const admin = await connect(kind, server);
      cleanups.push(() => admin.close());
      assert.equal(await send(admin, ["FUNCTION", "LOAD", luaScript.library()]), LIBRARY);
      const tb = new TbClient(conn.redis);
      assert.equal((await tb.acquire(freshKey("preloaded"), 10, 20)).remaining, 19);
      assert.equal(tb.backendInUse, "function");
    });

    test("backend 'function' or 'script' is kept, never switched", async () => {
      const { conn } = await fresh();
      for (const backend of ["function", "script"]) {
        const tb = new TbClient(conn.redis, { backend });
        if (backend === "function" && !FUNCTIONS) {
          await assert.rejects(tb.acquire(freshKey("forced"), 1, 5), /unknown command/);
          continue;
        }
        assert.equal((await tb.acquire(freshKey("forced"), 1, 5)).remaining, 4);
        assert.equal(tb.backendInUse, backend);
      }
    });

    test("after a failover to a primary without the module, the client switches, warns once and retries", async () => {
      const { conn, failOver } = await startFailover(kind, true, cleanups);
      const { lines, logger } = recorder();
      const tb = new TbClient(conn.redis, { logger });
      const key = freshKey("failover");
      assert.equal((await tb.acquire(key, 0.01, 10, 4)).remaining, 6);
      assert.equal(tb.backendInUse, "module");
      await failOver();
      assert.equal((await tb.acquire(key, 0.01, 10, 4)).remaining, 2); // no error, and the replicated bucket went on
      assert.equal(tb.backendInUse, WITHOUT_MODULE);
      assert.equal((await tb.acquire(key, 0.01, 10, 4)).allowed, false);
      const warnings = lines.filter((line) => line.level === "warn");
      assert.equal(warnings.length, 1, JSON.stringify(lines));
      assert.match(warnings[0].message, /does not know TB\.ACQUIRE \(ERR unknown command .TB\.ACQUIRE.\).*instead of the redis-tb module/);
      assert.ok(!warnings[0].message.includes(key), "no arguments, so no identities, in the log");
    });

    test("a failback to a primary with the module brings the calls back to it, logged once", async (t) => {
      const saved = TbClient.moduleRetryMs;
      TbClient.moduleRetryMs = 0; // one call a minute tries the module again; here every call
      t.after(() => (TbClient.moduleRetryMs = saved));
      const { conn, failOver, moveTo } = await startFailover(kind, true, cleanups);
      const { lines, logger } = recorder();
      const tb = new TbClient(conn.redis, { logger });
      const key = freshKey("failback");
      await tb.acquire(key, 0.01, 10, 4);
      await failOver();
      assert.equal((await tb.acquire(key, 0.01, 10, 4)).remaining, 2);
      assert.equal((await tb.acquire(key, 0.01, 10, 1)).remaining, 1); // tried the module, stayed
      assert.equal(tb.backendInUse, WITHOUT_MODULE);
      const back = await Server.start({ module: true });
      cleanups.push(() => back.stop());
      await moveTo(back);
      assert.equal((await tb.acquire(key, 0.01, 10, 4)).remaining, 6); // a new primary: its own (empty) bucket
      assert.equal(tb.backendInUse, "module");
      const again = lines.filter((line) => /answers again/.test(line.message));
      assert.deepEqual(again.map((line) => line.level), ["warn"]);
    });

    test("a promoted replica without the module serves the next call", async () => {
      const { conn, failOver } = await startFailover(kind, false, cleanups);
      const tb = new TbClient(conn.redis);
      const key = freshKey("promoted");
      assert.equal((await tb.acquire(key, 0.01, 10, 4)).remaining, 6);
      await failOver();
      assert.equal((await tb.acquire(key, 0.01, 10, 4)).remaining, 2);
      assert.equal(tb.backendInUse, WITHOUT_MODULE);
    });

    test("by default a warning goes to process.emitWarning, code REDIS_TB_BACKEND", async () => {
      const { conn } = await fresh({ user: "-time" });
      const warned = new Promise((resolve) => {
        const listener = (warning) => {
          if (warning.code !== "REDIS_TB_BACKEND") return;
          process.off("warning", listener);
          resolve(warning.message);
        };
        process.on("warning", listener);
      });
      await new TbClient(conn.redis).acquire(freshKey("default-logger"), 1, 5);
      assert.match(await warned, /refuses TIME inside scripts/);
    });

    // TIME refused inside scripts: the caller's clock, and the bound burst + rate * (t + skew).
    for (const [how, backend] of [["acl", "auto"], ["renamed", "auto"], ["renamed", "script"]]) {
      test(`TIME refused (${how}), backend ${backend}: two callers 1 s apart stay within burst + rate * (t + skew)`, async () => {
        const { conn } = how === "acl" ? await fresh({ user: "-time" }) : await fresh({ args: ["--rename-command", "TIME", "TB_TEST_TIME"] });
        await assert.rejects(send(conn, ["EVAL", "return redis.call('TIME')", "0"]), (error) => isTimeRefused(error) && !isUnknownCommand(error));
        const [rate, burst, skewUs, stepUs, steps] = [10, 20, 1_000_000, 50_000, 40];
        let virtualUs = Date.now() * 1000; // near the server's clock, so the bucket's expiry is a real one
        const { lines, logger } = recorder();
        const early = new TbClient(conn.redis, { backend, logger, nowUs: () => virtualUs });
        const late = new TbClient(conn.redis, { backend, logger, nowUs: () => virtualUs + skewUs });
        const key = freshKey("skew");
        const startUs = virtualUs;
        let allowed = 0;
        for (let step = 0; step <= steps; step++) {
          for (const caller of [early, late]) {
            while ((await caller.acquire(key, rate, burst)).allowed) allowed += 1;
          }
          virtualUs += stepUs;
        }
        const tS = (virtualUs - stepUs - startUs) / 1e6;
        assert.ok(allowed <= burst + rate * (tS + skewUs / 1e6), `${allowed} allowed`);
        assert.ok(allowed >= burst + rate * tS, `${allowed} allowed: the callers' clocks drove the refill`);
        const stored = await send(conn, ["HGET", key, "ts"]);
        assert.equal(Number(stored), virtualUs - stepUs + skewUs);
        const timeLines = lines.filter((line) => /refuses TIME/.test(line.message));
        assert.equal(timeLines.length, 2); // once per client
        assert.ok(timeLines.every((line) => isTimeRefused(new Error(line.message))), "each says why");
      });
    }
  });
}

describe("cluster without the module", { skip: !FUNCTIONS && "no Redis Functions" }, () => {
  let cluster;
  before(async () => {
    cluster = await Cluster.start({ module: false });
  });
  after(async () => {
    await cluster?.stop();
  });

  // The first kind's client loads the library on the primaries; the second finds it there. A FUNCTION FLUSH on one
  // primary then costs that primary one reload, whichever client meets it.
  for (const kind of CLIENT_KINDS) {
    test(`${kind}: each primary has the library after its first call; a FUNCTION FLUSH on one costs one reload there`, async () => {
      const conn = await connectCluster(kind, cluster);
      try {
        const tb = new TbClient(conn.redis);
        const keys = Array.from({ length: 30 }, (_, i) => `{n${i}}:${freshKey("shard")}`); // tags on all three shards
        for (const key of keys) assert.equal((await tb.acquire(key, 0.01, 20, 5)).remaining, 15);
        assert.equal(tb.backendInUse, "function");
        const loads = [];
        for (const node of cluster.nodes) {
          assert.deepEqual(await libraries(node.port), [LIBRARY]);
          loads.push(await calls(node.port, "function|load"));
        }
        await rawCommand(cluster.nodes[1].port, "FUNCTION FLUSH");
        for (const key of keys) assert.equal((await tb.acquire(key, 0.01, 20, 5)).remaining, 10);
        const after = await Promise.all(cluster.nodes.map((node) => calls(node.port, "function|load")));
        assert.equal(after[1], loads[1] + 1);
        // node-redis sends FUNCTION LOAD to every primary (its command policy for it), where the others answer
        // that the library exists; ioredis sends it to the key's node only.
        for (const i of [0, 2]) assert.equal(after[i], loads[i] + (kind === "node-redis" ? 1 : 0));
      } finally {
        await conn.close();
      }
    });
  }
});

test("the classifiers agree with the shared fixture (fixtures/backends.json)", () => {
  const { cases } = JSON.parse(fs.readFileSync(path.join(REPOSITORY, "fixtures", "backends.json"), "utf8"));
  for (const entry of cases) {
    const error = new Error(entry.reply);
    assert.equal(backendErrorClass(error), entry.class, JSON.stringify(entry));
    // A server without the command has no FCALL either.
    if (entry.class === "unknown-command") assert.ok(isFunctionsUnavailable(error), JSON.stringify(entry));
  }
});
