//! HTTP header fields from a decision: the one mapping of docs/headers.md, shared with the Python and Node
//! packages.
//!
//! - [`Standard::Draft`]: `RateLimit-Policy: "<name>";q=<floor(burst)>;w=<ceil(burst / rate)>` and
//!   `RateLimit: "<name>";r=<remaining>;t=<ceil(reset_after_ms / 1000)>`, one list member per bucket.
//! - [`Standard::Legacy`]: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` of the limiting bucket.
//! - [`Standard::Both`] (the default): both sets; [`Standard::None`]: neither.
//! - Every number is an integer from 0 to [`MAX_INTEGER`], the largest RFC 8941 sf-integer: larger values (a burst
//!   of 1e21, an infinite `burst / rate`, the module's saturated 2^63-1) go out as it, values below 0 and NaN as 0
//!   (`fixtures/headers.json`).
//! - A limit's name is an sf-string: quoted, `"` and `\` escaped. It holds only 0x20 to 0x7E; a name's other bytes
//!   go out as `%XX` (a [`Limit`](crate::Limit) refuses such a name, tb-rls takes names from requests).
//! - `Retry-After` on a refusal, `ceil(retry_after_ms / 1000)` whole seconds of the limiting bucket (the one the
//!   reply names, which the single-limit fields describe); left out when its `retry_after_ms` is -1 (the cost
//!   exceeds the burst: waiting never helps).
#![forbid(unsafe_code)]

use std::fmt::{self, Write};

use crate::replies::{AcquiredEach, BucketResult};

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

impl std::str::FromStr for Standard {
    type Err = UnknownStandard;

    /// The name the other packages take for their `standard` option: `both`, `draft`, `legacy` or `none`.
    fn from_str(name: &str) -> Result<Standard, UnknownStandard> {
        match name {
            "both" => Ok(Standard::Both),
            "draft" => Ok(Standard::Draft),
            "legacy" => Ok(Standard::Legacy),
            "none" => Ok(Standard::None),
            _ => Err(UnknownStandard),
        }
    }
}

/// A name [`Standard`] does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownStandard;

impl fmt::Display for UnknownStandard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("standard must be one of both, draft, legacy, none")
    }
}

impl std::error::Error for UnknownStandard {}

/// The largest RFC 8941 sf-integer (15 digits): every number in a field is at most this.
pub const MAX_INTEGER: i64 = 999_999_999_999_999;

fn clamp(number: i64) -> i64 {
    number.clamp(0, MAX_INTEGER)
}

/// A double as a field's integer, rounded as given: clamped to 0..=MAX_INTEGER, infinity as MAX_INTEGER, NaN as 0.
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
    /// The limit's name, sent as an sf-string.
    pub name: &'a str,
    /// Tokens per second.
    pub rate: f64,
    /// Capacity in tokens.
    pub burst: f64,
}

fn seconds_up(ms: i64) -> i64 {
    if ms <= 0 {
        0
    } else {
        clamp(ms.saturating_add(999) / 1000)
    }
}

/// An RFC 8941 sf-string, written at the end of `out`: quoted, with `\` and `"` escaped, and every byte outside
/// 0x20 to 0x7E (which an sf-string cannot hold) as `%XX`.
fn push_sf_string(out: &mut impl Write, text: &str) -> fmt::Result {
    out.write_char('"')?;
    let mut rest = text;
    while let Some(at) = rest.find(|c: char| matches!(c, '\\' | '"') || !(' '..='~').contains(&c)) {
        let (plain, special) = rest.split_at(at);
        out.write_str(plain)?;
        let mut chars = special.chars();
        if let Some(c) = chars.next() {
            if matches!(c, '\\' | '"') {
                out.write_char('\\')?;
                out.write_char(c)?;
            } else {
                let mut bytes = [0; 4];
                for byte in c.encode_utf8(&mut bytes).bytes() {
                    write!(out, "%{byte:02X}")?;
                }
            }
        }
        rest = chars.as_str();
    }
    out.write_str(rest)?;
    out.write_char('"')
}

/// Whole requests the burst allows (the draft's `q` is an integer); also `RateLimit-Limit`.
pub fn quota(burst: f64) -> i64 {
    clamp_f64(burst.floor())
}

/// The window: seconds to fill from empty, rounded up, at least 1.
fn window(policy: &Policy<'_>) -> i64 {
    clamp_f64((policy.burst / policy.rate).ceil()).max(1)
}

/// The `RateLimit-Policy` value: one item per policy, in order. It depends on the policies alone, so a caller
/// with a fixed list of limits makes it once.
pub fn policy_field(policies: &[Policy<'_>]) -> String {
    let mut field = String::with_capacity(policies.len() * 24);
    for (index, policy) in policies.iter().enumerate() {
        if index > 0 {
            field.push_str(", ");
        }
        // Writing to a String cannot fail.
        let _ = push_sf_string(&mut field, policy.name);
        let _ = write!(field, ";q={};w={}", quota(policy.burst), window(policy));
    }
    field
}

/// The `RateLimit` value: one item per bucket of `reply`, named after its policy (`names`, in the same order),
/// in call order.
pub fn current_field<'a>(names: impl IntoIterator<Item = &'a str>, reply: &AcquiredEach) -> String {
    let mut field = String::with_capacity(reply.buckets.len() * 24);
    // Writing to a String cannot fail.
    let _ = write_current_field(&mut field, names, reply);
    field
}

/// [`current_field`] written at the end of `out` (a byte buffer a header value can keep, say).
pub fn write_current_field<'a>(
    out: &mut impl Write,
    names: impl IntoIterator<Item = &'a str>,
    reply: &AcquiredEach,
) -> fmt::Result {
    for (index, (name, bucket)) in names.into_iter().zip(&reply.buckets).enumerate() {
        if index > 0 {
            out.write_str(", ")?;
        }
        push_sf_string(out, name)?;
        let mut digits = itoa::Buffer::new();
        out.write_str(";r=")?;
        out.write_str(digits.format(remaining(bucket)))?;
        out.write_str(";t=")?;
        out.write_str(digits.format(reset_seconds(bucket)))?;
    }
    Ok(())
}

/// The bucket the legacy fields describe: the reply's limiting one (the first when that index is out of range).
pub fn legacy_index(policy_count: usize, reply: &AcquiredEach) -> usize {
    if reply.limiting_index < policy_count {
        reply.limiting_index
    } else {
        0
    }
}

/// `RateLimit-Remaining` of a bucket, and its `r`.
pub fn remaining(bucket: &BucketResult) -> i64 {
    clamp(bucket.remaining)
}

/// `RateLimit-Reset` of a bucket, and its `t`: seconds until it is full, rounded up.
pub fn reset_seconds(bucket: &BucketResult) -> i64 {
    seconds_up(bucket.reset_after_ms)
}

/// `Retry-After` of a decision: on a refusal that waiting can end, the limiting bucket's wait in whole seconds
/// rounded up.
pub fn retry_after_seconds(reply: &AcquiredEach) -> Option<i64> {
    let retry_after_ms = reply.retry_after_ms();
    (!reply.allowed && retry_after_ms >= 0).then(|| seconds_up(retry_after_ms))
}

/// Whether `standard` sends the draft's fields (`RateLimit-Policy`, `RateLimit`).
pub fn sends_draft(standard: Standard) -> bool {
    matches!(standard, Standard::Draft | Standard::Both)
}

/// Whether `standard` sends the legacy fields (`RateLimit-Limit`, `-Remaining`, `-Reset`).
pub fn sends_legacy(standard: Standard) -> bool {
    matches!(standard, Standard::Legacy | Standard::Both)
}

/// The header fields (name, value) for a decision over `policies`, one per bucket of `reply` in call order: the
/// mapping of docs/headers.md, which the tower layer and tb-rls send.
pub fn rate_limit_headers(
    policies: &[Policy<'_>],
    reply: &AcquiredEach,
    standard: Standard,
) -> Vec<(&'static str, String)> {
    let mut headers = Vec::with_capacity(6);
    if policies.is_empty() {
        return headers;
    }
    if sends_draft(standard) {
        headers.push(("RateLimit-Policy", policy_field(policies)));
        headers.push((
            "RateLimit",
            current_field(policies.iter().map(|policy| policy.name), reply),
        ));
    }
    if sends_legacy(standard) {
        let index = legacy_index(policies.len(), reply);
        if let (Some(policy), Some(bucket)) = (policies.get(index), reply.buckets.get(index)) {
            headers.push(("RateLimit-Limit", quota(policy.burst).to_string()));
            headers.push(("RateLimit-Remaining", remaining(bucket).to_string()));
            headers.push(("RateLimit-Reset", reset_seconds(bucket).to_string()));
        }
    }
    if let Some(seconds) = retry_after_seconds(reply) {
        headers.push(("Retry-After", seconds.to_string()));
    }
    headers
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A bucket's reply: allowed where `retry_after_ms` is 0.
    pub(crate) fn bucket(remaining: i64, retry_after_ms: i64, reset_after_ms: i64) -> BucketResult {
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

    #[test]
    fn sf_strings_escape_quotes_and_backslashes_and_percent_encode_the_rest() {
        let sf = |text: &str| {
            let mut out = String::new();
            push_sf_string(&mut out, text).expect("a String takes it");
            out
        };
        assert_eq!(sf("a \"b\" \\c"), "\"a \\\"b\\\" \\\\c\"");
        assert_eq!(sf("café\ttab"), "\"caf%C3%A9%09tab\"");
        assert_eq!(sf("\u{7f}\u{0}\r\n"), "\"%7F%00%0D%0A\"");
        assert_eq!(sf("\u{a0}"), "\"%C2%A0\"");
    }
}
