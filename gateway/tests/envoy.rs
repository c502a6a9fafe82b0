//! End to end: wrk → Envoy (its HTTP rate limit filter) → tb-rls → redis-server with the module, for 20 s, with
//! the per-user, global and export descriptors of `tests/envoy/`. What the upstream served stays within
//! `burst + rate × t` for every descriptor, every 429 carries the headers, and Redis killed mid-run makes tb-rls
//! answer UNAVAILABLE at once (Envoy: 503, failure_mode_deny) and recover by itself once Redis is back.

mod common;

use std::time::{Duration, Instant};

use common::{
    assert_within_buckets, fixture, fresh_dir, request, should_rate_limit, Edge, Redis, Service,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_under_load_stays_within_every_bucket_and_survives_redis_restarting() {
    let dir = fresh_dir();
    // AOF with fsync on every write: the buckets survive the restart, so the bound holds over the whole run.
    let mut redis = Redis::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let service = Service::start(
        &fixture("envoy/ratelimit.yaml"),
        &redis.url(),
        &["--response-headers", "draft", "--redis-timeout", "100ms"],
        &dir,
    );
    let edge = Edge::start(service.grpc_port, &dir);

    // Envoy's first request opens its gRPC connection to tb-rls, and tb-rls's first call its Redis one: on a busy
    // machine that can outlast the 100 ms Redis deadline once (a 503, Envoy's failure mode), so the probe is
    // repeated until the path is up; the bounds below are asserted over the load that follows.
    let mut first = edge.get("/", "probe");
    if first.status != 200 {
        let up = common::wait_until(Duration::from_secs(10), || {
            first = edge.get("/", "probe");
            first.status == 200
        });
        assert!(up, "{first:?}\n{}", edge.envoy.log_text());
    }
    assert!(first.headers.contains_key("x-ratelimit-limit"), "{first:?}");

    let started = Instant::now();
    let listener_port = edge.listener_port;
    let wrk = std::thread::spawn(move || common::load(listener_port, 20, 8));

    // Mid-run: Redis killed.
    tokio::time::sleep(Duration::from_secs(7)).await;
    redis.stop();
    let mut client = service.client().await;
    let asked = Instant::now();
    let status = should_rate_limit(
        &mut client,
        request("edge", &[(&[("user", "probe")], None)]),
    )
    .await
    .expect_err("no Redis, no decision");
    let unavailable_after = asked.elapsed();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        unavailable_after < Duration::from_millis(500),
        "UNAVAILABLE took {unavailable_after:?}"
    );
    let refused = edge.get("/", "probe");
    assert_eq!(refused.status, 503, "failure_mode_deny: {refused:?}");

    // Back after about 3 s; requests succeed again without anyone touching tb-rls.
    tokio::time::sleep(Duration::from_secs(3)).await;
    redis.restart();
    let restarted = Instant::now();
    let mut recovered = None;
    while restarted.elapsed() < Duration::from_secs(10) {
        if edge.get("/", "probe").status != 503 {
            recovered = Some(restarted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered = recovered.expect("no recovery within 10 s of Redis restarting");

    let load = wrk.join().expect("wrk thread");
    let seconds = started.elapsed().as_secs_f64();
    let served = edge.served();
    println!(
        "{seconds:.1} s: wrk statuses {:?}, served {served:?}; UNAVAILABLE after {unavailable_after:?}, recovered {recovered:?} after the restart",
        load.statuses
    );
    let count = |status: u16| load.statuses.get(&status).copied().unwrap_or(0);
    assert!(
        count(200) > 0 && count(429) > 0 && count(503) > 0,
        "{}",
        load.output
    );
    assert_eq!(
        load.bare_429, 0,
        "429s without the rate-limit headers:\n{}",
        load.output
    );
    assert_within_buckets(&served, seconds);
    // The limiter let through a fair share: at least half of what the global bucket allows outside the outage.
    let outage_s = 3.0 + recovered.as_secs_f64();
    let floor = 0.5 * common::GLOBAL_LIMIT.1 * (seconds - outage_s - 1.0);
    assert!(
        served.total as f64 >= floor,
        "only {} served (floor {floor:.0})",
        served.total
    );
}
