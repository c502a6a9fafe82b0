// Compiled by `tsc --noEmit` (make lint), never run: the declarations as a CommonJS TypeScript user meets them.
import tb = require("redis-tb");
import IORedis = require("ioredis");

const client = new tb.TbClient(new IORedis.Redis());
async function main(): Promise<number> {
  const reply = await client.acquireAtMost("k", 1, 5, 3);
  const store = new tb.TbStore({ client, burst: 5, rate: 1 });
  store.init({ windowMs: 1000 });
  return reply.granted;
}
void main;
