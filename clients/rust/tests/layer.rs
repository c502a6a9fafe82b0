//! The tower layer in a real axum server over HTTP, in front of a spawned Redis (or of none): headers on every
//! limited response, 429 with Retry-After and the JSON body, several limits all or nothing, skip, the peer
//! address as the default identity, the three fail modes, the refusal options (status, body, error hook) and
//! shadow mode, and what happens when Redis answers again after a fault (the charge-backs, TB.LOWER).

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use common::Server;
use http::StatusCode;
use redis_tb_client::{
    json_response, Client, FailMode, Identity, Limit, RateLimitLayer, RateLimitLayerBuilder,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn with_module() -> Server {
    Server::start()
}

/// Serves `layer` around a one-route app on a free loopback port, with the peer address for the key.
async fn serve(layer: RateLimitLayerBuilder) -> SocketAddr {
    let layer = layer.build().expect("a layer");
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/health", get(|| async { "ok" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let service = app.into_make_service_with_connect_info::<SocketAddr>();
        let _ = axum::serve(listener, service).await;
    });
    address
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(found, _)| found.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// One HTTP/1.1 GET on its own connection.
async fn get_path(address: SocketAddr, path: &str) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|line| line.split_once(": "))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn client(url: &str) -> Client {
    Client::builder(url)
        .timeout(Duration::from_millis(500))
        .build()
        .expect("a client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_burst_gets_429_with_the_headers_and_body() {
    let server = with_module();
    let limit = Limit::new("api", 0.5, 2.0).expect("a limit");
    let layer = RateLimitLayer::builder(client(&server.url()), [limit]);
    let address = serve(layer).await;

    let first = get_path(address, "/").await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, "hello");
    assert_eq!(first.header("ratelimit-policy"), Some("\"api\";q=2;w=4"));
    assert_eq!(first.header("ratelimit"), Some("\"api\";r=1;t=2"));
    assert_eq!(first.header("ratelimit-limit"), Some("2"));
    assert_eq!(first.header("ratelimit-remaining"), Some("1"));
    assert_eq!(first.header("retry-after"), None);

    assert_eq!(get_path(address, "/").await.status, 200);
    let refused = get_path(address, "/").await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("content-type"), Some("application/json"));
    assert_eq!(refused.header("ratelimit-remaining"), Some("0"));
    // About 2 s until the next token at 0.5/s: Retry-After rounds up.
    assert_eq!(refused.header("retry-after"), Some("2"));
    let body: serde_json::Value = serde_json::from_str(&refused.body).expect("a JSON body");
    assert_eq!(body["error"], "rate limit exceeded");
    assert_eq!(body["limit"], "api");
    let retry = body["retry_after_ms"].as_i64().expect("retry_after_ms");
    assert!((1_000..=2_000).contains(&retry), "{retry}");

    // The peer address is the identity, in the shared key layout.
    let mut conn = server.conn();
    let exists: i64 = redis::cmd("EXISTS")
        .arg("ratelimit:{127.0.0.1}:api")
        .query(&mut conn)
        .expect("EXISTS");
    assert_eq!(exists, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_are_all_or_nothing_and_skip_lets_a_request_through() {
    let server = with_module();
    let per_client = Limit::new("per-client", 0.001, 5.0).expect("a limit");
    let per_tenant = Limit::new("tenant", 0.001, 2.0)
        .expect("a limit")
        .key_fn(|parts| {
            if parts.uri.path() == "/health" {
                Identity::Skip
            } else {
                Identity::Key("acme".to_owned())
            }
        });
    let layer =
        RateLimitLayer::builder(client(&server.url()), [per_client, per_tenant]).key_fn(|parts| {
            if parts.uri.path() == "/health" {
                Identity::Skip
            } else {
                Identity::Key("user-1".to_owned())
            }
        });
    let address = serve(layer).await;

    for _ in 0..3 {
        let health = get_path(address, "/health").await;
        assert_eq!(health.status, 200);
        assert_eq!(health.header("ratelimit"), None);
    }
    let first = get_path(address, "/").await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.header("ratelimit"),
        Some("\"per-client\";r=4;t=1000, \"tenant\";r=1;t=1000")
    );
    assert_eq!(get_path(address, "/").await.status, 200);
    let refused = get_path(address, "/").await;
    assert_eq!(refused.status, 429);
    let body: serde_json::Value = serde_json::from_str(&refused.body).expect("a JSON body");
    assert_eq!(body["limit"], "tenant");

    // The refusal took nothing from the per-client bucket: 3 tokens left after two requests.
    let mut conn = server.conn();
    let reply: Vec<i64> = redis::cmd("TB.ACQUIRE")
        .arg("ratelimit:{user-1}:per-client")
        .arg(0.001)
        .arg(5)
        .arg(0)
        .query(&mut conn)
        .expect("peek");
    assert_eq!(reply[1], 3);
    // Skipped requests took nothing: the tenant's bucket holds the two requests only.
    let tenant: Vec<i64> = redis::cmd("TB.ACQUIRE")
        .arg("ratelimit:{acme}:tenant")
        .arg(0.001)
        .arg(2)
        .arg(0)
        .query(&mut conn)
        .expect("peek");
    assert_eq!(tenant[1], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_each_fail_mode_answers_as_documented() {
    let url = format!("redis://127.0.0.1:{}/", common::free_port());
    let limit = || Limit::new("api", 0.001, 3.0).expect("a limit");

    // local (the default): in-memory buckets of the same limit: 3 requests, then 429.
    let local = serve(RateLimitLayer::builder(client(&url), [limit()])).await;
    let statuses = [
        get_path(local, "/").await.status,
        get_path(local, "/").await.status,
        get_path(local, "/").await.status,
        get_path(local, "/").await.status,
    ];
    assert_eq!(statuses, [200, 200, 200, 429]);

    let open = serve(RateLimitLayer::builder(client(&url), [limit()]).fail(FailMode::Open)).await;
    for _ in 0..5 {
        let reply = get_path(open, "/").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("ratelimit"), None);
    }

    let closed =
        serve(RateLimitLayer::builder(client(&url), [limit()]).fail(FailMode::Closed)).await;
    let refused = get_path(closed, "/").await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.body, "{\"error\":\"rate limiter unavailable\"}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_memory_admitted_during_a_fault_is_charged_back_to_redis() {
    let server = with_module();
    let limit = Limit::new("api", 0.001, 10.0).expect("a limit");
    let layer = RateLimitLayer::builder(client(&server.url()), [limit]);
    let address = serve(layer).await;
    let mut conn = server.conn();
    let maxmemory = |conn: &mut redis::Connection, bytes: &str| {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(bytes)
            .query(conn)
            .expect("CONFIG SET");
    };

    for left in [9, 8] {
        let reply = get_path(address, "/").await;
        assert_eq!(
            reply.header("ratelimit-remaining"),
            Some(left.to_string().as_str())
        );
    }
    // Out of memory: every TB.ACQUIRE is refused with OOM, a fault of each call alone; the in-memory bucket
    // continues from Redis's last answer (8 left).
    maxmemory(&mut conn, "1");
    for left in [7, 6, 5] {
        let reply = get_path(address, "/").await;
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.header("ratelimit-remaining"),
            Some(left.to_string().as_str())
        );
    }
    maxmemory(&mut conn, "0");
    // Redis answers again: the 3 admitted meanwhile are charged back first, then the request takes its token.
    let reply = get_path(address, "/").await;
    assert_eq!(reply.header("ratelimit-remaining"), Some("4"));
    let peek: Vec<i64> = redis::cmd("TB.ACQUIRE")
        .arg("ratelimit:{127.0.0.1}:api")
        .arg(0.001)
        .arg(10)
        .arg(0)
        .query(&mut conn)
        .expect("peek");
    assert_eq!(peek[1], 4);
}

/// What `TB.ACQUIRE` with cost 0 reports of a bucket: its tokens left.
fn remaining(conn: &mut redis::Connection, key: &str, rate: f64, burst: f64) -> i64 {
    let peek: Vec<i64> = redis::cmd("TB.ACQUIRE")
        .arg(key)
        .arg(rate)
        .arg(burst)
        .arg(0)
        .query(conn)
        .expect("peek");
    peek[1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_has_the_status_and_the_body_the_options_give() {
    let server = with_module();
    let limit = || Limit::new("api", 0.001, 1.0).expect("a limit");

    let fixed = serve(
        RateLimitLayer::builder(client(&server.url()), [limit()])
            .status_code(StatusCode::SERVICE_UNAVAILABLE)
            .on_refusal(|refusal| json_response(refusal.status, &json!({"error": "slow down"}))),
    )
    .await;
    assert_eq!(get_path(fixed, "/").await.status, 200);
    let refused = get_path(fixed, "/").await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.body, "{\"error\":\"slow down\"}");
    assert_eq!(refused.header("content-type"), Some("application/json"));
    assert_eq!(refused.header("ratelimit-remaining"), Some("0"));

    // A response made from the refusal; each layer its own prefix, so its own bucket.
    let made = serve(
        RateLimitLayer::builder(client(&server.url()), [limit()])
            .prefix("made:")
            .on_refusal(|refusal| {
                let body = json!({
                    "who": refusal.limit.name(),
                    "limits": refusal.limits.len(),
                    "allowed": refusal.reply.allowed,
                    "waits": refusal.retry_after_ms > 0,
                    "path": refusal.request.uri.path(),
                });
                json_response(refusal.status, &body)
            }),
    )
    .await;
    assert_eq!(get_path(made, "/").await.status, 200);
    let refused = get_path(made, "/").await;
    assert_eq!(refused.status, 429);
    let body: serde_json::Value = serde_json::from_str(&refused.body).expect("JSON");
    assert_eq!(
        body,
        json!({"who": "api", "limits": 1, "allowed": false, "waits": true, "path": "/"})
    );

    // A refusal hook that panics: the default refusal, still a 429.
    let broken = serve(
        RateLimitLayer::builder(client(&server.url()), [limit()])
            .prefix("broken:")
            .on_refusal(|_| panic!("a bug in the refusal hook")),
    )
    .await;
    assert_eq!(get_path(broken, "/").await.status, 200);
    let refused = get_path(broken, "/").await;
    assert_eq!(refused.status, 429);
    let body: serde_json::Value = serde_json::from_str(&refused.body).expect("JSON");
    assert_eq!(body["error"], "rate limit exceeded");
    assert_eq!(body["limit"], "api");
}

#[test]
fn build_refuses_a_status_that_is_no_error_and_every_other_bad_option_at_once() {
    let layer = || {
        RateLimitLayer::builder(
            client("redis://127.0.0.1:1/"),
            [Limit::new("api", 1.0, 1.0).expect("a limit")],
        )
    };
    for status in [200_u16, 302, 600, 99] {
        let err = layer().status_code(status).build().err().expect("refused");
        assert!(err.to_string().contains("status_code"), "{err}");
    }
    assert!(layer().status_code(StatusCode::FORBIDDEN).build().is_ok());
    let err = layer().local_capacity(0).build().err().expect("refused");
    assert!(err.to_string().contains("local_capacity"), "{err}");
    let err = layer().prefix("app{x}:").build().err().expect("refused");
    assert!(err.to_string().contains("prefix"), "{err}");
    let err = layer().ipv6_subnet(65).build().err().expect("refused");
    assert!(err.to_string().contains("ipv6_subnet"), "{err}");
    let err = layer()
        .key(redis_tb_client::TrustedProxies::new(["10.0.0.0/99"]))
        .build()
        .err()
        .expect("refused");
    assert!(err.to_string().contains("trusted proxy"), "{err}");
}

/// A clone of a built layer keeps every option: the clone refuses with the status, the prefix and the local
/// capacity the original was built with, and shares its in-memory buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_of_a_built_layer_keeps_every_option() {
    let url = {
        let server = with_module();
        server.url()
    };
    // Redis is gone: the local fail mode decides, with a capacity of one key (the second key overflows into its
    // limit's bucket, which starts full: one more request there).
    let built = RateLimitLayer::builder(
        client(&url),
        [Limit::new("api", 0.001, 1.0).expect("a limit")],
    )
    .status_code(StatusCode::SERVICE_UNAVAILABLE)
    .local_capacity(1)
    .build()
    .expect("a layer");
    let clone = built.clone();
    let app = |layer: RateLimitLayer| {
        Router::new()
            .route("/", get(|| async { "hello" }))
            .layer(layer)
    };
    use tower::ServiceExt;
    let request = || {
        http::Request::builder()
            .uri("/")
            .extension(SocketAddr::from(([192, 0, 2, 1], 1)))
            .body(axum::body::Body::empty())
            .expect("a request")
    };
    let first = app(built).oneshot(request()).await.expect("a response");
    assert_eq!(first.status(), StatusCode::OK);
    let second = app(clone).oneshot(request()).await.expect("a response");
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_error_hook_sees_every_failed_call_with_its_class_and_request() {
    let server = with_module();
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let record = |seen: &Arc<Mutex<Vec<(String, String)>>>| {
        let seen = Arc::clone(seen);
        move |_: &redis_tb_client::Error,
              parts: &http::request::Parts,
              failure: redis_tb_client::failure::Failure| {
            seen.lock()
                .expect("the list")
                .push((failure.class.to_owned(), parts.uri.path().to_owned()));
        }
    };
    let limit = || Limit::new("api", 0.001, 10.0).expect("a limit");
    let address =
        serve(RateLimitLayer::builder(client(&server.url()), [limit()]).on_error(record(&seen)))
            .await;
    assert_eq!(get_path(address, "/").await.status, 200);
    assert!(seen.lock().expect("the list").is_empty());
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query(&mut server.conn())
        .expect("CONFIG SET");
    // Every failed call, not once per fault; the local fail mode answers.
    assert_eq!(get_path(address, "/").await.status, 200);
    assert_eq!(get_path(address, "/health").await.status, 200);
    assert_eq!(
        *seen.lock().expect("the list"),
        [
            ("oom".to_owned(), "/".to_owned()),
            ("oom".to_owned(), "/health".to_owned())
        ]
    );

    // No server at all: the connection row; a panicking hook changes nothing.
    let url = format!("redis://127.0.0.1:{}/", common::free_port());
    let unreachable: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let address = serve(
        RateLimitLayer::builder(client(&url), [limit()])
            .fail(FailMode::Closed)
            .on_error(record(&unreachable)),
    )
    .await;
    assert_eq!(get_path(address, "/").await.status, 503);
    assert_eq!(
        *unreachable.lock().expect("the list"),
        [("connection".to_owned(), "/".to_owned())]
    );
    let panicking = serve(
        RateLimitLayer::builder(client(&url), [limit()])
            .fail(FailMode::Open)
            .on_error(|_, _, _| panic!("a bug in the hook")),
    )
    .await;
    assert_eq!(get_path(panicking, "/").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_limit_that_refuses_serves_the_request_charged_and_out_of_the_headers() {
    let server = with_module();
    let mut conn = server.conn();
    let api = Limit::new("api", 0.001, 5.0).expect("a limit");
    let strict = Limit::new("strict", 0.001, 1.0)
        .expect("a limit")
        .shadow(true);
    let address = serve(RateLimitLayer::builder(
        client(&server.url()),
        [api, strict],
    ))
    .await;
    for left in ["4", "3", "2"] {
        let reply = get_path(address, "/").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "hello");
        assert_eq!(reply.header("ratelimit-policy"), Some("\"api\";q=5;w=5000"));
        assert_eq!(reply.header("ratelimit-remaining"), Some(left));
    }
    // Charged as if enforced: its one token was taken by the first request, the others did not fit.
    assert_eq!(
        remaining(&mut conn, "ratelimit:{127.0.0.1}:strict", 0.001, 1.0),
        0
    );
    assert_eq!(
        remaining(&mut conn, "ratelimit:{127.0.0.1}:api", 0.001, 5.0),
        2
    );

    // Enforced limits decide first: a request they refuse leaves the shadow limit's bucket alone.
    let tight = Limit::new("tight", 0.001, 1.0).expect("a limit");
    let loose = Limit::new("loose", 0.001, 10.0)
        .expect("a limit")
        .shadow(true);
    let address = serve(RateLimitLayer::builder(
        client(&server.url()),
        [tight, loose],
    ))
    .await;
    assert_eq!(get_path(address, "/").await.status, 200);
    let refused = get_path(address, "/").await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some("\"tight\";q=1;w=1000")
    );
    assert_eq!(
        remaining(&mut conn, "ratelimit:{127.0.0.1}:loose", 0.001, 10.0),
        9
    );

    // Shadow mode on the layer: every limit; nothing refused, no header, buckets charged.
    let whole = Limit::new("whole", 0.001, 1.0).expect("a limit");
    let address = serve(RateLimitLayer::builder(client(&server.url()), [whole]).shadow(true)).await;
    for _ in 0..3 {
        let reply = get_path(address, "/").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("ratelimit"), None);
        assert_eq!(reply.header("ratelimit-policy"), None);
    }
    assert_eq!(
        remaining(&mut conn, "ratelimit:{127.0.0.1}:whole", 0.001, 1.0),
        0
    );
}

#[cfg(feature = "prometheus")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_count_a_known_sequence_exactly() {
    let server = with_module();
    let mut registry = prometheus_client::registry::Registry::default();
    let api = Limit::new("api", 0.001, 2.0).expect("a limit");
    let trial = Limit::new("trial", 0.001, 1.0)
        .expect("a limit")
        .shadow(true);
    let layer = RateLimitLayer::builder(client(&server.url()), [api, trial])
        .key_fn(|parts| match (parts.uri.path(), parts.uri.query()) {
            ("/health", _) => Identity::Skip,
            (_, Some("as=other")) => Identity::Key("someone else".to_owned()),
            _ => Identity::Key("someone".to_owned()),
        })
        .metrics(&mut registry);
    let address = serve(layer).await;

    // Allowed (a call for each plan); served though the shadow limit refuses; refused by api (its one call);
    // skipped (no call): five calls answered by the module.
    let statuses = [
        get_path(address, "/").await.status,
        get_path(address, "/").await.status,
        get_path(address, "/").await.status,
        get_path(address, "/health").await.status,
    ];
    assert_eq!(statuses, [200, 200, 429, 200]);
    // Out of memory: a refusal writes nothing, so the module still answers it (its sixth call). Calls that would
    // write (another identity's first, enforced and shadow) fail (class oom) and the local fail mode admits them
    // from that identity's full in-memory buckets.
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query(&mut server.conn())
        .expect("CONFIG SET");
    assert_eq!(get_path(address, "/").await.status, 429);
    assert_eq!(get_path(address, "/?as=other").await.status, 200);

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("the scrape");
    for line in [
        "redis_tb_requests_total{outcome=\"allowed\"} 2",
        "redis_tb_requests_total{outcome=\"shadow_refused\"} 1",
        "redis_tb_requests_total{outcome=\"refused\"} 2",
        "redis_tb_requests_total{outcome=\"skipped\"} 1",
        "redis_tb_refusals_total{limit=\"trial\"} 1",
        "redis_tb_refusals_total{limit=\"api\"} 2",
        "redis_tb_decisions_total{source=\"module\"} 6",
        "redis_tb_decisions_total{source=\"local\"} 2",
        "redis_tb_decisions_total{source=\"function\"} 0",
        "redis_tb_decisions_total{source=\"closed\"} 0",
        "redis_tb_redis_failures_total{class=\"oom\"} 2",
        "redis_tb_call_duration_seconds_count 8",
        "redis_tb_call_duration_seconds_bucket{le=\"2.5\"} 8",
    ] {
        assert!(text.lines().any(|found| found == line), "{line} in\n{text}");
    }
}

/// Sets `maxmemory` (`1`: every write is refused with OOM under the default noeviction policy; `0`: no limit).
fn maxmemory(conn: &mut redis::Connection, bytes: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(bytes)
        .query(conn)
        .expect("CONFIG SET maxmemory");
}

/// A client that keeps to its limit (rate 2/s, burst 5: the burst, then one request every 500 ms) through a 10 s
/// fault and 5 s after it is never refused: the in-memory buckets continue where Redis left off, and when Redis
/// answers again its bucket (full by then) is brought down to the in-memory one, not charged the fault again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_paced_at_its_limit_meets_no_refusal_through_a_fault_and_after_it() {
    let server = with_module();
    let mut conn = server.conn();
    let limit = Limit::new("api", 2.0, 5.0).expect("a limit");
    let address = serve(RateLimitLayer::builder(client(&server.url()), [limit])).await;
    for _ in 0..5 {
        assert_eq!(get_path(address, "/").await.status, 200);
    }
    // The paced requests start 600 ms after the burst, one every 500 ms: each finds at least 1.2 tokens (a timer
    // never fires early), so lateness alone never makes one refused.
    let start = tokio::time::Instant::now() + Duration::from_millis(600);
    let (fault_from, fault_until, end) = (2, 22, 32);
    let mut refused = Vec::new();
    for tick in 0..end {
        if tick == fault_from {
            maxmemory(&mut conn, "1");
        }
        if tick == fault_until {
            maxmemory(&mut conn, "0");
        }
        tokio::time::sleep_until(start + Duration::from_millis(500) * tick).await;
        let reply = get_path(address, "/").await;
        if reply.status != 200 {
            refused.push((
                tick,
                reply.status,
                reply.header("ratelimit-remaining").map(str::to_owned),
            ));
        }
    }
    assert_eq!(refused, [], "(tick, status, remaining) of the refused; the fault was ticks {fault_from} to {fault_until}");
    // Nor did the fault hand out a fresh burst: Redis, full when it answered again, was brought down to the
    // in-memory bucket, and the paced requests keep it below 2 tokens.
    assert!(remaining(&mut conn, "ratelimit:{127.0.0.1}:api", 2.0, 5.0) <= 1);
}

/// Eight requests at once when Redis answers again each send the in-memory floor (TB.LOWER) before their call:
/// what memory admitted during the fault is charged once, and Redis ends exactly where this process's history
/// puts it. A pause of writes holds the charge-backs of all eight in flight together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_at_recovery_charge_what_memory_admitted_once() {
    let server = with_module();
    let mut conn = server.conn();
    // 0.01 tokens a second: what the test's seconds refill stays below one token.
    let (rate, burst) = (0.01, 100.0);
    let slow_client = Client::builder(&server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a client");
    let limit = Limit::new("api", rate, burst).expect("a limit");
    let address = serve(RateLimitLayer::builder(slow_client, [limit])).await;
    for _ in 0..10 {
        assert_eq!(get_path(address, "/").await.status, 200);
    }
    maxmemory(&mut conn, "1");
    for _ in 0..30 {
        assert_eq!(get_path(address, "/").await.status, 200);
    }
    maxmemory(&mut conn, "0");
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("WRITE")
        .query(&mut conn)
        .expect("CLIENT PAUSE");
    let requests: Vec<_> = (0..8)
        .map(|_| tokio::spawn(async move { get_path(address, "/").await.status }))
        .collect();
    for request in requests {
        assert_eq!(request.await.expect("a request"), 200);
    }
    let key = "ratelimit:{127.0.0.1}:api";
    assert_eq!(remaining(&mut conn, key, rate, burst), 100 - 10 - 30 - 8);
}

/// A buffer the test's log lines are written to.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("the log").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A charge-back that meets a fault (OOM) is owed again and its call decided in memory, never sent after it; one
/// refused by a configuration error (an ACL user without TB.LOWER: NOPERM) is dropped, logged as an error and
/// given to the error hook, and the call goes on to Redis.
#[tokio::test]
async fn a_charge_back_meeting_a_fault_stays_owed_and_one_refused_by_configuration_is_dropped() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // The test's runtime is this thread alone, the layer's tasks included.
    let _logging = tracing::subscriber::set_default(subscriber);
    let server = with_module();
    let mut conn = server.conn();
    let (rate, burst) = (0.001, 10.0);
    let lower_stats = |conn: &mut redis::Connection| {
        common::info_field(conn, "commandstats", "cmdstat_tb.lower").unwrap_or_default()
    };
    let acquires = |conn: &mut redis::Connection| {
        common::info_field(conn, "commandstats", "cmdstat_tb.acquire").unwrap_or_default()
    };
    let remaining_header = |reply: &Reply| reply.header("ratelimit-remaining").map(str::to_owned);

    // OOM: the first failed call owes 1; each next one's TB.LOWER is refused with OOM (owed again) and the call
    // is decided in memory without TB.ACQUIRE being sent.
    let oom = serve(RateLimitLayer::builder(
        client(&server.url()),
        [Limit::new("oom", rate, burst).expect("a limit")],
    ))
    .await;
    for left in ["9", "8"] {
        assert_eq!(
            remaining_header(&get_path(oom, "/").await).as_deref(),
            Some(left)
        );
    }
    maxmemory(&mut conn, "1");
    assert_eq!(
        remaining_header(&get_path(oom, "/").await).as_deref(),
        Some("7")
    );
    let acquires_before = acquires(&mut conn);
    for left in ["6", "5"] {
        let reply = get_path(oom, "/").await;
        assert_eq!(
            (reply.status, remaining_header(&reply).as_deref()),
            (200, Some(left))
        );
    }
    assert_eq!(
        acquires(&mut conn),
        acquires_before,
        "no TB.ACQUIRE after a failed TB.LOWER"
    );
    // Refused by the command itself (it answers a call that writes nothing, so it runs): Redis counts them failed.
    assert!(
        lower_stats(&mut conn).contains("failed_calls=2"),
        "{}",
        lower_stats(&mut conn)
    );
    maxmemory(&mut conn, "0");
    // Redis (8) is brought down to the in-memory 5, all three admissions covered, then takes 1.
    assert_eq!(
        remaining_header(&get_path(oom, "/").await).as_deref(),
        Some("4")
    );
    assert_eq!(
        remaining(&mut conn, "ratelimit:{127.0.0.1}:oom", rate, burst),
        4
    );

    // NOPERM: the same fault, then an application user that may not run TB.LOWER.
    let () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "limited",
                "on",
                ">pw",
                "~*",
                "+@all",
                "-tb.lower",
            ][..],
        )
        .query(&mut conn)
        .expect("ACL SETUSER");
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = Arc::clone(&seen);
    let limited = client(&format!("redis://limited:pw@127.0.0.1:{}/", server.port));
    let noperm = serve(
        RateLimitLayer::builder(
            limited,
            [Limit::new("noperm", rate, burst).expect("a limit")],
        )
        .on_error(move |_, _, failure| {
            record
                .lock()
                .expect("the list")
                .push(failure.class.to_owned())
        }),
    )
    .await;
    for left in ["9", "8"] {
        assert_eq!(
            remaining_header(&get_path(noperm, "/").await).as_deref(),
            Some(left)
        );
    }
    // Redis checks the ACL before memory: during the fault each charge-back is refused (NOPERM, dropped) and
    // the call goes on, to meet OOM and be decided in memory.
    maxmemory(&mut conn, "1");
    for left in ["7", "6", "5"] {
        assert_eq!(
            remaining_header(&get_path(noperm, "/").await).as_deref(),
            Some(left)
        );
    }
    maxmemory(&mut conn, "0");
    // The charge-back is refused and dropped: Redis (8) answers the call itself, and the next call sends none.
    for left in ["7", "6"] {
        assert_eq!(
            remaining_header(&get_path(noperm, "/").await).as_deref(),
            Some(left)
        );
    }
    assert_eq!(
        remaining(&mut conn, "ratelimit:{127.0.0.1}:noperm", rate, burst),
        6
    );
    assert_eq!(
        *seen.lock().expect("the list"),
        ["oom", "noperm", "oom", "noperm", "oom", "noperm"]
    );
    let text = String::from_utf8(log.0.lock().expect("the log").clone()).expect("text");
    let refusals: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("refused a charge-back (TB.LOWER)"))
        .collect();
    assert_eq!(refusals.len(), 1, "{text}");
    assert!(
        refusals[0].contains("ERROR") && refusals[0].contains("NOPERM"),
        "{text}"
    );
}

/// A request dropped while its charge-back is out (a client that went away, a timeout around the layer) leaves what
/// the charge-back covered owed: the next request sends it again, and what Redis answers afterwards is taken as it
/// is. Left in flight, the share would be subtracted from every answer and sent down again with every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_during_its_charge_back_leaves_it_owed() {
    use tower::ServiceExt;
    let server = with_module();
    let mut conn = server.conn();
    let (rate, burst) = (0.001, 10.0);
    let slow_client = Client::builder(&server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a client");
    let layer = RateLimitLayer::builder(
        slow_client,
        [Limit::new("api", rate, burst).expect("a limit")],
    )
    .key_fn(|_| Identity::Key("someone".to_owned()))
    .build()
    .expect("a layer");
    let service = tower_layer::Layer::layer(
        &layer,
        tower::service_fn(|_: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }),
    );
    let request = || {
        http::Request::builder()
            .uri("/")
            .body(axum::body::Body::empty())
            .expect("a request")
    };
    let left = |response: &http::Response<redis_tb_client::RateLimitBody<axum::body::Body>>| {
        response
            .headers()
            .get("ratelimit-remaining")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    for expected in ["9", "8"] {
        let response = service
            .clone()
            .oneshot(request())
            .await
            .expect("a response");
        assert_eq!(left(&response).as_deref(), Some(expected));
    }
    maxmemory(&mut conn, "1");
    for expected in ["7", "6", "5"] {
        let response = service
            .clone()
            .oneshot(request())
            .await
            .expect("a response");
        assert_eq!(left(&response).as_deref(), Some(expected));
    }
    maxmemory(&mut conn, "0");
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(500)
        .arg("WRITE")
        .query(&mut conn)
        .expect("CLIENT PAUSE");
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        service.clone().oneshot(request()),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the request ended while writes were paused"
    );
    // A write waits for the pause to end; the dropped request's TB.LOWER (a minimum) runs then too.
    remaining(&mut conn, "ratelimit:{someone}:api", rate, burst);
    for expected in ["4", "3", "2"] {
        let response = service
            .clone()
            .oneshot(request())
            .await
            .expect("a response");
        assert_eq!(left(&response).as_deref(), Some(expected));
    }
    assert_eq!(
        remaining(&mut conn, "ratelimit:{someone}:api", rate, burst),
        2
    );
}
