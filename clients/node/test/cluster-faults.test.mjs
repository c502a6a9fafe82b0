// Unplanned and planned failovers of a 3 primaries + 3 replicas cluster under load through Express (docs/clients.md,
// "When Redis fails"): one primary is killed, or stopped and started again (after its replica took over, or before),
// or hands its shard to a replica without the module. Every identity must stay within burst + rate * t plus the
// calls in flight when the fault begins, however long the shard is gone: the in-memory buckets continue from Redis's
// last answer, and Redis is brought down to them when it answers again, so no fault hands out a fresh burst. Each
// test starts its own cluster (cluster-node-timeout 1000 ms: a replica takes over within a few seconds), so the
// scenarios are independent.
import assert from "node:assert/strict";
import http from "node:http";
import { test } from "node:test";

import express from "express";

import { rateLimit } from "../src/index.mjs";
import { CLIENT_KINDS, connectCluster } from "./clients.mjs";
import { Cluster, rawCommand, waitUntil } from "./harness.mjs";
import { closeServer, listen } from "./http-helpers.mjs";

const RATE = 5;
const BURST = 10;
const IDENTITIES = 20;
const PER_IDENTITY_RPS = 10; // twice the rate: 200 requests/s
const WORKERS = IDENTITIES; // one per identity: one call of it in flight at a time, and a stalled call stalls no other identity
// One call per identity in flight when the fault begins (Redis may have taken it while the middleware, given no
// reply, admits it in memory), and one answered by the primary but lost with it before it reached the replica.
const IN_FLIGHT = 2;
const NODE_ARGS = ["--cluster-node-timeout", "1000", "--repl-diskless-sync-delay", "0"];
const DEADLINE_MS = 30_000;
const ANSWER_MS = 10_000; // a request's answer: the middleware's deadline is 1 s
const SILENT = { warn() {}, error() {} };

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function replication(node) {
  return rawCommand(node.port, "INFO replication");
}

/** The replica of `primary` among the cluster's nodes. */
async function replicaOf(cluster, primary) {
  const found = [];
  for (const node of cluster.nodes) {
    if (node === primary) continue;
    try {
      if ((await replication(node)).includes(`master_port:${primary.port}\r\n`)) found.push(node);
    } catch {
      // a node that is down replicates nothing
    }
  }
  assert.equal(found.length, 1, `replicas of ${primary.port}`);
  return found[0];
}

/** Whether `node` serves `key` (the others answer MOVED). */
async function serves(node, key) {
  return (await rawCommand(node.port, `EXISTS ${key}`)).startsWith(":");
}

/** SHUTDOWN NOSAVE, and waits until `node` exits (it answers nothing). */
async function shutDown(node) {
  rawCommand(node.port, "SHUTDOWN NOSAVE").catch(() => {});
  const exited = () => node.child.exitCode !== null || node.child.signalCode !== null;
  await waitUntil(exited, DEADLINE_MS, `${node.port} exits after SHUTDOWN NOSAVE`);
}

/** Waits until `node` is a primary and finds the cluster serving every slot. */
async function takesOver(node) {
  await waitUntil(
    async () => {
      try {
        return (await replication(node)).includes("role:master") && (await rawCommand(node.port, "CLUSTER INFO")).includes("cluster_state:ok");
      } catch {
        return false;
      }
    },
    DEADLINE_MS,
    `${node.port} serves its shard`,
  );
}

/** The limiter calls `node` has served: TB.* commands, FCALL, EVAL and EVALSHA (INFO commandstats). */
async function limiterCalls(node) {
  const info = await rawCommand(node.port, "INFO commandstats");
  let calls = 0;
  for (const match of info.matchAll(/cmdstat_(?:tb\.\w+|fcall|eval|evalsha):calls=(\d+)/g)) calls += Number(match[1]);
  return calls;
}

/** Waits until the middleware's calls reach `primary`, the shard's new primary: the client found it. */
async function reached(primary) {
  await waitUntil(async () => (await limiterCalls(primary)) > 0, DEADLINE_MS, "the middleware's calls reach the new primary");
}

/** Requests of IDENTITIES identities at PER_IDENTITY_RPS each through an Express app over ioredis's Cluster. */
class Load {
  static async start(cluster, kind) {
    const conn = await connectCluster(kind, cluster);
    const app = express();
    const middleware = rateLimit({ client: conn.redis, prefix: "e:", limits: { name: "api", rate: RATE, burst: BURST }, key: (req) => req.get("x-user"), logger: SILENT });
    app.use(middleware);
    app.get("/", (req, res) => res.send("ok"));
    const server = http.createServer(app);
    const base = await listen(server);
    return new Load(conn, middleware, server, base);
  }

  constructor(conn, middleware, server, base) {
    this.conn = conn;
    this.middleware = middleware;
    this.server = server;
    this.records = new Map(Array.from({ length: IDENTITIES }, (_, n) => [`u${n}`, { statuses: [], first: Infinity, last: 0, refused: -Infinity }]));
    this.stopping = false;
    this.workers = Array.from({ length: WORKERS }, (_, worker) => this._worker(worker, base));
  }

  async _worker(worker, base) {
    const share = [...this.records.keys()].filter((_, n) => n % WORKERS === worker);
    const interval = 1000 / (PER_IDENTITY_RPS * share.length);
    let due = performance.now() + Math.random() * interval;
    while (!this.stopping) {
      for (const identity of share) {
        const now = performance.now();
        due = Math.max(due + interval, now - 500); // a stalled worker catches up for at most half a second
        await sleep(Math.max(0, due - now));
        const began = performance.now();
        // A request the middleware never answers fails the test (fetch would wait 300 s for the headers).
        const response = await fetch(base, { headers: { "x-user": identity }, signal: AbortSignal.timeout(ANSWER_MS) });
        await response.arrayBuffer();
        const record = this.records.get(identity);
        record.statuses.push(response.status);
        record.first = Math.min(record.first, began);
        record.last = performance.now();
        if (response.status === 429) record.refused = began;
      }
    }
  }

  async runFor(ms) {
    await sleep(ms);
  }

  /**
   * Runs the load at least 2 s more, until most identities were refused (429) in calls begun from now: their
   * tokens were all spent after the fault, so a fresh burst would have been admitted and counted.
   */
  async runUntilLimited() {
    const since = performance.now();
    const limited = () => [...this.records.values()].filter((record) => record.refused >= since).length;
    await sleep(2000);
    await waitUntil(() => limited() >= IDENTITIES / 2, DEADLINE_MS, "most identities meet their limit after the fault");
  }

  async stop() {
    if (this.stopped) return;
    this.stopped = true;
    this.stopping = true;
    await Promise.all(this.workers);
    await closeServer(this.server);
    await this.conn.close();
  }

  /**
   * Every identity admitted at most burst + rate * t + IN_FLIGHT and was never answered otherwise than 200 or 429;
   * identities on the faulted shard were among them.
   */
  async assertBoundKept(faulted) {
    let onFaulted = 0;
    for (const identity of this.records.keys()) if (await serves(faulted, `e:{${identity}}:api`)) onFaulted += 1;
    assert.ok(onFaulted > 0, "no identity on the faulted shard");
    const over = [];
    for (const [identity, record] of this.records) {
      const admitted = record.statuses.filter((status) => status === 200).length;
      const seconds = (record.last - record.first) / 1000;
      const bound = BURST + RATE * seconds + IN_FLIGHT;
      const shown = `${identity}: ${admitted} admitted of ${record.statuses.length} in ${seconds.toFixed(1)} s`;
      if (admitted > bound) over.push(`${shown}, bound ${bound.toFixed(1)}`);
      assert.ok(record.statuses.every((status) => status === 200 || status === 429), shown);
    }
    assert.deepEqual(over, []);
  }
}

/** A cluster and its load for one test, stopped at its end whatever happened. */
async function scenario(t, kind, clusterOptions) {
  const cluster = await Cluster.start({ module: true, replicas: 1, args: NODE_ARGS, ...clusterOptions });
  t.after(() => cluster.stop());
  const primary = cluster.nodes[0];
  const replica = await replicaOf(cluster, primary);
  const load = await Load.start(cluster, kind);
  t.after(() => load.stop());
  await load.runFor(2000); // Redis's buckets run low before the fault begins
  return { cluster, primary, replica, load };
}

/** One test of `name` per client kind in `kinds`, each with its own cluster. */
function eachKind(kinds, name, body) {
  for (const kind of kinds) test(`Express over ${kind}: ${name}`, (t) => body(t, kind));
}

// Both clients through the unplanned failover and the switch of backend; the stops and restarts through ioredis.
eachKind(CLIENT_KINDS, "a killed primary (SIGKILL) and its replica taking over keep every identity within burst + rate * t", async (t, kind) => {
  const { primary, replica, load } = await scenario(t, kind);
  primary.child.kill("SIGKILL");
  await takesOver(replica);
  await reached(replica);
  await load.runUntilLimited();
  await load.stop();
  await load.assertBoundKept(replica);
});

eachKind(["ioredis"], "a primary stopped with SHUTDOWN NOSAVE and started again as a replica keeps every identity within burst + rate * t", async (t, kind) => {
  const { cluster, primary, replica, load } = await scenario(t, kind);
  await shutDown(primary);
  await takesOver(replica);
  await primary.restart();
  const replicating = async () => {
    try {
      return (await replicaOf(cluster, replica)) === primary && (await replication(primary)).includes("master_link_status:up");
    } catch {
      return false; // not yet known as the new primary's replica
    }
  };
  await waitUntil(replicating, DEADLINE_MS, "the restarted primary replicates the new one");
  await reached(replica);
  await load.runUntilLimited();
  await load.stop();
  await load.assertBoundKept(replica);
});

eachKind(["ioredis"], "a primary stopped with SHUTDOWN NOSAVE and started again before a replica takes over (AOF) keeps its shard, every identity within burst + rate * t", async (t, kind) => {
  const args = [...NODE_ARGS, "--appendonly", "yes", "--cluster-replica-no-failover", "yes"]; // no replica may take over
  const { primary, load } = await scenario(t, kind, { args });
  await shutDown(primary);
  await load.runFor(500); // the shard's calls fail meanwhile
  await primary.restart();
  await takesOver(primary);
  await reached(primary); // a new process: its command counts start at 0
  await load.runUntilLimited();
  await load.stop();
  await load.assertBoundKept(primary);
});

eachKind(CLIENT_KINDS, "a failover to a replica without the module switches to the function library, which finds the module's buckets", async (t, kind) => {
  const { replica, load } = await scenario(t, kind, { replicaModule: false });
  assert.equal(replica.module, false);
  const tb = load.middleware.limiter.client;
  assert.equal(tb.backendInUse, "module");
  assert.equal(await rawCommand(replica.port, "CLUSTER FAILOVER"), "+OK\r\n");
  await takesOver(replica);
  await waitUntil(() => tb.backendInUse !== "module", DEADLINE_MS, "the client leaves the module");
  await reached(replica);
  await load.runUntilLimited();
  await load.stop();
  await load.assertBoundKept(replica);
  assert.ok(["function", "script"].includes(tb.backendInUse), tb.backendInUse);
});
