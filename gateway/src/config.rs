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
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

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

/// One level of the tree: the descriptors under a parent, and the parent's own limit.
#[derive(Debug, Default)]
struct Node {
    /// Children by `key` or `key_value`.
    children: HashMap<String, Node>,
    /// Children whose value has a `*`, as (`key_value`, the pattern split at `*`), in file order.
    wildcards: Vec<(String, Vec<String>)>,
    limit: Option<Arc<Limit>>,
    /// `share_threshold`: values this wildcard matches share one bucket, named by the pattern.
    share_threshold: bool,
}

// ---- The file format --------------------------------------------------------------------------------------------
// Raw structs mirror the YAML. `validate_keys` has checked the keys and scalars first, as envoyproxy/ratelimit's
// validateYamlKeys does, so a known key the structs do not read where it stands is ignored, as there. Checks that
// need a whole descriptor run in `TryFrom`, so the YAML parser reports them with the line where it starts.

#[derive(Deserialize)]
struct RawFile {
    #[serde(default, deserialize_with = "scalar_text")]
    domain: Option<String>,
    #[serde(default)]
    descriptors: Option<Vec<RawDescriptor>>,
}

#[derive(Deserialize)]
#[serde(try_from = "RawDescriptorFields")]
struct RawDescriptor {
    key: String,
    value: String,
    rate_limit: Option<RawRateLimit>,
    descriptors: Vec<RawDescriptor>,
    shadow_mode: bool,
    quota_mode: bool,
    share_threshold: bool,
}

#[derive(Deserialize)]
struct RawDescriptorFields {
    #[serde(default, deserialize_with = "scalar_text")]
    key: Option<String>,
    #[serde(default, deserialize_with = "scalar_text")]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    descriptors: Option<Vec<RawDescriptor>>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    #[serde(default)]
    #[allow(dead_code)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<serde_norway::Value>,
}

impl TryFrom<RawDescriptorFields> for RawDescriptor {
    type Error = String;

    fn try_from(raw: RawDescriptorFields) -> Result<Self, String> {
        let key = raw.key.unwrap_or_default();
        if key.is_empty() {
            return Err("descriptor has empty key".to_owned());
        }
        let value = raw.value.unwrap_or_default();
        if raw.share_threshold && !value.contains('*') {
            return Err(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{}'",
                composite_key(&key, &value)
            ));
        }
        Ok(RawDescriptor {
            key,
            value,
            rate_limit: raw.rate_limit,
            descriptors: raw.descriptors.unwrap_or_default(),
            shadow_mode: raw.shadow_mode,
            quota_mode: raw.quota_mode,
            share_threshold: raw.share_threshold,
        })
    }
}

#[derive(Deserialize)]
#[serde(try_from = "RawRateLimitFields")]
struct RawRateLimit {
    policy: Policy,
    name: String,
    replaces: Vec<String>,
}

#[derive(Deserialize)]
struct RawRateLimitFields {
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default)]
    unit: Option<UnitText>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    burst: Option<u32>,
    #[serde(default, deserialize_with = "scalar_text")]
    name: Option<String>,
    #[serde(default)]
    replaces: Option<Vec<RawReplaces>>,
}

#[derive(Deserialize)]
struct RawReplaces {
    #[serde(default, deserialize_with = "scalar_text")]
    name: Option<String>,
}

impl TryFrom<RawRateLimitFields> for RawRateLimit {
    type Error = String;

    fn try_from(raw: RawRateLimitFields) -> Result<Self, String> {
        let name = raw.name.unwrap_or_default();
        let mut replaces = Vec::new();
        for entry in raw.replaces.unwrap_or_default() {
            let replaced = entry.name.unwrap_or_default();
            if replaced.is_empty() {
                return Err("should not have an empty replaces entry".to_owned());
            }
            if replaced == name {
                return Err("replaces should not contain name of same descriptor".to_owned());
            }
            replaces.push(replaced);
        }
        let policy = if raw.unlimited {
            if raw.unit.is_some() {
                return Err("should not specify rate limit unit when unlimited".to_owned());
            }
            Policy::Unlimited
        } else {
            let Some(UnitText(unit)) = raw.unit else {
                return Err("invalid rate limit unit '' (one of second, minute, hour, day, week, month, year)".to_owned());
            };
            let burst = match raw.burst {
                Some(0) => return Err("burst must be at least 1".to_owned()),
                Some(burst) => burst,
                None => raw.requests_per_unit.max(1),
            };
            Policy::Bucket {
                requests_per_unit: raw.requests_per_unit,
                unit,
                burst,
            }
        };
        Ok(RawRateLimit {
            policy,
            name,
            replaces,
        })
    }
}

/// A unit as written: refused where it stands when it names no unit.
struct UnitText(Unit);

impl<'de> Deserialize<'de> for UnitText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Unit::parse(&text).map(UnitText).ok_or_else(|| {
            de::Error::custom(format!(
                "invalid rate limit unit '{text}' (one of second, minute, hour, day, week, month, year)"
            ))
        })
    }
}

/// A scalar as text, whatever scalar the YAML wrote (`value: 42` is the value "42"), as envoyproxy/ratelimit's YAML
/// decoder reads any scalar into a string field.
fn scalar_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    struct Text;
    impl Visitor<'_> for Text {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string, number or boolean")
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            Ok(Some(text.to_owned()))
        }
        fn visit_bool<E: de::Error>(self, value: bool) -> Result<Self::Value, E> {
            Ok(Some(value.to_string()))
        }
        fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
            Ok(Some(value.to_string()))
        }
        fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
            Ok(Some(value.to_string()))
        }
        fn visit_f64<E: de::Error>(self, value: f64) -> Result<Self::Value, E> {
            Ok(Some(value.to_string()))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    deserializer.deserialize_any(Text)
}

/// The tree's key for a descriptor: `key`, or `key_value` when it has a value (envoyproxy/ratelimit's).
pub(crate) fn composite_key(key: &str, value: &str) -> String {
    if value.is_empty() {
        key.to_owned()
    } else {
        format!("{key}_{value}")
    }
}

/// Every key the file format knows, at any level (envoyproxy/ratelimit's `validKeys`), plus our `burst`.
const KNOWN_KEYS: [&str; 17] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "burst",
];

/// Why `validate_keys` refused a file, and the key to look for when naming its line.
#[derive(Debug)]
struct KeyError {
    message: String,
    key: Option<String>,
}

/// envoyproxy/ratelimit's `validateYamlKeys`: mapping keys are known strings; lists hold mappings; scalars are
/// strings, integers, booleans or null. `metadata` is not looked into (it is free-form). A document that is no
/// mapping is left to the typed parse, which refuses it.
fn validate_keys(tree: &serde_norway::Value) -> Result<(), KeyError> {
    use serde_norway::Value;
    let Value::Mapping(map) = tree else {
        return Ok(());
    };
    for (key, value) in map {
        let Value::String(name) = key else {
            return Err(KeyError {
                message: format!(
                    "config error, key is not of type string: {}",
                    scalar_display(key)
                ),
                key: None,
            });
        };
        if !KNOWN_KEYS.contains(&name.as_str()) {
            return Err(KeyError {
                message: format!("config error, unknown key '{name}'"),
                key: Some(name.clone()),
            });
        }
        if name == "metadata" {
            continue;
        }
        match value {
            Value::Sequence(items) => {
                for item in items {
                    if !item.is_mapping() {
                        return Err(KeyError {
                            message: format!(
                                "config error, yaml file contains list of type other than map: {}",
                                scalar_display(item)
                            ),
                            key: Some(name.clone()),
                        });
                    }
                    validate_keys(item)?;
                }
            }
            Value::Mapping(_) => validate_keys(value)?,
            Value::String(_) | Value::Bool(_) | Value::Null => {}
            Value::Number(number) if number.is_i64() => {}
            other => {
                return Err(KeyError {
                    message: format!(
                        "error checking config: '{name}: {}' is not a string, an integer or a boolean",
                        scalar_display(other)
                    ),
                    key: Some(name.clone()),
                });
            }
        }
    }
    Ok(())
}

/// A YAML value in a message: a scalar as written, anything else by its kind.
fn scalar_display(value: &serde_norway::Value) -> String {
    use serde_norway::Value;
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(flag) => flag.to_string(),
        Value::Number(number) => number.to_string(),
        Value::String(text) => text.clone(),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(_) => "a tagged value".to_owned(),
    }
}

/// The message of a `KeyError`, with the first line where its key is written, when one can be found.
fn locate(text: &str, error: KeyError) -> String {
    let line = error.key.as_deref().and_then(|key| {
        let written = format!("{key}:");
        text.lines().position(|line| {
            line.split(|c: char| c.is_whitespace() || c == '{' || c == ',' || c == '-')
                .any(|word| word == written)
        })
    });
    match line {
        Some(index) => format!("{} at line {}", error.message, index + 1),
        None => error.message,
    }
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
            let tree: serde_norway::Value = serde_norway::from_str(text)
                .map_err(|err| error(format!("error loading config file: {err}")))?;
            validate_keys(&tree).map_err(|why| error(locate(text, why)))?;
            let raw: RawFile = if tree.is_null() {
                RawFile {
                    domain: None,
                    descriptors: None,
                }
            } else {
                serde_norway::from_str(text)
                    .map_err(|err| error(format!("error loading config file: {err}")))?
            };
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

    /// The limit for one request descriptor, given as its `(key, value)` entries; `None` when nothing matches.
    pub fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched> {
        let mut level = self.domains.get(domain)?;
        let mut bucket_entries = Vec::with_capacity(entries.len());
        for (index, &(key, value)) in entries.iter().enumerate() {
            let exact = format!("{key}_{value}");
            let (node, shared_value) = if let Some(node) = level.children.get(&exact) {
                (node, None)
            } else if let Some((node, pattern)) = level.wildcard(&exact) {
                (node, node.share_threshold.then_some(pattern))
            } else if let Some(node) = level.children.get(key) {
                (node, None)
            } else {
                return None;
            };
            let bucket_value = shared_value
                .and_then(|pattern| pattern.strip_prefix(&format!("{key}_")).map(str::to_owned))
                .unwrap_or_else(|| value.to_owned());
            bucket_entries.push((key.to_owned(), bucket_value));
            if index + 1 == entries.len() {
                return node.limit.clone().map(|limit| Matched {
                    limit,
                    bucket_entries,
                });
            }
            if node.children.is_empty() {
                return None;
            }
            level = node;
        }
        None
    }
}

impl Node {
    fn load(&mut self, parent_path: &str, descriptors: Vec<RawDescriptor>) -> Result<(), String> {
        for raw in descriptors {
            let key = composite_key(&raw.key, &raw.value);
            let path = format!("{parent_path}.{key}");
            if self.children.contains_key(&key) {
                return Err(format!("duplicate descriptor composite key '{path}'"));
            }
            let limit = raw.rate_limit.map(|rate_limit| {
                Arc::new(Limit {
                    policy: rate_limit.policy,
                    name: rate_limit.name,
                    replaces: rate_limit.replaces,
                    shadow_mode: raw.shadow_mode,
                    quota_mode: raw.quota_mode,
                    path: path.clone(),
                })
            });
            let mut child = Node {
                limit,
                share_threshold: raw.share_threshold,
                ..Node::default()
            };
            child.load(&path, raw.descriptors)?;
            if key.contains('*') {
                let parts = key.split('*').map(str::to_owned).collect();
                self.wildcards.push((key.clone(), parts));
            }
            self.children.insert(key, child);
        }
        Ok(())
    }

    /// The first wildcard child (in file order) whose pattern matches `key_value`, with its pattern.
    fn wildcard(&self, key_value: &str) -> Option<(&Node, String)> {
        self.wildcards
            .iter()
            .find(|(_, parts)| wildcard_match(parts, key_value))
            .and_then(|(pattern, _)| {
                self.children
                    .get(pattern)
                    .map(|node| (node, pattern.clone()))
            })
    }
}

/// Whether `text` matches a pattern split at its `*`s; each `*` stands for any run of characters, empty included.
fn wildcard_match(parts: &[String], text: &str) -> bool {
    let Some((first, rest)) = parts.split_first() else {
        return text.is_empty();
    };
    let Some((last, middle)) = rest.split_last() else {
        return text == first;
    };
    if text.len() < first.len() + last.len() || !text.starts_with(first.as_str()) {
        return false;
    }
    let Some(mut remaining) = text
        .get(first.len()..)
        .and_then(|tail| tail.strip_suffix(last.as_str()))
    else {
        return false;
    };
    for part in middle {
        match remaining.find(part.as_str()) {
            Some(at) => remaining = remaining.get(at + part.len()..).unwrap_or(""),
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests;
