//! The tower layer: every request a limit applies to takes its cost from Redis first; a refusal answers `429`
//! with `Retry-After` and a small JSON body; every limited response carries the RateLimit header fields
//! (docs/headers.md). Works with axum's `Router::layer` as it is:
//!
//! ```text
//! errors      refusals and failures are responses (429, or 503 for fail mode closed), never the service's
//!             error: the layer adds no error type of its own, so axum needs no HandleErrorLayer
//! readiness   poll_ready answers at once; the call clones the inner service and waits for its readiness only
//!             after Redis has decided, so no slot of the inner service is held while Redis is asked
//! one call    one limit: TB.ACQUIRE; several: one TB.ACQUIREEACH, all or nothing, one header item each
//! failures    the fail mode: local (default: in-memory buckets that continue from Redis's last answer and
//!             charge back what they admitted), open, or closed; the failure table's logging
//! ```
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::client::Client;
use crate::command::BucketWithCost;
use crate::error::{ConfigError, Error};
use crate::failure::Failure;
use crate::headers::{rate_limit_headers, Policy, Standard};
use crate::keys::{self, addr_identity, Ipv6Subnet};
use crate::limit::{Identity, KeyFn, Limit};
use crate::local::{LocalBucket, LocalBuckets, DEFAULT_CAPACITY};
use crate::replies::{AcquiredEach, BucketResult};

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

/// A configuration error of the same row is logged at most once in this long.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Builds the layer: `RateLimitLayer::new(client, [Limit::new("api", 10.0, 20.0)?])`, then options.
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client,
    limits: Vec<Limit>,
    key: Option<KeyFn>,
    ipv6_subnet: Ipv6Subnet,
    prefix: String,
    fail: FailMode,
    standard: Standard,
    status: StatusCode,
    local: Mutex<LocalBuckets>,
    epoch: Instant,
    log: Mutex<LogState>,
    anonymous_warned: AtomicBool,
}

#[derive(Default)]
struct LogState {
    /// A fault is under way: its warning was logged; cleared by the next call that answers.
    in_fault: bool,
    error_logged_at: HashMap<&'static str, Instant>,
}

impl RateLimitLayer {
    /// Every request takes each limit's cost from its bucket for the request's identity (by default the peer
    /// address from axum's `ConnectInfo<SocketAddr>`). Refuses an empty list of limits and two limits of one
    /// name.
    pub fn new(
        client: Client,
        limits: impl IntoIterator<Item = Limit>,
    ) -> Result<RateLimitLayer, ConfigError> {
        let limits: Vec<Limit> = limits.into_iter().collect();
        if limits.is_empty() {
            return Err(ConfigError::new(
                "limits must name at least one limit".to_owned(),
            ));
        }
        for (index, limit) in limits.iter().enumerate() {
            if limits
                .iter()
                .skip(index + 1)
                .any(|other| other.name == limit.name)
            {
                return Err(ConfigError::new(format!(
                    "limits: two limits are named {:?}; each needs its own name (it names the buckets)",
                    limit.name
                )));
            }
        }
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                client,
                limits,
                key: None,
                ipv6_subnet: Ipv6Subnet::DEFAULT,
                prefix: keys::DEFAULT_PREFIX.to_owned(),
                fail: FailMode::Local,
                standard: Standard::Both,
                status: StatusCode::TOO_MANY_REQUESTS,
                local: Mutex::new(LocalBuckets::new(DEFAULT_CAPACITY)),
                epoch: Instant::now(),
                log: Mutex::new(LogState::default()),
                anonymous_warned: AtomicBool::new(false),
            }),
        })
    }

    fn with(self, change: impl FnOnce(&mut Shared)) -> RateLimitLayer {
        let mut shared = match Arc::try_unwrap(self.shared) {
            Ok(shared) => shared,
            Err(shared) => Shared {
                client: shared.client.clone(),
                limits: shared.limits.clone(),
                key: shared.key.clone(),
                ipv6_subnet: shared.ipv6_subnet,
                prefix: shared.prefix.clone(),
                fail: shared.fail,
                standard: shared.standard,
                status: shared.status,
                local: Mutex::new(LocalBuckets::new(DEFAULT_CAPACITY)),
                epoch: shared.epoch,
                log: Mutex::new(LogState::default()),
                anonymous_warned: AtomicBool::new(false),
            },
        };
        change(&mut shared);
        RateLimitLayer {
            shared: Arc::new(shared),
        }
    }

    /// Who a request counts against, for every limit without a key function of its own. Return
    /// [`Identity::Skip`] to let a request through unlimited, [`Identity::Anonymous`] when there is no identity.
    pub fn key<F>(self, key: F) -> RateLimitLayer
    where
        F: Fn(&Parts) -> Identity + Send + Sync + 'static,
    {
        self.with(|shared| shared.key = Some(Arc::new(key)))
    }

    /// The prefix length IPv6 peers are grouped by in the default key (default /56).
    pub fn ipv6_subnet(self, subnet: Ipv6Subnet) -> RateLimitLayer {
        self.with(|shared| shared.ipv6_subnet = subnet)
    }

    /// The start of every bucket key (default `ratelimit:`). Refuses a prefix that empties the hash tag.
    pub fn prefix(self, prefix: &str) -> Result<RateLimitLayer, ConfigError> {
        let prefix = keys::check_prefix(prefix)?.to_owned();
        Ok(self.with(|shared| shared.prefix = prefix))
    }

    /// What answers while Redis fails (default [`FailMode::Local`]).
    pub fn fail(self, fail: FailMode) -> RateLimitLayer {
        self.with(|shared| shared.fail = fail)
    }

    /// Which header fields to send (default [`Standard::Both`]).
    pub fn standard(self, standard: Standard) -> RateLimitLayer {
        self.with(|shared| shared.standard = standard)
    }

    /// Keys the local fail mode keeps in memory (default 10,000); beyond them, one overflow bucket per limit.
    pub fn local_capacity(self, capacity: usize) -> RateLimitLayer {
        self.with(|shared| shared.local = Mutex::new(LocalBuckets::new(capacity)))
    }
}

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

/// The limits that apply to one request, each with its bucket key.
struct Plan {
    limits: Vec<Limit>,
    keys: Vec<String>,
}

/// What to answer.
enum Verdict {
    /// Go on to the inner service, adding these headers.
    Pass(Vec<(&'static str, String)>),
    /// Answer this instead.
    Refuse(Response<Body>),
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<axum::BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // Readiness of the inner service is awaited in the call, after Redis decided.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let mut inner = self.inner.clone();
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let plan = shared.plan(&parts);
            let request = Request::from_parts(parts, body);
            let headers = match plan {
                None => Vec::new(),
                Some(plan) => match shared.decide(&plan).await {
                    Verdict::Pass(headers) => headers,
                    Verdict::Refuse(response) => return Ok(response),
                },
            };
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            let response = inner.call(request).await?;
            let mut response = response.map(Body::new);
            append(&mut response, headers);
            Ok(response)
        })
    }
}

fn append(response: &mut Response<Body>, headers: Vec<(&'static str, String)>) {
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .append(HeaderName::from_static(lower(name)), value);
        }
    }
}

/// The header names of [`rate_limit_headers`] in the lowercase `HeaderName::from_static` wants.
fn lower(name: &'static str) -> &'static str {
    match name {
        "RateLimit-Policy" => "ratelimit-policy",
        "RateLimit" => "ratelimit",
        "RateLimit-Limit" => "ratelimit-limit",
        "RateLimit-Remaining" => "ratelimit-remaining",
        "RateLimit-Reset" => "ratelimit-reset",
        _ => "retry-after",
    }
}

impl Shared {
    /// The limits for a request and their keys; `None` when every limit skips it.
    fn plan(&self, parts: &Parts) -> Option<Plan> {
        let mut limits = Vec::with_capacity(self.limits.len());
        let mut keys = Vec::with_capacity(self.limits.len());
        for limit in &self.limits {
            let identity = match limit.key.as_ref().or(self.key.as_ref()) {
                Some(key) => key(parts),
                None => peer_identity(parts, self.ipv6_subnet),
            };
            let tag = match identity {
                Identity::Skip => continue,
                Identity::Key(text) if !text.is_empty() => keys::tag_of(Some(&text)),
                Identity::Key(_) | Identity::Anonymous => {
                    self.warn_anonymous(limit);
                    keys::tag_of(None)
                }
            };
            keys.push(keys::tagged_key(&self.prefix, &tag, &limit.name));
            limits.push(limit.clone());
        }
        (!limits.is_empty()).then_some(Plan { limits, keys })
    }

    fn warn_anonymous(&self, limit: &Limit) {
        if !self.anonymous_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                limit = %limit.name,
                "redis-tb: the key function found no identity for a request: such requests share the anonymous \
                 bucket. Serve with `into_make_service_with_connect_info::<SocketAddr>()` for the peer address, \
                 or give the layer a key function that finds the client (logged once per process)"
            );
        }
    }

    fn now_ms(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1000.0
    }

    /// Asks Redis (after the charge-backs the local buckets owe), or the fail mode when that fails.
    async fn decide(&self, plan: &Plan) -> Verdict {
        let buckets: Vec<LocalBucket<'_>> = plan
            .limits
            .iter()
            .zip(&plan.keys)
            .map(|(limit, key)| LocalBucket {
                key,
                limit: &limit.name,
                rate: limit.rate,
                burst: limit.burst,
                cost: limit.cost,
            })
            .collect();
        match self.ask(&buckets).await {
            Ok(reply) => {
                self.answered();
                if self.fail == FailMode::Local {
                    let now_ms = self.now_ms();
                    if let Ok(mut local) = self.local.lock() {
                        local.answered(&buckets, &reply.buckets, now_ms);
                    }
                }
                self.verdict(plan, &reply)
            }
            Err(err) => {
                self.failed(&err);
                match self.fail {
                    FailMode::Open => Verdict::Pass(Vec::new()),
                    FailMode::Closed => Verdict::Refuse(unavailable()),
                    FailMode::Local => {
                        let now_ms = self.now_ms();
                        let reply = match self.local.lock() {
                            Ok(mut local) => local.acquire_each(&buckets, now_ms),
                            // A panic elsewhere poisoned the table: refuse rather than let everything through.
                            Err(_) => return Verdict::Refuse(unavailable()),
                        };
                        self.verdict(plan, &reply)
                    }
                }
            }
        }
    }

    /// The charge-backs, then the call: TB.ACQUIRE for one limit, TB.ACQUIREEACH for several.
    async fn ask(&self, buckets: &[LocalBucket<'_>]) -> Result<AcquiredEach, Error> {
        if self.fail == FailMode::Local {
            let owed = match self.local.lock() {
                Ok(local) => local.owed(buckets),
                Err(_) => Vec::new(),
            };
            for charge in owed {
                match self
                    .client
                    .charge(&charge.key, charge.rate, charge.burst, charge.cost)
                    .await
                {
                    Ok(_) => self.settle(&charge.key),
                    Err(err) if is_debt_refusal(&err) => {
                        tracing::error!(
                            "redis-tb: Redis refused the charge-back of {} tokens admitted while it failed ({err}); \
                             dropped",
                            charge.cost
                        );
                        self.settle(&charge.key);
                    }
                    Err(err) => return Err(err),
                }
            }
        }
        if let [bucket] = buckets {
            let reply = self
                .client
                .acquire(bucket.key, bucket.rate, bucket.burst, bucket.cost)
                .await?;
            return Ok(AcquiredEach {
                allowed: reply.allowed,
                limiting_index: 0,
                buckets: vec![BucketResult {
                    fits: reply.allowed,
                    remaining: reply.remaining,
                    retry_after_ms: reply.retry_after_ms,
                    reset_after_ms: reply.reset_after_ms,
                }],
            });
        }
        let each: Vec<BucketWithCost<'_>> = buckets
            .iter()
            .map(|bucket| BucketWithCost {
                key: bucket.key,
                rate: bucket.rate,
                burst: bucket.burst,
                cost: bucket.cost,
            })
            .collect();
        self.client.acquire_each(&each).await
    }

    fn settle(&self, key: &str) {
        if let Ok(mut local) = self.local.lock() {
            local.settled(key);
        }
    }

    fn verdict(&self, plan: &Plan, reply: &AcquiredEach) -> Verdict {
        let policies: Vec<Policy<'_>> = plan
            .limits
            .iter()
            .map(|limit| Policy {
                name: &limit.name,
                rate: limit.rate,
                burst: limit.burst,
            })
            .collect();
        let headers = rate_limit_headers(&policies, reply, self.standard);
        if reply.allowed {
            return Verdict::Pass(headers);
        }
        let name = plan
            .limits
            .get(reply.limiting_index)
            .map_or("", |limit| limit.name.as_str());
        let mut body = serde_json::Map::new();
        body.insert("error".to_owned(), "rate limit exceeded".into());
        body.insert("limit".to_owned(), name.into());
        let retry_after_ms = reply.retry_after_ms();
        if retry_after_ms >= 0 {
            body.insert("retry_after_ms".to_owned(), retry_after_ms.into());
        }
        let body = serde_json::Value::Object(body).to_string();
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = self.status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        append(&mut response, headers);
        Verdict::Refuse(response)
    }

    /// A call answered: a fault under way ends.
    fn answered(&self) {
        let ended = self
            .log
            .lock()
            .map(|mut log| std::mem::replace(&mut log.in_fault, false))
            .unwrap_or(false);
        if ended {
            tracing::info!("redis-tb: Redis answers again; limiter calls go to it");
        }
    }

    /// A call failed: logged as the failure table says (a warning once per fault; a configuration error at
    /// error level, at most once a minute per row).
    fn failed(&self, err: &Error) {
        let failure: Failure = err.failure();
        let Ok(mut log) = self.log.lock() else {
            return;
        };
        let starts = !std::mem::replace(&mut log.in_fault, true);
        if failure.is_config_error() {
            let now = Instant::now();
            let due = log
                .error_logged_at
                .get(failure.row)
                .is_none_or(|at| now.duration_since(*at) >= ERROR_LOG_INTERVAL);
            if due {
                log.error_logged_at.insert(failure.row, now);
                drop(log);
                tracing::error!(
                    row = failure.row,
                    "redis-tb: limiter call refused: {err}; this does not pass by itself (the Redis user's \
                     password or permissions, a key of another type, or a bug); meanwhile fail={:?} answers",
                    self.fail
                );
            }
        } else if starts {
            drop(log);
            tracing::warn!(
                row = failure.row,
                "redis-tb: Redis unavailable ({err}); fail={:?} answers until it answers again",
                self.fail
            );
        }
    }
}

/// The default key: the peer address from axum's `ConnectInfo<SocketAddr>` (served with
/// `into_make_service_with_connect_info::<SocketAddr>()`), IPv4-mapped IPv6 as IPv4, other IPv6 by its `subnet`
/// prefix; [`Identity::Anonymous`] without one. For a key function that skips some requests and keys the others
/// as the default does.
pub fn peer_identity(parts: &Parts, subnet: Ipv6Subnet) -> Identity {
    match parts.extensions.get::<ConnectInfo<SocketAddr>>() {
        Some(ConnectInfo(address)) => Identity::Key(addr_identity(address.ip(), subnet)),
        None => Identity::Anonymous,
    }
}

/// `TB.CHARGE` refused because the charge would put the bucket more than a day into debt.
fn is_debt_refusal(err: &Error) -> bool {
    err.server_text()
        .is_some_and(|text| text.contains("24 hours of refill into debt"))
}

/// Fail mode closed: Redis could not be asked, so the request is refused.
fn unavailable() -> Response<Body> {
    let mut response = Response::new(Body::from(
        serde_json::json!({"error": "rate limiter unavailable"}).to_string(),
    ));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

// The layer's own errors are responses: what it adds to the inner service's error type is nothing.
const _: fn() = || {
    fn infallible<T: Service<Request<Body>, Error = Infallible>>() {}
    infallible::<RateLimit<axum::routing::Route>>();
};
