"use strict";
// Express (4 and 5) middleware: `app.use(rateLimit({ client, limits }))`, or one per route with its own limits.
// Headers go on every response it lets through; a refusal ends the request with `statusCode` and a JSON body.

const { createHttpLimiter } = require("./http.cjs");

/** Express middleware over `createHttpLimiter`'s options (see http.cjs, or the package's type declarations). */
function rateLimit(options) {
  const limiter = createHttpLimiter(options);
  async function middleware(req, res, next) {
    let outcome;
    try {
      outcome = await limiter.check(req);
    } catch (error) {
      next(error);
      return;
    }
    const { headers } = outcome;
    for (const name in headers) res.setHeader(name, headers[name]);
    if (outcome.action === "allow") {
      next();
      return;
    }
    res.status(outcome.status).json(outcome.body);
  }
  middleware.limiter = limiter;
  return middleware;
}

module.exports = { rateLimit };
