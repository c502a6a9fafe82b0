//! Building: [`RateLimitLayer::builder`]'s options. Every setter takes its value as it is and cannot fail;
//! [`RateLimitLayerBuilder::build`] checks them all at once, and the layer it returns keeps them for good (a clone
//! shares them, with the in-memory buckets and the metrics).
#![forbid(unsafe_code)]

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};

use super::answer::{Fixed, Refusal, RefusalHook};
use super::lease::Leases;
use super::{ErrorHook, FailMode, LogState, RateLimitLayer, Shared};
use crate::client::Client;
use crate::error::{ConfigError, Error};
use crate::extract::{KeyExtractor, PeerIp};
use crate::failure::Failure;
use crate::headers::Standard;
use crate::keys::{self, Ipv6Subnet};
use crate::limit::{Identity, KeyFn, Limit};
use crate::local::{LocalBuckets, DEFAULT_CAPACITY};

/// The options of a [`RateLimitLayer`], from [`RateLimitLayer::builder`]; [`build`](Self::build) checks them.
#[derive(Clone)]
#[must_use = "a builder does nothing until build() makes the layer"]
pub struct RateLimitLayerBuilder {
    client: Client,
    limits: Vec<Limit>,
    key: Option<KeyFn>,
    ipv6_subnet: u8,
    prefix: String,
    fail: FailMode,
    standard: Standard,
    status: u16,
    refusal: Option<RefusalHook>,
    on_error: Option<ErrorHook>,
    shadow: bool,
    local_capacity: usize,
    #[cfg(feature = "prometheus")]
    metrics: Option<crate::metrics::Metrics>,
}

impl RateLimitLayer {
    /// The options of a layer over `client` that takes each of `limits`' cost from its bucket for every request
    /// (all or nothing), each with its defaults; [`RateLimitLayerBuilder::build`] checks them and makes the layer.
    pub fn builder(
        client: Client,
        limits: impl IntoIterator<Item = Limit>,
    ) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            client,
            limits: limits.into_iter().collect(),
            key: None,
            ipv6_subnet: Ipv6Subnet::DEFAULT.bits(),
            prefix: keys::DEFAULT_PREFIX.to_owned(),
            fail: FailMode::Local,
            standard: Standard::Both,
            status: StatusCode::TOO_MANY_REQUESTS.as_u16(),
            refusal: None,
            on_error: None,
            shadow: false,
            local_capacity: DEFAULT_CAPACITY,
            #[cfg(feature = "prometheus")]
            metrics: None,
        }
    }
}

impl RateLimitLayerBuilder {
    /// Who a request counts against, for every limit without a key of its own (default [`PeerIp`], the peer
    /// address): [`crate::TrustedProxies`], [`crate::GlobalKey`], a closure `Fn(&Parts) -> Identity`, or your
    /// own [`KeyExtractor`].
    pub fn key<K: KeyExtractor>(mut self, key: K) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// [`key`](Self::key) for a closure, with its argument's type inferred: `.key_fn(|request| ...)`.
    pub fn key_fn<F>(self, key: F) -> Self
    where
        F: Fn(&Parts) -> Identity + Send + Sync + 'static,
    {
        self.key(key)
    }

    /// The prefix length IPv6 addresses are grouped by (default 56; 1 to 64).
    pub fn ipv6_subnet(mut self, bits: u8) -> Self {
        self.ipv6_subnet = bits;
        self
    }

    /// The start of every bucket key (default `ratelimit:`); one holding `{` or `}` is refused.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// What answers while Redis fails (default [`FailMode::Local`]).
    pub fn fail(mut self, fail: FailMode) -> Self {
        self.fail = fail;
        self
    }

    /// Which header fields to send (default [`Standard::Both`]).
    pub fn standard(mut self, standard: Standard) -> Self {
        self.standard = standard;
        self
    }

    /// The status of a refusal (default 429): an HTTP error status, 400 to 599. `StatusCode` or `u16`.
    pub fn status_code(mut self, status: impl Into<u16>) -> Self {
        self.status = status.into();
        self
    }

    /// The response to a refused request (default [`Refusal::default_response`]: the status code option's status
    /// and `{"error": "rate limit exceeded", "limit": <name>, "retry_after_ms": <ms>}`). The layer adds the
    /// RateLimit fields and `Retry-After`. If it panics, the refusal is the default one, logged.
    pub fn on_refusal<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.refusal = Some(Arc::new(hook));
        self
    }

    /// Called for every failed limiter call, before the fail mode answers, with the error, the request's head
    /// and the failure table's row (`failure.class`: `timeout`, `connection`, `oom`, ...). A panic in it is
    /// logged and changes nothing else.
    pub fn on_error<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Error, &Parts, Failure) + Send + Sync + 'static,
    {
        self.on_error = Some(Arc::new(hook));
        self
    }

    /// Shadow mode for every limit (default off): buckets are charged as usual, but a request they refuse is
    /// served, and logged at warning level at most once a second per limit. [`Limit::shadow`] for one limit.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Keys the local fail mode keeps in memory (default 10,000; at least 1); beyond them, one overflow bucket
    /// per limit.
    pub fn local_capacity(mut self, capacity: usize) -> Self {
        self.local_capacity = capacity;
        self
    }

    /// Counts into `registry` (behind the `prometheus` feature): the five series of docs/operating.md,
    /// registered once per call. For several routers, build one layer and clone it: clones share the series.
    #[cfg(feature = "prometheus")]
    pub fn metrics(mut self, registry: &mut prometheus_client::registry::Registry) -> Self {
        self.metrics = Some(crate::metrics::Metrics::register(registry));
        self
    }

    /// The layer, or the first option refused: no limit, two limits of one name, a prefix holding a brace, a
    /// status that is not an HTTP error, a local capacity of 0, an IPv6 prefix length outside 1 to 64, or a key
    /// whose [`KeyExtractor::check`] refuses.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        if self.limits.is_empty() {
            return Err(ConfigError::new(
                "limits must name at least one limit".to_owned(),
            ));
        }
        for (index, limit) in self.limits.iter().enumerate() {
            if self
                .limits
                .iter()
                .skip(index + 1)
                .any(|other| other.name == limit.name)
            {
                return Err(ConfigError::new(format!(
                    "limits: two limits are named {:?}; each needs its own name (it names the buckets)",
                    limit.name
                )));
            }
            if let Some(key) = &limit.key {
                key.check()?;
            }
        }
        if let Some(limit) = self
            .limits
            .iter()
            .find(|limit| limit.lease && limit.burst < 1.0)
        {
            return Err(ConfigError::new(format!(
                "limit {:?}: a leased limit needs a burst of at least 1 (leases are whole tokens), not {}",
                limit.name, limit.burst
            )));
        }
        if self.limits.iter().filter(|limit| limit.lease).count() > 1 {
            return Err(ConfigError::new(
                "limits: at most one limit may be leased (the shared, hot one); a request's leased tokens, once \
                 spent, cannot go back to a lease when another leased limit refuses"
                    .to_owned(),
            ));
        }
        keys::check_prefix(&self.prefix)?;
        let status = StatusCode::from_u16(self.status)
            .ok()
            .filter(|status| status.is_client_error() || status.is_server_error())
            .ok_or_else(|| {
                ConfigError::new(format!(
                    "status_code must be an HTTP error status (400 to 599), not {}",
                    self.status
                ))
            })?;
        if self.local_capacity == 0 {
            return Err(ConfigError::new(
                "local_capacity must be a positive integer (keys kept in memory), not 0".to_owned(),
            ));
        }
        let ipv6_subnet = Ipv6Subnet::new(self.ipv6_subnet)?;
        let key: KeyFn = self.key.unwrap_or_else(|| Arc::new(PeerIp));
        key.check()?;
        let fixed = Fixed::of(&self.limits);
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                client: self.client,
                fixed,
                limits: self.limits,
                key,
                ipv6_subnet,
                prefix: self.prefix,
                fail: self.fail,
                standard: self.standard,
                status,
                refusal: self.refusal,
                on_error: self.on_error,
                shadow: self.shadow,
                #[cfg(feature = "prometheus")]
                metrics: self.metrics,
                local: Arc::new(Mutex::new(LocalBuckets::new(self.local_capacity))),
                leases: Arc::new(Leases::new(self.local_capacity)),
                epoch: Instant::now(),
                in_fault: AtomicBool::new(false),
                log: Mutex::new(LogState::default()),
                anonymous_warned: AtomicBool::new(false),
            }),
        })
    }
}
