//! The tower layer: every request a limit applies to takes its cost from Redis first; a refusal answers `429`
//! (or the status_code option's) with `Retry-After` and a small JSON body (or the body option's); every limited
//! response carries the RateLimit header fields (docs/headers.md). Works with axum's `Router::layer` as it is:
//!
//! ```text
//! errors      refusals and failures are responses (429, or 503 for fail mode closed), never the service's
//!             error: the layer adds no error type of its own, so axum needs no HandleErrorLayer
//! readiness   poll_ready answers at once; the call clones the inner service and waits for its readiness only
//!             after Redis has decided, so no slot of the inner service is held while Redis is asked
//! one call    one limit: TB.ACQUIRE; several: one TB.ACQUIREEACH, all or nothing, one header item each. On a
//!             cluster, limits whose keys are in other slots (their own key function) go in one call per slot,
//!             and a refusal by one gives back (TB.REFUND) what the others took
//! failures    the fail mode: local (default: in-memory buckets that continue from Redis's last answer; when
//!             Redis answers again, each call for a key they admitted for first brings Redis's bucket down to
//!             the in-memory one, TB.LOWER), open, or closed; the failure table's logging; the on_error hook
//! refusals    status_code (default 429) and body (a JSON object, or a function of the Decision)
//! shadow      shadow limits are decided in a second call, only when the enforced limits allow; their refusals
//!             serve the request, are logged once a second per limit and appear in no header
//! metrics     the five series of docs/operating.md, with the `prometheus` feature, in the user's Registry
//! ```
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::client::Client;
use crate::cluster::key_slot;
use crate::command::BucketWithCost;
use crate::error::{ConfigError, Error};
use crate::failure::Failure;
use crate::headers::{self, Policy, Standard};
use crate::keys::{self, addr_identity, Ipv6Subnet};
use crate::limit::{Identity, KeyFn, Limit};
use crate::local::{
    limiting_index, ChargeBack, ChargeOutcome, LocalBucket, LocalBuckets, DEFAULT_CAPACITY,
};
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
    body: RefusalBody,
    on_error: Option<ErrorHook>,
    shadow: bool,
    #[cfg(feature = "prometheus")]
    metrics: Option<crate::metrics::Metrics>,
    local: Mutex<LocalBuckets>,
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

/// A shadow limit's refusals are logged at most once per limit in this long.
const SHADOW_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The `on_error` hook: called for every failed limiter call with the error, the request's head and the
/// failure table's row (its `class` is the row's short name).
pub type ErrorHook = Arc<dyn Fn(&Error, &Parts, Failure) + Send + Sync>;

/// A refusal, as a body function is given it.
#[derive(Debug)]
pub struct Decision<'a> {
    /// The limit that refuses (the one with the longest wait).
    pub limit: &'a Limit,
    /// Its wait in ms; -1 when its cost exceeds its burst, so waiting never helps.
    pub retry_after_ms: i64,
    /// Every enforced limit of the request.
    pub limits: &'a [Limit],
    /// Redis's reply (or the local fail mode's, alike), one bucket per limit.
    pub reply: &'a AcquiredEach,
}

/// The body of a refusal: a fixed JSON object, or a function of the [`Decision`] returning one.
#[derive(Clone, Default)]
pub enum RefusalBody {
    /// `{"error": "rate limit exceeded", "limit": <name>, "retry_after_ms": <ms>}`, the wait left out when
    /// waiting never helps.
    #[default]
    Default,
    Json(serde_json::Value),
    With(Arc<dyn Fn(&Decision<'_>) -> serde_json::Value + Send + Sync>),
}

impl RefusalBody {
    /// A body made for each refusal by `body`. If it panics, the refusal gets the default body and the panic is
    /// logged: a refusal is never a 500.
    pub fn with<F>(body: F) -> RefusalBody
    where
        F: Fn(&Decision<'_>) -> serde_json::Value + Send + Sync + 'static,
    {
        RefusalBody::With(Arc::new(body))
    }
}

impl From<serde_json::Value> for RefusalBody {
    fn from(value: serde_json::Value) -> RefusalBody {
        RefusalBody::Json(value)
    }
}

/// The default refusal body.
pub fn default_body(decision: &Decision<'_>) -> serde_json::Value {
    let mut body = serde_json::Map::new();
    body.insert("error".to_owned(), "rate limit exceeded".into());
    body.insert("limit".to_owned(), decision.limit.name.as_str().into());
    if decision.retry_after_ms >= 0 {
        body.insert("retry_after_ms".to_owned(), decision.retry_after_ms.into());
    }
    serde_json::Value::Object(body)
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
                body: RefusalBody::Default,
                on_error: None,
                shadow: false,
                #[cfg(feature = "prometheus")]
                metrics: None,
                local: Mutex::new(LocalBuckets::new(DEFAULT_CAPACITY)),
                epoch: Instant::now(),
                in_fault: AtomicBool::new(false),
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
                body: shared.body.clone(),
                on_error: shared.on_error.clone(),
                shadow: shared.shadow,
                #[cfg(feature = "prometheus")]
                metrics: shared.metrics.clone(),
                local: Mutex::new(LocalBuckets::new(DEFAULT_CAPACITY)),
                epoch: shared.epoch,
                in_fault: AtomicBool::new(false),
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

    /// The status of a refusal (default 429). Refuses a status that is not an HTTP error (400 to 599).
    pub fn status_code(self, status: StatusCode) -> Result<RateLimitLayer, ConfigError> {
        if !(status.is_client_error() || status.is_server_error()) {
            return Err(ConfigError::new(format!(
                "status_code must be an HTTP error status (400 to 599), not {}",
                status.as_u16()
            )));
        }
        Ok(self.with(|shared| shared.status = status))
    }

    /// The JSON body of a refusal: `serde_json::json!({...})` (an object), or [`RefusalBody::with`] a function
    /// of the [`Decision`]. Refuses a JSON value that is not an object.
    pub fn body(self, body: impl Into<RefusalBody>) -> Result<RateLimitLayer, ConfigError> {
        let body = body.into();
        if let RefusalBody::Json(value) = &body {
            if !value.is_object() {
                return Err(ConfigError::new(format!(
                    "body must be a JSON object or a function returning one, not {value}"
                )));
            }
        }
        Ok(self.with(|shared| shared.body = body))
    }

    /// Called for every failed limiter call, before the fail mode answers, with the error, the request's head
    /// and the failure table's row (`failure.class`: `timeout`, `connection`, `oom`, ...). A panic in it is
    /// logged and changes nothing else.
    pub fn on_error<F>(self, hook: F) -> RateLimitLayer
    where
        F: Fn(&Error, &Parts, Failure) + Send + Sync + 'static,
    {
        self.with(|shared| shared.on_error = Some(Arc::new(hook)))
    }

    /// Shadow mode for every limit (default off): buckets are charged as usual, but a request they refuse is
    /// served, and logged at warning level at most once a second per limit. [`Limit::shadow`] for one limit.
    pub fn shadow(self, shadow: bool) -> RateLimitLayer {
        self.with(|shared| shared.shadow = shadow)
    }

    /// Counts into `registry` (behind the `prometheus` feature): the five series of docs/operating.md,
    /// registered once per call. For several routers, build one layer and clone it: clones share the series.
    #[cfg(feature = "prometheus")]
    pub fn metrics(self, registry: &mut prometheus_client::registry::Registry) -> RateLimitLayer {
        let metrics = crate::metrics::Metrics::register(registry);
        self.with(|shared| shared.metrics = Some(metrics))
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

/// One limit that applies to a request, with its bucket key.
struct Planned<'a> {
    limit: &'a Limit,
    key: String,
}

impl Planned<'_> {
    fn bucket(&self) -> LocalBucket<'_> {
        LocalBucket {
            key: &self.key,
            limit: &self.limit.name,
            rate: self.limit.rate,
            burst: self.limit.burst,
            cost: self.limit.cost,
        }
    }
}

/// The enforced limits of a request, decided first, and its shadow limits, decided when they allow; each in the
/// order of the layer's limits.
struct Plans<'a> {
    enforced: PlanList<'a>,
    shadow: PlanList<'a>,
}

/// The limits of one group of a request: one needs no list made (the usual request).
#[derive(Default)]
enum PlanList<'a> {
    #[default]
    Empty,
    One(Planned<'a>),
    Several(Vec<Planned<'a>>),
}

impl<'a> PlanList<'a> {
    fn push(&mut self, planned: Planned<'a>) {
        *self = match std::mem::take(self) {
            PlanList::Empty => PlanList::One(planned),
            PlanList::One(first) => PlanList::Several(vec![first, planned]),
            PlanList::Several(mut list) => {
                list.push(planned);
                PlanList::Several(list)
            }
        };
    }

    fn as_slice(&self) -> &[Planned<'a>] {
        match self {
            PlanList::Empty => &[],
            PlanList::One(planned) => std::slice::from_ref(planned),
            PlanList::Several(list) => list,
        }
    }
}

/// The header fields of a response, in the order of docs/headers.md, as [`headers::rate_limit_headers`] gives
/// them.
#[derive(Default)]
struct Fields(Vec<(&'static str, String)>);

impl Fields {
    /// The fields of a decision over the enforced limits `plan`.
    fn of(standard: Standard, plan: &[Planned<'_>], reply: &AcquiredEach) -> Fields {
        let policies: Vec<Policy<'_>> = plan.iter().map(|planned| planned.limit.policy()).collect();
        Fields(headers::rate_limit_headers(&policies, reply, standard))
    }

    /// Appends the fields to `headers`.
    fn append_to(self, headers: &mut HeaderMap) {
        for (name, value) in self.0 {
            // Every value is printable ASCII (an sf-string or digits), so each converts.
            if let (Some(name), Ok(value)) = (header_name(name), HeaderValue::try_from(value)) {
                headers.append(name, value);
            }
        }
    }
}

/// The `HeaderName` of a field [`headers::rate_limit_headers`] names.
fn header_name(name: &str) -> Option<HeaderName> {
    match name {
        "RateLimit-Policy" => Some(RATELIMIT_POLICY),
        "RateLimit" => Some(RATELIMIT),
        "RateLimit-Limit" => Some(RATELIMIT_LIMIT),
        "RateLimit-Remaining" => Some(RATELIMIT_REMAINING),
        "RateLimit-Reset" => Some(RATELIMIT_RESET),
        "Retry-After" => Some(RETRY_AFTER),
        _ => None,
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// A limiter call's reply: one bucket's needs no list made (the usual request).
enum Reply {
    One(BucketResult),
    Each(AcquiredEach),
}

impl Reply {
    fn allowed(&self) -> bool {
        match self {
            Reply::One(bucket) => bucket.fits,
            Reply::Each(each) => each.allowed,
        }
    }

    fn buckets(&self) -> &[BucketResult] {
        match self {
            Reply::One(bucket) => std::slice::from_ref(bucket),
            Reply::Each(each) => &each.buckets,
        }
    }

    /// The reply in `TB.ACQUIREEACH`'s shape, as `TB.ACQUIRE`'s one bucket is in it.
    fn into_each(self) -> AcquiredEach {
        match self {
            Reply::One(bucket) => AcquiredEach {
                allowed: bucket.fits,
                limiting_index: 0,
                buckets: vec![bucket],
            },
            Reply::Each(each) => each,
        }
    }
}

/// What to answer.
enum Verdict {
    /// Go on to the inner service, adding these fields.
    Pass(Fields),
    /// Answer this instead (a shadow plan's: an empty response); the names of the limits whose bucket did not
    /// fit (none for a fail mode's refusal).
    Refuse(Response<Body>, Vec<String>),
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
            let fields = match shared.plan(&parts) {
                None => {
                    shared.count_request("skipped", &[]);
                    Fields::default()
                }
                Some(plans) => match shared.limit(&plans, &parts).await {
                    Ok(fields) => fields,
                    Err(response) => return Ok(response),
                },
            };
            let request = Request::from_parts(parts, body);
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            let response = inner.call(request).await?;
            let mut response = response.map(Body::new);
            fields.append_to(response.headers_mut());
            Ok(response)
        })
    }
}

impl Shared {
    /// The limits for a request and their keys, enforced and shadow apart; `None` when every limit skips it.
    fn plan(&self, parts: &Parts) -> Option<Plans<'_>> {
        let mut plans = Plans {
            enforced: PlanList::Empty,
            shadow: PlanList::Empty,
        };
        for limit in &self.limits {
            let key = match limit.key.as_ref().or(self.key.as_ref()) {
                Some(key) => match key(parts) {
                    Identity::Skip => continue,
                    Identity::Key(text) if !text.is_empty() => {
                        keys::bucket_key(&self.prefix, Some(&text), &limit.name)
                    }
                    Identity::Key(_) | Identity::Anonymous => self.anonymous_key(limit),
                },
                // The default key, peer_identity's, made in place.
                None => match parts.extensions.get::<ConnectInfo<SocketAddr>>() {
                    Some(ConnectInfo(address)) => {
                        keys::peer_key(&self.prefix, address.ip(), self.ipv6_subnet, &limit.name)
                    }
                    None => self.anonymous_key(limit),
                },
            };
            let plan = if self.shadow || limit.shadow {
                &mut plans.shadow
            } else {
                &mut plans.enforced
            };
            plan.push(Planned { limit, key });
        }
        let applies = !(plans.enforced.as_slice().is_empty() && plans.shadow.as_slice().is_empty());
        applies.then_some(plans)
    }

    /// The key of `limit`'s bucket for requests without an identity, warned about once.
    fn anonymous_key(&self, limit: &Limit) -> String {
        self.warn_anonymous(limit);
        keys::bucket_key(&self.prefix, None, &limit.name)
    }

    /// The enforced limits, all or nothing; when they allow, the shadow limits, all or nothing among themselves,
    /// whose refusal is logged and serves the request. The fields (of the enforced limits only), or the refusal.
    async fn limit(&self, plans: &Plans<'_>, parts: &Parts) -> Result<Fields, Response<Body>> {
        let mut fields = Fields::default();
        let (enforced, shadow) = (plans.enforced.as_slice(), plans.shadow.as_slice());
        if !enforced.is_empty() {
            match self.decide(enforced, parts, true).await {
                Verdict::Pass(found) => fields = found,
                Verdict::Refuse(response, refused) => {
                    self.count_request("refused", &refused);
                    return Err(response);
                }
            }
        }
        if !shadow.is_empty() {
            if let Verdict::Refuse(_, refused) = self.decide(shadow, parts, false).await {
                self.count_request("shadow_refused", &refused);
                self.shadow_refused(shadow, refused);
                return Ok(fields);
            }
        }
        self.count_request("allowed", &[]);
        Ok(fields)
    }

    /// Shadow limits refused a request that is served: logged at most once a second per limit. A fail mode's
    /// refusal names no bucket: every shadow limit of the call would have refused.
    fn shadow_refused(&self, plan: &[Planned<'_>], mut refused: Vec<String>) {
        if refused.is_empty() {
            refused = plan
                .iter()
                .map(|planned| planned.limit.name.clone())
                .collect();
        }
        let now = Instant::now();
        for name in refused {
            if self.shadow_log_due(&name, now) {
                tracing::warn!(
                    limit = %name,
                    "redis-tb: shadow limit {name:?} would have refused a request; it was served (logged at most \
                     once a second per limit)"
                );
            }
        }
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

    /// Whether a refusal of shadow limit `name` at `now` is logged: the first, then one a second at most.
    fn shadow_log_due(&self, name: &str, now: Instant) -> bool {
        let Ok(mut log) = self.log.lock() else {
            return false;
        };
        let due = log
            .shadow_logged_at
            .get(name)
            .is_none_or(|at| now.saturating_duration_since(*at) >= SHADOW_LOG_INTERVAL);
        if due {
            log.shadow_logged_at.insert(name.to_owned(), now);
        }
        due
    }

    /// Asks Redis (after the charge-backs the local buckets owe), or the fail mode when that fails. `enforced`:
    /// the verdict is the response's (headers, body); else only whether it allows and which limits refused.
    async fn decide(&self, plan: &[Planned<'_>], parts: &Parts, enforced: bool) -> Verdict {
        let started = self.call_started();
        // One limit, the usual case, needs no list made.
        let one: [LocalBucket<'_>; 1];
        let several: Vec<LocalBucket<'_>>;
        let buckets: &[LocalBucket<'_>] = match plan {
            [planned] => {
                one = [planned.bucket()];
                &one
            }
            _ => {
                several = plan.iter().map(Planned::bucket).collect();
                &several
            }
        };
        match self.ask(buckets, parts).await {
            Ok(reply) => {
                self.count_decided(|| self.client.backend_in_use().as_str(), started);
                self.answered();
                if self.fail == FailMode::Local {
                    let now_ms = self.now_ms();
                    if let Ok(mut local) = self.local.lock() {
                        local.answered(buckets, reply.buckets(), now_ms);
                    }
                }
                self.verdict(plan, reply, enforced)
            }
            Err(err) => {
                self.failed(&err);
                self.count_failed(err.failure().class);
                self.call_hook(&err, parts);
                let (source, verdict) = match self.fail {
                    FailMode::Open => ("open", Verdict::Pass(Fields::default())),
                    FailMode::Closed => ("closed", Verdict::Refuse(unavailable(), Vec::new())),
                    FailMode::Local => {
                        let now_ms = self.now_ms();
                        let reply = match self.local.lock() {
                            Ok(mut local) => Some(local.acquire_each(buckets, now_ms)),
                            // A panic elsewhere poisoned the table: refuse rather than let everything through.
                            Err(_) => None,
                        };
                        let verdict = match reply {
                            Some(reply) => self.verdict(plan, Reply::Each(reply), enforced),
                            None => Verdict::Refuse(unavailable(), Vec::new()),
                        };
                        ("local", verdict)
                    }
                };
                // The call's duration ends with the fail mode's answer.
                self.count_decided(|| source, started);
                verdict
            }
        }
    }

    /// The charge-backs, then the call: TB.ACQUIRE for one limit, TB.ACQUIREEACH for several; on a cluster, one
    /// call per slot of the buckets.
    async fn ask(&self, buckets: &[LocalBucket<'_>], request: &Parts) -> Result<Reply, Error> {
        if self.fail == FailMode::Local {
            let pending = self.charges(buckets);
            if !pending.charges.is_empty() {
                // Boxed: charge-backs follow a fault only, and unboxed their future would make every call's as
                // large as theirs, moved at each await on the way down.
                Box::pin(self.charge_back(pending, request)).await?;
            }
        }
        let parts = if self.client.is_cluster() {
            slot_parts(buckets)
        } else {
            Vec::new()
        };
        if parts.len() < 2 {
            return self.acquire(buckets).await;
        }
        // Buckets in several cluster slots (limits with their own key function): one call per slot, and when one
        // refuses, what the others took goes back, so a refused request takes nothing.
        let mut replies = Vec::with_capacity(parts.len());
        for part in &parts {
            let chosen: Vec<LocalBucket<'_>> = part
                .iter()
                .filter_map(|&index| buckets.get(index).copied())
                .collect();
            replies.push(self.acquire(&chosen).await?.into_each());
        }
        let allowed = replies.iter().all(|reply| reply.allowed);
        if !allowed {
            for (part, reply) in parts.iter().zip(&replies) {
                if !reply.allowed {
                    continue;
                }
                for bucket in part.iter().filter_map(|&index| buckets.get(index)) {
                    let refund = self
                        .client
                        .refund(bucket.key, bucket.rate, bucket.burst, bucket.cost)
                        .await;
                    if let Err(err) = refund {
                        // The request stays refused; the bucket keeps what it took.
                        tracing::warn!(
                            limit = %bucket.limit,
                            "redis-tb: could not give back the tokens of a refused request ({err})"
                        );
                    }
                }
            }
        }
        let mut results: Vec<Option<BucketResult>> = vec![None; buckets.len()];
        for (part, reply) in parts.iter().zip(replies) {
            for (&index, result) in part.iter().zip(reply.buckets) {
                if let Some(slot) = results.get_mut(index) {
                    *slot = Some(result);
                }
            }
        }
        let results: Vec<BucketResult> = results.into_iter().flatten().collect();
        if results.len() != buckets.len() {
            return Err(Error::Protocol(
                "a reply of one part held fewer buckets than the part".to_owned(),
            ));
        }
        Ok(Reply::Each(AcquiredEach {
            allowed,
            limiting_index: limiting_index(&results, allowed),
            buckets: results,
        }))
    }

    /// One call for `buckets` (one slot): TB.ACQUIRE for one, TB.ACQUIREEACH for several.
    async fn acquire(&self, buckets: &[LocalBucket<'_>]) -> Result<Reply, Error> {
        if let [bucket] = buckets {
            let reply = self
                .client
                .acquire(bucket.key, bucket.rate, bucket.burst, bucket.cost)
                .await?;
            return Ok(Reply::One(BucketResult {
                fits: reply.allowed,
                remaining: reply.remaining,
                retry_after_ms: reply.retry_after_ms,
                reset_after_ms: reply.reset_after_ms,
            }));
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
        self.client.acquire_each(&each).await.map(Reply::Each)
    }

    /// The charge-backs to send before a call for `buckets`: none (and no clock read) in the usual call, where no
    /// key is diverged.
    fn charges(&self, buckets: &[LocalBucket<'_>]) -> Pending<'_> {
        let charges = match self.local.lock() {
            Ok(mut local) if local.has_diverged() => local.charge_backs(buckets, self.now_ms()),
            _ => Vec::new(),
        };
        Pending {
            local: &self.local,
            charges,
            next: 0,
        }
    }

    /// Before a call for keys the in-memory buckets diverged on, one `TB.LOWER` each (`pending`), in call order,
    /// on the call's connection: Redis's bucket comes down to the in-memory one. A charge-back that fails like a
    /// fault fails the call (its share and those not sent are owed again, and the fail mode decides); one refused
    /// by a configuration error is dropped, reported, and the call goes on.
    async fn charge_back(&self, mut pending: Pending<'_>, request: &Parts) -> Result<(), Error> {
        while let Some(charge) = pending.charges.get(pending.next) {
            let result = self
                .client
                .lower(&charge.key, charge.rate, charge.burst, charge.tokens)
                .await;
            let outcome = match &result {
                Ok(_) => ChargeOutcome::Accepted,
                Err(err) => ChargeOutcome::of_failure(err.failure()),
            };
            pending.end_next(outcome);
            match result {
                Err(err) if outcome == ChargeOutcome::Failed => return Err(err),
                Err(err) => self.charge_back_refused(&err, request),
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// A charge-back refused by a configuration error: counted and given to the error hook as a failed call, and
    /// logged at error level (at most once a minute per row); what it covered is dropped.
    fn charge_back_refused(&self, err: &Error, request: &Parts) {
        let failure = err.failure();
        self.count_failed(failure.class);
        self.call_hook(err, request);
        let Ok(mut log) = self.log.lock() else {
            return;
        };
        let now = Instant::now();
        let due = log
            .charge_back_logged_at
            .get(failure.row)
            .is_none_or(|at| now.duration_since(*at) >= ERROR_LOG_INTERVAL);
        if due {
            log.charge_back_logged_at.insert(failure.row, now);
            drop(log);
            tracing::error!(
                row = failure.row,
                "redis-tb: Redis refused a charge-back (TB.LOWER) of what the in-memory buckets admitted while it \
                 failed: {err}; what it covered is dropped and the request goes on to Redis. This does not pass by \
                 itself (the Redis user's permissions, a key of another type, or a bug)"
            );
        }
    }

    /// The on_error hook, if any, for a failed call; a panic in it is logged.
    fn call_hook(&self, err: &Error, request: &Parts) {
        if let Some(hook) = &self.on_error {
            let called = std::panic::catch_unwind(AssertUnwindSafe(|| {
                hook(err, request, err.failure());
            }));
            if called.is_err() {
                tracing::error!("redis-tb: the on_error hook panicked");
            }
        }
    }

    fn verdict(&self, plan: &[Planned<'_>], reply: Reply, enforced: bool) -> Verdict {
        // An allowed request (the usual one) reads the reply as it came: one bucket's needs no list made.
        if reply.allowed() {
            if !enforced {
                return Verdict::Pass(Fields::default());
            }
            return Verdict::Pass(Fields::of(self.standard, plan, &reply.into_each()));
        }
        let refused: Vec<String> = plan
            .iter()
            .zip(reply.buckets())
            .filter(|(_, bucket)| !bucket.fits)
            .map(|(planned, _)| planned.limit.name.clone())
            .collect();
        if !enforced {
            return Verdict::Refuse(Response::new(Body::empty()), refused);
        }
        let reply = &reply.into_each();
        let fields = Fields::of(self.standard, plan, reply);
        // Every limit applies in the usual request: the layer's list is the request's.
        let listed: Vec<Limit>;
        let limits: &[Limit] = if plan.len() == self.limits.len() {
            &self.limits
        } else {
            listed = plan.iter().map(|planned| planned.limit.clone()).collect();
            &listed
        };
        let body = match plan.get(reply.limiting_index).or(plan.first()) {
            Some(planned) => self.refusal_body(&Decision {
                limit: planned.limit,
                retry_after_ms: reply.retry_after_ms(),
                limits,
                reply,
            }),
            None => serde_json::json!({"error": "rate limit exceeded"}),
        };
        let mut response = Response::new(Body::from(body.to_string()));
        *response.status_mut() = self.status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        fields.append_to(response.headers_mut());
        Verdict::Refuse(response, refused)
    }

    /// A request's outcome and the limits that refused it, counted when the layer has metrics.
    fn count_request(&self, _outcome: &'static str, _refused: &[String]) {
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &self.metrics {
            metrics.request(_outcome, _refused);
        }
    }

    /// When a limiter call begins, for its duration: read only when the layer has metrics.
    fn call_started(&self) -> Option<Instant> {
        #[cfg(feature = "prometheus")]
        if self.metrics.is_some() {
            return Some(Instant::now());
        }
        None
    }

    /// A limiter call begun at `_started` was decided by `_source`.
    fn count_decided(&self, _source: impl FnOnce() -> &'static str, _started: Option<Instant>) {
        #[cfg(feature = "prometheus")]
        if let (Some(metrics), Some(started)) = (&self.metrics, _started) {
            metrics.decided(_source(), started.elapsed());
        }
    }

    /// A limiter call failed, of the failure table's `_class`.
    fn count_failed(&self, _class: &'static str) {
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &self.metrics {
            metrics.failed(_class);
        }
    }

    /// The body option's JSON for a refusal; the default body when a body function panics.
    fn refusal_body(&self, decision: &Decision<'_>) -> serde_json::Value {
        match &self.body {
            RefusalBody::Default => default_body(decision),
            RefusalBody::Json(value) => value.clone(),
            RefusalBody::With(body) => {
                match std::panic::catch_unwind(AssertUnwindSafe(|| body(decision))) {
                    Ok(value) => value,
                    Err(_) => {
                        tracing::error!(
                            limit = %decision.limit.name,
                            "redis-tb: the body function panicked; the refusal has the default body"
                        );
                        default_body(decision)
                    }
                }
            }
        }
    }

    /// A call answered: a fault under way ends.
    fn answered(&self) {
        // A load first: the usual call, with no fault under way, writes nothing shared.
        if self.in_fault.load(Ordering::Acquire) && self.in_fault.swap(false, Ordering::AcqRel) {
            tracing::info!("redis-tb: Redis answers again; limiter calls go to it");
        }
    }

    /// A call failed: logged as the failure table says (a warning once per fault; a configuration error at
    /// error level, at most once a minute per row).
    fn failed(&self, err: &Error) {
        let failure: Failure = err.failure();
        let starts = !self.in_fault.swap(true, Ordering::AcqRel);
        if failure.is_config_error() {
            let Ok(mut log) = self.log.lock() else {
                return;
            };
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

/// The indexes of `buckets` grouped by cluster slot, each group in the order of its first bucket.
fn slot_parts(buckets: &[LocalBucket<'_>]) -> Vec<Vec<usize>> {
    let mut parts: Vec<(u16, Vec<usize>)> = Vec::new();
    for (index, bucket) in buckets.iter().enumerate() {
        let slot = key_slot(bucket.key);
        match parts.iter_mut().find(|(known, _)| *known == slot) {
            Some((_, part)) => part.push(index),
            None => parts.push((slot, vec![index])),
        }
    }
    parts.into_iter().map(|(_, part)| part).collect()
}

/// The charge-backs of one call, from the first not yet ended. Each ends once: with its outcome, or, when the
/// call's future is dropped before (a client that went away, a timeout around the layer), as failed: its share is
/// owed again, never left in flight for good (where every answer would subtract it again).
struct Pending<'a> {
    local: &'a Mutex<LocalBuckets>,
    charges: Vec<ChargeBack>,
    /// `charges[next..]` have not ended.
    next: usize,
}

impl Pending<'_> {
    fn end_next(&mut self, outcome: ChargeOutcome) {
        if let (Some(charge), Ok(mut local)) = (self.charges.get(self.next), self.local.lock()) {
            local.charge_ended(charge, outcome);
        }
        self.next = self.next.saturating_add(1);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Some(rest) = self
            .charges
            .get(self.next..)
            .filter(|rest| !rest.is_empty())
        else {
            return;
        };
        if let Ok(mut local) = self.local.lock() {
            for charge in rest {
                local.charge_ended(charge, ChargeOutcome::Failed);
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::tests::bucket;

    #[test]
    fn a_one_bucket_reply_gives_the_verdict_of_its_acquire_each_shape() {
        let client = Client::new("redis://127.0.0.1:1/").expect("a client");
        let layer = RateLimitLayer::new(client, [Limit::new("api", 10.0, 20.0).expect("a limit")])
            .expect("a layer");
        let shared = &layer.shared;
        let plan = [Planned {
            limit: &shared.limits[0],
            key: String::new(),
        }];
        let allowed = bucket(19, 0, 100);
        let refused = bucket(0, 2500, 2000);
        // A verdict's status (none for an allowed request: the inner service answers), headers and refused limits.
        let seen = |verdict: Verdict| -> (Option<StatusCode>, Vec<(String, String)>, Vec<String>) {
            let (status, headers, refused) = match verdict {
                Verdict::Pass(fields) => {
                    let mut response = Response::new(());
                    fields.append_to(response.headers_mut());
                    (None, response.headers().clone(), Vec::new())
                }
                Verdict::Refuse(response, refused) => {
                    (Some(response.status()), response.headers().clone(), refused)
                }
            };
            let headers = headers
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_str().expect("text").to_owned()))
                .collect();
            (status, headers, refused)
        };
        for result in [allowed, refused] {
            for enforced in [true, false] {
                let one = seen(shared.verdict(&plan, Reply::One(result), enforced));
                let each = Reply::Each(Reply::One(result).into_each());
                assert_eq!(
                    one,
                    seen(shared.verdict(&plan, each, enforced)),
                    "{result:?}, {enforced}"
                );
            }
        }
        let (_, headers, _) = seen(shared.verdict(&plan, Reply::One(allowed), true));
        let expected = [
            ("ratelimit-policy", "\"api\";q=20;w=2"),
            ("ratelimit", "\"api\";r=19;t=1"),
            ("ratelimit-limit", "20"),
            ("ratelimit-remaining", "19"),
            ("ratelimit-reset", "1"),
        ]
        .map(|(name, value)| (name.to_owned(), value.to_owned()));
        assert_eq!(headers, expected);
    }

    #[test]
    fn a_shadow_limit_s_refusals_are_logged_at_most_once_a_second_each() {
        let client = Client::new("redis://127.0.0.1:1/").expect("a client");
        let limit = Limit::new("trial", 1.0, 1.0).expect("a limit");
        let layer = RateLimitLayer::new(client, [limit]).expect("a layer");
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let shared = &layer.shared;
        assert!(shared.shadow_log_due("trial", at(0)));
        assert!(!shared.shadow_log_due("trial", at(1)));
        assert!(!shared.shadow_log_due("trial", at(999)));
        // Another limit has its own second.
        assert!(shared.shadow_log_due("other", at(500)));
        assert!(shared.shadow_log_due("trial", at(1_000)));
        assert!(!shared.shadow_log_due("trial", at(1_999)));
        assert!(!shared.shadow_log_due("other", at(1_499)));
        assert!(shared.shadow_log_due("other", at(1_500)));
    }
}
