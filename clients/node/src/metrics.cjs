"use strict";
// The middleware's metrics (docs/operating.md, "Watching the middleware"), the same names, labels and meaning as
// the Python package's and the Rust layer's, kept by prom-client, an optional peer dependency:
//   redis_tb_requests_total{outcome}         allowed, refused, shadow_refused, skipped: one per request
//   redis_tb_refusals_total{limit}           per refused or shadow-refused request, each limit that did not fit
//   redis_tb_decisions_total{source}         per limiter call: module, function, script (the backend that
//                                            answered), or the fail mode that answered instead: local, open, closed
//   redis_tb_redis_failures_total{class}     limiter calls that failed, by fixtures/failures.json's class
//   redis_tb_call_duration_seconds           the limiter call's time (the round trip, or the fail mode's answer)
// Labels hold limit names and fixed words only, never an identity. Each metric is registered once per registry:
// every middleware of the process (or another copy of this package) over the same registry finds it there and
// counts into the same series. The fixed words (outcomes and sources) start at 0, so that a rate over a series
// that has not moved yet reads 0 rather than nothing; a limit's and a class's series appear with their first count,
// as the Python package's do.

const { TbArgumentError } = require("./errors.cjs");

const OUTCOMES = ["allowed", "refused", "shadow_refused", "skipped"];
const SOURCES = ["module", "function", "script", "local", "open", "closed"];
/** Seconds: 0.5 ms to 2.5 s. */
const DURATION_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5];

const DEFINITIONS = {
  requests: {
    name: "redis_tb_requests_total",
    help: "Requests the rate-limit middleware saw, by outcome",
    labelNames: ["outcome"],
  },
  refusals: {
    name: "redis_tb_refusals_total",
    help: "Per refused or shadow-refused request, each limit whose bucket did not fit",
    labelNames: ["limit"],
  },
  decisions: {
    name: "redis_tb_decisions_total",
    help: "Limiter calls by what decided: the backend that answered or the fail mode",
    labelNames: ["source"],
  },
  failures: {
    name: "redis_tb_redis_failures_total",
    help: "Limiter calls that failed, by the failure table's class",
    labelNames: ["class"],
  },
  duration: {
    name: "redis_tb_call_duration_seconds",
    help: "The limiter call: the Redis round trip, or the fail mode's answer",
    labelNames: [],
    buckets: DURATION_BUCKETS,
  },
};

/** prom-client's exports, or null where it is not installed; looked up once, by the first middleware built. */
let promClient;

function loadPromClient() {
  if (promClient === undefined) {
    try {
      promClient = require("prom-client");
    } catch (error) {
      // Not installed; an install that is broken (a dependency of its own missing) says so.
      if (error?.code !== "MODULE_NOT_FOUND" || !String(error.message).includes("'prom-client'")) throw error;
      promClient = null;
    }
  }
  return promClient;
}

/**
 * Where a registry's counts are kept, shared by every middleware over it (and by another copy of this package in
 * the process: the key is the global symbol registry's): a property of each counter this module registers.
 */
const COUNTS = Symbol.for("redis-tb.metrics.counts");

/**
 * A counter of `definition` in `registry` whose counts are plain numbers (`counter[COUNTS]`: label value -> count),
 * added per request at the cost of a property increment and handed to prom-client when the registry is scraped:
 * prom-client's own `inc` hashes its labels at every call, a few times the cost of everything else counted here.
 * `fixed`: label values shown from 0. An existing counter of that name is used if this package registered it.
 */
function countedCounter(prom, registry, definition, fixed) {
  const existing = registry.getSingleMetric(definition.name);
  if (existing !== undefined) {
    if (existing[COUNTS] === undefined) {
      throw new TbArgumentError(`metrics: the registry holds another metric named ${definition.name}, not redis-tb's`);
    }
    return existing;
  }
  const counts = new Map(fixed.map((value) => [value, 0]));
  const published = new Map();
  const [labelName] = definition.labelNames;
  const counter = new prom.Counter({
    ...definition,
    registers: [registry],
    // What was counted since the last scrape, added to prom-client's series (so that its reset() still starts
    // them afresh).
    collect() {
      for (const [value, count] of counts) {
        this.inc({ [labelName]: value }, count - (published.get(value) ?? 0));
        published.set(value, count);
      }
    },
  });
  counter[COUNTS] = counts;
  return counter;
}

/** The histogram of `definition` in `registry`: the one registered there already, else a new one. */
function histogramOf(prom, registry, definition) {
  const existing = registry.getSingleMetric(definition.name);
  if (existing === undefined) return new prom.Histogram({ ...definition, registers: [registry] });
  if (existing.type !== "histogram" || (existing.labelNames ?? []).length !== 0) {
    throw new TbArgumentError(`metrics: the registry holds another metric named ${definition.name}, not redis-tb's`);
  }
  return existing;
}

/** What one middleware counts into: its registry's counts, and the duration histogram's observer. */
class MiddlewareMetrics {
  constructor(prom, registry) {
    this.requests = countedCounter(prom, registry, DEFINITIONS.requests, OUTCOMES)[COUNTS];
    this.refusals = countedCounter(prom, registry, DEFINITIONS.refusals, [])[COUNTS];
    this.decisions = countedCounter(prom, registry, DEFINITIONS.decisions, SOURCES)[COUNTS];
    this.failures = countedCounter(prom, registry, DEFINITIONS.failures, [])[COUNTS];
    // Bound once: prom-client then neither makes a closure nor looks the (empty) label set up per observation.
    this.observe = histogramOf(prom, registry, DEFINITIONS.duration).labels().observe;
  }

  /** One request, by `outcome` (one of OUTCOMES). */
  request(outcome) {
    this.requests.set(outcome, this.requests.get(outcome) + 1);
  }

  /** The limits of `buckets` that did not fit, for a refused or shadow-refused request. */
  refused(buckets) {
    for (const bucket of buckets) {
      if (bucket.fits === false) this.refusals.set(bucket.name, (this.refusals.get(bucket.name) ?? 0) + 1);
    }
  }

  /** One limiter call: what decided it (one of SOURCES), the class of its failure if it failed, its seconds. */
  call(source, failureClass, seconds) {
    this.decisions.set(source, this.decisions.get(source) + 1);
    if (failureClass !== undefined) this.failed(failureClass);
    this.observe(seconds);
  }

  /** A failure of class `failureClass` (a call's, or a charge-back's refused for a configuration error). */
  failed(failureClass) {
    this.failures.set(failureClass, (this.failures.get(failureClass) ?? 0) + 1);
  }
}

/**
 * The middleware's `metrics` option as what it counts into: undefined (the default) is prom-client's default
 * registry where prom-client is installed, and no metrics where it is not; false is none; a prom-client Registry is
 * that registry.
 */
function metricsFor(option) {
  if (option === false) return undefined;
  const isRegistry = typeof option?.getSingleMetric === "function" && typeof option?.registerMetric === "function";
  if (option !== undefined && !isRegistry) {
    throw new TbArgumentError(`metrics must be a prom-client Registry or false, got ${option === null ? "null" : typeof option}`);
  }
  const prom = loadPromClient();
  if (prom === null) {
    if (option === undefined) return undefined;
    throw new TbArgumentError("metrics: a Registry was given but prom-client cannot be loaded (npm install prom-client)");
  }
  return new MiddlewareMetrics(prom, option ?? prom.register);
}

module.exports = { metricsFor, OUTCOMES, SOURCES, DURATION_BUCKETS };
