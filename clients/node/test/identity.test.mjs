// The identity rule and the key layout (docs/clients.md): ipIdentity and the bucket keys against the fixture the
// Python package reads too, then real Express and Fastify apps meeting requests without an identity (a reset
// socket, a Unix socket), IPv4-mapped and rotating IPv6 peers, and SKIP.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { describe, test } from "node:test";

import express from "express";
import Fastify from "fastify";

import { fastifyRateLimit, ipIdentity, rateLimit, SKIP, TbArgumentError } from "../src/index.mjs";
import { bucketKey } from "../src/identity.cjs";
import { suiteServer } from "./clients.mjs";
import { REPOSITORY, freshKey, waitUntil } from "./harness.mjs";
import { closeServer, limitHeaders, listen } from "./http-helpers.mjs";

const warnings = [];
process.on("warning", (warning) => {
  if (warning.code === "REDIS_TB_ANONYMOUS") warnings.push(warning);
});

const FIXTURE = JSON.parse(fs.readFileSync(path.join(REPOSITORY, "fixtures", "keys.json"), "utf8"));

describe("identity and key layout", () => {
  test("ipIdentity follows the rule's examples", () => {
    assert.equal(ipIdentity("127.0.0.1"), "127.0.0.1");
    assert.equal(ipIdentity("::ffff:127.0.0.1"), "127.0.0.1");
    assert.equal(ipIdentity("::FFFF:7f00:1"), "127.0.0.1");
    assert.equal(ipIdentity("2001:db8:1:2ff:aaaa::1"), "2001:db8:1:200::/56");
    assert.equal(ipIdentity("2001:DB8:1:2ff:aaaa::1%eth0", { ipv6Subnet: 64 }), "2001:db8:1:2ff::/64");
    assert.equal(ipIdentity("2001:0:0:1::1", { ipv6Subnet: 64 }), "2001:0:0:1::/64");
    for (const none of [undefined, null, "", "localhost", "/tmp/app.sock", "1.2.3"]) assert.equal(ipIdentity(none), undefined);
    for (const bad of [0, 65, 56.5, "56"]) {
      assert.throws(() => ipIdentity("::1", { ipv6Subnet: bad }), /ipv6Subnet must be an integer from 1 to 64/);
      assert.throws(() => rateLimit({ client: {}, limits: { rate: 1, burst: 1 }, ipv6Subnet: bad }), TbArgumentError);
    }
  });

  test("keys escape the identity into one non-empty hash tag", () => {
    assert.equal(bucketKey("ratelimit:", "}x", "a"), "ratelimit:{%7Dx}:a");
    assert.equal(bucketKey("ratelimit:", "a b", "a"), "ratelimit:{a%20b}:a");
    assert.equal(bucketKey("ratelimit:", "é", "a"), "ratelimit:{%C3%A9}:a");
    assert.equal(bucketKey("ratelimit:", "2001:db8:1:200::/56", "a"), "ratelimit:{2001:db8:1:200::/56}:a");
    assert.equal(bucketKey("ratelimit:", "%anonymous", "a"), "ratelimit:{%25anonymous}:a");
    for (const none of [undefined, null, ""]) assert.equal(bucketKey("ratelimit:", none, "a"), "ratelimit:{%anonymous}:a");
  });

  test("fixtures/keys.json: the keys and identities the Python package derives too", () => {
    for (const row of FIXTURE.keys) {
      assert.equal(bucketKey(row.prefix, row.identity, row.limit), row.key, JSON.stringify(row).slice(0, 200));
    }
    for (const row of FIXTURE.ip_identity) {
      assert.equal(ipIdentity(row.address, { ipv6Subnet: row.ipv6_subnet }) ?? null, row.identity, JSON.stringify(row));
    }
    for (const subnet of FIXTURE.ipv6_subnet_refused) {
      assert.throws(() => ipIdentity("::1", { ipv6Subnet: subnet }), /ipv6Subnet/, JSON.stringify(subnet));
    }
  });
});

/** Connects, sends one request, waits until the app has it (`arrived` grew), then resets the connection. */
async function sendThenReset(port, arrived) {
  const before = arrived();
  const socket = net.connect(port, "127.0.0.1");
  socket.on("error", () => {});
  await new Promise((resolve) => socket.once("connect", resolve));
  socket.write("GET / HTTP/1.1\r\nHost: test\r\n\r\n");
  await waitUntil(() => arrived() > before, 5000, "the request to arrive");
  socket.resetAndDestroy();
}

/** Resolves once the request's socket is gone: what an async step before the limiter lets happen. */
async function socketGone(raw) {
  await waitUntil(() => raw.socket.destroyed, 5000, "the reset to reach the server");
}

describe("requests without an identity, and IPv6 peers", () => {
  const suite = suiteServer();

  test("Express: 20 send-then-reset requests behind an async middleware share the anonymous bucket (burst 2)", async () => {
    const prefix = `${freshKey("reset")}:`;
    const limiter = rateLimit({ client: suite.conn.redis, prefix, limits: { name: "api", rate: 0.001, burst: 2 } });
    let arrived = 0;
    let decided = 0;
    let handled = 0;
    const app = express();
    app.use(async (req, res, next) => {
      arrived++;
      await socketGone(req);
      next();
    });
    app.use(async (req, res, next) => {
      await limiter(req, res, next);
      decided++;
    });
    app.get("/", (req, res) => {
      handled++;
      res.send("ok");
    });
    const server = http.createServer(app);
    await listen(server);
    try {
      for (let i = 0; i < 20; i++) await sendThenReset(server.address().port, () => arrived);
      await waitUntil(() => decided === 20, 10_000, "20 decisions");
      assert.equal(handled, 2);
      assert.equal(await suite.conn.redis.exists(`${prefix}{%anonymous}:api`), 1);
    } finally {
      await closeServer(server);
    }
  });

  test("Fastify: the same behind an onRequest hook registered before the plugin", async () => {
    const prefix = `${freshKey("reset-fastify")}:`;
    let arrived = 0;
    let handled = 0;
    let answered = 0;
    const fastify = Fastify();
    fastify.addHook("onRequest", async (request) => {
      arrived++;
      await socketGone(request.raw);
    });
    fastify.addHook("onSend", async () => {
      answered++; // the handler's answer or the plugin's 429
    });
    await fastify.register(fastifyRateLimit, { client: suite.conn.redis, prefix, limits: { name: "api", rate: 0.001, burst: 2 } });
    fastify.get("/", async () => {
      handled++;
      return "ok";
    });
    await fastify.listen({ port: 0, host: "127.0.0.1" });
    try {
      for (let i = 0; i < 20; i++) await sendThenReset(fastify.server.address().port, () => arrived);
      await waitUntil(() => answered === 20, 10_000, "20 answers");
      assert.equal(handled, 2);
      assert.equal(await suite.conn.redis.exists(`${prefix}{%anonymous}:api`), 1);
    } finally {
      await fastify.close();
    }
  });

  test("Express on a Unix socket: requests have no address and share the anonymous bucket", async () => {
    const prefix = `${freshKey("unix")}:`;
    const app = express();
    app.use(rateLimit({ client: suite.conn.redis, prefix, limits: { name: "api", rate: 0.001, burst: 2 } }));
    app.get("/", (req, res) => res.send("ok"));
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "redis-tb-uds-"));
    const socketPath = path.join(dir, "app.sock");
    const server = http.createServer(app);
    await new Promise((resolve) => server.listen(socketPath, resolve));
    try {
      const statuses = [];
      for (let i = 0; i < 6; i++) {
        statuses.push(
          await new Promise((resolve, reject) => {
            http.get({ socketPath, path: "/", agent: false }, (res) => {
              res.resume();
              resolve(res.statusCode);
            }).on("error", reject);
          }),
        );
      }
      assert.deepEqual(statuses, [200, 200, 429, 429, 429, 429]);
      assert.equal(await suite.conn.redis.exists(`${prefix}{%anonymous}:api`), 1);
    } finally {
      await closeServer(server);
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test("Express on a dual-stack socket keys an IPv4 client as 127.0.0.1, as Fastify and Python do", async () => {
    const prefix = `${freshKey("mapped")}:`;
    const app = express();
    let seen;
    app.use((req, res, next) => {
      seen = req.ip;
      next();
    });
    app.use(rateLimit({ client: suite.conn.redis, prefix, limits: { name: "api", rate: 1, burst: 5 } }));
    app.get("/", (req, res) => res.send("ok"));
    const server = http.createServer(app);
    await new Promise((resolve) => server.listen(0, "::", resolve));
    try {
      assert.equal((await fetch(`http://127.0.0.1:${server.address().port}/`)).status, 200);
      assert.equal(seen, "::ffff:127.0.0.1", "Express reports the mapped form");
      assert.equal(await suite.conn.redis.exists(`${prefix}{127.0.0.1}:api`), 1);
    } finally {
      await closeServer(server);
    }
  });

  test("IPv6 peers in one /56 share a bucket; another /56 has its own; ipv6Subnet narrows it", async () => {
    const prefix = `${freshKey("ipv6")}:`;
    const app = express();
    app.set("trust proxy", true); // the peer address comes from X-Forwarded-For, so one test can hold many
    app.get("/", rateLimit({ client: suite.conn.redis, prefix, limits: { name: "api", rate: 0.001, burst: 2 } }), (req, res) => res.send("ok"));
    app.get("/64", rateLimit({ client: suite.conn.redis, prefix, limits: { name: "narrow", rate: 0.001, burst: 2 }, ipv6Subnet: 64 }), (req, res) => res.send("ok"));
    const server = http.createServer(app);
    const base = await listen(server);
    const from = async (route, address) => (await fetch(`${base}${route}`, { headers: { "x-forwarded-for": address } })).status;
    try {
      const rotated = ["2001:db8:1:2ff::1", "2001:db8:1:2aa:5::9", "2001:db8:1:200:ffff::1"];
      assert.deepEqual(await Promise.all(rotated.map((address) => from("/", address))).then((s) => s.sort()), [200, 200, 429]);
      assert.equal(await from("/", "2001:db8:1:300::1"), 200, "the next /56");
      assert.equal(await suite.conn.redis.exists(`${prefix}{2001:db8:1:200::/56}:api`), 1);
      assert.deepEqual([await from("/64", "2001:db8:1:2ff::1"), await from("/64", "2001:db8:1:2aa::1")], [200, 200]);
    } finally {
      await closeServer(server);
    }
  });

  test("SKIP is the one way through unlimited: no bucket, no headers", async () => {
    const prefix = `${freshKey("skip")}:`;
    const app = express();
    app.use(rateLimit({ client: suite.conn.redis, prefix, limits: { name: "api", rate: 0.001, burst: 1 }, key: (req) => (req.get("x-internal") ? SKIP : req.get("x-user")) }));
    app.get("/", (req, res) => res.send("ok"));
    const server = http.createServer(app);
    const base = await listen(server);
    try {
      for (let i = 0; i < 3; i++) {
        const response = await fetch(base, { headers: { "x-internal": "1" } });
        assert.equal(response.status, 200);
        assert.deepEqual(limitHeaders(response), {});
      }
      assert.deepEqual((await suite.conn.redis.keys(`${prefix}*`)).length, 0);
      assert.deepEqual([(await fetch(base)).status, (await fetch(base)).status], [200, 429], "no x-user: anonymous, limited");
    } finally {
      await closeServer(server);
    }
  });

  test("the anonymous identity was warned about once in this process", () => {
    assert.equal(warnings.length, 1);
    assert.match(warnings[0].message, /no identity/);
  });
});
