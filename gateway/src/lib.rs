//! `tb-rls`: an Envoy rate limit service (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) whose
//! limits are redis-tb token buckets, one `TB.ACQUIREEACH` per request.
//!
//! Layout, as envoyproxy/ratelimit splits config / service / backend:
//!
//! ```text
//! config/       pure: the YAML format, checked once (format.rs); descriptor matching (tree.rs: exact, wildcard,
//!               key only, nesting)
//! decision/     pure: request -> buckets and costs (mod.rs), their Redis keys (the client crate's); module reply ->
//!               statuses, overall code, shadow and quota mode (verdict.rs); the response headers (headers.rs)
//! service.rs    the gRPC service, thin over decision and backend
//! backend.rs    Redis standalone or Cluster, timeouts, reconnecting in the background
//! reload.rs     reading the file(s) and polling them for changes
//! metrics.rs    Prometheus counters and latency, served over HTTP
//! settings.rs   flags and their environment variables
//! ```
//!
//! Nothing on a request's path unwraps, expects, panics or indexes: `lib.rs` denies them outside tests.
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod backend;
pub mod config;
pub mod decision;
pub mod metrics;
pub mod reload;
pub mod service;
pub mod settings;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tonic_health::ServingStatus;

use crate::backend::Backend;
use crate::metrics::Metrics;
use crate::service::RateLimiter;
use crate::settings::{LogFormat, Settings};

/// Sets up logging as `settings` ask: to stderr, text or one JSON object per line.
pub fn init_logging(settings: &Settings) {
    let builder = tracing_subscriber::fmt()
        .with_max_level(settings.log_level)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    match settings.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Runs the service until SIGINT or SIGTERM. `Err` says why it could not start.
pub async fn run(settings: Settings) -> Result<(), String> {
    let policy = settings.config_policy();
    let sources = reload::read_sources(&settings.config).map_err(|err| err.to_string())?;
    let config = reload::parse(&sources, policy).map_err(|err| err.to_string())?;
    reload::check_not_empty(&config, &settings.config, policy)?;
    tracing::info!(domains = ?config.domains(), path = %settings.config.display(), "configuration loaded");
    let shared: reload::Shared = Arc::new(RwLock::new(Arc::new(config)));
    let metrics = Arc::new(Metrics::default());

    let backend = Backend::new(
        &settings.topology(),
        settings.redis_timeout,
        Arc::clone(&metrics),
    )?;

    let grpc_addr: SocketAddr =
        format!("{}:{}", bracketed(&settings.grpc_host), settings.grpc_port)
            .parse()
            .map_err(|err| {
                format!(
                    "GRPC_HOST/GRPC_PORT {}:{}: {err}",
                    settings.grpc_host, settings.grpc_port
                )
            })?;
    if settings.prometheus_addr != "off" {
        let listener = tokio::net::TcpListener::bind(&settings.prometheus_addr)
            .await
            .map_err(|err| format!("PROMETHEUS_ADDR {}: {err}", settings.prometheus_addr))?;
        tracing::info!(addr = %settings.prometheus_addr, "metrics on http://{}/metrics", settings.prometheus_addr);
        tokio::spawn(metrics::serve(listener, Arc::clone(&metrics)));
    }
    tokio::spawn(reload::watch(
        settings.config.clone(),
        sources,
        Arc::clone(&shared),
        settings.config_poll,
        policy,
        Arc::clone(&metrics),
    ));

    // Health: SERVING while Redis is connected and not stalling (see `Backend::is_serving`), for "" and the rate
    // limit service alike.
    let (reporter, health_service) = tonic_health::server::health_reporter();
    {
        let backend = backend.clone();
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let serving = backend.is_serving();
                let connected = backend.is_connected();
                if last != Some(serving) {
                    let status = if serving {
                        ServingStatus::Serving
                    } else {
                        ServingStatus::NotServing
                    };
                    reporter.set_service_status("", status).await;
                    reporter
                        .set_service_status("envoy.service.ratelimit.v3.RateLimitService", status)
                        .await;
                    last = Some(serving);
                }
                // After the health status, so whoever sees the gauge at 1 finds the service SERVING too.
                metrics.set_redis_connected(connected);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }

    let limiter = RateLimiter {
        config: shared,
        options: settings.options(),
        backend,
        metrics,
        failure_log: backend::Throttle::default(),
        in_flight: Arc::new(tokio::sync::Semaphore::new(
            usize::try_from(settings.max_in_flight).unwrap_or(usize::MAX),
        )),
    };
    tracing::info!(addr = %grpc_addr, "gRPC rate limit service listening");
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(health_service)
        .add_service(
            RateLimitServiceServer::new(limiter)
                .max_decoding_message_size(settings.max_request_bytes),
        )
        .serve_with_shutdown(grpc_addr, shutdown_signal())
        .await
        .map_err(|err| format!("gRPC server on {grpc_addr}: {err}"))
}

/// An IPv6 literal in brackets, so `host:port` parses.
fn bracketed(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        if let Ok(mut terminate) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = interrupt => {}
                _ = terminate.recv() => {}
            }
        } else {
            let _ = interrupt.await;
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
    tracing::info!("shutting down");
}
