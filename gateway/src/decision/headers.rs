//! The rate-limit response headers (`--response-headers`). Pure.
#![forbid(unsafe_code)]

use envoy_types::pb::envoy::config::core::v3::HeaderValue;

use super::{BucketReply, EachReply, Options, Plan};
use crate::config::Limit;

/// Which rate-limit headers a response carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HeaderFormat {
    /// No rate-limit fields, only `Retry-After` on a refusal (Envoy's own `enable_x_ratelimit_headers` still
    /// works from the descriptor statuses).
    None,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit`, one item per limited descriptor.
    Draft,
    /// The single-limit headers envoyproxy/ratelimit sends, from the reply's limiting bucket.
    Legacy,
    /// Both.
    Both,
}

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
    /// The rate-limit headers of this plan's buckets, by `rate_limit_headers`; `over_limit` is the verdict.
    pub(super) fn headers(
        &self,
        options: &Options,
        reply: Option<&EachReply>,
        over_limit: bool,
    ) -> Vec<HeaderValue> {
        let Some(reply) = reply else {
            return Vec::new();
        };
        let rows: Vec<HeaderRow> = self
            .buckets
            .iter()
            .zip(&reply.buckets)
            .map(|(bucket, result)| HeaderRow {
                name: policy_name(&bucket.limit),
                rate_per_sec: bucket.rate_per_sec,
                burst: f64::from(bucket.burst),
                reply: *result,
            })
            .collect();
        rate_limit_headers(
            options.headers,
            &options.header_names,
            &rows,
            reply.limiting_index,
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

// ---- Headers ------------------------------------------------------------------------------------------------------
//
// The mapping of docs/headers.md, which the client packages share (fixtures/headers.json holds its cases):
//
//   RateLimit-Policy     "<name>";q=<floor(burst)>;w=<max(1, ceil(burst / rate))>   one member per bucket
//   RateLimit            "<name>";r=<remaining>;t=<ceil(reset_after_ms / 1000)>     one member per bucket
//   RateLimit-Limit      floor(burst)                    of the limiting bucket (the reply's limiting_index)
//   RateLimit-Remaining  remaining                       of the limiting bucket
//   RateLimit-Reset      ceil(reset_after_ms / 1000)     of the limiting bucket
//   Retry-After          ceil(retry_after_ms / 1000)     refusals only, whatever the format; the longest wait of
//                                                        the buckets that did not fit, none if one never fits
//
// Every number is an RFC 8941 sf-integer: from 0 to 999,999,999,999,999 (15 digits), larger values clamped.

/// The largest RFC 8941 sf-integer.
pub const MAX_SF_INTEGER: i64 = 999_999_999_999_999;

/// One bucket as the headers see it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeaderRow<'a> {
    /// The limit's name (see `policy_name`); written as an sf-string.
    pub name: &'a str,
    /// Tokens per second, > 0.
    pub rate_per_sec: f64,
    /// Capacity in tokens.
    pub burst: f64,
    pub reply: BucketReply,
}

/// The header fields for `rows` in `format`; `limiting_index` names the bucket of the single-limit fields (the
/// first when out of range), and `refused` adds `Retry-After` where waiting can cure it.
pub fn rate_limit_headers(
    format: HeaderFormat,
    names: &HeaderNames,
    rows: &[HeaderRow],
    limiting_index: usize,
    refused: bool,
) -> Vec<HeaderValue> {
    let mut headers = Vec::new();
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    };
    if rows.is_empty() {
        return headers;
    }
    if matches!(format, HeaderFormat::Draft | HeaderFormat::Both) {
        let policy: Vec<String> = rows
            .iter()
            .map(|row| {
                format!(
                    "{};q={};w={}",
                    sf_string(row.name),
                    sf_integer(row.burst.floor()),
                    sf_integer((row.burst / row.rate_per_sec).ceil().max(1.0))
                )
            })
            .collect();
        let state: Vec<String> = rows
            .iter()
            .map(|row| {
                format!(
                    "{};r={};t={}",
                    sf_string(row.name),
                    clamp_sf(row.reply.remaining),
                    ceil_seconds(row.reply.reset_after_ms)
                )
            })
            .collect();
        headers.push(header("RateLimit-Policy", policy.join(", ")));
        headers.push(header("RateLimit", state.join(", ")));
    }
    if matches!(format, HeaderFormat::Legacy | HeaderFormat::Both) {
        if let Some(row) = rows.get(limiting_index).or(rows.first()) {
            headers.push(header(&names.limit, sf_integer(row.burst.floor())));
            headers.push(header(
                &names.remaining,
                clamp_sf(row.reply.remaining).to_string(),
            ));
            headers.push(header(
                &names.reset,
                ceil_seconds(row.reply.reset_after_ms).to_string(),
            ));
        }
    }
    if refused {
        let mut wait_ms = Some(0);
        for row in rows.iter().filter(|row| !row.reply.fits) {
            wait_ms = match (wait_ms, row.reply.retry_after_ms) {
                (Some(_), ms) if ms < 0 => None,
                (Some(longest), ms) => Some(longest.max(ms)),
                (None, _) => None,
            };
        }
        if let Some(ms) = wait_ms.filter(|&ms| ms > 0) {
            headers.push(header("Retry-After", ceil_seconds(ms).to_string()));
        }
    }
    headers
}

/// An RFC 8941 sf-string: in quotes, `"` and `\` escaped. It may hold only 0x20 to 0x7E; a name's other
/// characters (non-ASCII, tab, CR, LF, DEL and the other controls) go out as `%XX` per UTF-8 byte. The packages
/// refuse such a name when a limit is built; tb-rls's names also come from a request's descriptor keys (an
/// override's name), which it cannot refuse in advance.
fn sf_string(text: &str) -> String {
    let hex = |nibble: u8| {
        char::from_digit(u32::from(nibble), 16).map_or('0', |digit| digit.to_ascii_uppercase())
    };
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for &byte in text.as_bytes() {
        match byte {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(char::from(byte));
            }
            0x20..=0x7E => out.push(char::from(byte)),
            _ => {
                out.push('%');
                out.push(hex(byte >> 4));
                out.push(hex(byte & 0x0F));
            }
        }
    }
    out.push('"');
    out
}

/// `value` within the sf-integer range.
fn clamp_sf(value: i64) -> i64 {
    value.clamp(0, MAX_SF_INTEGER)
}

/// A whole number of `f64` as an sf-integer: clamped to 0..=MAX_SF_INTEGER (NaN and infinity to the maximum),
/// written in digits (every integer of that range is exact in an f64, and `Display` never uses an exponent).
fn sf_integer(value: f64) -> String {
    // 999,999,999,999,999 < 2^53: exact as an f64.
    const MAX: f64 = 999_999_999_999_999.0;
    let clamped = if value.is_nan() {
        MAX
    } else {
        value.clamp(0.0, MAX)
    };
    format!("{clamped}")
}

/// Milliseconds as whole seconds rounded up, within the sf-integer range.
fn ceil_seconds(ms: i64) -> i64 {
    let ms = ms.max(0);
    clamp_sf(ms / 1000 + i64::from(ms % 1000 != 0))
}

#[cfg(test)]
#[path = "headers_tests.rs"]
mod tests;
