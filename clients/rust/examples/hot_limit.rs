//! An axum app with one hot shared limit: every request takes from one bucket (a global key), whichever process
//! serves it. Several copies of it on one Redis share that bucket; with `LEASE=1` each process takes the limit's
//! tokens in batches and decides most requests in memory (`Limit::lease`).
//!
//!     REDIS_URL=redis://127.0.0.1:7777 BIND=127.0.0.1:3000 LEASE=1 cargo run -p redis-tb-client --example hot_limit
//!
//! `RATE` and `BURST` (default 1,000 a second, a burst of 1,000) set the limit. `scripts/bench_lease.py`
//! (`make bench-lease`) runs four of these under `wrk`, with and without the lease, beside the same app without a
//! layer and with tower_governor's in-memory layer (`LAYER=none` or `LAYER=governor`).

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use redis_tb_client::{Client, GlobalKey, Limit, RateLimitLayer};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::GlobalKeyExtractor;
use tower_governor::GovernorLayer;

fn number(name: &str, default: f64) -> Result<f64, Box<dyn std::error::Error>> {
    match std::env::var(name) {
        Ok(text) => Ok(text.parse()?),
        Err(_) => Ok(default),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_ansi(false).init();
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let lease = std::env::var("LEASE").is_ok_and(|value| value == "1");
    let layer = std::env::var("LAYER").unwrap_or_else(|_| "redis-tb".to_owned());
    let (rate, burst) = (number("RATE", 1_000.0)?, number("BURST", 1_000.0)?);

    let app = Router::new().route("/", get(|| async { "hello\n" }));
    let app = match layer.as_str() {
        "none" => app,
        "governor" => {
            // In memory, per process: the same one key and header fields, nothing shared.
            let config = GovernorConfigBuilder::default()
                .key_extractor(GlobalKeyExtractor)
                .use_headers()
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .ok_or("a tower_governor configuration")?;
            app.layer(GovernorLayer::new(config))
        }
        _ => {
            let limit = Limit::new("hot", rate, burst)?.key(GlobalKey).lease(lease);
            app.layer(RateLimitLayer::builder(Client::new(&url)?, [limit]).build()?)
        }
    };
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("serving on http://{bind}");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
