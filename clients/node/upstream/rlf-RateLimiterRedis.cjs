// Adapter for rate-limiter-flexible's suite (copied over its lib/RateLimiterRedis.js by run.mjs): the suite's
// RateLimiterRedis is redis-tb's RateLimiterTB.
const { RateLimiterTB } = require(`${process.env.REDIS_TB_PACKAGE}/src/index.cjs`);

module.exports = class RateLimiterRedis extends RateLimiterTB {};
