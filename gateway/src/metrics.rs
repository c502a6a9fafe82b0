//! Prometheus metrics, kept in memory by `prometheus-client` (the Prometheus project's Rust client) and written
//! out on `GET /metrics` (any path answers the same): in the Prometheus text format (0.0.4) by default, as
//! client_golang, client_python and envoyproxy/ratelimit answer a plain GET, and in the OpenMetrics text format when
//! the request's `Accept` asks for `application/openmetrics-text` (as Prometheus's scraper does).
//!
//! ```text
//! tb_rls_decisions_total{domain,code}      requests answered, by domain (configured ones; others are "other")
//!                                          and code: ok, over_limit, unavailable, error, invalid
//! tb_rls_shadow_over_limit_total{domain}   descriptors over their limit in shadow mode (let through)
//! tb_rls_redis_errors_total{kind}          failed Redis calls: unavailable (timeout, no connection), reply
//! tb_rls_config_reloads_total{result}      configuration loads: ok, error
//! tb_rls_request_duration_seconds          ShouldRateLimit latency inside the service (histogram)
//! tb_rls_redis_connected                   1 while a Redis connection is up
//! tb_rls_redis_connects_total              connection attempts (each after the backoff)
//! tb_rls_requests_refused_total{reason}    requests refused before planning: in_flight (over --max-in-flight)
//! ```
//!
//! Labels carry configured domain names and fixed words only, never a descriptor's value, so the number of series
//! is bounded by the configuration.
#![forbid(unsafe_code)]

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Upper bounds of the latency histogram's buckets, in seconds.
const LATENCY_BOUNDS_S: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The media type of the OpenMetrics text format, served to a request whose `Accept` names it.
const OPENMETRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The media type of the Prometheus text format, served to every other request (curl, a plain GET, older scrapers).
const PROMETHEUS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A request's outcome, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Ok,
    OverLimit,
    Unavailable,
    Error,
    Invalid,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::OverLimit => "over_limit",
            Outcome::Unavailable => "unavailable",
            Outcome::Error => "error",
            Outcome::Invalid => "invalid",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    domain: String,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabels {
    domain: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Every metric the service keeps, and the registry that writes them out.
pub struct Metrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter>,
    shadow: Family<DomainLabels, Counter>,
    redis_errors: Family<KindLabels, Counter>,
    reloads: Family<ResultLabels, Counter>,
    latency: Histogram,
    redis_connected: Gauge,
    redis_connects: Counter,
    refused: Family<ReasonLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let decisions = Family::<DecisionLabels, Counter>::default();
        let shadow = Family::<DomainLabels, Counter>::default();
        let redis_errors = Family::<KindLabels, Counter>::default();
        let reloads = Family::<ResultLabels, Counter>::default();
        let latency = Histogram::new(LATENCY_BOUNDS_S);
        let redis_connected = Gauge::default();
        let redis_connects = Counter::default();
        let refused = Family::<ReasonLabels, Counter>::default();
        // Fixed label values are shown from the start (at 0), so a rate() over them has a first sample.
        for kind in ["unavailable", "reply"] {
            redis_errors.get_or_create(&KindLabels { kind }).inc_by(0);
        }
        for result in ["ok", "error"] {
            reloads.get_or_create(&ResultLabels { result }).inc_by(0);
        }
        refused
            .get_or_create(&ReasonLabels {
                reason: "in_flight",
            })
            .inc_by(0);
        registry.register(
            "tb_rls_decisions",
            "ShouldRateLimit requests answered, by domain and code",
            decisions.clone(),
        );
        registry.register(
            "tb_rls_shadow_over_limit",
            "Descriptors over their limit in shadow mode",
            shadow.clone(),
        );
        registry.register(
            "tb_rls_redis_errors",
            "Failed Redis calls",
            redis_errors.clone(),
        );
        registry.register(
            "tb_rls_config_reloads",
            "Configuration loads",
            reloads.clone(),
        );
        registry.register(
            "tb_rls_redis_connected",
            "Whether a Redis connection is up (1) or not (0)",
            redis_connected.clone(),
        );
        registry.register(
            "tb_rls_redis_connects",
            "Redis connection attempts",
            redis_connects.clone(),
        );
        registry.register(
            "tb_rls_requests_refused",
            "Requests refused before planning",
            refused.clone(),
        );
        registry.register(
            "tb_rls_request_duration_seconds",
            "ShouldRateLimit latency inside the service",
            latency.clone(),
        );
        Metrics {
            registry,
            decisions,
            shadow,
            redis_errors,
            reloads,
            latency,
            redis_connected,
            redis_connects,
            refused,
        }
    }
}

impl Metrics {
    pub fn decision(&self, domain: &str, outcome: Outcome, elapsed: Duration) {
        self.decisions
            .get_or_create(&DecisionLabels {
                domain: domain.to_owned(),
                code: outcome.label(),
            })
            .inc();
        self.latency.observe(elapsed.as_secs_f64());
    }

    pub fn shadow_over_limit(&self, domain: &str, count: usize) {
        if count == 0 {
            return;
        }
        self.shadow
            .get_or_create(&DomainLabels {
                domain: domain.to_owned(),
            })
            .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
    }

    pub fn redis_error(&self, unavailable: bool) {
        let kind = if unavailable { "unavailable" } else { "reply" };
        self.redis_errors.get_or_create(&KindLabels { kind }).inc();
    }

    pub fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reloads.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn set_redis_connected(&self, connected: bool) {
        self.redis_connected.set(i64::from(connected));
    }

    pub fn redis_connect_attempt(&self) {
        self.redis_connects.inc();
    }

    pub fn refused_in_flight(&self) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: "in_flight",
            })
            .inc();
    }

    /// The OpenMetrics text format, ending with `# EOF`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error would leave a truncated page, which Prometheus refuses.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// The page for a request whose head is `head`: its media type and body.
    pub fn page(&self, head: &[u8]) -> (&'static str, String) {
        let openmetrics = self.render();
        if accepts_openmetrics(head) {
            (OPENMETRICS_TYPE, openmetrics)
        } else {
            (PROMETHEUS_TYPE, prometheus_text(&openmetrics))
        }
    }
}

/// Whether a request head has an `Accept` header naming the OpenMetrics text format (any version).
fn accepts_openmetrics(head: &[u8]) -> bool {
    String::from_utf8_lossy(head).lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("accept")
                && value
                    .to_ascii_lowercase()
                    .contains("application/openmetrics-text")
        })
    })
}

/// The Prometheus text format of an OpenMetrics page. The two differ, for what this service exports, in three
/// ways: a counter's `# TYPE` and `# HELP` name its samples (`x_total`) rather than its family (`x`); there is no
/// `# UNIT` line; and no `# EOF` (which older parsers read as a comment anyway).
fn prometheus_text(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# TYPE ", "# HELP "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(&name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(line) => out.push_str(&line),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Serves `metrics.page()` over HTTP/1.1 on `listener`, one response per connection.
pub async fn serve(listener: TcpListener, metrics: std::sync::Arc<Metrics>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = std::sync::Arc::clone(&metrics);
        tokio::spawn(async move {
            // Read the request head (bounded); its path does not matter.
            let mut head = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            let read = async {
                while !head.windows(4).any(|window| window == b"\r\n\r\n") && head.len() < 16 * 1024
                {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => head.extend_from_slice(chunk.get(..n).unwrap_or_default()),
                    }
                }
                true
            };
            if !matches!(
                tokio::time::timeout(Duration::from_secs(5), read).await,
                Ok(true)
            ) {
                return;
            }
            let (content_type, body) = metrics.page(&head);
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // What a scrape shows after a few events: the metric names and labels docs/gateway.md lists, the fixed label
    // values from the start, and the histogram in cumulative buckets.
    #[test]
    fn render_shows_each_metric_with_its_documented_name() {
        let metrics = Metrics::default();
        metrics.decision("api", Outcome::Ok, Duration::from_micros(300));
        metrics.decision("api", Outcome::Ok, Duration::from_millis(2));
        metrics.decision("api", Outcome::OverLimit, Duration::from_millis(2));
        metrics.shadow_over_limit("api", 2);
        metrics.shadow_over_limit("api", 0);
        metrics.redis_error(true);
        metrics.reload(false);
        metrics.set_redis_connected(true);
        metrics.redis_connect_attempt();
        let page = metrics.render();
        for line in [
            "# TYPE tb_rls_decisions counter",
            "tb_rls_decisions_total{domain=\"api\",code=\"ok\"} 2",
            "tb_rls_decisions_total{domain=\"api\",code=\"over_limit\"} 1",
            "tb_rls_shadow_over_limit_total{domain=\"api\"} 2",
            "tb_rls_redis_errors_total{kind=\"unavailable\"} 1",
            "tb_rls_redis_errors_total{kind=\"reply\"} 0",
            "tb_rls_config_reloads_total{result=\"error\"} 1",
            "tb_rls_config_reloads_total{result=\"ok\"} 0",
            "tb_rls_redis_connected 1",
            "tb_rls_redis_connects_total 1",
            "tb_rls_requests_refused_total{reason=\"in_flight\"} 0",
            "tb_rls_request_duration_seconds_bucket{le=\"0.0005\"} 1",
            "tb_rls_request_duration_seconds_bucket{le=\"0.0025\"} 3",
            "tb_rls_request_duration_seconds_count 3",
            "# EOF",
        ] {
            assert!(
                page.lines().any(|have| have == line),
                "{line:?} missing from:\n{page}"
            );
        }
    }

    // A plain GET gets the Prometheus text format, as the other Prometheus clients serve it: counters typed by
    // their samples' name, no `# EOF`; an `Accept` naming OpenMetrics gets the OpenMetrics page unchanged.
    #[test]
    fn a_plain_get_gets_the_prometheus_text_format_and_openmetrics_is_served_when_asked() {
        let metrics = Metrics::default();
        metrics.decision("api", Outcome::Ok, Duration::from_micros(300));
        let (plain_type, plain) = metrics.page(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(plain_type, "text/plain; version=0.0.4; charset=utf-8");
        for line in [
            "# TYPE tb_rls_decisions_total counter",
            "tb_rls_decisions_total{domain=\"api\",code=\"ok\"} 1",
            "# TYPE tb_rls_redis_connected gauge",
            "# TYPE tb_rls_request_duration_seconds histogram",
        ] {
            assert!(
                plain.lines().any(|have| have == line),
                "{line:?} missing from:\n{plain}"
            );
        }
        assert!(!plain.contains("# EOF"), "{plain}");
        assert!(
            !plain.contains("# TYPE tb_rls_decisions counter"),
            "{plain}"
        );

        let head = b"GET /metrics HTTP/1.1\r\naccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n";
        let (open_type, open) = metrics.page(head);
        assert_eq!(
            open_type,
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert_eq!(open, metrics.render());
        assert!(open.ends_with("# EOF\n"), "{open}");
    }

    #[test]
    fn a_domain_with_quotes_and_newlines_stays_one_label_value() {
        let metrics = Metrics::default();
        metrics.decision("a\"b\nc", Outcome::Ok, Duration::ZERO);
        assert!(metrics
            .render()
            .contains("tb_rls_decisions_total{domain=\"a\\\"b\\nc\",code=\"ok\"} 1"));
    }
}
