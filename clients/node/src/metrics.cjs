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

const { TbArgumentError, FAILURE_CLASSES } = require("./errors.cjs");

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

/** The metric `definition` of `registry`: the one registered there already, else a new one registered there. */
function metricOf(registry, Kind, type, definition) {
  const existing = registry.getSingleMetric(definition.name);
  if (existing === undefined) return new Kind({ ...definition, registers: [registry] });
  const labels = existing.labelNames ?? [];
  if (existing.type !== type || labels.join() !== definition.labelNames.join()) {
    throw new TbArgumentError(
      `metrics: the registry holds another metric named ${definition.name} (labels ${JSON.stringify(labels)}), not redis-tb's`,
    );
  }
  return existing;
}

/** What one middleware counts into: its registry's metrics, with the label sets it uses made once. */
class MiddlewareMetrics {
  constructor(prom, registry) {
    this.requests = metricOf(registry, prom.Counter, "counter", DEFINITIONS.requests);
    this.refusals = metricOf(registry, prom.Counter, "counter", DEFINITIONS.refusals);
    this.decisions = metricOf(registry, prom.Counter, "counter", DEFINITIONS.decisions);
    this.failures = metricOf(registry, prom.Counter, "counter", DEFINITIONS.failures);
    this.duration = metricOf(registry, prom.Histogram, "histogram", DEFINITIONS.duration);
    this.outcomeLabels = labelSets("outcome", OUTCOMES);
    this.sourceLabels = labelSets("source", SOURCES);
    this.classLabels = labelSets("class", FAILURE_CLASSES);
    this.limitLabels = new Map();
    for (const labels of Object.values(this.outcomeLabels)) this.requests.inc(labels, 0);
    for (const labels of Object.values(this.sourceLabels)) this.decisions.inc(labels, 0);
  }

  /** One request, by `outcome` (one of OUTCOMES). */
  request(outcome) {
    this.requests.inc(this.outcomeLabels[outcome]);
  }

  /** The limits of `buckets` that did not fit, for a refused or shadow-refused request. */
  refused(buckets) {
    for (const bucket of buckets) {
      if (bucket.fits !== false) continue;
      let labels = this.limitLabels.get(bucket.name);
      if (labels === undefined) {
        labels = Object.freeze({ limit: bucket.name });
        this.limitLabels.set(bucket.name, labels);
      }
      this.refusals.inc(labels);
    }
  }

  /** One limiter call: what decided it (one of SOURCES), the class of its failure if it failed, its seconds. */
  call(source, failureClass, seconds) {
    this.decisions.inc(this.sourceLabels[source]);
    if (failureClass !== undefined) this.failures.inc(this.classLabels[failureClass] ?? { class: failureClass });
    this.duration.observe(seconds);
  }
}

/** { [value]: { [name]: value } } for each value, made once so that counting allocates nothing. */
function labelSets(name, values) {
  const sets = {};
  for (const value of values) sets[value] = Object.freeze({ [name]: value });
  return sets;
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
