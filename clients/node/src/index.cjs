"use strict";
// redis-tb for Node: a typed client for the redis-tb module's commands (with the shared Lua script where the module
// is not loaded), rate-limit headers, Express middleware, a Fastify plugin, and drop-ins for the limiters people
// use: an express-rate-limit store, a rate-limiter-flexible-compatible limiter, a @nestjs/throttler storage. The
// ESM entry (index.mjs) re-exports this one implementation.

const { TbClient } = require("./client.cjs");
const { TbReplyError, TbArgumentError, TbProtocolError, TbUnavailableError, classifyFailure } = require("./errors.cjs");
const { rateLimitHeaders } = require("./headers.cjs");
const { createHttpLimiter } = require("./http.cjs");
const { SKIP, ipIdentity } = require("./identity.cjs");
const { rateLimit } = require("./express.cjs");
const { fastifyRateLimit } = require("./fastify.cjs");
const { TbStore } = require("./erl.cjs");
const { RateLimiterTB, RateLimiterRes } = require("./flexible.cjs");
const { TbThrottlerStorage } = require("./nest.cjs");
const script = require("./script.cjs");

const luaScript = {
  source: script.source,
  sha1: script.sha1,
  file: script.file,
  libraryName: script.libraryName,
  library: script.library,
};

module.exports = {
  TbClient,
  TbReplyError,
  TbArgumentError,
  TbProtocolError,
  TbUnavailableError,
  classifyFailure,
  rateLimitHeaders,
  createHttpLimiter,
  SKIP,
  ipIdentity,
  rateLimit,
  fastifyRateLimit,
  TbStore,
  RateLimiterTB,
  RateLimiterRes,
  TbThrottlerStorage,
  luaScript,
};
