// Spawned servers for the tests: a private redis-server (or a 3-primary cluster) on free loopback ports, with or
// without the module, stopped by PID. Binaries are absolute paths, never looked up on the PATH:
//   REDIS_SERVER  default /usr/bin/redis-server       REDIS_CLI  default /usr/bin/redis-cli
//   TB_MODULE     default <repository>/target/release/libredis_tb.so (what `make test` builds)
// Tests never touch port 6379 or a server they did not start.
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

/** A port the OS just gave us (bound and released), with port + 10000 free too when `withBus` (a cluster node). */
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
    if (!withBus) return port;
    if (port + 10000 < 65536 && (await portIsFree(port + 10000))) return port;
  }
}

function portIsFree(port) {
  return new Promise((resolve) => {
    const listener = net.createServer();
    listener.once("error", () => resolve(false));
    listener.listen(port, "127.0.0.1", () => listener.close(() => resolve(true)));
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
      if (await server._ready()) return server;
      log = server.log();
      await server.stop({ keepDir: true });
    }
    throw new Error(`${SERVER} did not start in ${STARTUP_ATTEMPTS} attempts; last log:\n${log}`);
  }

  constructor(child, port, dir, module) {
    this.child = child;
    this.port = port;
    this.dir = dir;
    this.module = module;
    this.url = `redis://127.0.0.1:${port}`;
    this.exited = new Promise((resolve) => child.once("exit", resolve));
  }

  async _ready() {
    const deadline = Date.now() + STARTUP_DEADLINE_MS;
    let gone = false;
    this.exited.then(() => (gone = true));
    while (Date.now() < deadline && !gone) {
      try {
        if ((await rawCommand(this.port, "PING", 500)).startsWith("+PONG")) return true;
      } catch {
        // not listening yet
      }
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

/** A 3-primary cluster (no replicas), each node with or without the module. */
export class Cluster {
  static async start({ module = true } = {}) {
    const args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"];
    const nodes = [];
    try {
      for (let i = 0; i < 3; i++) nodes.push(await Server.start({ module, args, clusterBus: true }));
      const addresses = nodes.map((node) => `127.0.0.1:${node.port}`);
      await promisify(execFile)(CLI, ["--cluster", "create", ...addresses, "--cluster-replicas", "0", "--cluster-yes"]);
      for (const node of nodes) {
        await waitUntil(async () => (await rawCommand(node.port, "CLUSTER INFO")).includes("cluster_state:ok"), 10_000);
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
