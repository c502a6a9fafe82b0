//! The layer's Prometheus metrics (docs/operating.md, "Watching the middleware"), kept by `prometheus-client` in
//! a registry the user gives (`RateLimitLayer::metrics(&mut registry)`), behind the `prometheus` feature.
//!
//! ```text
//! redis_tb_requests_total{outcome}          allowed, refused, shadow_refused, skipped
//! redis_tb_refusals_total{limit}            per refused or shadow-refused request, each limit that did not fit
//! redis_tb_decisions_total{source}          module, function, script (Redis answered), lease (a leased limit
//!                                           took part), local, open, closed
//! redis_tb_redis_failures_total{class}      failed limiter calls, by the failure table's class
//! redis_tb_call_duration_seconds            the limiter call, buckets 0.5 ms to 2.5 s
//! ```
//!
//! Labels hold fixed words and limit names only, never an identity. The fixed values are made at once, so they
//! are scraped from 0.
#![forbid(unsafe_code)]

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of `redis_tb_call_duration_seconds`'s buckets: 0.5 ms to 2.5 s, as in every package.
const DURATION_BOUNDS_S: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
const OUTCOMES: [&str; 4] = ["allowed", "refused", "shadow_refused", "skipped"];
const SOURCES: [&str; 7] = [
    "module", "function", "script", "lease", "local", "open", "closed",
];

type Labelled = Family<[(&'static str, String); 1], Counter>;

/// The series of one registry; clones count into the same series.
#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    requests: Labelled,
    refusals: Labelled,
    decisions: Labelled,
    failures: Labelled,
    duration: Histogram,
}

impl Metrics {
    /// Registers the five series in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Metrics {
        let metrics = Metrics {
            requests: Labelled::default(),
            refusals: Labelled::default(),
            decisions: Labelled::default(),
            failures: Labelled::default(),
            duration: Histogram::new(DURATION_BOUNDS_S),
        };
        for outcome in OUTCOMES {
            let _ = metrics
                .requests
                .get_or_create(&[("outcome", outcome.to_owned())]);
        }
        for source in SOURCES {
            let _ = metrics
                .decisions
                .get_or_create(&[("source", source.to_owned())]);
        }
        registry.register(
            "redis_tb_requests",
            "Requests the rate-limit middleware saw, by outcome",
            metrics.requests.clone(),
        );
        registry.register(
            "redis_tb_refusals",
            "Per refused or shadow-refused request, each limit whose bucket did not fit",
            metrics.refusals.clone(),
        );
        registry.register(
            "redis_tb_decisions",
            "Limiter calls by what decided: the backend that answered or the fail mode",
            metrics.decisions.clone(),
        );
        registry.register(
            "redis_tb_redis_failures",
            "Limiter calls that failed, by the failure table's class",
            metrics.failures.clone(),
        );
        registry.register(
            "redis_tb_call_duration_seconds",
            "The limiter call: the Redis round trip, or the fail mode's answer",
            metrics.duration.clone(),
        );
        metrics
    }

    /// A request's outcome, and the limits that refused it (refused or shadow-refused).
    pub(crate) fn request(&self, outcome: &'static str, refused: &[String]) {
        self.requests
            .get_or_create(&[("outcome", outcome.to_owned())])
            .inc();
        for name in refused {
            self.refusals
                .get_or_create(&[("limit", name.clone())])
                .inc();
        }
    }

    /// A limiter call ended after `took`, decided by `source`.
    pub(crate) fn decided(&self, source: &'static str, took: Duration) {
        self.decisions
            .get_or_create(&[("source", source.to_owned())])
            .inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// A limiter call failed, of the failure table's `class`.
    pub(crate) fn failed(&self, class: &'static str) {
        self.failures
            .get_or_create(&[("class", class.to_owned())])
            .inc();
    }
}
