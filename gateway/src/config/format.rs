//! The file format: envoyproxy/ratelimit's YAML, read into raw structs and checked (keys, scalars, the rules that
//! need a whole descriptor). Pure: it gets a file's text; `config` builds the matching tree from what it returns.
#![forbid(unsafe_code)]

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::{Policy, Unit};

/// One file's text, parsed and checked; the message of an error names the line where it is known.
pub(super) fn parse(text: &str) -> Result<RawFile, String> {
    let tree: serde_norway::Value =
        serde_norway::from_str(text).map_err(|err| format!("error loading config file: {err}"))?;
    validate_keys(&tree).map_err(|why| locate(text, why))?;
    if tree.is_null() {
        return Ok(RawFile {
            domain: None,
            descriptors: None,
        });
    }
    serde_norway::from_str(text).map_err(|err| format!("error loading config file: {err}"))
}

// ---- The file format --------------------------------------------------------------------------------------------
// Raw structs mirror the YAML. `validate_keys` has checked the keys and scalars first, as envoyproxy/ratelimit's
// validateYamlKeys does, so a known key the structs do not read where it stands is ignored, as there. Checks that
// need a whole descriptor run in `TryFrom`, so the YAML parser reports them with the line where it starts.

#[derive(Deserialize)]
pub(super) struct RawFile {
    #[serde(default, deserialize_with = "scalar_text")]
    pub(super) domain: Option<String>,
    #[serde(default)]
    pub(super) descriptors: Option<Vec<RawDescriptor>>,
}

#[derive(Deserialize)]
#[serde(try_from = "RawDescriptorFields")]
pub(super) struct RawDescriptor {
    pub(super) key: String,
    pub(super) value: String,
    pub(super) rate_limit: Option<RawRateLimit>,
    pub(super) descriptors: Vec<RawDescriptor>,
    pub(super) shadow_mode: bool,
    pub(super) quota_mode: bool,
    pub(super) share_threshold: bool,
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
pub(super) struct RawRateLimit {
    pub(super) policy: Policy,
    pub(super) name: String,
    pub(super) replaces: Vec<String>,
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
pub(super) fn composite_key(key: &str, value: &str) -> String {
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
