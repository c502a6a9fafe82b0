//! The rate-limit response headers (`--response-headers`): the client crate's mapping (docs/headers.md,
//! `redis_tb_client::headers`), under the legacy names chosen and as Envoy's header values. Pure.
#![forbid(unsafe_code)]

use envoy_types::pb::envoy::config::core::v3::HeaderValue;

use redis_tb_client::headers::{self, Policy, Standard};
use redis_tb_client::AcquiredEach;

use super::{Options, Plan};
use crate::config::Limit;

/// Names of the legacy headers (envoyproxy/ratelimit's `LIMIT_*_HEADER` settings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            limit: "RateLimit-Limit".to_owned(),
            remaining: "RateLimit-Remaining".to_owned(),
            reset: "RateLimit-Reset".to_owned(),
        }
    }
}

impl Plan {
    /// The rate-limit headers of this plan's buckets; `over_limit` is the verdict.
    pub(super) fn headers(
        &self,
        options: &Options,
        reply: Option<&AcquiredEach>,
        over_limit: bool,
    ) -> Vec<HeaderValue> {
        let Some(reply) = reply else {
            return Vec::new();
        };
        let policies: Vec<Policy<'_>> = self
            .buckets
            .iter()
            .map(|bucket| Policy {
                name: policy_name(&bucket.limit),
                rate: bucket.rate_per_sec,
                burst: f64::from(bucket.burst),
            })
            .collect();
        response_headers(
            options.headers,
            &options.header_names,
            &policies,
            reply,
            over_limit,
        )
    }
}

/// The name a limit goes by in headers: its `name`, else its path in the file (never a request's values).
fn policy_name(limit: &Limit) -> &str {
    if limit.name.is_empty() {
        &limit.path
    } else {
        &limit.name
    }
}

/// The header fields of `reply` over `policies` in `standard` (`redis_tb_client::headers::rate_limit_headers`),
/// the legacy ones under `names`. `refused` is the verdict: shadow mode lets a refused call through (no
/// `Retry-After`), and a refusal no bucket explains (a `requests_per_unit: 0` limit) has no wait to give.
pub fn response_headers(
    standard: Standard,
    names: &HeaderNames,
    policies: &[Policy<'_>],
    reply: &AcquiredEach,
    refused: bool,
) -> Vec<HeaderValue> {
    let decided;
    let reply = if refused || reply.allowed {
        reply
    } else {
        decided = AcquiredEach {
            allowed: true,
            limiting_index: reply.limiting_index,
            buckets: reply.buckets.clone(),
        };
        &decided
    };
    headers::rate_limit_headers(policies, reply, standard)
        .into_iter()
        .map(|(name, value)| HeaderValue {
            key: match name {
                "RateLimit-Limit" => names.limit.clone(),
                "RateLimit-Remaining" => names.remaining.clone(),
                "RateLimit-Reset" => names.reset.clone(),
                other => other.to_owned(),
            },
            value,
            ..HeaderValue::default()
        })
        .collect()
}

#[cfg(test)]
#[path = "headers_tests.rs"]
mod tests;
