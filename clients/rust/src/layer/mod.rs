//! The tower layer: every request a limit applies to takes its cost from Redis first; a refusal answers `429`
//! (or the status code option's, or the `on_refusal` hook's response) with `Retry-After`; every limited response
//! carries the RateLimit header fields (docs/headers.md). Works with axum's `Router::layer` as it is:
//!
//! ```text
//! build.rs    the builder: setters that cannot fail, one build() that checks every option
//! decide.rs   the Service: the request's buckets, the Redis call (or the fail mode), the charge-backs
//! lease.rs    leased limits: tokens taken in batches and spent in memory, one refill in flight per key
//! answer.rs   the responses: header fields, the refusal, fail mode closed's 503, the response body type
//!
//! errors      refusals and failures are responses (429, or 503 for fail mode closed), never the service's
//!             error: the layer adds no error type of its own, so axum needs no HandleErrorLayer
//! readiness   poll_ready answers at once; the call clones the inner service and waits for its readiness only
//!             after Redis has decided, so no slot of the inner service is held while Redis is asked
//! one call    one limit: TB.ACQUIRE; several: one TB.ACQUIREEACH, all or nothing, one header item each. On a
//!             cluster, limits whose keys are in other slots (their own key) go in one call per slot, and a
//!             refusal by one gives back (TB.REFUND) what the others took
//! failures    the fail mode: local (default: in-memory buckets that continue from Redis's last answer; when
//!             Redis answers again, each call for a key they admitted for first brings Redis's bucket down to
//!             the in-memory one, TB.LOWER), open, or closed; the failure table's logging; the on_error hook
//! shadow      shadow limits are decided in a second call, only when the enforced limits allow; their refusals
//!             serve the request, are logged once a second per limit and appear in no header
//! metrics     the five series of docs/operating.md, with the `prometheus` feature, in the user's Registry
//! ```
#![forbid(unsafe_code)]

mod answer;
mod build;
mod decide;
mod lease;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::request::Parts;
use http::StatusCode;
use tower_layer::Layer;

pub use answer::{json_response, RateLimitBody, Refusal, RefusalHook};
pub use build::RateLimitLayerBuilder;

use crate::client::Client;
use crate::error::Error;
use crate::failure::Failure;
use crate::headers::Standard;
use crate::keys::Ipv6Subnet;
use crate::limit::{KeyFn, Limit};
use crate::local::LocalBuckets;

/// What answers while Redis fails (docs/clients.md, "When Redis fails").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailMode {
    /// Each process limits with in-memory buckets of the same limits; nothing is refused for want of Redis.
    #[default]
    Local,
    /// Requests go through unlimited, with a warning once per fault.
    Open,
    /// Requests are refused with `503` and `Retry-After: 1`.
    Closed,
}

/// The `on_error` hook: called for every failed limiter call with the error, the request's head and the
/// failure table's row (its `class` is the row's short name).
pub type ErrorHook = Arc<dyn Fn(&Error, &Parts, Failure) + Send + Sync>;

/// A tower layer limiting every request by its limits in Redis:
/// `RateLimitLayer::builder(client, [Limit::new("api", 10.0, 20.0)?]).build()?`. A clone shares everything:
/// options, in-memory buckets, metrics.
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

/// A built layer's options and state.
struct Shared {
    client: Client,
    limits: Vec<Limit>,
    key: KeyFn,
    ipv6_subnet: Ipv6Subnet,
    prefix: String,
    fail: FailMode,
    standard: Standard,
    status: StatusCode,
    /// The header values of the whole list of limits that every decision shares.
    fixed: answer::Fixed,
    refusal: Option<RefusalHook>,
    on_error: Option<ErrorHook>,
    shadow: bool,
    #[cfg(feature = "prometheus")]
    metrics: Option<crate::metrics::Metrics>,
    /// Shared with the refills of leased limits, which run on tasks of their own.
    local: Arc<Mutex<LocalBuckets>>,
    /// The leases of the leased limit's keys.
    leases: Arc<lease::Leases>,
    epoch: Instant,
    /// A fault is under way: its warning was logged; cleared by the next call that answers.
    in_fault: AtomicBool,
    log: Mutex<LogState>,
    anonymous_warned: AtomicBool,
}

#[derive(Default)]
struct LogState {
    error_logged_at: HashMap<&'static str, Instant>,
    /// When a charge-back refused by each row was last logged (as configuration errors, once a minute per row).
    charge_back_logged_at: HashMap<&'static str, Instant>,
    /// When each shadow limit's refusal was last logged.
    shadow_logged_at: HashMap<String, Instant>,
}

/// Whether the message `key` names is logged at `now`: the first time, then at most once in `interval`; when it
/// is, `now` is recorded as its last time.
fn log_due<Q, K>(
    logged_at: &mut HashMap<K, Instant>,
    key: &Q,
    now: Instant,
    interval: Duration,
) -> bool
where
    Q: ?Sized + std::hash::Hash + Eq + ToOwned<Owned = K>,
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
{
    let due = logged_at
        .get(key)
        .is_none_or(|at| now.saturating_duration_since(*at) >= interval);
    if due {
        logged_at.insert(key.to_owned(), now);
    }
    due
}

/// A configuration error of the same row is logged at most once in this long.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// A shadow limit's refusals are logged at most once per limit in this long.
const SHADOW_LOG_INTERVAL: Duration = Duration::from_secs(1);

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}
