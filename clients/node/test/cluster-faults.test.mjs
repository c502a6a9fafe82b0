// Unplanned and planned failovers of a 3 primaries + 3 replicas cluster under load through Express (docs/clients.md,
// "When Redis fails"): one primary is killed, or stopped and started again, or hands its shard to a replica without
// the module. Every identity must stay within burst + rate * t plus the calls in flight when the fault begins,
// however long the shard is gone; before the in-memory buckets continued from Redis's last answer and charged back
// what they admitted, such a fault handed every identity 3-4 fresh bursts. Each test starts its own cluster
// (cluster-node-timeout 1000 ms: a replica takes over within a few seconds), so the scenarios are independent.
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

async function takesOver(replica) {
  await waitUntil(
    async () => {
      try {
        return (await replication(replica)).includes("role:master") && (await rawCommand(replica.port, "CLUSTER INFO")).includes("cluster_state:ok");
      } catch {
        return false;
      }
    },
    DEADLINE_MS,
    "the replica takes over",
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
    this.records = new Map(Array.from({ length: IDENTITIES }, (_, n) => [`u${n}`, { statuses: [], first: Infinity, last: 0 }]));
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
        const response = await fetch(base, { headers: { "x-user": identity } });
        await response.arrayBuffer();
        const record = this.records.get(identity);
        record.statuses.push(response.status);
        record.first = Math.min(record.first, began);
        record.last = performance.now();
      }
    }
  }

  async runFor(ms) {
    await sleep(ms);
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
   * identities on the faulted shard were among them, and most identities' load passed their limit (429s), so a
   * fresh burst shows.
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
    const refused = [...this.records.values()].filter((record) => record.statuses.includes(429)).length;
    assert.ok(refused >= IDENTITIES / 2, `only ${refused} identities met their limit: the load was too light to show a fresh burst`);
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
  await load.runFor(2000); // every identity's burst spent: Redis's buckets are low when the fault begins
  return { cluster, primary, replica, load };
}

for (const kind of CLIENT_KINDS) {
test(`Express over ${kind}: a killed primary (SIGKILL) and its replica taking over keep every identity within burst + rate * t`, async (t) => {
  const { primary, replica, load } = await scenario(t, kind);
  primary.child.kill("SIGKILL");
  await takesOver(replica);
  await reached(replica);
  await load.runFor(2000);
  await load.stop();
  await load.assertBoundKept(replica);
});

test(`Express over ${kind}: a primary stopped with SHUTDOWN NOSAVE and started again as a replica keeps every identity within burst + rate * t`, async (t) => {
  const { cluster, primary, replica, load } = await scenario(t, kind);
  await rawCommand(primary.port, "SHUTDOWN NOSAVE").catch(() => {}); // it exits without a reply
  await primary.exited;
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
  await load.runFor(2000);
  await load.stop();
  await load.assertBoundKept(replica);
});

test(`Express over ${kind}: a failover to a replica without the module switches to the function library, which finds the module's buckets`, async (t) => {
  const { replica, load } = await scenario(t, kind, { replicaModule: false });
  assert.equal(replica.module, false);
  const tb = load.middleware.limiter.client;
  assert.equal(tb.backendInUse, "module");
  assert.equal(await rawCommand(replica.port, "CLUSTER FAILOVER"), "+OK\r\n");
  await takesOver(replica);
  await waitUntil(() => tb.backendInUse !== "module", DEADLINE_MS, "the client leaves the module");
  await reached(replica);
  await load.runFor(2000);
  await load.stop();
  await load.assertBoundKept(replica);
  assert.ok(["function", "script"].includes(tb.backendInUse), tb.backendInUse);
});
}
