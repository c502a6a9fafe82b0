//! From a `RateLimitRequest` to one `TB.ACQUIREEACH` call, and from its reply to the `RateLimitResponse`. Pure:
//! no I/O and no clock; the service runs the call in between.
//!
//! Each request descriptor with a bucket limit becomes one bucket of the call:
//!
//! ```text
//! key    <prefix>{<domain>}:<key>=<value>:<key>=<value>...   each part %-escaped (see `descriptor_key`)
//! rate   requests_per_unit / the unit's seconds               tokens per second
//! burst  the limit's burst (default requests_per_unit)
//! cost   the descriptor's hits_addend, else the request's, else 1 (0 reports without taking)
//! ```
//!
//! Every bucket of a request carries the domain as its hash tag, so in a Redis Cluster one call reaches one slot
//! and stays all or nothing (docs/gateway.md weighs this). Two descriptors naming the same bucket become one
//! bucket with their costs added (the command takes each key once), and both report its result. Descriptors that
//! match nothing, or an `unlimited` limit, are OK without Redis; `requests_per_unit: 0` is OVER_LIMIT without it.
//!
//! Shadow mode: the command is all or nothing, so a shadow bucket that does not fit would refuse the real ones
//! too. `Plan::unshadow` takes such buckets out of the charge (cost 0) for one more call. As envoyproxy/ratelimit
//! answers: a limit's own `shadow_mode` reports its descriptor OK; the global `SHADOW_MODE` keeps each descriptor's
//! OVER_LIMIT and makes only the overall code OK. Both count in the shadow metric.
//!
//! Quota mode (a limit's `quota_mode`, or `QUOTA_MODE` for every descriptor): a quota descriptor over its limit is
//! reported OVER_LIMIT, but refuses the request only when every quota descriptor of it is over (as
//! envoyproxy/ratelimit). Until then its bucket is taken out of the charge like a shadow one, so the others are
//! charged; when they all are over, the request is refused and, as any refusal, takes nothing.
//!
//! ```text
//! mod.rs      the types, planning a request, the command's buckets (the client crate builds the command and
//!             reads its reply)
//! verdict.rs  the reply -> the response: statuses, overall code, shadow and quota mode
//! headers.rs  the response headers
//! ```
#![forbid(unsafe_code)]

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use redis_tb_client::headers::Standard;
use redis_tb_client::BucketWithCost;

use crate::config::{Config, Limit, Policy, Unit};

mod headers;
mod verdict;

pub use headers::{response_headers, HeaderNames};
pub use redis_tb_client::keys::descriptor_key;
pub use verdict::Verdict;

/// `RateLimitResponse.Code.OVER_LIMIT`, for callers comparing a response's code.
pub const OVER_LIMIT: Code = Code::OverLimit;

/// Most buckets one command takes (the module's cap).
pub const MAX_BUCKETS: usize = 1000;

/// Why a request cannot be planned: the caller's mistake, answered INVALID_ARGUMENT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    EmptyDomain,
    NoDescriptors,
    TooManyBuckets(usize),
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanError::EmptyDomain => f.write_str("rate limit domain must not be empty"),
            PlanError::NoDescriptors => f.write_str("rate limit descriptor list must not be empty"),
            PlanError::TooManyBuckets(count) => write!(
                f,
                "{count} rate-limited descriptors in one request; at most {MAX_BUCKETS}"
            ),
        }
    }
}

/// One bucket of the `TB.ACQUIREEACH` call.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    pub key: String,
    /// Tokens added per second, > 0.
    pub rate_per_sec: f64,
    /// Capacity in tokens, ≥ 1.
    pub burst: u32,
    /// Tokens this request takes, ≥ 0.
    pub cost: u64,
    /// Every descriptor on this bucket is in shadow mode.
    pub shadow: bool,
    /// Every descriptor on this bucket is in quota mode.
    pub quota: bool,
    /// It did not fit on an earlier call and is shadow-only, so it is now charged 0 (see `Plan::unshadow`).
    pub charged_zero: bool,
    /// The limit (for headers: its name, burst and rate).
    pub limit: Arc<Limit>,
}

/// What answers one request descriptor.
#[derive(Clone, Debug, PartialEq)]
pub enum Slot {
    /// No limit matched: OK, no Redis.
    NoLimit,
    /// `unlimited: true`: OK, no Redis.
    Unlimited,
    /// `requests_per_unit: 0`: OVER_LIMIT (OK in shadow mode), no Redis.
    Zero(Arc<Limit>),
    /// The bucket at this index of `Plan::buckets`.
    Bucket(usize),
}

/// A request, planned: the buckets to send and how each descriptor is answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub buckets: Vec<Bucket>,
    /// One per request descriptor, in order.
    pub slots: Vec<Slot>,
    /// Per slot: a quota descriptor (its limit's `quota_mode`, or the global one; never an unlimited one).
    pub quota: Vec<bool>,
}

/// How responses are shaped, beyond the configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Prepended to every Redis key.
    pub key_prefix: String,
    /// Every limit in shadow mode (envoyproxy/ratelimit's `SHADOW_MODE`).
    pub global_shadow: bool,
    /// Every descriptor in quota mode (envoyproxy/ratelimit's `QUOTA_MODE`).
    pub global_quota: bool,
    /// Which rate-limit header fields a response carries (`--response-headers`).
    pub headers: Standard,
    pub header_names: HeaderNames,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            key_prefix: "tb-rls:".to_owned(),
            global_shadow: false,
            global_quota: false,
            headers: Standard::None,
            header_names: HeaderNames::default(),
        }
    }
}

/// Plans `request` against `config`.
pub fn plan(
    config: &Config,
    options: &Options,
    request: &RateLimitRequest,
) -> Result<Plan, PlanError> {
    if request.domain.is_empty() {
        return Err(PlanError::EmptyDomain);
    }
    if request.descriptors.is_empty() {
        return Err(PlanError::NoDescriptors);
    }
    let request_cost = u64::from(request.hits_addend.max(1));
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut slots = Vec::with_capacity(request.descriptors.len());
    let mut quota = Vec::with_capacity(request.descriptors.len());
    // Envoy's `replaces`: a matched limit named in another matched limit's `replaces` is dropped.
    let mut matched = Vec::with_capacity(request.descriptors.len());
    for descriptor in &request.descriptors {
        let entries: Vec<(&str, &str)> = descriptor
            .entries
            .iter()
            .map(|entry| (entry.key.as_str(), entry.value.as_str()))
            .collect();
        // Envoy's per-descriptor override (`RateLimitOverride`), only in a configured domain, as
        // envoyproxy/ratelimit: its rate, no shadow mode, a name made of the domain and the entries' keys (never a
        // request's values: they reach response headers).
        let overridden = descriptor
            .limit
            .as_ref()
            .filter(|_| config.has_domain(&request.domain))
            .and_then(|limit| {
                Unit::from_proto(limit.unit).map(|unit| (limit.requests_per_unit, unit))
            });
        let found = match overridden {
            Some((requests_per_unit, unit)) => Some((
                Arc::new(Limit {
                    policy: Policy::Bucket {
                        requests_per_unit,
                        unit,
                        burst: requests_per_unit.max(1),
                    },
                    name: String::new(),
                    replaces: Vec::new(),
                    shadow_mode: false,
                    quota_mode: false,
                    path: override_path(&request.domain, &entries),
                }),
                entries
                    .iter()
                    .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
            )),
            None => config
                .find(&request.domain, &entries)
                .map(|found| (found.limit, found.bucket_entries)),
        };
        let cost = if descriptor.is_negative_hits {
            // Refills are not supported: the descriptor is reported on without taking anything.
            0
        } else {
            descriptor
                .hits_addend
                .map_or(request_cost, |addend| addend.value)
        };
        matched.push((found, cost));
    }
    let replaced: Vec<String> = matched
        .iter()
        .filter_map(|(found, _)| found.as_ref())
        .flat_map(|(limit, _)| limit.replaces.iter().cloned())
        .collect();
    for (found, cost) in matched {
        let Some((limit, bucket_entries)) = found else {
            slots.push(Slot::NoLimit);
            quota.push(options.global_quota);
            continue;
        };
        if !limit.name.is_empty() && replaced.contains(&limit.name) {
            slots.push(Slot::NoLimit);
            quota.push(options.global_quota);
            continue;
        }
        let shadow = limit.shadow_mode || options.global_shadow;
        let in_quota =
            (limit.quota_mode || options.global_quota) && limit.policy != Policy::Unlimited;
        quota.push(in_quota);
        match limit.policy {
            Policy::Unlimited => slots.push(Slot::Unlimited),
            Policy::Bucket {
                requests_per_unit: 0,
                ..
            } => slots.push(Slot::Zero(limit)),
            Policy::Bucket { burst, .. } => {
                let rate_per_sec = limit.rate_per_sec().unwrap_or(1.0);
                let key = descriptor_key(&options.key_prefix, &request.domain, &bucket_entries);
                if let Some(index) = buckets.iter().position(|bucket| bucket.key == key) {
                    if let Some(bucket) = buckets.get_mut(index) {
                        bucket.cost = bucket.cost.saturating_add(cost);
                        bucket.shadow &= shadow;
                        bucket.quota &= in_quota;
                    }
                    slots.push(Slot::Bucket(index));
                } else {
                    if buckets.len() == MAX_BUCKETS {
                        return Err(PlanError::TooManyBuckets(MAX_BUCKETS + 1));
                    }
                    slots.push(Slot::Bucket(buckets.len()));
                    buckets.push(Bucket {
                        key,
                        rate_per_sec,
                        burst,
                        cost,
                        shadow,
                        quota: in_quota,
                        charged_zero: false,
                        limit,
                    });
                }
            }
        }
    }
    Ok(Plan {
        buckets,
        slots,
        quota,
    })
}

/// An override's name in headers: the domain and the entries' keys, `<domain>.<key>[.<key>...]`.
fn override_path(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut path = domain.to_owned();
    for (key, _) in entries {
        path.push('.');
        path.push_str(key);
    }
    path
}

impl Plan {
    /// The buckets of the command, in plan order: each with its key, rate, burst and cost (0 once it is charged
    /// nothing, see `unshadow`).
    pub fn command_buckets(&self) -> Vec<BucketWithCost<'_>> {
        self.buckets
            .iter()
            .map(|bucket| BucketWithCost {
                key: &bucket.key,
                rate: bucket.rate_per_sec,
                burst: f64::from(bucket.burst),
                cost: if bucket.charged_zero {
                    0.0
                } else {
                    cost_tokens(bucket.cost)
                },
            })
            .collect()
    }
}

/// A cost as the command's number. A burst is at most `u32::MAX`, so every cost above that exceeds every burst
/// and is answered alike (never fits, `retry_after_ms` -1): it goes out as `u32::MAX + 1`, exact in an f64.
fn cost_tokens(cost: u64) -> f64 {
    u32::try_from(cost).map_or(f64::from(u32::MAX) + 1.0, f64::from)
}

#[cfg(test)]
mod tests;
