"use strict";
// One face over the Redis clients the package accepts: `send(key, args)` runs one command on the node that owns
// `key` and resolves with the raw reply. It owns client detection and cluster routing, and never adds a round trip:
//   ioredis           `call`
//   ioredis Cluster   the node that owns the key's slot, from the slot map the client already holds (ioredis
//                     routes by the keys of commands it knows, and a module command is not one of them, so
//                     `cluster.call` would go to a random node and follow a MOVED). A MOVED from a stale map goes
//                     through `cluster.call`, which follows it and refreshes the map.
//   node-redis        `sendCommand(args)`
//   node-redis Cluster `sendCommand(key, false, args)`, which routes by the key it is given

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

/** `{ kind, send(key, args) }` for `redis`; `args` are strings, the command name first. */
function connect(redis) {
  const kind = kindOf(redis);
  switch (kind) {
    case "ioredis":
      return { kind, send: (_key, args) => redis.call(...args) };
    case "ioredis-cluster":
      return {
        kind,
        send: (key, args) => {
          const node = ioredisClusterNode(redis, key);
          // A node still connecting queues the call (ioredis's offline queue); one that has ended is left to the
          // cluster client, which reconnects or redirects.
          if (node === undefined || node.status === "end" || node.status === "close") return redis.call(...args);
          return node.call(...args).catch((error) => {
            if (isMoved(error)) return redis.call(...args);
            throw error;
          });
        },
      };
    case "node-redis":
      return { kind, send: (_key, args) => redis.sendCommand(args) };
    case "node-redis-cluster":
      return { kind, send: (key, args) => redis.sendCommand(key, false, args) };
  }
}

module.exports = { connect, keySlot, kindOf };
