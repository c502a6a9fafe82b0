// TbClient.throttle (CL.THROTTLE, redis-cell's command) through both Redis clients: redis-cell's reply by name, the
// server's errors, and the library function the call goes to where the module is missing.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { TbClient, TbReplyError, TbArgumentError } from "../src/index.mjs";
import script from "../src/script.cjs";
import { connect, CLIENT_KINDS } from "./clients.mjs";
import { Server, freshKey, WITHOUT_MODULE } from "./harness.mjs";

// Without the module the calls go to the library or the script, which serve CL.THROTTLE once lua/tb.lua has it.
const BACKENDS = [
  { name: "module", module: true, skip: false },
  { name: WITHOUT_MODULE, module: false, skip: script.source().includes("CL.THROTTLE") ? false : "lua/tb.lua has no CL.THROTTLE" },
];

for (const backend of BACKENDS) {
  for (const kind of CLIENT_KINDS) {
    describe(`TbClient.throttle over ${kind}, ${backend.name}`, { skip: backend.skip }, () => {
      let server;
      let conn;
      let tb;
      before(async () => {
        server = await Server.start({ module: backend.module });
        conn = await connect(kind, server);
        tb = new TbClient(conn.redis);
      });
      after(async () => {
        await conn?.close();
        await server?.stop();
      });

      test("replies as redis-cell, waits in seconds", async () => {
        const key = freshKey("throttle");
        // maxBurst 4 (5 at once), one a minute: every wait is in whole minutes, far above the time the calls take.
        assert.deepEqual(await tb.throttle(key, 4, 1, 60), { limited: false, limit: 5, remaining: 4, retryAfter: -1, resetAfter: 60 });
        assert.deepEqual(await tb.throttle(key, 4, 1, 60, 4), { limited: false, limit: 5, remaining: 0, retryAfter: -1, resetAfter: 300 });
        assert.deepEqual(await tb.throttle(key, 4, 1, 60), { limited: true, limit: 5, remaining: 0, retryAfter: 60, resetAfter: 300 });
        // More than the limit ever admits: -1.
        assert.equal((await tb.throttle(key, 4, 1, 60, 6)).retryAfter, -1);
        assert.deepEqual(await tb.throttle(freshKey("peek"), 4, 1, 60, 0), { limited: false, limit: 5, remaining: 5, retryAfter: -1, resetAfter: 0 });
      });

      test("errors carry the server's text", async () => {
        const key = freshKey("throttle-errors");
        await assert.rejects(tb.throttle(key, -1, 1, 60), (error) => {
          assert.ok(error instanceof TbReplyError);
          assert.equal(error.command, "CL.THROTTLE");
          assert.match(error.message, /ERR max_burst must be an integer from 0 to 9223372036854775806/);
          return true;
        });
        await tb.acquire(`${key}:bucket`, 1, 5);
        await assert.rejects(tb.throttle(`${key}:bucket`, 1, 1, 60), (error) => error instanceof TbReplyError && error.code === "WRONGTYPE");
        await assert.rejects(tb.throttle(key, 1, Number.NaN, 60), TbArgumentError);
      });
    });
  }
}

test("the script and the library serve CL.THROTTLE as cl_throttle", () => {
  assert.ok(script.supports("CL.THROTTLE"));
  assert.deepEqual(script.evalArguments("CL.THROTTLE", ["k", "4", "10", "60", "1"]), ["1", "k", "CL.THROTTLE", "4", "10", "60", "1"]);
  const fcall = script.fcallArguments("CL.THROTTLE", ["k", "4", "10", "60", "1"]);
  assert.deepEqual(fcall, ["FCALL", `${script.libraryName()}_cl_throttle`, "1", "k", "4", "10", "60", "1"]);
  assert.equal(script.functionName("TB.ACQUIRE"), `${script.libraryName()}_acquire`);
});
