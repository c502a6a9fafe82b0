"use strict";
// Express (4 and 5) middleware: `app.use(rateLimit({ client, limits }))`, or one per route with its own limits.
// Headers go on every response it lets through; a refusal ends the request with `statusCode` and a JSON body.

const { createHttpLimiter } = require("./http.cjs");

/** Express middleware over `createHttpLimiter`'s options (see http.cjs, or the package's type declarations). */
function rateLimit(options) {
  const limiter = createHttpLimiter(options);
  // Not an async function: Express 5 would add a reaction to its promise on every request, and Express 4 would leave
  // an error thrown after the await unhandled.
  function middleware(req, res, next) {
    limiter.check(req).then((outcome) => respond(outcome, res, next), next);
  }
  middleware.limiter = limiter;
  return middleware;
}

/** The headers of `outcome` on `res`, then the next handler, or the refusal; an error (headers sent) to `next`. */
function respond(outcome, res, next) {
  try {
    const { headers } = outcome;
    for (const name in headers) res.setHeader(name, headers[name]);
    if (outcome.action !== "allow") {
      res.status(outcome.status).json(outcome.body);
      return;
    }
  } catch (error) {
    next(error);
    return;
  }
  next();
}

module.exports = { rateLimit };
