//! Token-bucket rate limiting on Redis with the redis-tb module, or, where the module cannot load, its Lua
//! script as a Functions library or an `EVAL` script: an async [`Client`] for the `TB.*` commands and a tower
//! [`RateLimitLayer`] for axum.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use redis_tb_client::{Client, Limit, RateLimitLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("redis://127.0.0.1:6379")?;
//! let limits = RateLimitLayer::builder(client, [Limit::new("api", 10.0, 20.0)?]).build()?;
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(limits);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! The layer: [`RateLimitLayer::builder`] takes the options (setters that cannot fail), and
//! [`RateLimitLayerBuilder::build`] checks them all at once. Who a request counts against is a [`KeyExtractor`]:
//! [`PeerIp`] (the default), [`TrustedProxies`], [`GlobalKey`], or a closure. A refusal is the
//! [`RateLimitLayerBuilder::on_refusal`] hook's response. The `axum` feature (default) reads the peer address
//! from axum's `ConnectInfo`; without it the crate needs tower and http only. The public modules hold the rules
//! shared with the other packages and tb-rls: [`keys`], [`headers`], [`failure`], [`cluster`], [`script`].
//!
//! # Layout
//!
//! ```text
//! client.rs    the connection (one server or a Redis Cluster) and the deadline of each call
//! cluster.rs   a call's commands to the primary of its keys' slot, MOVED and ASK followed
//! backends.rs  backend selection (module, library, script) over any redis-rs async connection
//! command.rs   each command's arguments for the module and for the script; replies.rs their typed replies
//! script.rs    lua/tb.lua embedded at build time, and the library generated from it
//! failure.rs   the failure table of docs/clients.md and the errors that pick a backend
//! keys.rs      identities (peer addresses, IPv6 by prefix) and bucket keys
//! local.rs     the in-memory buckets of the fail mode `local`
//! headers.rs   the RateLimit header fields of docs/headers.md
//! limit.rs     a named limit and the identity a key gives
//! extract.rs   the key extractors: peer address, trusted proxies, global, closures
//! layer/       the tower layer: build.rs (the builder), decide.rs (the service), answer.rs (responses)
//! ```
//!
//! The shared rules (keys, failures, the local fallback) are tested against the repository's `fixtures/`, the
//! same files the Python and Node packages read.
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

mod backends;
mod client;
pub mod cluster;
mod command;
mod error;
mod extract;
pub mod failure;
pub mod headers;
pub mod keys;
mod layer;
mod limit;
mod local;
#[cfg(feature = "prometheus")]
mod metrics;
mod replies;
pub mod script;

pub use backends::{Backend, Backends};
pub use client::{
    probe_delay, redact, Client, ClientBuilder, DEFAULT_TIMEOUT, MAX_IN_FLIGHT, STALL_FRACTION,
};
pub use command::{Bucket, BucketWithCost};
pub use error::{ConfigError, Error};
pub use extract::{peer_addr, GlobalKey, KeyExtractor, PeerIp, TrustedProxies};
pub use layer::{
    json_response, ErrorHook, FailMode, RateLimit, RateLimitBody, RateLimitLayer,
    RateLimitLayerBuilder, Refusal, RefusalHook,
};
pub use limit::{Identity, Limit};
pub use replies::{
    Acquired, AcquiredAll, AcquiredEach, BucketResult, Charged, PartialGrant, Refunded, Reservation,
};
