"use strict";
// The one place that knows which Redis client the package was given (ioredis or node-redis, a Cluster or not) and
// how to use it; every other file asks the object `connect(redis)` returns. `send(key, args)` runs one command on
// the node that owns `key` and resolves with the raw reply, never adding a round trip:
//   ioredis           `call`
//   ioredis Cluster   the node that owns the key's slot, from the slot map the client already holds (ioredis
//                     routes by the keys of commands it knows, and a module command is not one of them, so
//                     `cluster.call` would go to a random node and follow a MOVED). A MOVED from a stale map goes
//                     through `cluster.call`, which follows it and refreshes the map.
//   node-redis        `sendCommand(args)`
//   node-redis Cluster `sendCommand(key, false, args)`, which routes by the key it is given
// The rest: whether the client is closed or ready (`closed`, `ready`), the primaries that hold keys (`primaries`),
// and for a standalone client a connection of the middleware's own (`openOwn`, the deadline rule of lane.cjs).

const { isReplyError } = require("./errors.cjs");

// CRC16-CCITT (XMODEM), the hash of Redis Cluster's key slots.
const CRC16_TABLE = (() => {
  const table = new Uint16Array(256);
  for (let byte = 0; byte < 256; byte++) {
    let crc = byte << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    table[byte] = crc;
  }
  return table;
})();

/** The cluster slot of `key`: the CRC16 of its hash tag (the text inside the first non-empty `{...}`) or of all of it. */
function keySlot(key) {
  let bytes = Buffer.from(key);
  const open = bytes.indexOf(0x7b);
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1);
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  let crc = 0;
  for (const byte of bytes) crc = ((crc << 8) & 0xffff) ^ CRC16_TABLE[((crc >> 8) ^ byte) & 0xff];
  return crc % 16384;
}

function kindOf(redis) {
  if (redis === null || typeof redis !== "object") {
    throw new TypeError("redis-tb: expected an ioredis or node-redis client (or cluster), got " + typeof redis);
  }
  if (redis.isCluster === true && typeof redis.call === "function") return "ioredis-cluster";
  if (typeof redis.call === "function" && typeof redis.sendCommand === "function") return "ioredis";
  if (typeof redis.sendCommand === "function" && Array.isArray(redis.masters)) return "node-redis-cluster";
  if (typeof redis.sendCommand === "function") return "node-redis";
  throw new TypeError(
    "redis-tb: expected an ioredis or node-redis client (or cluster): this object has neither call() nor sendCommand()",
  );
}

function ioredisClusterNode(cluster, key) {
  const owners = cluster.slots[keySlot(key)];
  if (!owners || owners.length === 0) return undefined;
  const primary = owners[0];
  return cluster.nodes("master").find((node) => `${node.options.host}:${node.options.port}` === primary);
}

function isMoved(error) {
  return typeof error?.message === "string" && /^(MOVED|ASK) /.test(error.message);
}

/** How `send(key, args)` reaches the node of `key` through `redis`, a client of `kind`. */
function sender(kind, redis) {
  switch (kind) {
    case "ioredis":
      return (_key, args) => redis.call(...args);
    case "ioredis-cluster":
      return (key, args) => {
        const node = ioredisClusterNode(redis, key);
        // A node still connecting queues the call (ioredis's offline queue); one that has ended is left to the
        // cluster client, which reconnects or redirects.
        if (node === undefined || node.status === "end" || node.status === "close") return redis.call(...args);
        return node.call(...args).catch((error) => {
          if (isMoved(error)) return redis.call(...args);
          throw error;
        });
      };
    case "node-redis":
      return (_key, args) => redis.sendCommand(args);
    case "node-redis-cluster":
      return (key, args) => redis.sendCommand(key, false, args);
  }
}

/**
 * One `send(args)` per primary that holds keys: the server itself, or each primary of a cluster (node-redis's
 * cluster clients of its primaries are opened on demand, hence a promise).
 */
async function primaries(kind, redis) {
  switch (kind) {
    case "ioredis":
      return [(args) => redis.call(...args)];
    case "ioredis-cluster":
      return redis.nodes("master").map((node) => (args) => node.call(...args));
    case "node-redis":
      return [(args) => redis.sendCommand(args)];
    case "node-redis-cluster":
      return Promise.all(
        redis.masters.map(async (master) => {
          const node = await redis.nodeClient(master);
          return (args) => node.sendCommand(args);
        }),
      );
  }
}

/**
 * Whether `redis` would write a command now rather than queue or refuse it; for a node-redis cluster, with `key`,
 * whether the client of that key's slot is ready (rate-limiter-flexible's `rejectIfRedisNotReady` check).
 */
function ready(kind, redis, key) {
  switch (kind) {
    case "ioredis":
    case "ioredis-cluster":
      return redis.status === "ready";
    case "node-redis":
      return typeof redis.isReady === "function" ? redis.isReady() : redis.isReady !== false;
    case "node-redis-cluster": {
      if (redis.isOpen === false) return false;
      if (key === undefined) return true;
      try {
        const node = redis._slots?.getClient?.(key, false);
        return node === undefined || node.isReady === true;
      } catch {
        return false;
      }
    }
  }
}

/**
 * Whether the application's client `redis` is closed, so that its own commands fail at once ("Connection is
 * closed.", ClientClosedError): an ioredis client or cluster that has ended, a node-redis one that is not open.
 */
function closed(kind, redis) {
  return kind.startsWith("ioredis") ? redis.status === "end" : redis.isOpen === false;
}

/**
 * A connection of the middleware's own to the server of `redis`, a standalone client: a duplicate without offline
 * queue, resending or automatic reconnection, connecting within `timeoutMs`. `open()` connects and PINGs;
 * `drop()` resets it (nothing more written or read).
 */
function openOwn(kind, redis, timeoutMs) {
  let own;
  if (kind === "ioredis") {
    own = redis.duplicate({
      lazyConnect: true,
      enableReadyCheck: false, // the probe's PING checks it, and passes on a BUSY or LOADING reply as itself
      enableOfflineQueue: false,
      autoResendUnfulfilledCommands: false,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
      reconnectOnError: () => false,
      connectTimeout: timeoutMs,
    });
  } else if (kind === "node-redis") {
    const socket = { ...redis.options?.socket, reconnectStrategy: false, connectTimeout: timeoutMs };
    own = redis.duplicate({ disableOfflineQueue: true, socket });
  } else {
    throw new TypeError(`redis-tb: a ${kind} client is used as it is, never duplicated`);
  }
  // Every failure reaches the call or the probe that meets it; a refusal while connecting (NOAUTH, WRONGPASS)
  // is kept, since ioredis then rejects connect() with "Connection is closed." only.
  let refusal;
  own.on("error", (error) => {
    if (isReplyError(error)) refusal = error;
  });
  return {
    redis: own,
    async open() {
      try {
        await own.connect();
      } catch (error) {
        throw refusal ?? error;
      }
      if (kind === "ioredis") own.stream?.unref?.();
      else own.unref?.();
      await (kind === "ioredis" ? own.call("PING") : own.sendCommand(["PING"]));
    },
    ready: () => (kind === "ioredis" ? own.status === "ready" : own.isReady !== false),
    onClose: (listener) => own.once("end", listener),
    drop() {
      try {
        if (kind !== "ioredis") {
          if (typeof own.destroy === "function") own.destroy();
          else own.disconnect();
        } else if (own.stream !== undefined && !own.stream.destroyed && own.stream.readyState === "open") {
          // A reset: no FIN, nothing more written or read. (No disconnect() before it: its FIN would leave a
          // shutdown request pending on the socket, which can hold the process at exit.) Without a retry
          // strategy, ioredis then ends the client.
          own.stream.resetAndDestroy();
        } else if (own.status !== "end") {
          own.disconnect();
        }
      } catch {
        // already closed
      }
    },
  };
}

/**
 * The face of `redis`: `{ kind, cluster, send(key, args), closed(), ready(key?), primaries(), openOwn(timeoutMs) }`;
 * `args` are strings, the command name first.
 */
function connect(redis) {
  const kind = kindOf(redis);
  return {
    kind,
    cluster: kind.endsWith("-cluster"),
    send: sender(kind, redis),
    closed: () => closed(kind, redis),
    ready: (key) => ready(kind, redis, key),
    primaries: () => primaries(kind, redis),
    openOwn: (timeoutMs) => openOwn(kind, redis, timeoutMs),
  };
}

module.exports = { connect, keySlot, kindOf };
