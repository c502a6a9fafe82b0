// Adapter for @nestjs/throttler's suite (copied over its src/throttler.service.ts by run.mjs): the default storage
// is redis-tb's TbThrottlerStorage on the server run.mjs started, a fresh prefix per storage.
import { Injectable, OnApplicationShutdown } from '@nestjs/common';
import { ThrottlerStorageRecord } from './throttler-storage-record.interface';
import { ThrottlerStorage } from './throttler-storage.interface';

// eslint-disable-next-line @typescript-eslint/no-var-requires
const { TbThrottlerStorage } = require(`${process.env.REDIS_TB_PACKAGE}/src/index.cjs`);
// eslint-disable-next-line @typescript-eslint/no-var-requires
const { Redis } = require(`${process.env.REDIS_TB_PACKAGE}/node_modules/ioredis`);

let counter = 0;

@Injectable()
export class ThrottlerStorageService implements ThrottlerStorage, OnApplicationShutdown {
  private redis = new Redis({ port: Number(process.env.REDIS_TB_PORT), host: '127.0.0.1' });
  private inner = new TbThrottlerStorage({
    client: this.redis,
    prefix: `nest:${process.pid}:${Date.now()}:${++counter}:`,
  });

  get storage(): Map<string, unknown> {
    return new Map();
  }

  increment(
    key: string,
    ttl: number,
    limit: number,
    blockDuration: number,
    throttlerName: string,
  ): Promise<ThrottlerStorageRecord> {
    return this.inner.increment(key, ttl, limit, blockDuration, throttlerName);
  }

  onApplicationShutdown() {
    this.redis.disconnect();
  }
}
