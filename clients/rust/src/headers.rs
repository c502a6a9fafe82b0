//! HTTP header fields from a decision: the one mapping of docs/headers.md, shared with the Python and Node
//! packages.
//!
//! - [`Standard::Draft`]: `RateLimit-Policy: "<name>";q=<floor(burst)>;w=<ceil(burst / rate)>` and
//!   `RateLimit: "<name>";r=<remaining>;t=<ceil(reset_after_ms / 1000)>`, one list member per bucket.
//! - [`Standard::Legacy`]: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` of the limiting bucket.
//! - [`Standard::Both`] (the default): both sets; [`Standard::None`]: neither.
//! - Every number is an integer from 0 to [`MAX_INTEGER`], the largest RFC 8941 sf-integer: larger values (a burst
//!   of 1e21, an infinite `burst / rate`, the module's saturated 2^63-1) go out as it (`fixtures/headers.json`).
//! - `Retry-After` on a refusal, `ceil(retry_after_ms / 1000)` whole seconds; left out when `retry_after_ms` is
//!   -1 (the cost exceeds the burst: waiting never helps).
#![forbid(unsafe_code)]

use crate::replies::AcquiredEach;

/// Which header fields to send.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Standard {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11).
    Draft,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (the older drafts).
    Legacy,
    /// All five.
    #[default]
    Both,
    /// No RateLimit fields (`Retry-After` still goes on a refusal).
    None,
}

/// The largest RFC 8941 sf-integer (15 digits): every number in a field is at most this.
pub const MAX_INTEGER: i64 = 999_999_999_999_999;

fn clamp(number: i64) -> i64 {
    number.clamp(0, MAX_INTEGER)
}

/// A non-negative double as a field's integer: rounded as given, clamped (infinity and NaN-free inputs only).
fn clamp_f64(number: f64) -> i64 {
    if number >= MAX_INTEGER as f64 {
        MAX_INTEGER
    } else if number > 0.0 {
        // Below MAX_INTEGER, so the conversion is exact for integral values.
        number as i64
    } else {
        0
    }
}

/// A limit as the headers describe it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy<'a> {
    pub name: &'a str,
    pub rate: f64,
    pub burst: f64,
}

fn seconds_up(ms: i64) -> i64 {
    if ms <= 0 {
        0
    } else {
        clamp(ms.saturating_add(999) / 1000)
    }
}

/// An RFC 8941 sf-string: quoted, with `\` and `"` escaped.
fn sf_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        if c == '\\' || c == '"' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

/// Whole requests the burst allows (the draft's `q` is an integer).
fn quota(burst: f64) -> i64 {
    clamp_f64(burst.floor())
}

/// The window: seconds to fill from empty, rounded up, at least 1.
fn window(policy: &Policy<'_>) -> i64 {
    clamp_f64((policy.burst / policy.rate).ceil()).max(1)
}

/// The header fields (name, value) for a decision over `policies`, one per bucket of `reply` in call order.
pub fn rate_limit_headers(
    policies: &[Policy<'_>],
    reply: &AcquiredEach,
    standard: Standard,
) -> Vec<(&'static str, String)> {
    let mut headers = Vec::with_capacity(6);
    if policies.is_empty() {
        return headers;
    }
    if matches!(standard, Standard::Draft | Standard::Both) {
        let policy: Vec<String> = policies
            .iter()
            .map(|p| format!("{};q={};w={}", sf_string(p.name), quota(p.burst), window(p)))
            .collect();
        let current: Vec<String> = policies
            .iter()
            .zip(&reply.buckets)
            .map(|(p, b)| {
                format!(
                    "{};r={};t={}",
                    sf_string(p.name),
                    clamp(b.remaining),
                    seconds_up(b.reset_after_ms)
                )
            })
            .collect();
        headers.push(("RateLimit-Policy", policy.join(", ")));
        headers.push(("RateLimit", current.join(", ")));
    }
    if matches!(standard, Standard::Legacy | Standard::Both) {
        let index = if reply.limiting_index < policies.len() {
            reply.limiting_index
        } else {
            0
        };
        if let (Some(policy), Some(bucket)) = (policies.get(index), reply.buckets.get(index)) {
            headers.push(("RateLimit-Limit", quota(policy.burst).to_string()));
            headers.push(("RateLimit-Remaining", clamp(bucket.remaining).to_string()));
            headers.push((
                "RateLimit-Reset",
                seconds_up(bucket.reset_after_ms).to_string(),
            ));
        }
    }
    let retry_after_ms = reply.retry_after_ms();
    if !reply.allowed && retry_after_ms >= 0 {
        headers.push(("Retry-After", seconds_up(retry_after_ms).to_string()));
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replies::BucketResult;

    fn bucket(remaining: i64, retry_after_ms: i64, reset_after_ms: i64) -> BucketResult {
        BucketResult {
            fits: retry_after_ms == 0,
            remaining,
            retry_after_ms,
            reset_after_ms,
        }
    }

    const POLICIES: [Policy<'static>; 2] = [
        Policy {
            name: "per-user",
            rate: 10.0,
            burst: 20.0,
        },
        Policy {
            name: "tenant",
            rate: 100.0,
            burst: 1000.0,
        },
    ];

    /// The two examples of docs/headers.md, field by field.
    #[test]
    fn the_examples_of_the_headers_doc() {
        let allowed = AcquiredEach {
            allowed: true,
            limiting_index: 0,
            buckets: vec![bucket(19, 0, 100), bucket(999, 0, 10)],
        };
        assert_eq!(
            rate_limit_headers(&POLICIES, &allowed, Standard::Both),
            vec![
                (
                    "RateLimit-Policy",
                    "\"per-user\";q=20;w=2, \"tenant\";q=1000;w=10".to_owned()
                ),
                (
                    "RateLimit",
                    "\"per-user\";r=19;t=1, \"tenant\";r=999;t=1".to_owned()
                ),
                ("RateLimit-Limit", "20".to_owned()),
                ("RateLimit-Remaining", "19".to_owned()),
                ("RateLimit-Reset", "1".to_owned()),
            ]
        );
        let refused = AcquiredEach {
            allowed: false,
            limiting_index: 0,
            buckets: vec![bucket(0, 100, 2000), bucket(980, 0, 200)],
        };
        assert_eq!(
            rate_limit_headers(&POLICIES, &refused, Standard::Both),
            vec![
                (
                    "RateLimit-Policy",
                    "\"per-user\";q=20;w=2, \"tenant\";q=1000;w=10".to_owned()
                ),
                (
                    "RateLimit",
                    "\"per-user\";r=0;t=2, \"tenant\";r=980;t=1".to_owned()
                ),
                ("RateLimit-Limit", "20".to_owned()),
                ("RateLimit-Remaining", "0".to_owned()),
                ("RateLimit-Reset", "2".to_owned()),
                ("Retry-After", "1".to_owned()),
            ]
        );
    }

    #[test]
    fn a_cost_above_the_burst_gets_no_retry_after_and_names_are_quoted() {
        let never = AcquiredEach {
            allowed: false,
            limiting_index: 0,
            buckets: vec![bucket(5, -1, 0)],
        };
        let policy = [Policy {
            name: "a \"b\" \\",
            rate: 1.0,
            burst: 5.5,
        }];
        assert_eq!(
            rate_limit_headers(&policy, &never, Standard::Draft),
            vec![
                (
                    "RateLimit-Policy",
                    "\"a \\\"b\\\" \\\\\";q=5;w=6".to_owned()
                ),
                ("RateLimit", "\"a \\\"b\\\" \\\\\";r=5;t=0".to_owned()),
            ]
        );
    }
}
