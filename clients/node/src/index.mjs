// The ESM entry: the CommonJS implementation's exports, so that `import` and `require` share one copy (no dual
// package hazard: a TbClient made by one is an instance for the other).
import tb from "./index.cjs";

export const {
  TbClient,
  TbReplyError,
  TbArgumentError,
  TbProtocolError,
  rateLimitHeaders,
  createHttpLimiter,
  rateLimit,
  fastifyRateLimit,
  TbStore,
  RateLimiterTB,
  RateLimiterRes,
  TbThrottlerStorage,
  luaScript,
} = tb;
export default tb;
