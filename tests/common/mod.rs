//! Shared harness for the integration tests: spawn a private `redis-server` on a free loopback port, talk to
//! it, and stop it by PID when the guard drops.
//!
//! The server binary is `$REDIS_SERVER` (default `redis-server` on the PATH), the module is `$TB_MODULE`
//! (default `target/release/libredis_tb.so`, which `make test` builds first). Tests never touch port 6379 or a
//! server they did not start, and each server gets its own scratch directory.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// How long a server may take to answer its first PING.
const STARTUP_DEADLINE: Duration = Duration::from_secs(20);
/// How many times we pick a new port when a server dies at startup (someone else took the port).
const STARTUP_ATTEMPTS: u32 = 5;

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

pub fn module_path() -> PathBuf {
    match std::env::var_os("TB_MODULE") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_tb.so"),
    }
}

pub fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// A running server owned by one test. Dropping it kills the process, waits for it and removes its directory.
pub struct Server {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
    args: Vec<String>,
    with_module: bool,
}

/// What to start.
#[derive(Clone, Default)]
pub struct Options {
    /// Load the module (most tests); `false` for a plain server such as a module-less replica.
    pub without_module: bool,
    /// Extra `--name value` arguments, e.g. `["--appendonly", "yes"]`.
    pub args: Vec<String>,
    /// Reuse this directory (restart over existing AOF/RDB files) instead of a fresh one.
    pub dir: Option<PathBuf>,
}

impl Server {
    /// A fresh server with the module loaded, no persistence.
    pub fn start() -> Server {
        Server::start_with(Options::default())
    }

    pub fn start_with(options: Options) -> Server {
        let dir = options.dir.clone().unwrap_or_else(fresh_dir);
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        let mut last_log = String::new();
        for _ in 0..STARTUP_ATTEMPTS {
            let port = free_port();
            let mut child = spawn(port, &dir, &options);
            match wait_ready(port, &mut child) {
                Ok(()) => {
                    return Server {
                        child,
                        port,
                        dir,
                        args: options.args.clone(),
                        with_module: !options.without_module,
                    };
                }
                Err(()) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_log = std::fs::read_to_string(log_path(&dir, port)).unwrap_or_default();
                }
            }
        }
        panic!(
            "redis-server did not start after {STARTUP_ATTEMPTS} attempts; last log:\n{last_log}"
        );
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

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(log_path(&self.dir, self.port)).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the server with SIGKILL and waits for it, keeping its directory.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit by itself (after `SHUTDOWN`), up to `deadline`.
    pub fn wait_exit(&mut self, deadline: Duration) -> bool {
        wait_until(deadline, || !self.is_alive())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A scratch directory unique to this process and call.
pub fn fresh_dir() -> PathBuf {
    let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("redis-tb-test-{}-{n}", std::process::id()))
}

fn log_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("server-{port}.log"))
}

/// A port the OS just gave us, released for the server to take.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

fn spawn(port: u16, dir: &Path, options: &Options) -> Child {
    let mut command = Command::new(server_binary());
    command
        .arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(log_path(dir, port))
        .args(["--daemonize", "no"]);
    if !options.without_module {
        command.arg("--loadmodule").arg(module_path());
    }
    command.args(&options.args);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", server_binary()))
}

fn wait_ready(port: u16, child: &mut Child) -> Result<(), ()> {
    let start = Instant::now();
    while start.elapsed() < STARTUP_DEADLINE {
        if !matches!(child.try_wait(), Ok(None)) {
            return Err(());
        }
        if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) {
            if let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) {
                // A server still loading its AOF/RDB answers LOADING; wait for a real PONG.
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return Ok(());
                }
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
    Err(())
}

/// Polls `condition` every few milliseconds until it holds or `deadline` passes; returns whether it held.
pub fn wait_until(deadline: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if start.elapsed() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// `TB.ACQUIRE key rate burst [cost]`, expecting the 4-integer reply.
pub fn acquire(
    conn: &mut redis::Connection,
    key: &str,
    rate: &str,
    burst: &str,
    cost: Option<&str>,
) -> [i64; 4] {
    let mut command = redis::cmd("TB.ACQUIRE");
    command.arg(key).arg(rate).arg(burst);
    if let Some(cost) = cost {
        command.arg(cost);
    }
    let reply: Vec<i64> = command.query(conn).expect("TB.ACQUIRE reply");
    reply.try_into().expect("four integers")
}

/// Runs `TB.ACQUIRE` with raw arguments and returns the error text it must fail with.
pub fn acquire_error(conn: &mut redis::Connection, args: &[&str]) -> String {
    let result: redis::RedisResult<redis::Value> = redis::cmd("TB.ACQUIRE").arg(args).query(conn);
    match result {
        Err(e) => error_text(&e),
        Ok(value) => panic!("TB.ACQUIRE {args:?} succeeded with {value:?}"),
    }
}

/// The wire text of a server error, as `CODE message`.
pub fn error_text(error: &redis::RedisError) -> String {
    match (error.code(), error.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => error.to_string(),
    }
}

/// `HGETALL key` as sorted pairs.
pub fn hgetall(conn: &mut redis::Connection, key: &str) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> =
        redis::cmd("HGETALL").arg(key).query(conn).expect("HGETALL");
    pairs.sort();
    pairs
}

/// A key's absolute expiry in Unix milliseconds (-1: none, -2: no key).
///
/// Exact where the server has `PEXPIRETIME` (7.0+, Valkey). Redis 6.2 has no way to read an absolute expiry, so
/// there it is `TIME + PTTL` read in one `MULTI`, within a couple of milliseconds; equality then allows that slack.
#[derive(Debug, Clone, Copy)]
pub struct Expiry {
    pub at_ms: i64,
    pub exact: bool,
}

/// How far apart two expiries may be when one was reconstructed from `PTTL`.
const EXPIRY_SLACK_MS: i64 = 2;

impl PartialEq for Expiry {
    fn eq(&self, other: &Expiry) -> bool {
        let slack = if self.exact && other.exact {
            0
        } else {
            EXPIRY_SLACK_MS
        };
        (self.at_ms - other.at_ms).abs() <= slack
    }
}

impl Expiry {
    /// The slack to allow when comparing this expiry with an exact time.
    pub fn slack_ms(&self) -> i64 {
        if self.exact {
            0
        } else {
            EXPIRY_SLACK_MS
        }
    }
}

pub fn pexpiretime(conn: &mut redis::Connection, key: &str) -> Expiry {
    match redis::cmd("PEXPIRETIME").arg(key).query::<i64>(conn) {
        Ok(at_ms) => Expiry { at_ms, exact: true },
        Err(e) if error_text(&e).to_lowercase().contains("unknown command") => {
            let ((secs, micros), ttl_ms): ((i64, i64), i64) = redis::pipe()
                .atomic()
                .cmd("TIME")
                .cmd("PTTL")
                .arg(key)
                .query(conn)
                .expect("TIME + PTTL");
            let at_ms = if ttl_ms < 0 {
                ttl_ms
            } else {
                secs * 1_000 + micros / 1_000 + ttl_ms
            };
            Expiry {
                at_ms,
                exact: ttl_ms < 0,
            }
        }
        Err(e) => panic!("PEXPIRETIME {key}: {e}"),
    }
}

pub fn ping(conn: &mut redis::Connection) {
    let pong: String = redis::cmd("PING")
        .query(conn)
        .expect("server still answers");
    assert_eq!(pong, "PONG");
}
