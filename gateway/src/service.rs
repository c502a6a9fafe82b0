//! The gRPC `envoy.service.ratelimit.v3.RateLimitService`: thin glue over `decision` (what to ask Redis, what to
//! answer) and `backend` (asking it). It takes the configuration in force once per request, so a reload never
//! changes a request halfway.
//!
//! ```text
//! INVALID_ARGUMENT   empty domain, no descriptors, more than 1,000 rate-limited descriptors
//! UNAVAILABLE        Redis not connected, no reply within --redis-timeout, or a transient server state:
//!                    Envoy's failure_mode_deny decides
//! INTERNAL           Redis replied with an error (e.g. the module is not loaded) or an unexpected shape
//! ```
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::backend::{Backend, BackendError};
use crate::config::Config;
use crate::decision::{self, Options};
use crate::metrics::{Metrics, Outcome};
use crate::reload::Shared;

/// How many calls one request may take: the first, and one more per round of shadow-mode buckets taken out of
/// the charge (see `Plan::unshadow`); a request that still finds a new shadow misfit after that is answered from
/// the last reply.
const MAX_CALLS: usize = 3;

/// The service's state: shared by every request.
pub struct RateLimiter {
    pub config: Shared,
    pub options: Options,
    pub backend: Backend,
    pub metrics: Arc<Metrics>,
    pub failure_log: Throttle,
}

/// Lets one log line through per second; counts the ones it holds back. When Redis is away every request fails,
/// and a line each would flood the log at the request rate; the metrics count them all.
#[derive(Default)]
pub struct Throttle {
    /// Milliseconds since `epoch` of the last line let through, plus 1 (0: none yet).
    last_ms: AtomicU64,
    suppressed: AtomicU64,
    epoch: std::sync::OnceLock<Instant>,
}

impl Throttle {
    /// `Some(lines held back since the last one)` when a line may be logged now.
    pub fn admit(&self) -> Option<u64> {
        let epoch = *self.epoch.get_or_init(Instant::now);
        let now_ms = u64::try_from(epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last_ms = self.last_ms.load(Ordering::Relaxed);
        if last_ms != 0 && now_ms.saturating_sub(last_ms) < 1_000 {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self
            .last_ms
            .compare_exchange(last_ms, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

impl RateLimiter {
    fn config(&self) -> Result<Arc<Config>, Status> {
        self.config
            .read()
            .map(|config| Arc::clone(&config))
            .map_err(|_| Status::internal("configuration lock poisoned"))
    }

    async fn decide(
        &self,
        config: &Config,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, (Outcome, Status)> {
        let mut plan = decision::plan(config, &self.options, request)
            .map_err(|err| (Outcome::Invalid, Status::invalid_argument(err.to_string())))?;
        let mut reply = None;
        if !plan.buckets.is_empty() {
            for _ in 0..MAX_CALLS {
                let value = self.backend.acquire_each(&plan.command_args()).await.map_err(|err| {
                    let unavailable = matches!(err, BackendError::Unavailable(_));
                    self.metrics.redis_error(unavailable);
                    if let Some(suppressed) = self.failure_log.admit() {
                        tracing::warn!(domain = %request.domain, error = %err, suppressed, "rate limit call failed");
                    }
                    if unavailable {
                        (Outcome::Unavailable, Status::unavailable(err.to_string()))
                    } else {
                        (Outcome::Error, Status::internal(err.to_string()))
                    }
                })?;
                let parsed = decision::parse_reply(&value, plan.buckets.len()).map_err(|why| {
                    self.metrics.redis_error(false);
                    tracing::error!(domain = %request.domain, error = %why, "unexpected reply from redis");
                    (Outcome::Error, Status::internal(format!("unexpected reply from redis: {why}")))
                })?;
                let again = plan.unshadow(&parsed);
                reply = Some(parsed);
                if !again {
                    break;
                }
            }
        }
        let verdict = plan.respond(&self.options, reply.as_ref());
        self.metrics
            .shadow_over_limit(&request.domain, verdict.shadow_hits);
        Ok(verdict.response)
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let request = request.into_inner();
        let config = self.config()?;
        // Only configured domains become label values: a caller cannot grow the metrics without bound.
        let label = if config.has_domain(&request.domain) {
            request.domain.as_str()
        } else {
            "other"
        };
        let result = self.decide(&config, &request).await;
        let outcome = match &result {
            Ok(response) if response.overall_code == i32::from(decision::OVER_LIMIT) => {
                Outcome::OverLimit
            }
            Ok(_) => Outcome::Ok,
            Err((outcome, _)) => *outcome,
        };
        self.metrics.decision(label, outcome, started.elapsed());
        tracing::debug!(domain = %request.domain, outcome = ?outcome, "decided");
        result.map(Response::new).map_err(|(_, status)| status)
    }
}
