//! From a `RateLimitRequest` to one `TB.ACQUIREEACH` call, and from its reply to the `RateLimitResponse`. Pure:
//! no I/O and no clock; the service runs the call in between.
//!
//! Each request descriptor with a bucket limit becomes one bucket of the call:
//!
//! ```text
//! key    <prefix>{<domain>}:<key>=<value>:<key>=<value>...   each part %-escaped (see `bucket_key`)
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
#![forbid(unsafe_code)]

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration;

use crate::config::{Config, Limit, Policy, Unit};

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

/// The command's reply for one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketReply {
    /// The bucket held its cost.
    pub fits: bool,
    /// Whole tokens left after the call (before it, for a refused call).
    pub remaining: i64,
    /// 0 when it fits; -1 when the cost exceeds the burst; else ms until it would fit.
    pub retry_after_ms: i64,
    /// ms until the bucket is full again.
    pub reset_after_ms: i64,
}

/// The whole reply: `[allowed, limiting_index, [fits, remaining, retry_after_ms, reset_after_ms] ...]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EachReply {
    pub allowed: bool,
    pub limiting_index: usize,
    pub buckets: Vec<BucketReply>,
}

/// Which rate-limit headers a response carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HeaderFormat {
    /// No rate-limit fields, only `Retry-After` on a refusal (Envoy's own `enable_x_ratelimit_headers` still
    /// works from the descriptor statuses).
    None,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit`, one item per limited descriptor.
    Draft,
    /// The single-limit headers envoyproxy/ratelimit sends, from the descriptor closest to its limit.
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

/// How responses are shaped, beyond the configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Prepended to every Redis key.
    pub key_prefix: String,
    /// Every limit in shadow mode (envoyproxy/ratelimit's `SHADOW_MODE`).
    pub global_shadow: bool,
    /// Every descriptor in quota mode (envoyproxy/ratelimit's `QUOTA_MODE`).
    pub global_quota: bool,
    pub headers: HeaderFormat,
    pub header_names: HeaderNames,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            key_prefix: "tb-rls:".to_owned(),
            global_shadow: false,
            global_quota: false,
            headers: HeaderFormat::None,
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
                let key = bucket_key(&options.key_prefix, &request.domain, &bucket_entries);
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

/// The Redis key of a bucket: `<prefix>{<domain>}:<key>=<value>...`, escaped so distinct entries never collide
/// and the hash tag is always exactly the domain.
///
/// Each part (domain, key, value) is escaped by the packages' identity rule (docs/clients.md, "Identity and
/// keys": of its UTF-8 bytes, `!` to `~` stay except `%`, `{` and `}`; every other byte becomes `%XX`), and `:`
/// and `=` too, since here they separate the entries of one key: the packages' tags never hold several parts.
pub fn bucket_key(prefix: &str, domain: &str, entries: &[(String, String)]) -> String {
    let mut key = String::with_capacity(prefix.len() + domain.len() + 16 * entries.len());
    key.push_str(prefix);
    key.push('{');
    escape_into(&mut key, domain);
    key.push('}');
    for (name, value) in entries {
        key.push(':');
        escape_into(&mut key, name);
        key.push('=');
        escape_into(&mut key, value);
    }
    key
}

fn escape_into(out: &mut String, text: &str) {
    // A nibble is below 16, so `from_digit` always has a digit for it.
    let hex = |nibble: u8| {
        char::from_digit(u32::from(nibble), 16).map_or('0', |digit| digit.to_ascii_uppercase())
    };
    for &byte in text.as_bytes() {
        let kept =
            (b'!'..=b'~').contains(&byte) && !matches!(byte, b'%' | b'{' | b'}' | b':' | b'=');
        if kept {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(hex(byte >> 4));
            out.push(hex(byte & 0x0F));
        }
    }
}

impl Plan {
    /// The command's arguments after its name: `key rate burst cost` per bucket.
    pub fn command_args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(4 * self.buckets.len());
        for bucket in &self.buckets {
            args.push(bucket.key.clone());
            args.push(bucket.rate_per_sec.to_string());
            args.push(bucket.burst.to_string());
            args.push(if bucket.charged_zero {
                "0".to_owned()
            } else {
                bucket.cost.to_string()
            });
        }
        args
    }

    /// After a refused call: if every bucket that did not fit is shadow-only, or quota-only while some quota
    /// descriptor still fits, charge those 0 and return true (call again); otherwise the refusal stands and this
    /// returns false.
    pub fn unshadow(&mut self, reply: &EachReply) -> bool {
        if reply.allowed {
            return false;
        }
        let quota_refuses = self.every_quota_over(Some(reply));
        let misfits: Vec<usize> = reply
            .buckets
            .iter()
            .enumerate()
            .filter(|(_, bucket)| !bucket.fits)
            .map(|(index, _)| index)
            .collect();
        let all_soft = !misfits.is_empty()
            && misfits.iter().all(|&index| {
                self.buckets.get(index).is_some_and(|bucket| {
                    !bucket.charged_zero && (bucket.shadow || (bucket.quota && !quota_refuses))
                })
            });
        if !all_soft {
            return false;
        }
        for index in misfits {
            if let Some(bucket) = self.buckets.get_mut(index) {
                bucket.charged_zero = true;
            }
        }
        true
    }

    /// Whether the bucket at `index` is over its limit: charged 0 after an earlier refusal, or not fitting.
    fn bucket_over(&self, index: usize, reply: Option<&EachReply>) -> bool {
        self.buckets
            .get(index)
            .is_some_and(|bucket| bucket.charged_zero)
            || reply
                .and_then(|reply| reply.buckets.get(index))
                .is_some_and(|bucket| !bucket.fits)
    }

    /// For one slot: over its limit, and reported OK anyway by its limit's own shadow mode.
    fn slot_over(&self, slot: &Slot, reply: Option<&EachReply>) -> (bool, bool) {
        match slot {
            Slot::NoLimit | Slot::Unlimited => (false, false),
            Slot::Zero(limit) => (true, limit.shadow_mode),
            Slot::Bucket(index) => (
                self.bucket_over(*index, reply),
                self.buckets
                    .get(*index)
                    .is_some_and(|bucket| bucket.limit.shadow_mode),
            ),
        }
    }

    /// Whether the request has quota descriptors and every one is reported OVER_LIMIT, so quota refuses it.
    fn every_quota_over(&self, reply: Option<&EachReply>) -> bool {
        let mut quotas = self
            .slots
            .iter()
            .zip(&self.quota)
            .filter(|(_, &quota)| quota)
            .peekable();
        quotas.peek().is_some()
            && quotas.all(|(slot, _)| {
                let (over, shadow) = self.slot_over(slot, reply);
                over && !shadow
            })
    }

    /// The response for `reply` (`None` when the plan had no bucket and nothing was called).
    pub fn respond(&self, options: &Options, reply: Option<&EachReply>) -> Verdict {
        let mut statuses = Vec::with_capacity(self.slots.len());
        let mut over_limit = self.every_quota_over(reply);
        let mut shadow_hits = 0;
        for (slot, &quota) in self.slots.iter().zip(&self.quota) {
            let status = match slot {
                Slot::NoLimit => DescriptorStatus {
                    code: Code::Ok.into(),
                    ..DescriptorStatus::default()
                },
                Slot::Unlimited => DescriptorStatus {
                    code: Code::Ok.into(),
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                },
                Slot::Zero(limit) => {
                    over_limit |= !limit.shadow_mode && !quota;
                    shadow_hits += usize::from(limit.shadow_mode || options.global_shadow);
                    DescriptorStatus {
                        code: if limit.shadow_mode {
                            Code::Ok
                        } else {
                            Code::OverLimit
                        }
                        .into(),
                        current_limit: current_limit(limit),
                        ..DescriptorStatus::default()
                    }
                }
                Slot::Bucket(index) => {
                    let index = *index;
                    let bucket = self.buckets.get(index);
                    let result = reply.and_then(|reply| reply.buckets.get(index));
                    // The limit's own shadow_mode answers OK; the global one keeps OVER_LIMIT here and only
                    // turns the overall code OK (below), as envoyproxy/ratelimit does. A quota descriptor over
                    // its limit refuses only with every other quota descriptor (above).
                    let (over, limit_shadow) = self.slot_over(slot, reply);
                    over_limit |= over && !limit_shadow && !quota;
                    shadow_hits += usize::from(over && (limit_shadow || options.global_shadow));
                    DescriptorStatus {
                        code: if over && !limit_shadow {
                            Code::OverLimit
                        } else {
                            Code::Ok
                        }
                        .into(),
                        current_limit: bucket.and_then(|bucket| current_limit(&bucket.limit)),
                        limit_remaining: result.map_or(0, |result| {
                            u32::try_from(result.remaining.max(0)).unwrap_or(u32::MAX)
                        }),
                        duration_until_reset: result
                            .map(|result| duration_ms(result.reset_after_ms)),
                        ..DescriptorStatus::default()
                    }
                }
            };
            statuses.push(status);
        }
        // A refusal the replies do not explain (no bucket reported as not fitting) still refuses.
        if let Some(reply) = reply {
            if !reply.allowed
                && !over_limit
                && !self.buckets.iter().any(|bucket| bucket.charged_zero)
            {
                over_limit = true;
            }
        }
        let over_limit = over_limit && !options.global_shadow;
        let response_headers_to_add = self.headers(options, reply, over_limit);
        Verdict {
            over_limit,
            shadow_hits,
            response: RateLimitResponse {
                overall_code: if over_limit {
                    Code::OverLimit
                } else {
                    Code::Ok
                }
                .into(),
                statuses,
                response_headers_to_add,
                ..RateLimitResponse::default()
            },
        }
    }

    /// The rate-limit headers of this plan's buckets, by `rate_limit_headers`; `over_limit` is the verdict.
    fn headers(
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

/// What the service answers, and what the metrics count.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub over_limit: bool,
    /// Descriptors over their limit in shadow mode (let through).
    pub shadow_hits: usize,
    pub response: RateLimitResponse,
}

fn current_limit(limit: &Limit) -> Option<RateLimit> {
    match limit.policy {
        Policy::Bucket {
            requests_per_unit,
            unit,
            ..
        } => Some(RateLimit {
            name: limit.name.clone(),
            requests_per_unit,
            unit: unit.proto_value(),
        }),
        Policy::Unlimited => None,
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

fn duration_ms(ms: i64) -> Duration {
    let ms = ms.max(0);
    Duration {
        seconds: ms / 1000,
        nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap_or(0),
    }
}

/// Reads the command's reply, checking its shape against the plan; `Err` says what was wrong.
pub fn parse_reply(value: &redis::Value, bucket_count: usize) -> Result<EachReply, String> {
    use redis::Value;
    let int = |value: Option<&Value>| match value {
        Some(Value::Int(number)) => Ok(*number),
        other => Err(format!("expected an integer, got {other:?}")),
    };
    let Value::Array(items) = value else {
        return Err(format!("expected an array, got {value:?}"));
    };
    if items.len() != 2 + bucket_count {
        return Err(format!(
            "expected {} elements for {bucket_count} buckets, got {}",
            2 + bucket_count,
            items.len()
        ));
    }
    let allowed = int(items.first())? == 1;
    let limiting_index = usize::try_from(int(items.get(1))?).unwrap_or(0);
    let mut buckets = Vec::with_capacity(bucket_count);
    for item in items.iter().skip(2) {
        let Value::Array(row) = item else {
            return Err(format!("expected a bucket row, got {item:?}"));
        };
        buckets.push(BucketReply {
            fits: int(row.first())? == 1,
            remaining: int(row.get(1))?,
            retry_after_ms: int(row.get(2))?,
            reset_after_ms: int(row.get(3))?,
        });
    }
    Ok(EachReply {
        allowed,
        limiting_index,
        buckets,
    })
}

#[cfg(test)]
#[path = "decision_tests.rs"]
mod tests;
