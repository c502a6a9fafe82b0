// TbThrottlerStorage inside @nestjs/throttler's own guard, in a real Nest app (Express platform) over HTTP: the
// guard's limit, its headers and 429 from the storage's records; the block after a refusal; blockDuration 0.
// Plain JavaScript, so the decorators are applied by hand.
import "reflect-metadata";
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Controller, Get, Module } from "@nestjs/common";
import { APP_GUARD, NestFactory } from "@nestjs/core";
import { ThrottlerGuard, ThrottlerModule, ThrottlerStorageService } from "@nestjs/throttler";

import { TbThrottlerStorage } from "../src/index.mjs";
import { suiteServer } from "./clients.mjs";
import { freshKey } from "./harness.mjs";

async function nestApp(storage, throttlers) {
  class AppController {
    hello() {
      return "ok";
    }
  }
  Controller()(AppController);
  Get()(AppController.prototype, "hello", Object.getOwnPropertyDescriptor(AppController.prototype, "hello"));
  class AppModule {}
  Module({
    imports: [ThrottlerModule.forRoot({ throttlers, storage })],
    controllers: [AppController],
    providers: [{ provide: APP_GUARD, useClass: ThrottlerGuard }],
  })(AppModule);
  const app = await NestFactory.create(AppModule, { logger: false });
  await app.listen(0, "127.0.0.1");
  return { app, url: (await app.getUrl()).replace("[::1]", "127.0.0.1") };
}

describe("@nestjs/throttler with TbThrottlerStorage", () => {
  const suite = suiteServer();

  test("the guard lets `limit` through, then answers 429 with Retry-After, and keeps the key blocked", async () => {
    const storage = new TbThrottlerStorage({ client: suite.conn.redis, prefix: `${freshKey("nest")}:` });
    const { app, url } = await nestApp(storage, [{ ttl: 8000, limit: 2, blockDuration: 20_000 }]);
    try {
      const responses = [];
      for (let i = 0; i < 3; i++) responses.push(await fetch(url));
      assert.deepEqual(responses.map((r) => r.status), [200, 200, 429]);
      assert.equal(responses[0].headers.get("x-ratelimit-limit"), "2");
      assert.equal(responses[0].headers.get("x-ratelimit-remaining"), "1");
      assert.equal(responses[0].headers.get("x-ratelimit-reset"), "4", "one token of a 2-per-8-s bucket: 4 s to full");
      const retry = Number(responses[2].headers.get("retry-after"));
      assert.ok(retry > 19 && retry <= 24, `blocked for blockDuration: Retry-After ${retry}`);
      const again = await fetch(url);
      assert.equal(again.status, 429);
      assert.ok(Number(again.headers.get("retry-after")) <= retry, "a refusal while blocked does not extend the block");
    } finally {
      await app.close();
    }
  });

  test("a client polling every 500 ms is admitted after the block when the library's own storage admits it", async () => {
    // The guard's calls for { ttl: 1 s, limit: 1, blockDuration: 1.75 s }, made at the same instants on both storages:
    // the library blocks on the refusal that crosses the limit, does not extend the block for the refusals inside
    // it, and admits the first request after it.
    const theirs = new ThrottlerStorageService();
    const ours = new TbThrottlerStorage({ client: suite.conn.redis, prefix: `${freshKey("nestpoll")}:` });
    const blocked = { theirs: [], ours: [] };
    const started = Date.now();
    try {
      for (let i = 0; i < 8; i++) {
        await new Promise((resolve) => setTimeout(resolve, started + i * 500 - Date.now()));
        blocked.theirs.push((await theirs.increment("client", 1000, 1, 1750, "default")).isBlocked);
        blocked.ours.push((await ours.increment("client", 1000, 1, 1750, "default")).isBlocked);
      }
    } finally {
      theirs.onApplicationShutdown();
    }
    // Admitted at 0 ms, blocked by the request at 500 ms until 2,250 ms, admitted at 2,500 ms, blocked again at 3,000
    // (a stalled machine may shift that by one request, for both alike).
    assert.deepEqual(blocked.theirs.slice(0, 4), [false, true, true, true], "the library's block");
    assert.ok(blocked.theirs.slice(4).includes(false), "the library admits after the block");
    assert.deepEqual(blocked.ours, blocked.theirs);
  });

  test("after the block the key starts afresh: the whole limit passes again, as with the library's storage", async () => {
    const theirs = new ThrottlerStorageService();
    const ours = new TbThrottlerStorage({ client: suite.conn.redis, prefix: `${freshKey("nestfresh")}:` });
    const run = async (storage) => {
      const blocked = [];
      for (let i = 0; i < 3; i++) blocked.push((await storage.increment("client", 10_000, 2, 300, "default")).isBlocked);
      return blocked;
    };
    try {
      const before = { theirs: await run(theirs), ours: await run(ours) };
      assert.deepEqual(before.ours, [false, false, true]);
      assert.deepEqual(before.ours, before.theirs);
      await new Promise((resolve) => setTimeout(resolve, 400));
      const after = { theirs: await run(theirs), ours: await run(ours) };
      assert.deepEqual(after.theirs, [false, false, true], "the library: two hits afresh, then a new block");
      assert.deepEqual(after.ours, after.theirs);
    } finally {
      theirs.onApplicationShutdown();
    }
  });

  test("blockDuration 0: a refused request waits only for the next token", async () => {
    const storage = new TbThrottlerStorage({ client: suite.conn.redis, prefix: `${freshKey("nest0")}:` });
    const { app, url } = await nestApp(storage, [{ ttl: 8000, limit: 2, blockDuration: 0 }]);
    try {
      const statuses = [];
      let last;
      for (let i = 0; i < 3; i++) statuses.push((last = await fetch(url)).status);
      assert.deepEqual(statuses, [200, 200, 429]);
      assert.equal(last.headers.get("retry-after"), "4");
    } finally {
      await app.close();
    }
  });
});

test("limit 0 blocks every request, as the library's storage; options it does not know are refused by name", async () => {
  const storage = new TbThrottlerStorage({ client: { call() {}, sendCommand() {} } });
  const theirs = new ThrottlerStorageService();
  try {
    for (const store of [storage, theirs]) assert.equal((await store.increment("k", 1000, 0, 0, "default")).isBlocked, true);
  } finally {
    theirs.onApplicationShutdown();
  }
  assert.throws(() => new TbThrottlerStorage({ client: {}, ttl: 5 }), /unknown option ttl/);
});
