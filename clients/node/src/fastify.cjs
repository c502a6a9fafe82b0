"use strict";
// A Fastify plugin: `fastify.register(fastifyRateLimit, { client, limits })` limits every route of the instance
// (and of its children: the plugin does not encapsulate, as fastify-plugin would arrange). A route changes its own
// limits with `config: { rateLimit: { limits: [...] } }` (any option of the plugin) or opts out with
// `config: { rateLimit: false }`; with `global: false` only routes that set `config.rateLimit` are limited.

const { createHttpLimiter } = require("./http.cjs");

async function fastifyRateLimit(fastify, options) {
  const { global = true, ...shared } = options;
  const base = global ? createHttpLimiter(shared) : undefined;
  // One limiter per route config, built the first time the route is hit: validation errors surface at once in
  // tests and then cost nothing per request.
  const byRoute = new WeakMap();

  function limiterFor(request) {
    const own = request.routeOptions?.config?.rateLimit;
    if (own === false) return undefined;
    if (own === undefined || own === null || own === true) return base;
    let limiter = byRoute.get(own);
    if (limiter === undefined) {
      limiter = createHttpLimiter({ ...shared, ...own });
      byRoute.set(own, limiter);
    }
    return limiter;
  }

  fastify.addHook("onRequest", async (request, reply) => {
    const limiter = limiterFor(request);
    if (limiter === undefined) return;
    const outcome = await limiter.check(request);
    reply.headers(outcome.headers);
    if (outcome.action === "allow") return;
    reply.code(outcome.status).send(outcome.body);
    return reply;
  });
}

// What fastify-plugin sets: hooks apply to the registering instance, not to a child context only.
fastifyRateLimit[Symbol.for("skip-override")] = true;
fastifyRateLimit[Symbol.for("fastify.display-name")] = "redis-tb";
fastifyRateLimit[Symbol.for("plugin-meta")] = { name: "redis-tb", fastify: ">=4" };

module.exports = { fastifyRateLimit };
