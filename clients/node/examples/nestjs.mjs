// docs/node.md's @nestjs/throttler example (between the snippet markers, checked by test/examples.test.mjs).
// Plain JavaScript, so decorators are applied as functions; in TypeScript they are the usual @Module / @Controller.
// REDIS_URL=redis://127.0.0.1:7777 node examples/nestjs.mjs
import "reflect-metadata";
import assert from "node:assert/strict";

import { Controller, Get } from "@nestjs/common";
import { NestFactory } from "@nestjs/core";

class AppController {
  hello() {
    return "hello";
  }
}
Controller()(AppController);
Get()(AppController.prototype, "hello", Object.getOwnPropertyDescriptor(AppController.prototype, "hello"));

// --- snippet: start ---------------------------------------------------------------------------------------------
import { Module } from "@nestjs/common";
import { APP_GUARD } from "@nestjs/core";
import { ThrottlerGuard, ThrottlerModule } from "@nestjs/throttler";
import { Redis } from "ioredis";
import { TbThrottlerStorage } from "redis-tb";

const storage = new TbThrottlerStorage({ client: new Redis(process.env.REDIS_URL) });

// 10 requests per minute, as before; the bucket holds 10 and refills one every 6 s instead of all at once.
export class AppModule {}
Module({
  imports: [ThrottlerModule.forRoot({ throttlers: [{ ttl: 60_000, limit: 10 }], storage })],
  controllers: [AppController],
  providers: [{ provide: APP_GUARD, useClass: ThrottlerGuard }],
})(AppModule); // in TypeScript: @Module({ ... }) export class AppModule {}
// --- snippet: end -----------------------------------------------------------------------------------------------

storage.prefix = `throttler:example:${process.pid}:${Date.now()}:`; // keys of this run only
const app = await NestFactory.create(AppModule, { logger: false });
await app.listen(0, "127.0.0.1");
try {
  const url = (await app.getUrl()).replace("[::1]", "127.0.0.1");
  const statuses = [];
  for (let i = 0; i < 11; i++) statuses.push((await fetch(url)).status);
  assert.deepEqual(statuses, [...Array(10).fill(200), 429]);
  console.log("nestjs example: ok");
} finally {
  await app.close();
  storage.client.redis.disconnect();
}
