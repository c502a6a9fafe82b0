// Spawned servers for the tests: a private redis-server (or a 3-primary cluster) on free loopback ports, with or
// without the module, stopped by PID. Binaries are absolute paths, never looked up on the PATH:
//   REDIS_SERVER  default /usr/bin/redis-server       REDIS_CLI  default /usr/bin/redis-cli
//   TB_MODULE     default <repository>/target/release/libredis_tb.so (what `make test` builds)
// Tests never touch port 6379 or a server they did not start.
import assert from "node:assert/strict";
import { spawn, execFile, execFileSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

export const REPOSITORY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
export const SERVER = process.env.REDIS_SERVER || "/usr/bin/redis-server";
export const CLI = process.env.REDIS_CLI || "/usr/bin/redis-cli";
export const MODULE = process.env.TB_MODULE || path.join(REPOSITORY, "target", "release", "libredis_tb.so");

/** [major, minor] of the server binary. */
export const SERVER_VERSION = execFileSync(SERVER, ["--version"], { encoding: "utf8" }).match(/v=(\d+)\.(\d+)/).slice(1, 3).map(Number);
/** What serves the calls on a server without the module: the function library where the server has Redis Functions
 * (Redis 7.0+, Valkey), else the script (Redis 6.2). */
export const WITHOUT_MODULE = SERVER_VERSION[0] >= 7 ? "function" : "script";

const STARTUP_DEADLINE_MS = 20_000;
const STARTUP_ATTEMPTS = 5;

/** The ports `freePort` has handed out in this process: the OS may give a released port again. */
const handedOut = new Set();

/**
 * A port the OS just gave us (bound and released), never one handed out before in this process, with port + 10000
 * free too when `withBus` (a cluster node).
 */
async function freePort(withBus) {
  for (;;) {
    const port = await new Promise((resolve, reject) => {
      const listener = net.createServer();
      listener.once("error", reject);
      listener.listen(0, "127.0.0.1", () => {
        const { port: given } = listener.address();
        listener.close(() => resolve(given));
      });
    });
    if (handedOut.has(port)) continue;
    if (!withBus) {
      handedOut.add(port);
      return port;
    }
    const bus = port + 10000;
    if (bus < 65536 && !handedOut.has(bus) && (await portIsFree(bus))) {
      handedOut.add(port).add(bus);
      return port;
    }
  }
}

function portIsFree(port) {
  return new Promise((resolve) => {
    const listener = net.createServer();
    listener.once("error", () => resolve(false));
    listener.listen(port, "127.0.0.1", () => listener.close(() => resolve(true)));
  });
}

/**
 * Whether the server on `port` is the process `pid` and ready: it answers PING (not LOADING), and INFO gives `pid`
 * as its process_id. A released port can still be taken by another process's server before ours binds it; ours
 * then exits, and a check of PING alone would take the other for ours.
 */
function answersAs(port, pid, deadlineMs) {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    let text = "";
    const done = (answer) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(answer);
    };
    const timer = setTimeout(() => done(false), deadlineMs);
    socket.on("connect", () => socket.write("PING\r\nINFO server\r\n"));
    socket.on("data", (chunk) => {
      text += chunk;
      if (text.includes("\r\n") && !text.startsWith("+PONG\r\n")) return done(false);
      const found = /\r\nprocess_id:(\d+)\r\n/.exec(text);
      if (found) done(Number(found[1]) === pid);
    });
    socket.on("error", () => done(false));
    socket.on("close", () => done(false));
  });
}

/** Sends one inline command over a fresh socket and resolves with the raw reply text (no client library). */
export function rawCommand(port, line, deadlineMs = 2000) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    let text = "";
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error("no reply"));
    }, deadlineMs);
    socket.on("connect", () => socket.write(`${line}\r\n`));
    socket.on("data", (chunk) => {
      text += chunk;
      if (text.endsWith("\r\n")) {
        clearTimeout(timer);
        socket.end();
        resolve(text);
      }
    });
    socket.on("error", (error) => {
      clearTimeout(timer);
      reject(error);
    });
  });
}

export class Server {
  /** Starts a server: `module` false for one without the module; `args` extra `--name value` arguments. */
  static async start({ module = true, args = [], clusterBus = false, env = {} } = {}) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "redis-tb-node-"));
    let log = "";
    for (let attempt = 0; attempt < STARTUP_ATTEMPTS; attempt++) {
      const port = await freePort(clusterBus);
      const argv = ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
      argv.push("--dir", dir, "--logfile", "server.log", ...args);
      if (module) argv.push("--loadmodule", MODULE);
      const child = spawn(SERVER, argv, { stdio: "ignore", env: { ...process.env, ...env } });
      const server = new Server(child, port, dir, module);
      server.argv = argv;
      server.env = env;
      if (await server._ready()) return server;
      log = server.log();
      await server.stop({ keepDir: true });
    }
    throw new Error(`${SERVER} did not start in ${STARTUP_ATTEMPTS} attempts; last log:\n${log}`);
  }

  constructor(child, port, dir, module) {
    this.port = port;
    this.dir = dir;
    this.module = module;
    this.url = `redis://127.0.0.1:${port}`;
    this._adopt(child);
  }

  _adopt(child) {
    this.child = child;
    this.exited = new Promise((resolve) => child.once("exit", resolve));
  }

  /** Starts the exited server again with its port and directory (a cluster node keeps its nodes.conf). */
  async restart() {
    assert.ok(this.child.exitCode !== null || this.child.signalCode !== null, "the server still runs");
    this._adopt(spawn(SERVER, this.argv, { stdio: "ignore", env: { ...process.env, ...this.env } }));
    if (!(await this._ready())) throw new Error(`${SERVER} did not start again; log:\n${this.log()}`);
  }

  async _ready() {
    const deadline = Date.now() + STARTUP_DEADLINE_MS;
    let gone = false;
    this.exited.then(() => (gone = true));
    while (Date.now() < deadline && !gone) {
      if (await answersAs(this.port, this.child.pid, 500)) return true;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    return false;
  }

  log() {
    try {
      return fs.readFileSync(path.join(this.dir, "server.log"), "utf8");
    } catch {
      return "(no log)";
    }
  }

  /** Kills the process (by its PID), waits for it, and removes its directory. */
  async stop({ keepDir = false } = {}) {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill("SIGKILL");
    await this.exited;
    if (!keepDir) fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * A 3-primary cluster, each primary with `replicas` replicas (in sync once started): `nodes[0..2]` are the primaries.
 * Each node with or without the module (`replicaModule`, where given, for the replicas); `args` go to every node.
 */
export class Cluster {
  static async start({ module = true, replicas = 0, args = [], replicaModule = module } = {}) {
    const nodeArgs = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", ...args];
    const nodes = [];
    try {
      for (let i = 0; i < 3 * (1 + replicas); i++) {
        nodes.push(await Server.start({ module: i < 3 ? module : replicaModule, args: nodeArgs, clusterBus: true }));
      }
      const addresses = nodes.map((node) => `127.0.0.1:${node.port}`);
      await promisify(execFile)(CLI, ["--cluster", "create", ...addresses, "--cluster-replicas", String(replicas), "--cluster-yes"]);
      for (const [index, node] of nodes.entries()) {
        await waitUntil(async () => (await rawCommand(node.port, "CLUSTER INFO")).includes("cluster_state:ok"), 30_000);
        const role = index < 3 ? "role:master" : "master_link_status:up";
        await waitUntil(async () => (await rawCommand(node.port, "INFO replication")).includes(role), 30_000, `${role} on node ${index}`);
        // A primary ignores CLUSTER FAILOVER from a replica it does not know yet (Redis 6.2 learns it by gossip,
        // seconds after the replica started syncing): every node must know every replica.
        const knownReplicas = async () => (await rawCommand(node.port, "CLUSTER NODES")).split("\n").filter((line) => (line.split(" ")[2] ?? "").split(",").includes("slave")).length;
        await waitUntil(async () => (await knownReplicas()) === 3 * replicas, 30_000, `node ${index} knows every replica`);
      }
    } catch (error) {
      await Promise.all(nodes.map((node) => node.stop()));
      throw error;
    }
    return new Cluster(nodes);
  }

  constructor(nodes) {
    this.nodes = nodes;
  }

  async stop() {
    await Promise.all(this.nodes.map((node) => node.stop()));
  }
}

/** Polls `condition` until it holds, or fails after `deadlineMs`. */
export async function waitUntil(condition, deadlineMs = 5000, what = "condition") {
  const deadline = Date.now() + deadlineMs;
  for (;;) {
    if (await condition()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** A key no other test (or earlier run) uses. */
let counter = 0;
export function freshKey(label = "k") {
  counter += 1;
  return `test:${label}:${process.pid}:${Date.now()}:${counter}`;
}
