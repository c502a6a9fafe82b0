// Redis Cluster through both clients' cluster classes, with the module and with the script: each call goes
// straight to the node that owns its key (no MOVED: one round trip), and multi-bucket calls work on buckets that
// share a hash tag.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import http from "node:http";

import express from "express";

import { rateLimit, TbClient } from "../src/index.mjs";
import { keySlot } from "../src/connection.cjs";
import { connectCluster, CLIENT_KINDS } from "./clients.mjs";
import { Cluster, rawCommand, freshKey, WITHOUT_MODULE } from "./harness.mjs";
import { closeServer, listen } from "./http-helpers.mjs";

/** MOVED and ASK replies the nodes have sent so far (INFO errorstats). */
async function redirects(cluster) {
  let total = 0;
  for (const node of cluster.nodes) {
    const info = await rawCommand(node.port, "INFO errorstats");
    for (const match of info.matchAll(/errorstat_(?:MOVED|ASK):count=(\d+)/g)) total += Number(match[1]);
  }
  return total;
}

for (const backend of [{ name: "module", module: true }, { name: WITHOUT_MODULE, module: false }]) {
  describe(`cluster, ${backend.name}`, () => {
    let cluster;
    before(async () => {
      cluster = await Cluster.start({ module: backend.module });
    });
    after(async () => {
      await cluster?.stop();
    });

    test("the package computes a key's slot as the server does (CLUSTER KEYSLOT), hash tags included", async () => {
      for (const key of ["user:42", "foo", "{user:42}:api", "a{}b", "{}x{y}", "x{", "ü:42", freshKey("slot")]) {
        const reply = await rawCommand(cluster.nodes[0].port, `CLUSTER KEYSLOT "${key}"`);
        assert.equal(`:${keySlot(key)}\r\n`, reply, key);
      }
    });

    for (const kind of CLIENT_KINDS) {
      test(`${kind}: every call reaches its key's node directly, on every shard`, async () => {
        const conn = await connectCluster(kind, cluster);
        try {
          const tb = new TbClient(conn.redis);
          assert.equal(tb.clientKind, `${kind}-cluster`);
          const keys = Array.from({ length: 30 }, (_, i) => freshKey(`cluster-${i}`));
          await tb.acquire(keys[0], 1, 3); // the first call may find the backend and the slot map
          const before = await redirects(cluster);
          for (const key of keys) {
            assert.equal((await tb.acquire(key, 1, 3)).allowed, true);
          }
          assert.equal(await redirects(cluster), before, "no MOVED or ASK: one round trip per call");
          assert.equal(tb.backend, backend.name);
          const tag = freshKey("tag");
          const all = await tb.acquireAll(1, [{ key: `{${tag}}:a`, rate: 1, burst: 2 }, { key: `{${tag}}:b`, rate: 1, burst: 3 }]);
          assert.equal(all.allowed, true);
          const refund = await tb.refund(`{${tag}}:a`, 1, 2, 1);
          assert.equal(refund.remaining, 2);
          assert.equal(await tb.reset(`{${tag}}:b`), true);
        } finally {
          await conn.close();
        }
      });

      test(`${kind}: limits of two identities (two slots) go in one call per slot, refunded when one refuses`, async () => {
        const conn = await connectCluster(kind, cluster);
        const errors = [];
        const app = express();
        const prefix = `${freshKey("parts")}:`;
        const userKey = `${prefix}{u1}:user`;
        assert.notEqual(keySlot(userKey), keySlot(`${prefix}{acme}:tenant`), "the two buckets are in two slots");
        const limits = [{ name: "user", rate: 0.001, burst: 5 }, { name: "tenant", rate: 0.001, burst: 2, key: () => "acme" }];
        app.use(rateLimit({ client: conn.redis, prefix, limits, fail: "closed", key: () => "u1", onError: (error) => errors.push(error) }));
        app.get("/", (req, res) => res.send("ok"));
        const server = http.createServer(app);
        const base = await listen(server);
        try {
          const responses = [];
          for (let i = 0; i < 3; i++) responses.push(await fetch(base));
          assert.deepEqual(responses.map((response) => response.status), [200, 200, 429]);
          const refused = responses[2];
          assert.equal((await refused.json()).limit, "tenant");
          assert.equal(refused.headers.get("ratelimit-policy"), '"user";q=5;w=5000, "tenant";q=2;w=2000');
          assert.match(refused.headers.get("ratelimit"), /^"user";r=2;t=\d+, "tenant";r=0;t=\d+$/);
          assert.deepEqual(errors, []);
          // The refused request took nothing: what its user bucket gave was given back (a refund of 0 reads it).
          assert.equal((await new TbClient(conn.redis).refund(userKey, 0.001, 5, 0)).remaining, 3);
        } finally {
          await closeServer(server);
          await conn.close();
        }
      });

      test(`${kind}: a request one part refused stays refused when a refund fails, never the fail mode's`, async () => {
        // An ACL user that may take tokens but never give them back: TB.REFUND is denied, and so is DEL (the
        // script's refund deletes a bucket it fills: the user bucket below, burst 5, after a request of 1).
        const rules = ["+@all", "-del", ...(backend.module ? ["-tb.refund"] : [])].join(" ");
        for (const node of cluster.nodes) assert.equal(await rawCommand(node.port, `ACL SETUSER taker on >pw ~* ${rules}`), "+OK\r\n");
        const admin = await connectCluster(kind, cluster);
        const conn = await connectCluster(kind, cluster, { username: "taker", password: "pw" });
        const warnings = [];
        const errors = [];
        const logger = { warn: (message) => warnings.push(message), error: (message) => errors.push(message) };
        const prefix = `${freshKey("refund")}:`;
        const userKey = `${prefix}{u1}:user`;
        const limits = [{ name: "user", rate: 0.001, burst: 5 }, { name: "tenant", rate: 0.001, burst: 2, key: () => "acme" }];
        const app = express();
        app.use(rateLimit({ client: conn.redis, prefix, limits, key: () => "u1", logger })); // fail "local"
        app.get("/", (req, res) => res.send("ok"));
        const server = http.createServer(app);
        const base = await listen(server);
        try {
          // The tenant bucket emptied from outside the middleware: fail "local" has never seen it, and would admit.
          assert.equal((await new TbClient(admin.redis).acquire(`${prefix}{acme}:tenant`, 0.001, 2, 2)).allowed, true);
          const response = await fetch(base);
          assert.equal(response.status, 429);
          assert.equal((await response.json()).limit, "tenant");
          const refundWarnings = warnings.filter((message) => message.includes("could not give back what a refused request took"));
          assert.equal(refundWarnings.length, 1, warnings.join("\n"));
          assert.deepEqual(errors, []);
          // The refund failed: the user bucket keeps the token the refused request took (a refund of 0 reads it).
          assert.equal((await new TbClient(admin.redis).refund(userKey, 0.001, 5, 0)).remaining, 4);
        } finally {
          await closeServer(server);
          await conn.close();
          await admin.close();
        }
      });

      test(`${kind}: several limits for identities like {}, }x, }{ or none stay in one slot (no CROSSSLOT)`, async () => {
        const conn = await connectCluster(kind, cluster);
        const errors = [];
        const app = express();
        const limits = [{ name: "a", rate: 0.001, burst: 2 }, { name: "b", rate: 0.001, burst: 3 }];
        const prefix = `${freshKey("tags")}:`;
        app.use(rateLimit({ client: conn.redis, prefix, limits, fail: "closed", key: (req) => req.get("x-user"), onError: (error) => errors.push(error) }));
        app.get("/", (req, res) => res.send("ok"));
        const server = http.createServer(app);
        const base = await listen(server);
        try {
          for (const user of ["{}", "}x", "}{", "a{b}c", "{", ""]) {
            const statuses = [];
            for (let i = 0; i < 3; i++) statuses.push((await fetch(base, { headers: { "x-user": user } })).status);
            assert.deepEqual(statuses, [200, 200, 429], `x-user: ${JSON.stringify(user)}`);
          }
          assert.deepEqual(errors, []);
        } finally {
          await closeServer(server);
          await conn.close();
        }
      });
    }
  });
}
