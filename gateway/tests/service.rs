//! tb-rls over gRPC against a real redis-server with the module: decisions, all or nothing, headers, refusing a
//! bad file at start, reloading a changed one, Redis going away and coming back (with the health service
//! following), JSON logs, and the metrics.

mod common;

use std::time::{Duration, Instant};

use common::{fresh_dir, request, should_rate_limit, wait_until, Redis, Service};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const CONFIG: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 1, burst: 3 }
  - key: plan
    value: free
    rate_limit: { unit: minute, requests_per_unit: 60, name: free }
  - key: internal
    rate_limit: { unlimited: true }
";

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

fn write_config(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("ratelimit.yaml");
    // Write then rename, so the poller never reads half a file.
    let temporary = dir.join("ratelimit.yaml.tmp");
    std::fs::write(&temporary, text).expect("write the config");
    std::fs::rename(&temporary, &path).expect("move the config into place");
    path
}

/// Without the module, tb-rls runs TB.ACQUIREEACH as the Functions library built from lua/tb.lua, loaded on the
/// first call: the same decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_without_the_module_is_served_by_the_lua_library() {
    let redis = Redis::start_without_module();
    let dir = fresh_dir();
    let config = write_config(&dir, CONFIG);
    let service = Service::start(&config, &redis.url(), &[], &dir);
    let mut client = service.client().await;
    let mut codes = Vec::new();
    for _ in 0..4 {
        let response =
            should_rate_limit(&mut client, request("api", &[(&[("user", "ann")], None)]))
                .await
                .expect("a decision");
        codes.push(response.overall_code);
    }
    assert_eq!(codes, vec![OK, OK, OK, OVER]);
    let mut conn = redis.conn();
    let libraries: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query(&mut conn)
        .expect("FUNCTION LIST");
    assert!(
        format!("{libraries:?}").contains("tb_0_5_0"),
        "{libraries:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allows_the_burst_then_refuses_with_statuses() {
    let redis = Redis::start(&[]);
    let dir = fresh_dir();
    let config = write_config(&dir, CONFIG);
    let service = Service::start(&config, &redis.url(), &[], &dir);
    let mut client = service.client().await;
    let mut codes = Vec::new();
    for _ in 0..4 {
        let response =
            should_rate_limit(&mut client, request("api", &[(&[("user", "ann")], None)]))
                .await
                .expect("a decision");
        codes.push(response.overall_code);
        let status = response.statuses.first().expect("one status");
        let limit = status
            .current_limit
            .as_ref()
            .expect("the limit is reported");
        assert_eq!((limit.requests_per_unit, limit.unit), (1, 1));
    }
    assert_eq!(codes, vec![OK, OK, OK, OVER]);

    // A descriptor's hits_addend is its cost; 0 reports without taking and never refuses.
    let costly = should_rate_limit(
        &mut client,
        request("api", &[(&[("user", "bob")], Some(3))]),
    )
    .await
    .expect("a decision");
    assert_eq!(costly.overall_code, OK);
    assert_eq!(
        costly.statuses.first().map(|status| status.limit_remaining),
        Some(0)
    );
    let peek = should_rate_limit(
        &mut client,
        request("api", &[(&[("user", "bob")], Some(0))]),
    )
    .await
    .expect("a decision");
    assert_eq!(peek.overall_code, OK);
    let over_burst = should_rate_limit(
        &mut client,
        request("api", &[(&[("user", "cat")], Some(4))]),
    )
    .await
    .expect("a decision");
    assert_eq!(
        over_burst.overall_code, OVER,
        "a cost above the burst never fits"
    );

    // Unmatched and unlimited descriptors are OK without a bucket.
    let free = should_rate_limit(
        &mut client,
        request(
            "api",
            &[(&[("internal", "x")], None), (&[("nothing", "x")], None)],
        ),
    )
    .await
    .expect("a decision");
    assert_eq!(free.overall_code, OK);
    assert_eq!(
        free.statuses.first().map(|status| status.limit_remaining),
        Some(u32::MAX)
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.conn())
        .expect("KEYS");
    assert!(
        keys.iter().all(|key| key.starts_with("tb-rls:{api}:user=")),
        "{keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_takes_nothing_from_the_other_buckets() {
    let redis = Redis::start(&[]);
    let dir = fresh_dir();
    let config = write_config(&dir, CONFIG);
    let service = Service::start(&config, &redis.url(), &[], &dir);
    let mut client = service.client().await;
    let both: &[common::Descriptor<'_>] =
        &[(&[("plan", "free")], None), (&[("user", "dan")], Some(3))];
    let first = should_rate_limit(&mut client, request("api", both))
        .await
        .expect("a decision");
    assert_eq!(first.overall_code, OK);
    let free_left = first.statuses.first().map(|status| status.limit_remaining);
    assert_eq!(free_left, Some(59));
    let second = should_rate_limit(&mut client, request("api", both))
        .await
        .expect("a decision");
    assert_eq!(second.overall_code, OVER);
    let codes: Vec<i32> = second.statuses.iter().map(|status| status.code).collect();
    assert_eq!(codes, vec![OK, OVER], "the plan fits, the user does not");
    assert_eq!(
        second.statuses.first().map(|status| status.limit_remaining),
        free_left,
        "the refused request took nothing from the plan's bucket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_are_added_when_asked() {
    let redis = Redis::start(&[]);
    let dir = fresh_dir();
    let config = write_config(&dir, CONFIG);
    let service = Service::start(&config, &redis.url(), &["--response-headers", "both"], &dir);
    let mut client = service.client().await;
    let mut last = None;
    for _ in 0..4 {
        last = Some(
            should_rate_limit(
                &mut client,
                request(
                    "api",
                    &[(&[("user", "eve")], None), (&[("plan", "free")], None)],
                ),
            )
            .await
            .expect("a decision"),
        );
    }
    let response = last.expect("four responses");
    assert_eq!(response.overall_code, OVER);
    let headers: std::collections::BTreeMap<&str, &str> = response
        .response_headers_to_add
        .iter()
        .map(|header| (header.key.as_str(), header.value.as_str()))
        .collect();
    assert_eq!(
        headers.get("RateLimit-Policy"),
        Some(&"\"api.user\";q=3;w=3, \"free\";q=60;w=60")
    );
    let state = headers.get("RateLimit").expect("RateLimit");
    assert!(state.starts_with("\"api.user\";r=0;t="), "{state}");
    assert_eq!(headers.get("RateLimit-Limit"), Some(&"3"));
    assert_eq!(headers.get("RateLimit-Remaining"), Some(&"0"));
    assert_eq!(headers.get("Retry-After"), Some(&"1"));
}

#[test]
fn a_bad_file_is_refused_at_start_with_its_line_and_reason() {
    let dir = fresh_dir();
    let config = write_config(
        &dir,
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    );
    let config = config.to_str().expect("a UTF-8 temporary path");
    let (code, log) = exits_at_start("tb-rls-bad", &["--config", config], &dir);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("invalid rate limit unit 'fortnight'"), "{log}");
    assert!(log.contains("line 5"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_is_picked_up_and_a_bad_change_keeps_the_last_good_one() {
    let redis = Redis::start(&[]);
    let dir = fresh_dir();
    let config = write_config(&dir, CONFIG);
    let service = Service::start(&config, &redis.url(), &[], &dir);
    let mut client = service.client().await;
    let burst_of =
        |response: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
            response
                .statuses
                .first()
                .map(|status| status.limit_remaining)
        };
    let before = should_rate_limit(
        &mut client,
        request("api", &[(&[("user", "fay")], Some(0))]),
    )
    .await
    .expect("a decision");
    assert_eq!(burst_of(&before), Some(3));

    write_config(&dir, &CONFIG.replace("burst: 3", "burst: 7"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = None;
    while Instant::now() < deadline {
        let response = should_rate_limit(
            &mut client,
            request("api", &[(&[("user", "gus")], Some(0))]),
        )
        .await
        .expect("a decision");
        seen = burst_of(&response);
        if seen == Some(7) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, Some(7), "the new burst never applied");

    write_config(
        &dir,
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: { unit: sometimes }\n",
    );
    let refused = wait_until(Duration::from_secs(10), || {
        service
            .proc
            .log_text()
            .contains("configuration change refused")
    });
    assert!(refused, "{}", service.proc.log_text());
    assert!(service
        .proc
        .log_text()
        .contains("invalid rate limit unit 'sometimes'"));
    let after = should_rate_limit(
        &mut client,
        request("api", &[(&[("user", "hal")], Some(0))]),
    )
    .await
    .expect("still serving");
    assert_eq!(
        burst_of(&after),
        Some(7),
        "the last good configuration still applies"
    );
    assert!(service
        .metrics()
        .contains("tb_rls_config_reloads_total{result=\"error\"} 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_away_is_unavailable_at_once_and_recovery_is_automatic() {
    let mut redis = Redis::start(&[]);
    let dir = fresh_dir();
    let config = write_config(&dir, CONFIG);
    let service = Service::start(&config, &redis.url(), &["--redis-timeout", "100ms"], &dir);
    let mut client = service.client().await;
    let ask = || request("api", &[(&[("user", "ida")], None)]);
    let first = should_rate_limit(&mut client, ask())
        .await
        .expect("a decision");
    assert_eq!(first.overall_code, OK);

    let channel =
        tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{}", service.grpc_port))
            .expect("a URI")
            .connect()
            .await
            .expect("connect to the health service");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status =
        |health: &mut tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>| {
            let mut health = health.clone();
            async move {
                health
                    .check(tonic_health::pb::HealthCheckRequest {
                        service: "envoy.service.ratelimit.v3.RateLimitService".to_owned(),
                    })
                    .await
                    .expect("a health answer")
                    .into_inner()
                    .status
            }
        };
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    assert_eq!(status(&mut health).await, serving, "connected, so SERVING");

    redis.stop();
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        let status = should_rate_limit(&mut client, ask())
            .await
            .expect_err("no Redis, no decision");
        slowest = slowest.max(started.elapsed());
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    assert!(
        slowest < Duration::from_millis(500),
        "UNAVAILABLE took {slowest:?}"
    );

    let mut not_serving = false;
    for _ in 0..100 {
        if status(&mut health).await != serving {
            not_serving = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        not_serving,
        "the health service still says SERVING without Redis"
    );

    redis.restart();
    let started = Instant::now();
    let mut recovered = false;
    while started.elapsed() < Duration::from_secs(10) {
        if should_rate_limit(&mut client, ask()).await.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        recovered,
        "no recovery after Redis came back:\n{}",
        service.proc.log_text()
    );
    // Five refusals above, and any while the connection came back.
    let metrics = service.metrics();
    let count = |prefix: &str| -> u64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(prefix))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(0)
    };
    let unavailable = count("tb_rls_decisions_total{domain=\"api\",code=\"unavailable\"}");
    assert!(unavailable >= 5, "{metrics}");
    assert_eq!(
        count("tb_rls_redis_errors_total{kind=\"unavailable\"}"),
        unavailable,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_decisions_by_domain_and_code() {
    let redis = Redis::start(&[]);
    let dir = fresh_dir();
    let config = write_config(&dir, CONFIG);
    let service = Service::start(&config, &redis.url(), &[], &dir);
    let mut client = service.client().await;
    for _ in 0..5 {
        let _ = should_rate_limit(&mut client, request("api", &[(&[("user", "jo")], None)])).await;
    }
    let _ = should_rate_limit(&mut client, request("nope", &[(&[("user", "jo")], None)])).await;
    let _ = should_rate_limit(&mut client, request("", &[(&[("user", "jo")], None)])).await;
    let metrics = service.metrics();
    for line in [
        "tb_rls_decisions_total{domain=\"api\",code=\"ok\"} 3",
        "tb_rls_decisions_total{domain=\"api\",code=\"over_limit\"} 2",
        "tb_rls_decisions_total{domain=\"other\",code=\"ok\"} 1",
        "tb_rls_decisions_total{domain=\"other\",code=\"invalid\"} 1",
        "\ntb_rls_redis_connected 1\n",
        "tb_rls_request_duration_seconds_count 7",
    ] {
        assert!(metrics.contains(line), "missing {line}:\n{metrics}");
    }
}

#[test]
fn json_logs_are_one_object_per_line() {
    let redis = Redis::start(&[]);
    let dir = fresh_dir();
    let config = write_config(&dir, CONFIG);
    let service = Service::start(&config, &redis.url(), &["--log-format", "json"], &dir);
    let log = service.proc.log_text();
    let first = log.lines().next().expect("a log line");
    assert!(first.starts_with('{') && first.ends_with('}'), "{first}");
    assert!(first.contains("\"level\":\"INFO\""), "{first}");
    assert!(first.contains("configuration loaded"), "{first}");
}

/// Starts tb-rls with `args` and no Redis, and waits for it to exit: its exit code and log.
fn exits_at_start(name: &str, args: &[&str], dir: &std::path::Path) -> (Option<i32>, String) {
    let mut command = std::process::Command::new(common::tb_rls());
    command
        .env_clear()
        .args([
            "--grpc-port",
            &common::free_port().to_string(),
            "--prometheus-addr",
            "off",
        ])
        .args(args);
    let mut proc = common::Proc::spawn(name, &mut command, dir);
    let code = proc.wait_exit(Duration::from_secs(20));
    (code, proc.log_text())
}

#[test]
fn an_empty_configuration_is_refused_at_start_unless_allowed() {
    let dir = fresh_dir();
    let empty = dir.join("config");
    std::fs::create_dir_all(&empty).expect("an empty directory");
    let config = empty.to_str().expect("a UTF-8 path");
    let (code, log) = exits_at_start("tb-rls-empty", &["--config", config], &dir);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("no domain configured"), "{log}");

    let redis = Redis::start(&[]);
    let service = Service::start(&empty, &redis.url(), &["--allow-empty-config"], &dir);
    assert!(service
        .proc
        .log_text()
        .contains("configuration loaded domains=[]"));
}

#[test]
fn a_malformed_redis_url_is_refused_without_printing_its_password() {
    let dir = fresh_dir();
    let config = write_config(&dir, CONFIG);
    let config = config.to_str().expect("a UTF-8 path");
    for (redis_type, url) in [
        ("single", "redis://ann:s3cret-pw@127.0.0.1:notaport"),
        ("cluster", "redis://ann:s3cret-pw@127.0.0.1:notaport"),
        ("single", "redis//ann:s3cret-pw@127.0.0.1:6379"),
    ] {
        let (code, log) = exits_at_start(
            "tb-rls-url",
            &[
                "--config",
                config,
                "--redis-type",
                redis_type,
                "--redis-url",
                url,
            ],
            &dir,
        );
        assert_eq!(code, Some(2), "{url}: {log}");
        assert!(log.contains("REDIS_URL "), "{url}: {log}");
        assert!(!log.contains("s3cret"), "{url}: {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_vanishing_keep_the_last_good_configuration() {
    let redis = Redis::start(&[]);
    let dir = fresh_dir();
    let conf = dir.join("conf");
    std::fs::create_dir_all(&conf).expect("a config directory");
    std::fs::write(conf.join("api.yaml"), CONFIG).expect("write api.yaml");
    std::fs::write(
        conf.join("web.yaml"),
        "domain: web\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
    )
    .expect("write web.yaml");
    let service = Service::start(&conf, &redis.url(), &[], &dir);
    let mut client = service.client().await;
    let web = || request("web", &[(&[("user", "kim")], None)]);
    let first = should_rate_limit(&mut client, web())
        .await
        .expect("a decision");
    assert_eq!(first.overall_code, OK);

    // Each removal is refused, and the web domain still limits.
    for (file, refusal) in [
        ("web.yaml", "web.yaml vanished"),
        ("api.yaml", "no domain configured"),
    ] {
        std::fs::remove_file(conf.join(file)).expect("remove a file");
        let refused = wait_until(Duration::from_secs(10), || {
            service.proc.log_text().contains(refusal)
        });
        assert!(refused, "{}", service.proc.log_text());
        let response = should_rate_limit(&mut client, web())
            .await
            .expect("a decision");
        assert_eq!(response.overall_code, OVER, "after removing {file}");
    }
    assert!(service
        .metrics()
        .contains("tb_rls_config_reloads_total{result=\"ok\"} 0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_domain_config_merges_files_naming_one_domain() {
    let redis = Redis::start(&[]);
    let dir = fresh_dir();
    let conf = dir.join("conf");
    std::fs::create_dir_all(&conf).expect("a config directory");
    for (file, key) in [("a.yaml", "user"), ("b.yaml", "team")] {
        std::fs::write(
            conf.join(file),
            format!("domain: api\ndescriptors:\n  - key: {key}\n    rate_limit: {{ unit: hour, requests_per_unit: 1 }}\n"),
        )
        .expect("write a file");
    }
    let (code, log) = exits_at_start(
        "tb-rls-unmerged",
        &["--config", conf.to_str().expect("a UTF-8 path")],
        &dir,
    );
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("duplicate domain 'api'"), "{log}");

    let service = Service::start(&conf, &redis.url(), &["--merge-domain-config"], &dir);
    let mut client = service.client().await;
    for key in ["user", "team"] {
        let mut codes = Vec::new();
        for _ in 0..2 {
            let response = should_rate_limit(&mut client, request("api", &[(&[(key, "x")], None)]))
                .await
                .expect("a decision");
            codes.push(response.overall_code);
        }
        assert_eq!(codes, vec![OK, OVER], "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_descriptors_refuse_only_together() {
    let redis = Redis::start(&[]);
    let dir = fresh_dir();
    let config = write_config(
        &dir,
        "domain: api\ndescriptors:\n  - key: q1\n    quota_mode: true\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n  - key: q2\n    quota_mode: true\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
    );
    let service = Service::start(&config, &redis.url(), &[], &dir);
    let mut client = service.client().await;
    let ask =
        |second: &'static str| request("api", &[(&[("q1", "a")], None), (&[("q2", second)], None)]);
    let codes = |response: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        let statuses: Vec<i32> = response.statuses.iter().map(|status| status.code).collect();
        (response.overall_code, statuses)
    };
    let first = should_rate_limit(&mut client, ask("a"))
        .await
        .expect("a decision");
    assert_eq!(codes(&first), (OK, vec![OK, OK]));
    // Both over: refused.
    let second = should_rate_limit(&mut client, ask("a"))
        .await
        .expect("a decision");
    assert_eq!(codes(&second), (OVER, vec![OVER, OVER]));
    // One over, one not: let through, and only the one under its limit is charged.
    let third = should_rate_limit(&mut client, ask("b"))
        .await
        .expect("a decision");
    assert_eq!(codes(&third), (OK, vec![OVER, OK]));
    let fourth = should_rate_limit(&mut client, ask("b"))
        .await
        .expect("a decision");
    assert_eq!(codes(&fourth), (OVER, vec![OVER, OVER]), "q2=b was charged");
}
