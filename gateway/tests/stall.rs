//! tb-rls against a Redis that stalls: paused for writes (`CLIENT PAUSE ... WRITE`, what `FAILOVER` does), busy
//! running a long script, stopped (SIGSTOP) and restarted. Under load, a stall must not become a reconnect storm
//! (a few connections a second at most, connect lines rate-limited), calls that timed out must not be charged
//! when Redis resumes (none under a pause; under SIGSTOP at most those in flight at the first timeout), BUSY is
//! UNAVAILABLE rather than INTERNAL, and large or numerous requests cannot hold much memory. Each stall lasts a
//! second or two, not the 30 s of a real failover.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    fresh_dir, hammer, metric, request, should_rate_limit, tokens, wait_for_recovery, wait_until,
    Redis, Service,
};

const CONFIG: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1, burst: 50 }
";

fn service(redis: &Redis, extra: &[&str]) -> Service {
    let dir = fresh_dir();
    let path = dir.join("ratelimit.yaml");
    std::fs::write(&path, CONFIG).expect("write the config");
    Service::start(&path, &redis.url(), extra, &dir)
}

fn redis_command(redis: &Redis, args: &[&str]) -> redis::Value {
    let mut command = redis::cmd(args.first().copied().unwrap_or("PING"));
    for arg in args.iter().skip(1) {
        command.arg(*arg);
    }
    command.query(&mut redis.conn()).expect("a redis command")
}

fn lines(service: &Service, text: &str) -> usize {
    service.proc.log_text().matches(text).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_pause_is_no_reconnect_storm_and_nothing_is_charged_late() {
    let redis = Redis::start(&[]);
    let service = service(&redis, &["--redis-timeout", "100ms"]);
    assert_eq!(tokens(&service, "api", "ann").await, 50);
    let connects_before = metric(&service, "tb_rls_redis_connects_total");
    let logged_before = lines(&service, "connected to redis");

    // The health service, sampled through the pause: it may turn NOT_SERVING once, and must not flap.
    let channel =
        tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{}", service.grpc_port))
            .expect("a URI")
            .connect()
            .await
            .expect("connect to the health service");
    let health = tokio::spawn(async move {
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let mut statuses: Vec<i32> = Vec::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(2_000) {
            let status = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .expect("a health answer")
                .into_inner()
                .status;
            if statuses.last() != Some(&status) {
                statuses.push(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        statuses
    });

    redis_command(&redis, &["CLIENT", "PAUSE", "2500", "WRITE"]);
    let started = Instant::now();
    let (answered, unavailable) =
        hammer(&service, "api", "ann", 8, Duration::from_millis(2_000)).await;
    let stalled = started.elapsed();
    let statuses = health.await.expect("the health task");
    assert!(statuses.len() <= 2, "the health flapped: {statuses:?}");
    assert_eq!(
        answered, unavailable,
        "every call in the pause is unavailable"
    );
    assert!(answered >= 20, "only {answered} calls in the pause");
    let connects = metric(&service, "tb_rls_redis_connects_total") - connects_before;
    // Backoff 50, 100, 200, 400, 800, 1000 ms after each lost connection: about 6 in 2 s. The old service opened
    // one per timed-out call.
    assert!(
        connects <= 10,
        "{connects} connections in {stalled:?} for {answered} calls:\n{}",
        service.proc.log_text()
    );
    let logged = lines(&service, "connected to redis") - logged_before;
    assert!(logged <= 4, "{logged} connect lines in {stalled:?}");

    redis_command(&redis, &["CLIENT", "UNPAUSE"]);
    wait_for_recovery(&service, "api").await;
    // The paused calls were discarded with their connections: none of them reached the bucket.
    assert_eq!(
        tokens(&service, "api", "ann").await,
        50,
        "calls answered UNAVAILABLE were charged when the pause ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_charges_at_most_the_calls_in_flight_at_the_first_timeout() {
    let redis = Redis::start(&[]);
    let service = service(&redis, &["--redis-timeout", "100ms"]);
    assert_eq!(tokens(&service, "api", "bo").await, 50);
    let pid = redis.proc.as_ref().expect("running").pid().to_string();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &pid])
            .status()
            .expect("run kill");
        assert!(status.success());
    };

    signal("-STOP");
    // Three calls at once: written to the connection before the first times out.
    let mut client = service.client().await;
    let concurrent: Vec<_> = (0..3)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                should_rate_limit(&mut client, request("api", &[(&[("user", "bo")], None)])).await
            })
        })
        .collect();
    for call in concurrent {
        let status = call
            .await
            .expect("a task")
            .expect_err("no reply from a stopped server");
        assert_eq!(status.code(), tonic::Code::Unavailable);
    }
    // Then a second of calls: none of them may reach the stopped server's socket.
    let mut later = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        let status = should_rate_limit(&mut client, request("api", &[(&[("user", "bo")], None)]))
            .await
            .expect_err("no reply from a stopped server");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        later += 1;
    }
    signal("-CONT");
    wait_for_recovery(&service, "api").await;
    let left = tokens(&service, "api", "bo").await;
    assert!(
        left >= 47,
        "{} tokens charged after SIGCONT, for 3 calls in flight and {later} later ones",
        50 - left
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_server_is_unavailable_not_an_error() {
    let redis = Redis::start(&["--busy-reply-threshold", "50"]);
    let service = service(&redis, &["--redis-timeout", "1s"]);
    assert_eq!(tokens(&service, "api", "cy").await, 50);
    // A script that spins for 1.5 s: after 50 ms every other client is answered BUSY.
    let url = redis.url();
    let script = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url)
            .expect("a client")
            .get_connection()
            .expect("a connection");
        redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME') local start = t[1] * 1000000 + t[2] \
                 while true do local now = redis.call('TIME') \
                 if now[1] * 1000000 + now[2] - start > 1500000 then break end end return 1",
            )
            .arg(0)
            .query::<i64>(&mut conn)
            .expect("the script ran")
    });
    let busy = wait_until(Duration::from_secs(5), || {
        redis::cmd("PING")
            .query::<String>(&mut redis.conn())
            .is_err_and(|err| err.code() == Some("BUSY"))
    });
    assert!(busy, "the script never made the server busy");
    let mut client = service.client().await;
    let status = should_rate_limit(&mut client, request("api", &[(&[("user", "cy")], None)]))
        .await
        .expect_err("a busy server decides nothing");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("BUSY"), "{status:?}");
    script.join().expect("the script thread");
    wait_for_recovery(&service, "api").await;
    assert_eq!(
        metric(&service, "tb_rls_redis_errors_total{kind=\"reply\"}"),
        0
    );
    assert!(metric(&service, "tb_rls_redis_errors_total{kind=\"unavailable\"}") >= 1);
    assert_eq!(tokens(&service, "api", "cy").await, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_and_their_size_are_capped() {
    let redis = Redis::start(&[]);
    let service = service(
        &redis,
        &[
            "--redis-timeout",
            "1s",
            "--max-in-flight",
            "4",
            "--max-request-bytes",
            "65536",
        ],
    );

    // A request over the size limit is refused before it is read.
    let mut client = service.client().await;
    let large = "x".repeat(100_000);
    let status = should_rate_limit(&mut client, request("api", &[(&[("user", &large)], None)]))
        .await
        .expect_err("too large");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");

    // 32 requests of 4 MB at once hold next to nothing.
    let rss_kb = || {
        std::fs::read_to_string(format!("/proc/{}/status", service.proc.pid()))
            .unwrap_or_default()
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| {
                value
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    let before = rss_kb();
    let huge = Arc::new("y".repeat(4 << 20));
    let calls: Vec<_> = (0..32)
        .map(|_| {
            let mut client = client.clone();
            let huge = Arc::clone(&huge);
            tokio::spawn(async move {
                should_rate_limit(
                    &mut client,
                    request("api", &[(&[("user", huge.as_str())], None)]),
                )
                .await
                .map(|_| ())
            })
        })
        .collect();
    for call in calls {
        let outcome = call.await.expect("a task");
        assert!(outcome.is_err(), "a 4 MB request was decided");
    }
    let grown_mb = rss_kb().saturating_sub(before) / 1024;
    assert!(
        grown_mb < 40,
        "32 requests of 4 MB grew the service by {grown_mb} MB"
    );

    // With writes paused, 4 requests wait for their timeout; the others are refused at once.
    redis_command(&redis, &["CLIENT", "PAUSE", "1500", "WRITE"]);
    let started = Instant::now();
    let calls: Vec<_> = (0..12)
        .map(|index| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let user = format!("u{index}");
                let outcome =
                    should_rate_limit(&mut client, request("api", &[(&[("user", &user)], None)]))
                        .await;
                (
                    outcome.err().map(|status| status.message().to_owned()),
                    started.elapsed(),
                )
            })
        })
        .collect();
    let mut refused_at_once = 0;
    for call in calls {
        let (error, elapsed) = call.await.expect("a task");
        let error = error.expect("nothing is decided while writes are paused");
        if error.contains("too many requests in flight") {
            assert!(
                elapsed < Duration::from_millis(900),
                "refused after {elapsed:?}"
            );
            refused_at_once += 1;
        }
    }
    assert!(
        refused_at_once >= 8,
        "{refused_at_once} of 12 refused at once"
    );
    assert!(
        metric(
            &service,
            "tb_rls_requests_refused_total{reason=\"in_flight\"}"
        ) >= 8
    );
    redis_command(&redis, &["CLIENT", "UNPAUSE"]);
}
