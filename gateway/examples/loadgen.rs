//! A gRPC load generator for tb-rls (what `make bench` runs; ghz is not on the package registries): sends
//! `ShouldRateLimit` as fast as it can with a fixed number of requests in flight (closed loop), or at a fixed
//! rate (open loop, `--rate`), and prints one JSON line: decisions per second, latency percentiles, how many were
//! over the limit and how many failed.
//!
//! ```text
//! cargo run --release -p tb-rls --example loadgen -- --target 127.0.0.1:8081 --domain bench \
//!     --seconds 10 --concurrency 64 [--rate 10000] [--users 1000] [--connections 4]
//! ```
//!
//! Each request carries two descriptors: `user=<one of --users>` and `generic_key=global`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

struct Args {
    target: String,
    domain: String,
    seconds: f64,
    concurrency: usize,
    rate: Option<f64>,
    users: u64,
    connections: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        target: "127.0.0.1:8081".to_owned(),
        domain: "bench".to_owned(),
        seconds: 10.0,
        concurrency: 64,
        rate: None,
        users: 1000,
        connections: 4,
    };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let value = words
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<f64>()
                .map_err(|_| format!("{flag}: not a number: {value}"))
        };
        match flag.as_str() {
            "--target" => args.target = value.clone(),
            "--domain" => args.domain = value.clone(),
            "--seconds" => args.seconds = number()?,
            "--concurrency" => args.concurrency = number()? as usize,
            "--rate" => args.rate = Some(number()?),
            "--users" => args.users = number()? as u64,
            "--connections" => args.connections = number()? as usize,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(args)
}

fn request(domain: &str, user: u64) -> RateLimitRequest {
    let descriptor = |key: &str, value: String| RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value,
        }],
        ..RateLimitDescriptor::default()
    };
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![
            descriptor("user", format!("u{user}")),
            descriptor("generic_key", "global".to_owned()),
        ],
        hits_addend: 0,
    }
}

#[derive(Default)]
struct Tally {
    over_limit: AtomicU64,
    errors: AtomicU64,
}

/// One call; its latency in µs, or `None` if it failed.
async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    user: u64,
    tally: &Tally,
) -> Option<u64> {
    let started = Instant::now();
    match client.should_rate_limit(request(domain, user)).await {
        Ok(response) => {
            if response.into_inner().overall_code == 2 {
                tally.over_limit.fetch_add(1, Ordering::Relaxed);
            }
            Some(started.elapsed().as_micros() as u64)
        }
        Err(_) => {
            tally.errors.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let mut clients = Vec::new();
    for _ in 0..args.connections.max(1) {
        // One HTTP/2 connection each.
        let channel = Channel::from_shared(format!("http://{}", args.target))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        clients.push(RateLimitServiceClient::new(channel));
    }
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let duration = Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    match args.rate {
        None => {
            for worker in 0..args.concurrency {
                let mut client = clients[worker % clients.len()].clone();
                let (tally, stop, domain, users) = (
                    Arc::clone(&tally),
                    Arc::clone(&stop),
                    args.domain.clone(),
                    args.users,
                );
                tasks.push(tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    // A 64-bit LCG (Knuth's MMIX constants), its high bits picking the user: spread over all users.
                    let mut state = worker as u64;
                    while !stop.load(Ordering::Relaxed) {
                        state = state
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let user = (state >> 33) % users.max(1);
                        if let Some(us) = call(&mut client, &domain, user, &tally).await {
                            latencies.push(us);
                        }
                    }
                    latencies
                }));
            }
        }
        Some(rate) => {
            // Open loop: requests start on a fixed schedule, whatever the earlier ones are doing.
            let interval = Duration::from_secs_f64(1.0 / rate);
            let total = (rate * args.seconds) as u64;
            let per_task = args.concurrency.max(1) as u64;
            for worker in 0..per_task {
                let client = clients[worker as usize % clients.len()].clone();
                let (tally, domain, users) = (Arc::clone(&tally), args.domain.clone(), args.users);
                tasks.push(tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let mut index = worker;
                    let mut inflight = tokio::task::JoinSet::new();
                    while index < total {
                        let due = started + interval * (index as u32);
                        tokio::time::sleep_until(due.into()).await;
                        let mut client = client.clone();
                        let (tally, domain) = (Arc::clone(&tally), domain.clone());
                        let user = index.wrapping_mul(2654435761) % users.max(1);
                        inflight
                            .spawn(async move { call(&mut client, &domain, user, &tally).await });
                        while let Some(done) = inflight.try_join_next() {
                            if let Ok(Some(us)) = done {
                                latencies.push(us);
                            }
                        }
                        index += per_task;
                    }
                    while let Some(done) = inflight.join_next().await {
                        if let Ok(Some(us)) = done {
                            latencies.push(us);
                        }
                    }
                    latencies
                }));
            }
        }
    }
    if args.rate.is_none() {
        tokio::time::sleep(duration).await;
        stop.store(true, Ordering::Relaxed);
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let percentile = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let index = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies[index] as f64 / 1000.0
    };
    println!(
        "{{\"mode\": \"{}\", \"seconds\": {elapsed:.2}, \"decisions\": {}, \"decisions_per_s\": {:.0}, \"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"max_ms\": {:.3}, \"over_limit\": {}, \"errors\": {}}}",
        if args.rate.is_some() { "open" } else { "closed" },
        latencies.len(),
        latencies.len() as f64 / elapsed,
        percentile(0.50),
        percentile(0.99),
        percentile(1.0),
        tally.over_limit.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
    );
    Ok(())
}
