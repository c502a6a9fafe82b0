//! The gRPC `envoy.service.ratelimit.v3.RateLimitService`: thin glue over `decision` (what to ask Redis, what to
//! answer) and `backend` (asking it). It takes the configuration in force once per request, so a reload never
//! changes a request halfway.
//!
//! ```text
//! INVALID_ARGUMENT   empty domain, no descriptors, more than 1,000 rate-limited descriptors
//! UNAVAILABLE        Redis not connected, no reply within --redis-timeout, an outage of the failure table (BUSY,
//!                    LOADING, READONLY, OOM, MISCONF, MOVED, a failover...: redis_tb_client::failure), or more than
//!                    --max-in-flight requests at once: Envoy's failure_mode_deny decides
//! OUT_OF_RANGE       a request larger than --max-request-bytes (refused by tonic before it is read)
//! INTERNAL           a configuration error of the failure table (NOAUTH, NOPERM, WRONGTYPE, an error
//!                    it does not know), logged as an error, or a reply of an unexpected shape
//! ```
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::backend::{Backend, BackendError, Throttle};
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
    /// Requests being decided; one more than it holds is refused at once (UNAVAILABLE), so a burst of requests
    /// cannot pile up in memory behind a slow Redis.
    pub in_flight: Arc<tokio::sync::Semaphore>,
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
                let parsed = self.backend.acquire_each(&plan.command_buckets()).await.map_err(|err| {
                    let unavailable = matches!(err, BackendError::Unavailable(_));
                    self.metrics.redis_error(unavailable);
                    if let Some(suppressed) = self.failure_log.admit() {
                        if unavailable {
                            tracing::warn!(domain = %request.domain, error = %err, suppressed, "rate limit call failed");
                        } else {
                            // A configuration error does not pass by itself: said louder than an outage.
                            tracing::error!(domain = %request.domain, error = %err, suppressed, "rate limit call failed: a configuration error");
                        }
                    }
                    if unavailable {
                        (Outcome::Unavailable, Status::unavailable(err.to_string()))
                    } else {
                        (Outcome::Error, Status::internal(err.to_string()))
                    }
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
        let Ok(_permit) = Arc::clone(&self.in_flight).try_acquire_owned() else {
            self.metrics.refused_in_flight();
            return Err(Status::unavailable(
                "too many requests in flight (--max-in-flight)",
            ));
        };
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
