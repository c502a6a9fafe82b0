// The Redis clients the package accepts, each connected to a spawned server or cluster, with a `close()`.
import { Redis, Cluster as IoCluster } from "ioredis";
import { after, before } from "node:test";
import { createClient, createCluster } from "redis";

import { Server } from "./harness.mjs";

export const CLIENT_KINDS = ["ioredis", "node-redis"];

/** A connected standalone client of `kind` for `server`. */
export async function connect(kind, server, options = {}) {
  if (kind === "ioredis") {
    const redis = new Redis({ host: "127.0.0.1", port: server.port, lazyConnect: true, ...options });
    redis.on("error", () => {});
    await redis.connect();
    return { redis, close: () => redis.disconnect() };
  }
  const redis = createClient({ url: server.url, ...options });
  redis.on("error", () => {});
  await redis.connect();
  return { redis, close: () => redis.destroy() };
}

/** A connected cluster client of `kind` for `cluster`; `credentials`: { username, password } of an ACL user. */
export async function connectCluster(kind, cluster, credentials = {}) {
  const [first] = cluster.nodes;
  if (kind === "ioredis") {
    const redis = new IoCluster([{ host: "127.0.0.1", port: first.port }], { lazyConnect: true, redisOptions: credentials });
    redis.on("error", () => {});
    await redis.connect();
    return { redis, close: () => redis.disconnect() };
  }
  const redis = createCluster({ rootNodes: [{ url: first.url }], defaults: credentials });
  redis.on("error", () => {});
  await redis.connect();
  return { redis, close: () => redis.destroy() };
}

/**
 * A server and a connected client of `kind` for the tests of one suite: started in its `before`, stopped in its
 * `after`. The returned object gains `server` and `conn` once started.
 */
export function suiteServer(kind = "ioredis", serverOptions = {}) {
  const suite = {};
  before(async () => {
    suite.server = await Server.start(serverOptions);
    suite.conn = await connect(kind, suite.server);
  });
  after(async () => {
    await suite.conn?.close();
    await suite.server?.stop();
  });
  return suite;
}
