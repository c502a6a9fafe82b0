//! An axum app limited per client address: 10 requests a second, bursts of 20, in the Redis at `REDIS_URL`
//! (default `redis://127.0.0.1:6379`), serving on `BIND` (default `127.0.0.1:3000`). `/health` is not limited.
//!
//!     REDIS_URL=redis://127.0.0.1:7777 cargo run -p redis-tb-client --example axum
//!
//! docs/rust.md shows the part between the snippet markers as the whole `src/main.rs` of a new project.

// snippet: start
use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use redis_tb_client::{Client, Identity, KeyExtractor, Limit, PeerIp, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The limiter's warnings (Redis unavailable, a backend switch) go through `tracing`.
    tracing_subscriber::fmt().with_ansi(false).init();
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());

    let client = Client::new(&url)?;
    let limits = RateLimitLayer::builder(client, [Limit::new("api", 10.0, 20.0)?])
        // The default key is the peer address (IPv6 by /56); a key of your own may skip requests.
        .key_fn(|request| {
            if request.uri.path() == "/health" {
                Identity::Skip
            } else {
                PeerIp.extract(request)
            }
        })
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(limits);

    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!(
        "serving on http://{bind}, limits in Redis at {}",
        redis_tb_client::redact(&url)
    );
    // The peer address reaches the layer through ConnectInfo.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
// snippet: end
