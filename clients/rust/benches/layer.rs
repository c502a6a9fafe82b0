//! The layer's own time per request, beside tower_governor (in memory) and no layer, on one axum app driven
//! in-process with `tower::ServiceExt::oneshot` (no TCP, no HTTP parsing).
//!
//! The client has no way to swap its connection for a stub, so the layer runs against a real server: a
//! `redis-server` with the module that this bench spawns on loopback (`$REDIS_SERVER`, `$TB_MODULE`, as for the
//! tests). Its round trip is measured on its own, as a bare `acquire` of the very bucket the layer takes from,
//! through the same client on the same runtime, and taken out:
//!
//!     layer's own time = (app + redis-tb layer) - (app alone) - (bare acquire)
//!     governor's own time = (app + GovernorLayer) - (app alone)
//!
//! A difference of two separately measured round trips moves with the load of a shared machine by more than it
//! is, so the own times are also measured paired: each request through a layer right before its baseline, the
//! mean of the per-pair differences.
//!
//! Both layers key on the peer address from `ConnectInfo<SocketAddr>`, set headers on allowed responses
//! (tower_governor with `use_headers`) and allow every request (limits far above the request rate), so both
//! take the path most requests take. `make bench` runs it and prints both ratios of the two own times;
//! `cargo test --all-targets` runs each case once.
//!
//! Times on a shared machine move by more than the own times are; instructions do not. With
//! `LAYER_BENCH_ONLY=<case>:<requests>` the bench runs that many requests of one case inside `counted` (after as
//! many uncounted, which set up what later ones reuse) and exits, for valgrind's callgrind to count:
//! scripts/layer_instructions.sh gives each case's instructions per request and the same two own figures.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::cell::Cell;
use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use common::Server;
use criterion::Criterion;
use redis_tb_client::keys::{addr_identity, bucket_key, Ipv6Subnet, DEFAULT_PREFIX};
use redis_tb_client::{Backend, Client, Limit, RateLimitLayer};
use tower::ServiceExt;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

/// Far above any rate this bench reaches: every request is allowed, by both layers.
const RATE: f64 = 1e9;
/// The leased limit: a hot limit's bucket, emptied before the bench, that refills far faster than the bench asks
/// (every request allowed) and takes days to fill (a grant keeps its worth: `rate * (reset - now)`).
const LEASED_RATE: f64 = 1e6;
const LEASED_BURST: f64 = 1e12;
const PEER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 40_000);

fn app() -> Router {
    Router::new().route("/", get(|| async { "hello\n" }))
}

/// `router` as `axum::serve` runs it: its handlers turned into routes once (`with_state`), each layer applied
/// then. Unserved, axum applies the layers again on every request, work that neither layer does in a server.
fn served(router: Router) -> Router {
    router.with_state(())
}

fn request() -> Request<Body> {
    let mut request = Request::builder()
        .uri("/")
        .body(Body::empty())
        .expect("a request");
    request.extensions_mut().insert(ConnectInfo(PEER));
    request
}

/// `iters` requests through `router`, one after another; panics on an answer other than 200.
async fn drive(router: &Router, iters: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        let response = router.clone().oneshot(request()).await.expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
        black_box(response);
    }
    start.elapsed()
}

/// The sum of paired differences and how many pairs, over every run of one case (warm-up included).
#[derive(Default)]
struct Pairs {
    difference_ns: Cell<i128>,
    count: Cell<u64>,
}

impl Pairs {
    fn mean_ns(&self) -> f64 {
        self.difference_ns.get() as f64 / self.count.get().max(1) as f64
    }
}

/// One request through `first` then its baseline `second`, `iters` times, adding the first's time less the
/// second's to `pairs`; returns the first's times, which criterion reports. Pairing each request with its baseline
/// cancels the drift of a shared machine's load, which otherwise moves a difference of two separately measured
/// round trips by more than it is.
async fn paired<F, G>(pairs: &Pairs, iters: u64, first: F, second: G) -> Duration
where
    F: AsyncFn(),
    G: AsyncFn(),
{
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        first().await;
        let middle = Instant::now();
        second().await;
        let end = Instant::now();
        total += middle - start;
        pairs.difference_ns.set(
            pairs.difference_ns.get() + (middle - start).as_nanos() as i128
                - (end - middle).as_nanos() as i128,
        );
        pairs.count.set(pairs.count.get() + 1);
    }
    total
}

fn output_directory() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(
            || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")),
            PathBuf::from,
        )
        .join("criterion")
}

/// Criterion's estimate for one case, in nanoseconds per request, from the estimates it saved: the slope (the
/// middle figure of its `time:` line), or the mean where it fitted none.
fn estimate_ns(directory: &Path, id: &str) -> Option<f64> {
    let text = std::fs::read_to_string(directory.join(id).join("new/estimates.json")).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value["slope"]["point_estimate"]
        .as_f64()
        .or_else(|| value["mean"]["point_estimate"].as_f64())
}

/// Runs `requests` to the end: what callgrind counts with `--toggle-collect=*counted*`.
#[inline(never)]
fn counted(runtime: &tokio::runtime::Runtime, requests: impl std::future::Future<Output = ()>) {
    runtime.block_on(requests);
}

fn main() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let client = Client::builder(&server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a client");

    let plain = served(app());
    let governor_config = GovernorConfigBuilder::default()
        .use_headers()
        .per_nanosecond(1)
        .burst_size(1_000_000_000)
        .finish()
        .expect("a governor config");
    let governed = served(app().layer(GovernorLayer::new(governor_config)));
    let limit = Limit::new("api", RATE, RATE).expect("a limit");
    let limited = served(
        app().layer(
            RateLimitLayer::builder(client.clone(), [limit])
                .build()
                .expect("a layer"),
        ),
    );
    let key = bucket_key(
        DEFAULT_PREFIX,
        Some(&addr_identity(PEER.ip(), Ipv6Subnet::DEFAULT)),
        "api",
    );
    let hot = Limit::new("hot", LEASED_RATE, LEASED_BURST)
        .expect("a limit")
        .lease(true);
    let leased = served(
        app().layer(
            RateLimitLayer::builder(client.clone(), [hot])
                .build()
                .expect("a layer"),
        ),
    );
    let hot_key = bucket_key(
        DEFAULT_PREFIX,
        Some(&addr_identity(PEER.ip(), Ipv6Subnet::DEFAULT)),
        "hot",
    );
    runtime.block_on(async {
        let emptied = client
            .acquire(&hot_key, LEASED_RATE, LEASED_BURST, LEASED_BURST)
            .await
            .expect("TB.ACQUIRE");
        assert!(emptied.allowed);
    });

    // The layer must have reached the module (not the Lua script, not its local fallback).
    runtime.block_on(async {
        drive(&limited, 1).await;
        client
            .acquire(&key, RATE, RATE, 1.0)
            .await
            .expect("TB.ACQUIRE");
    });
    assert_eq!(client.backend_in_use(), Backend::Module);

    // LAYER_BENCH_ONLY=<case>:<requests>: that many requests of one case (none, tower_governor, redis_tb,
    // bare_acquire, redis_tb_leased) inside `counted`, after as many uncounted, then exit (see the top of this
    // file).
    if let Ok(only) = std::env::var("LAYER_BENCH_ONLY") {
        let (case, count) = only
            .split_once(':')
            .expect("LAYER_BENCH_ONLY=<case>:<requests>");
        let count: u64 = count.parse().expect("a number of requests");
        let requests = async |count: u64| match case {
            "none" => drop(drive(&plain, count).await),
            "tower_governor" => drop(drive(&governed, count).await),
            "redis_tb" => drop(drive(&limited, count).await),
            "redis_tb_leased" => drop(drive(&leased, count).await),
            "bare_acquire" => {
                for _ in 0..count {
                    let reply = client
                        .acquire(&key, RATE, RATE, 1.0)
                        .await
                        .expect("TB.ACQUIRE");
                    assert!(reply.allowed);
                }
            }
            other => panic!("LAYER_BENCH_ONLY: no case {other:?}"),
        };
        // The first requests of a case set up what later ones reuse (tower_governor's clock, allocator pools).
        runtime.block_on(requests(count));
        counted(&runtime, requests(count));
        return;
    }
    let directory = output_directory();
    let mut criterion = Criterion::default()
        .output_directory(&directory)
        .configure_from_args();
    let mut group = criterion.benchmark_group("layer");
    group.bench_function("none", |b| {
        b.iter_custom(|iters| runtime.block_on(drive(&plain, iters)));
    });
    group.bench_function("tower_governor", |b| {
        b.iter_custom(|iters| runtime.block_on(drive(&governed, iters)));
    });
    group.bench_function("redis_tb", |b| {
        b.iter_custom(|iters| runtime.block_on(drive(&limited, iters)));
    });
    group.bench_function("redis_tb_leased", |b| {
        b.iter_custom(|iters| runtime.block_on(drive(&leased, iters)));
    });
    group.bench_function("bare_acquire", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let reply = client
                        .acquire(&key, RATE, RATE, 1.0)
                        .await
                        .expect("TB.ACQUIRE");
                    assert!(reply.allowed);
                }
                start.elapsed()
            })
        });
    });
    // The own times directly, each request paired with its baseline.
    let request_through = async |router: &Router| {
        drive(router, 1).await;
    };
    let bare = async || {
        let reply = client
            .acquire(&key, RATE, RATE, 1.0)
            .await
            .expect("TB.ACQUIRE");
        assert!(reply.allowed);
    };
    let governor_pairs = Pairs::default();
    let layer_pairs = Pairs::default();
    group.bench_function("tower_governor_paired", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(paired(
                &governor_pairs,
                iters,
                async || request_through(&governed).await,
                async || request_through(&plain).await,
            ))
        });
    });
    group.bench_function("redis_tb_paired", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(paired(
                &layer_pairs,
                iters,
                async || request_through(&limited).await,
                async || {
                    request_through(&plain).await;
                    bare().await;
                },
            ))
        });
    });
    group.finish();
    assert!(
        client.is_available() && client.backend_in_use() == Backend::Module,
        "the client left the module during the bench"
    );

    // Criterion saves estimates only when benchmarking (`cargo bench`), not in `cargo test`'s single runs.
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    let group_directory = directory.join("layer");
    let ids = [
        "none",
        "tower_governor",
        "redis_tb",
        "bare_acquire",
        "redis_tb_leased",
    ];
    let estimates: Option<Vec<f64>> = ids
        .iter()
        .map(|id| estimate_ns(&group_directory, id))
        .collect();
    let Some(estimates) = estimates else {
        eprintln!("no estimates under {}", group_directory.display());
        return;
    };
    for (id, ns) in ids.iter().zip(&estimates) {
        println!("{id:>15} {ns:>8.0} ns per request");
    }
    let apart_governor = estimates[1] - estimates[0];
    let apart_layer = estimates[2] - estimates[0] - estimates[3];
    println!(
        "own time, measured apart: tower_governor {apart_governor:.0} ns, redis-tb layer {apart_layer:.0} ns; \
         ratio {:.2}",
        apart_layer / apart_governor
    );
    let apart_leased = estimates[4] - estimates[0];
    println!(
        "own time of a leased limit (its Redis calls included): {apart_leased:.0} ns; ratio to tower_governor {:.2}",
        apart_leased / apart_governor
    );
    let (governor_own, layer_own) = (governor_pairs.mean_ns(), layer_pairs.mean_ns());
    println!(
        "own time, paired ({} and {} pairs): tower_governor {governor_own:.0} ns, redis-tb layer {layer_own:.0} ns; \
         ratio redis-tb / tower_governor = {:.2}",
        governor_pairs.count.get(),
        layer_pairs.count.get(),
        layer_own / governor_own
    );
}
