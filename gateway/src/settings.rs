//! Command-line flags, each with an environment variable; where envoyproxy/ratelimit has a setting for the same
//! thing, the variable has its name (`GRPC_HOST`, `GRPC_PORT`, `REDIS_URL`, `REDIS_TYPE`, `LOG_LEVEL`,
//! `LOG_FORMAT`, `SHADOW_MODE`, `CACHE_KEY_PREFIX`, `LIMIT_RESPONSE_HEADERS_ENABLED`, `LIMIT_*_HEADER`), so a
//! deployment's environment carries over.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::backend::Topology;
use redis_tb_client::headers::Standard;

use crate::decision::{HeaderNames, Options};

/// An Envoy rate limit service (envoy.service.ratelimit.v3) backed by redis-tb's token buckets.
#[derive(Parser, Debug, Clone)]
#[command(name = "tb-rls", version)]
pub struct Settings {
    /// Address the gRPC service listens on (0.0.0.0 for every interface)
    #[arg(long, env = "GRPC_HOST", default_value = "127.0.0.1")]
    pub grpc_host: String,
    /// Port of the gRPC service (RateLimitService and grpc.health.v1.Health)
    #[arg(long, env = "GRPC_PORT", default_value_t = 8081)]
    pub grpc_port: u16,
    /// Address of the Prometheus metrics endpoint (HTTP, GET /metrics); "off" disables it
    #[arg(long, env = "PROMETHEUS_ADDR", default_value = "127.0.0.1:9090")]
    pub prometheus_addr: String,
    /// Redis: host:port or redis://[user:password@]host:port[/db]; for a cluster, seed nodes separated by commas
    #[arg(long, env = "REDIS_URL", default_value = "127.0.0.1:6379")]
    pub redis_url: String,
    /// single (one server) or cluster (Redis Cluster)
    #[arg(
        long,
        env = "REDIS_TYPE",
        value_enum,
        ignore_case = true,
        default_value = "single"
    )]
    pub redis_type: RedisType,
    /// Longest wait for Redis per request (and per connection attempt), e.g. 100ms or 1s
    #[arg(long, env = "REDIS_TIMEOUT", default_value = "100ms", value_parser = parse_duration)]
    pub redis_timeout: Duration,
    /// Largest ShouldRateLimit request accepted, in bytes; a larger one is refused before it is read
    #[arg(long, env = "TB_RLS_MAX_REQUEST_BYTES", default_value_t = 65_536)]
    pub max_request_bytes: usize,
    /// Most requests decided at once; one more is answered UNAVAILABLE at once
    #[arg(long, env = "TB_RLS_MAX_IN_FLIGHT", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight: u32,
    /// Rate limit configuration: a YAML file, or a directory of them (envoyproxy/ratelimit's format)
    #[arg(long, env = "TB_RLS_CONFIG")]
    pub config: PathBuf,
    /// Accept a configuration with no domain (every request passes unlimited), and a reload that drops the domains
    /// of files that vanished; both are refused otherwise, and the last good configuration keeps serving
    #[arg(long, env = "TB_RLS_ALLOW_EMPTY_CONFIG")]
    pub allow_empty_config: bool,
    /// Merge files that name the same domain (a descriptor path defined twice is still refused)
    #[arg(long, env = "MERGE_DOMAIN_CONFIG")]
    pub merge_domain_config: bool,
    /// Every descriptor in quota mode: over its limit it is reported, and refuses only when every quota
    /// descriptor of the request is over
    #[arg(long, env = "QUOTA_MODE")]
    pub quota_mode: bool,
    /// How often the configuration is checked for changes
    #[arg(long, env = "TB_RLS_CONFIG_POLL", default_value = "1s", value_parser = parse_duration)]
    pub config_poll: Duration,
    /// trace, debug, info, warn or error (any case)
    #[arg(long, env = "LOG_LEVEL", default_value = "info", value_parser = parse_level)]
    pub log_level: tracing::Level,
    /// text or json
    #[arg(
        long,
        env = "LOG_FORMAT",
        value_enum,
        ignore_case = true,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Prepended to every Redis key; without "{" or "}" (the hash tag of every key is its domain)
    #[arg(long, env = "CACHE_KEY_PREFIX", default_value = "tb-rls:", value_parser = parse_prefix)]
    pub cache_key_prefix: String,
    /// Every limit in shadow mode: counted, never denied
    #[arg(long, env = "SHADOW_MODE")]
    pub shadow_mode: bool,
    /// Rate-limit headers added to responses: none, draft (RateLimit-Policy and RateLimit), legacy
    /// (RateLimit-Limit/-Remaining/-Reset) or both
    #[arg(long, env = "TB_RLS_RESPONSE_HEADERS", value_parser = standards(), ignore_case = true)]
    pub response_headers: Option<Standard>,
    /// envoyproxy/ratelimit's switch: the legacy headers when --response-headers is not given
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED")]
    pub limit_response_headers_enabled: bool,
    /// Name of the legacy limit header
    #[arg(long, env = "LIMIT_LIMIT_HEADER", default_value = "RateLimit-Limit")]
    pub limit_limit_header: String,
    /// Name of the legacy remaining header
    #[arg(
        long,
        env = "LIMIT_REMAINING_HEADER",
        default_value = "RateLimit-Remaining"
    )]
    pub limit_remaining_header: String,
    /// Name of the legacy reset header
    #[arg(long, env = "LIMIT_RESET_HEADER", default_value = "RateLimit-Reset")]
    pub limit_reset_header: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RedisType {
    Single,
    Cluster,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl Settings {
    pub fn topology(&self) -> Topology {
        match self.redis_type {
            RedisType::Single => Topology::Single(self.redis_url.trim().to_owned()),
            RedisType::Cluster => Topology::Cluster(
                self.redis_url
                    .split(',')
                    .map(str::trim)
                    .filter(|url| !url.is_empty())
                    .map(str::to_owned)
                    .collect(),
            ),
        }
    }

    /// How configuration files are read and which reloads are accepted.
    pub fn config_policy(&self) -> crate::reload::Policy {
        crate::reload::Policy {
            merge_domains: self.merge_domain_config,
            allow_empty: self.allow_empty_config,
        }
    }

    pub fn options(&self) -> Options {
        let headers = match self.response_headers {
            Some(format) => format,
            None if self.limit_response_headers_enabled => Standard::Legacy,
            None => Standard::None,
        };
        Options {
            key_prefix: self.cache_key_prefix.clone(),
            global_shadow: self.shadow_mode,
            global_quota: self.quota_mode,
            headers,
            header_names: HeaderNames {
                limit: self.limit_limit_header.clone(),
                remaining: self.limit_remaining_header.clone(),
                reset: self.limit_reset_header.clone(),
            },
        }
    }
}

/// `250ms`, `1s`, `2m` or a bare number of milliseconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale_ms) = if let Some(number) = text.strip_suffix("ms") {
        (number, 1.0)
    } else if let Some(number) = text.strip_suffix('s') {
        (number, 1_000.0)
    } else if let Some(number) = text.strip_suffix('m') {
        (number, 60_000.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (e.g. 100ms, 1s)"))?;
    if !value.is_finite() || value <= 0.0 {
        return Err(format!(
            "must be a positive finite number (a duration: 100ms, 1s), not '{text}'"
        ));
    }
    Duration::try_from_secs_f64(value * scale_ms / 1_000.0)
        .map_err(|err| format!("'{text}': {err}"))
}

/// `--response-headers`: redis-tb-client's [`Standard`] by the name the other packages take, any case.
fn standards() -> impl clap::builder::TypedValueParser<Value = Standard> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new("none").help(
            "No rate-limit fields, only `Retry-After` on a refusal (Envoy's own `enable_x_ratelimit_headers` \
             still works from the descriptor statuses)",
        ),
        PossibleValue::new("draft")
            .help("The IETF draft's `RateLimit-Policy` and `RateLimit`, one item per limited descriptor"),
        PossibleValue::new("legacy").help(
            "The single-limit headers envoyproxy/ratelimit sends, from the reply's limiting bucket",
        ),
        PossibleValue::new("both").help("Both"),
    ])
    .try_map(|name| name.to_ascii_lowercase().parse::<Standard>())
}

/// A key prefix as redis-tb-client checks one (fixtures/options.json): no brace, which would move every key's slot.
fn parse_prefix(text: &str) -> Result<String, String> {
    redis_tb_client::keys::check_prefix(text)
        .map(str::to_owned)
        .map_err(|error| error.to_string())
}

fn parse_level(text: &str) -> Result<tracing::Level, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a log level (trace, debug, info, warn, error)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("250"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
    }

    /// `--<flag>=<text>` parsed with everything else at its default: the error's text, or None when accepted.
    fn refusal(flag: &str, text: &str) -> Option<String> {
        Settings::try_parse_from(["tb-rls", "--config", "x.yaml", &format!("{flag}={text}")])
            .err()
            .map(|error| error.to_string())
    }

    /// The fixture's rows that apply to tb-rls (those naming a `gateway` flag): each accepted value parses, each
    /// refused one is refused with the flag and the shared message. A timeout's numbers are written in seconds
    /// (`0.5s`); values no command line can carry (a number for the prefix, a boolean, null) are skipped.
    #[test]
    fn options_follow_the_shared_fixture() {
        let fixture = tb_test_support::fixture("options.json");
        let options = fixture["options"].as_array().expect("options");
        let mut checked = 0;
        for option in options {
            let Some(flag) = option["names"]["gateway"].as_str() else {
                continue;
            };
            let numbers = option["numbers"].as_bool() == Some(true);
            let text_of = |value: &serde_json::Value| -> Option<String> {
                if numbers {
                    let is_number = value.is_number()
                        || matches!(value.as_str(), Some("NaN" | "Infinity" | "-Infinity"));
                    is_number.then(|| format!("{}s", tb_test_support::fixture_number(value)))
                } else {
                    value.as_str().map(str::to_owned)
                }
            };
            let message = option["message"].as_str().expect("message");
            for value in option["accepted"].as_array().expect("accepted") {
                let text = text_of(value).expect("an accepted value a command line carries");
                assert_eq!(refusal(flag, &text), None, "{flag} {text}");
                checked += 1;
            }
            for value in option["refused"].as_array().expect("refused") {
                let Some(text) = text_of(value) else { continue };
                let error = refusal(flag, &text).unwrap_or_else(|| panic!("{flag} {text} refused"));
                assert!(
                    error.contains(flag) && error.contains(message),
                    "{flag} {text}: {error}"
                );
                checked += 1;
            }
        }
        assert!(checked > 20, "{checked} values checked");
    }

    #[test]
    fn envoyproxy_ratelimit_spellings_are_accepted() {
        let settings = Settings::try_parse_from([
            "tb-rls",
            "--config",
            "x.yaml",
            "--log-level",
            "WARN",
            "--redis-type",
            "CLUSTER",
            "--redis-url",
            "127.0.0.1:7000, 127.0.0.1:7001",
            "--limit-response-headers-enabled",
            "--merge-domain-config",
        ])
        .expect("parses");
        assert_eq!(settings.log_level, tracing::Level::WARN);
        assert_eq!(
            settings.topology(),
            Topology::Cluster(vec![
                "127.0.0.1:7000".to_owned(),
                "127.0.0.1:7001".to_owned()
            ])
        );
        assert_eq!(settings.options().headers, Standard::Legacy);
        assert!(settings.config_policy().merge_domains);
        assert!(!settings.config_policy().allow_empty);
    }

    #[test]
    fn response_headers_take_the_standard_names_in_any_case() {
        let parse = |value: &str| {
            Settings::try_parse_from(["tb-rls", "--config", "x.yaml", "--response-headers", value])
                .map(|settings| settings.options().headers)
        };
        assert_eq!(parse("draft").ok(), Some(Standard::Draft));
        assert_eq!(parse("BOTH").ok(), Some(Standard::Both));
        assert_eq!(parse("Legacy").ok(), Some(Standard::Legacy));
        assert_eq!(parse("none").ok(), Some(Standard::None));
        let refused = parse("rfc")
            .err()
            .map(|err| err.to_string())
            .unwrap_or_default();
        assert!(
            refused.contains("[possible values: none, draft, legacy, both]"),
            "{refused}"
        );
    }
}
