//! Prometheus metrics, kept in memory and written out in the text exposition format on `GET /metrics` (any path
//! answers the same). A few counters and one latency histogram do not need a metrics library.
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
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Upper bounds of the latency histogram's buckets, in seconds.
const LATENCY_BOUNDS_S: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

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

/// Every metric the service keeps.
#[derive(Default)]
pub struct Metrics {
    decisions: Mutex<BTreeMap<(String, Outcome), u64>>,
    shadow: Mutex<BTreeMap<String, u64>>,
    redis_unavailable: AtomicU64,
    redis_reply_errors: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    /// Counts per bound of `LATENCY_BOUNDS_S` (not cumulative), then the overflow.
    latency_buckets: [AtomicU64; 13],
    latency_sum_us: AtomicU64,
    latency_count: AtomicU64,
    redis_connected: AtomicU64,
    redis_connects: AtomicU64,
    refused_in_flight: AtomicU64,
}

impl Metrics {
    pub fn decision(&self, domain: &str, outcome: Outcome, elapsed: Duration) {
        if let Ok(mut decisions) = self.decisions.lock() {
            *decisions.entry((domain.to_owned(), outcome)).or_default() += 1;
        }
        let seconds = elapsed.as_secs_f64();
        let index = LATENCY_BOUNDS_S
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(LATENCY_BOUNDS_S.len());
        if let Some(bucket) = self.latency_buckets.get(index) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.latency_sum_us.fetch_add(micros, Ordering::Relaxed);
        self.latency_count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn shadow_over_limit(&self, domain: &str, count: usize) {
        if count == 0 {
            return;
        }
        if let Ok(mut shadow) = self.shadow.lock() {
            *shadow.entry(domain.to_owned()).or_default() += u64::try_from(count).unwrap_or(0);
        }
    }

    pub fn redis_error(&self, unavailable: bool) {
        let counter = if unavailable {
            &self.redis_unavailable
        } else {
            &self.redis_reply_errors
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn reload(&self, ok: bool) {
        let counter = if ok {
            &self.reloads_ok
        } else {
            &self.reloads_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_redis_connected(&self, connected: bool) {
        self.redis_connected
            .store(u64::from(connected), Ordering::Relaxed);
    }

    pub fn redis_connect_attempt(&self) {
        self.redis_connects.fetch_add(1, Ordering::Relaxed);
    }

    pub fn refused_in_flight(&self) {
        self.refused_in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP tb_rls_decisions_total ShouldRateLimit requests answered, by domain and code.\n");
        out.push_str("# TYPE tb_rls_decisions_total counter\n");
        if let Ok(decisions) = self.decisions.lock() {
            for ((domain, outcome), count) in decisions.iter() {
                let _ = writeln!(
                    out,
                    "tb_rls_decisions_total{{domain=\"{}\",code=\"{}\"}} {count}",
                    label_value(domain),
                    outcome.label()
                );
            }
        }
        out.push_str(
            "# HELP tb_rls_shadow_over_limit_total Descriptors over their limit in shadow mode.\n",
        );
        out.push_str("# TYPE tb_rls_shadow_over_limit_total counter\n");
        if let Ok(shadow) = self.shadow.lock() {
            for (domain, count) in shadow.iter() {
                let _ = writeln!(
                    out,
                    "tb_rls_shadow_over_limit_total{{domain=\"{}\"}} {count}",
                    label_value(domain)
                );
            }
        }
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        family(
            &mut out,
            "tb_rls_redis_errors_total",
            "counter",
            "Failed Redis calls.",
            &[
                ("{kind=\"unavailable\"}", load(&self.redis_unavailable)),
                ("{kind=\"reply\"}", load(&self.redis_reply_errors)),
            ],
        );
        family(
            &mut out,
            "tb_rls_config_reloads_total",
            "counter",
            "Configuration loads.",
            &[
                ("{result=\"ok\"}", load(&self.reloads_ok)),
                ("{result=\"error\"}", load(&self.reloads_failed)),
            ],
        );
        family(
            &mut out,
            "tb_rls_redis_connected",
            "gauge",
            "Whether a Redis connection is up (1) or not (0).",
            &[("", load(&self.redis_connected))],
        );
        family(
            &mut out,
            "tb_rls_redis_connects_total",
            "counter",
            "Redis connection attempts.",
            &[("", load(&self.redis_connects))],
        );
        family(
            &mut out,
            "tb_rls_requests_refused_total",
            "counter",
            "Requests refused before planning.",
            &[("{reason=\"in_flight\"}", load(&self.refused_in_flight))],
        );
        out.push_str(
            "# HELP tb_rls_request_duration_seconds ShouldRateLimit latency inside the service.\n",
        );
        out.push_str("# TYPE tb_rls_request_duration_seconds histogram\n");
        let mut cumulative = 0;
        for (bound, bucket) in LATENCY_BOUNDS_S.iter().zip(&self.latency_buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "tb_rls_request_duration_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "tb_rls_request_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let sum_s =
            Duration::from_micros(self.latency_sum_us.load(Ordering::Relaxed)).as_secs_f64();
        let _ = writeln!(out, "tb_rls_request_duration_seconds_sum {sum_s}");
        let _ = writeln!(out, "tb_rls_request_duration_seconds_count {count}");
        out
    }
}

/// Writes a metric's HELP and TYPE lines, then one `<name><labels> <value>` line per row.
fn family(out: &mut String, name: &str, kind: &str, help: &str, rows: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in rows {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serves `metrics.render()` over HTTP/1.1 on `listener`, one response per connection.
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
            let body = metrics.render();
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}
