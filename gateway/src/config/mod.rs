//! Rate limit configuration: envoyproxy/ratelimit's YAML format, parsed and checked once, and the descriptor
//! lookup over it. Pure: no I/O, no clock, no Redis; `reload` reads the files and hands their text here.
//!
//! ```yaml
//! domain: shop                      # one domain per file; a request names its domain
//! descriptors:                      # a tree: each level matches one entry of a request's descriptor
//!   - key: user                     # key only: any value matches, and each value gets its own bucket
//!     rate_limit: { unit: second, requests_per_unit: 10, burst: 20 }   # burst: ours, default requests_per_unit
//!   - key: user
//!     value: bob                    # key and value: more specific than key only, so it wins
//!     rate_limit: { unit: minute, requests_per_unit: 5 }
//!   - key: path
//!     value: /api/*                 # a value with `*`: a wildcard, tried after the exact value, before key only
//!     descriptors:                  # nested: a descriptor with entries (path, ...) then (method, ...)
//!       - key: method
//!         rate_limit: { unit: second, requests_per_unit: 100 }
//!   - key: internal
//!     rate_limit: { unlimited: true }
//!     shadow_mode: true             # counted and reported, never denies
//! ```
//!
//! Matching follows envoyproxy/ratelimit's `GetLimit` (src/config/config_impl.go) rule for rule: walk the
//! request descriptor's entries down the tree; at each level try `key_value` exactly, then the level's wildcard
//! values in file order, then `key` alone; a limit applies only where the last entry lands, so a descriptor
//! longer or shorter than the configured path gets none.
//!
//! Strictness follows its `validateYamlKeys` too: every mapping key anywhere (outside `metadata`) must be one of
//! the keys the format knows (plus our `burst`), a known key where it means nothing is ignored, every list holds
//! mappings, and every scalar is a string, integer, boolean or null (`1.5` is refused). `detailed_metric`,
//! `value_to_metric` and `metadata` are read and have no effect here (they shape that service's statsd metrics and
//! response metadata).
//!
//! ```text
//! mod.rs     the configuration's types, and building it from files
//! format.rs  the file format: raw structs, the key and scalar checks, error lines
//! tree.rs    the matching tree and the lookup of a request descriptor
//! ```
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use tree::Node;

mod format;
mod tree;

/// A limit's time unit, as envoyproxy/ratelimit spells it (any case) and `RateLimitResponse.RateLimit.Unit`
/// numbers it. Months are 30 days and years 365, as there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// The unit's length in seconds.
    pub fn seconds(self) -> u32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// The value of `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`.
    pub fn proto_value(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit for a proto value; `None` for UNKNOWN (0) and values this build does not know.
    pub fn from_proto(value: i32) -> Option<Unit> {
        [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ]
        .into_iter()
        .find(|unit| unit.proto_value() == value)
    }

    fn parse(text: &str) -> Option<Unit> {
        match text.to_ascii_lowercase().as_str() {
            "second" => Some(Unit::Second),
            "minute" => Some(Unit::Minute),
            "hour" => Some(Unit::Hour),
            "day" => Some(Unit::Day),
            "week" => Some(Unit::Week),
            "month" => Some(Unit::Month),
            "year" => Some(Unit::Year),
            _ => None,
        }
    }
}

/// What a matched descriptor is held to.
#[derive(Clone, Debug, PartialEq)]
pub enum Policy {
    /// A token bucket: `requests_per_unit` tokens per `unit` (the refill rate), holding at most `burst`.
    /// `requests_per_unit` 0 never allows anything and never reaches Redis.
    Bucket {
        requests_per_unit: u32,
        unit: Unit,
        /// Capacity in tokens, ≥ 1; `requests_per_unit` unless the file sets `burst`.
        burst: u32,
    },
    /// `unlimited: true`: always OK, never sent to Redis.
    Unlimited,
}

/// One configured limit, shared by every request that matches it.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    pub policy: Policy,
    /// The limit's `name` (reported as `current_limit.name`, and what `replaces` refers to).
    pub name: String,
    /// Names of limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// Count and report, but never deny.
    pub shadow_mode: bool,
    /// Over its limit, the request is refused only when every quota descriptor of it is over.
    pub quota_mode: bool,
    /// The path in the file, `domain.key_value.key`, for logs.
    pub path: String,
}

impl Limit {
    /// Tokens per second, for a bucket policy.
    pub fn rate_per_sec(&self) -> Option<f64> {
        match self.policy {
            Policy::Bucket {
                requests_per_unit,
                unit,
                ..
            } => Some(f64::from(requests_per_unit) / f64::from(unit.seconds())),
            Policy::Unlimited => None,
        }
    }
}

/// A limit found for a request descriptor, with the values that name its bucket: the entries' own values, or the
/// wildcard pattern for an entry whose match shares its threshold.
#[derive(Clone, Debug, PartialEq)]
pub struct Matched {
    pub limit: Arc<Limit>,
    /// One `(key, value)` per request entry, the value being what the bucket's name uses.
    pub bucket_entries: Vec<(String, String)>,
}

/// Why a configuration was refused. `file` names the file; the message carries the line where the YAML parser knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Every domain's descriptor tree. Built only by `Config::from_files`, so it is always valid.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Node>,
}

// ---- Building ---------------------------------------------------------------------------------------------------

impl Config {
    /// Parses every `(file name, text)` pair into one configuration: one domain per file, no domain twice.
    pub fn from_files<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Config, ConfigError> {
        Config::from_files_merging(files, false)
    }

    /// As `from_files`; with `merge_domains` (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`), files naming the same
    /// domain add their descriptors to it, and a descriptor path defined twice is refused.
    pub fn from_files_merging<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
        merge_domains: bool,
    ) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        for (file, text) in files {
            let error = |message: String| ConfigError {
                file: file.to_owned(),
                message,
            };
            let raw = format::parse(text).map_err(error)?;
            let domain = raw.domain.unwrap_or_default();
            if domain.is_empty() {
                return Err(error("config file cannot have empty domain".to_owned()));
            }
            let descriptors = raw.descriptors.unwrap_or_default();
            match config.domains.get_mut(&domain) {
                Some(root) if merge_domains => root.load(&domain, descriptors).map_err(error)?,
                Some(_) => {
                    return Err(error(format!("duplicate domain '{domain}' in config file")));
                }
                None => {
                    let mut root = Node::default();
                    root.load(&domain, descriptors).map_err(error)?;
                    config.domains.insert(domain, root);
                }
            }
        }
        Ok(config)
    }

    /// Parses one file's text.
    pub fn from_yaml(file: &str, text: &str) -> Result<Config, ConfigError> {
        Config::from_files([(file, text)])
    }

    /// The configured domains, sorted, for logs.
    pub fn domains(&self) -> Vec<&str> {
        let mut domains: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        domains.sort_unstable();
        domains
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }
}

#[cfg(test)]
mod tests;
