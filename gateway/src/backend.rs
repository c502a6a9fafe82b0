//! Redis, standalone or Cluster: sends one `TB.ACQUIREEACH` and bounds how long that may take. The call goes
//! through `redis_tb_client::Backends`: the module's command while it answers, else the Functions library or the
//! script built from `lua/tb.lua` (docs/clients.md, "Which backend runs the calls"), so a Redis without the module
//! serves too; its errors are read by the same crate's failure table. It never waits
//! for a connection on a request's behalf: without one it answers `Unavailable` at once and a background task
//! reconnects, so Envoy hears UNAVAILABLE within the timeout at worst and requests succeed again by themselves
//! once Redis is back.
//!
//! Standalone uses one multiplexed connection (concurrent requests are pipelined on it). Cluster uses redis-rs's
//! cluster client without retries (in redis-rs 0.27 its one retry count would also resend a call that timed out
//! or lost its connection, which may have been charged), through the crate's `cluster::Routed`: every command of
//! a call goes to the primary of its first key's slot, MOVED and ASK followed. Every key of one call shares the
//! hash tag `{domain}` (see `decision`), so the call never spans slots.
//!
//! A stall (a paused, stopped or busy server) must not become a reconnect storm or a late charge:
//!
//! ```text
//! call times out       the connection it used is dropped (only that one: a newer connection is kept), so
//!                      nothing more is written to it; requests answer UNAVAILABLE at once until a new one is up
//! a new connection     only after a PING answers on it, and after a backoff that doubles (50 ms to 1 s) each time
//!                      a connection is lost within 5 s of being made: a few connections a second at most,
//!                      whatever the request rate
//! connect/disconnect   logged at most once a second, with the number held back
//! ```
//!
//! What a timed-out call can still cost: a server that is paused (`CLIENT PAUSE WRITE`, a failover) postpones
//! the command and discards it when its connection closes, so it is never charged. A server that is stopped
//! outright (SIGSTOP, a frozen VM) reads what is already in its socket when it resumes and runs it: the calls in
//! flight on the connection when the first one timed out, at most `--max-in-flight`; nothing written later.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, Value};
use redis_tb_client::cluster::{key_slot, Routed};
use redis_tb_client::failure::Action;
use redis_tb_client::{AcquiredEach, Backends, BucketWithCost};

use crate::metrics::Metrics;

/// First wait before replacing a connection lost soon after it was made; doubles up to `MAX_BACKOFF`.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// A connection lost later than this after it was made resets the backoff.
const STABLE: Duration = Duration::from_secs(5);
/// After a call fails as unavailable, the health service says NOT_SERVING until a call succeeds or this long
/// passes quietly.
const SUSPECT_FOR_MS: u64 = 2_000;

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One server (or a proxy in front of several).
    Single(String),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// No connection, a dropped one, no reply within the timeout, or a server that cannot take the call now:
    /// worth retrying, answered UNAVAILABLE.
    Unavailable(String),
    /// Redis answered with a configuration error (`NOAUTH`, `NOPERM`, `WRONGTYPE`, an error the failure table
    /// does not know): answered INTERNAL.
    Reply(String),
}

impl BackendError {
    /// What a call that failed with `err` answers: the failure table's fail-mode rows are UNAVAILABLE (they pass
    /// by themselves), every other row INTERNAL (the retries the table names were already made by `Backends`).
    pub fn of(err: &redis_tb_client::Error) -> BackendError {
        match err.failure().action {
            Action::FailMode => BackendError::Unavailable(err.to_string()),
            Action::ErrorFailMode | Action::ReloadRetry | Action::ScriptRetry => {
                BackendError::Reply(err.to_string())
            }
        }
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Unavailable(why) => write!(f, "redis unavailable: {why}"),
            BackendError::Reply(why) => write!(f, "redis error: {why}"),
        }
    }
}

/// Lets one log line through per second; counts the ones it holds back. When Redis is away every request fails,
/// and a line each would flood the log at the request rate; the metrics count them all.
#[derive(Default)]
pub struct Throttle {
    /// Milliseconds since `epoch` of the last line let through, plus 1 (0: none yet).
    last_ms: AtomicU64,
    suppressed: AtomicU64,
    epoch: OnceLock<Instant>,
}

impl Throttle {
    /// `Some(lines held back since the last one)` when a line may be logged now.
    pub fn admit(&self) -> Option<u64> {
        let epoch = *self.epoch.get_or_init(Instant::now);
        let now_ms = u64::try_from(epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last_ms = self.last_ms.load(Ordering::Relaxed);
        if last_ms != 0 && now_ms.saturating_sub(last_ms) < 1_000 {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self
            .last_ms
            .compare_exchange(last_ms, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

#[derive(Clone)]
enum Connection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

enum Target {
    Single(Client),
    Cluster(ClusterClient),
}

/// The connection in use, and which one it is.
struct Live {
    generation: u64,
    connection: Connection,
    made: Instant,
}

/// When the next connection may be made.
struct Pace {
    /// Wait before the next attempt.
    backoff: Duration,
}

struct Inner {
    target: Target,
    /// Which backend (module, library, script) runs the calls: one for every connection, found from the replies.
    backends: Backends,
    /// Longest a call (or a connection attempt) may take.
    timeout: Duration,
    connection: Mutex<Option<Live>>,
    generation: AtomicU64,
    reconnecting: AtomicBool,
    pace: Mutex<Pace>,
    /// "connected" lines, and the lines of lost connections and failed attempts: each at most once a second, so
    /// a recovery is not hidden behind the failure just before it.
    log_up: Throttle,
    log_down: Throttle,
    metrics: Arc<Metrics>,
    epoch: Instant,
    /// Milliseconds since `epoch` (plus 1) of the last call that failed as unavailable, and of the last success.
    last_failure_ms: AtomicU64,
    last_success_ms: AtomicU64,
}

impl Inner {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }
}

/// A handle to Redis; clones share one connection.
#[derive(Clone)]
pub struct Backend {
    inner: Arc<Inner>,
}

impl Backend {
    /// Prepares the client and starts connecting in the background; fails only on a malformed URL (the message
    /// never carries a password).
    pub fn new(
        topology: &Topology,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Backend, String> {
        let target = match topology {
            Topology::Single(url) => Target::Single(
                Client::open(redis_url(url).as_str())
                    .map_err(|err| format!("REDIS_URL {}: {err}", redact(url)))?,
            ),
            Topology::Cluster(urls) => Target::Cluster(
                ClusterClient::builder(urls.iter().map(|url| redis_url(url)))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(0)
                    .build()
                    .map_err(|err| {
                        let shown: Vec<String> = urls.iter().map(|url| redact(url)).collect();
                        format!("REDIS_URL {}: {err}", shown.join(","))
                    })?,
            ),
        };
        let backend = Backend {
            inner: Arc::new(Inner {
                target,
                backends: Backends::new(None),
                timeout,
                connection: Mutex::new(None),
                generation: AtomicU64::new(0),
                reconnecting: AtomicBool::new(false),
                pace: Mutex::new(Pace {
                    backoff: Duration::ZERO,
                }),
                log_up: Throttle::default(),
                log_down: Throttle::default(),
                metrics,
                epoch: Instant::now(),
                last_failure_ms: AtomicU64::new(0),
                last_success_ms: AtomicU64::new(0),
            }),
        };
        backend.reconnect();
        Ok(backend)
    }

    /// Whether a connection is up.
    pub fn is_connected(&self) -> bool {
        self.inner
            .connection
            .lock()
            .map(|connection| connection.is_some())
            .unwrap_or(false)
    }

    /// Whether requests can be served (for the health service): connected, and no call has failed as unavailable
    /// (a timeout, a lost connection, BUSY...) in the last two seconds without a call succeeding since, so a stall
    /// that keeps replacing the connection does not make the health flap.
    pub fn is_serving(&self) -> bool {
        if !self.is_connected() {
            return false;
        }
        let timeout = self.inner.last_failure_ms.load(Ordering::Relaxed);
        let success = self.inner.last_success_ms.load(Ordering::Relaxed);
        timeout == 0
            || success >= timeout
            || self.inner.now_ms().saturating_sub(timeout) > SUSPECT_FOR_MS
    }

    /// Sends `TB.ACQUIREEACH` over `buckets` and returns its reply, one result per bucket.
    pub async fn acquire_each(
        &self,
        buckets: &[BucketWithCost<'_>],
    ) -> Result<AcquiredEach, BackendError> {
        let Some((generation, connection)) = self.current() else {
            self.reconnect();
            return Err(BackendError::Unavailable("not connected".to_owned()));
        };
        let outcome = tokio::time::timeout(
            self.inner.timeout,
            acquire_each(&self.inner.backends, connection, buckets),
        )
        .await;
        let result = match outcome {
            Err(_) => {
                self.drop_connection(generation, "a call timed out");
                Err(BackendError::Unavailable(format!(
                    "no reply within {} ms",
                    self.inner.timeout.as_millis()
                )))
            }
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => {
                if err.stops_calls() {
                    let timed_out = match &err {
                        redis_tb_client::Error::Redis(redis) => redis.is_timeout(),
                        redis_tb_client::Error::Timeout(_) => true,
                        _ => false,
                    };
                    let why = if timed_out {
                        "a call timed out"
                    } else {
                        "connection lost"
                    };
                    self.drop_connection(generation, why);
                    Err(BackendError::Unavailable(err.to_string()))
                } else {
                    Err(BackendError::of(&err))
                }
            }
        };
        let mark = match &result {
            Ok(_) => Some(&self.inner.last_success_ms),
            Err(BackendError::Unavailable(_)) => Some(&self.inner.last_failure_ms),
            Err(BackendError::Reply(_)) => None,
        };
        if let Some(mark) = mark {
            mark.store(self.inner.now_ms(), Ordering::Relaxed);
        }
        result
    }

    fn current(&self) -> Option<(u64, Connection)> {
        self.inner.connection.lock().ok().and_then(|live| {
            live.as_ref()
                .map(|live| (live.generation, live.connection.clone()))
        })
    }

    /// Forgets the connection `generation` (never a newer one), and starts replacing it after the backoff.
    fn drop_connection(&self, generation: u64, why: &str) {
        let dropped = match self.inner.connection.lock() {
            Ok(mut live) => match live.as_ref() {
                Some(current) if current.generation == generation => {
                    let made = current.made;
                    *live = None;
                    Some(made)
                }
                _ => None,
            },
            Err(_) => None,
        };
        let Some(made) = dropped else {
            return;
        };
        if let Ok(mut pace) = self.inner.pace.lock() {
            pace.backoff = if made.elapsed() < STABLE {
                (pace.backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF)
            } else {
                Duration::ZERO
            };
        }
        if let Some(suppressed) = self.inner.log_down.admit() {
            tracing::warn!(reason = why, suppressed, "dropped the redis connection");
        }
        self.reconnect();
    }

    /// Starts the reconnect task unless one is running.
    fn reconnect(&self) {
        if self.inner.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            loop {
                let wait = inner
                    .pace
                    .lock()
                    .map(|pace| pace.backoff)
                    .unwrap_or(MAX_BACKOFF);
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                inner.metrics.redis_connect_attempt();
                match connect(&inner).await {
                    Ok(connection) => {
                        let generation = inner.generation.fetch_add(1, Ordering::Relaxed) + 1;
                        if let Ok(mut slot) = inner.connection.lock() {
                            *slot = Some(Live {
                                generation,
                                connection,
                                made: Instant::now(),
                            });
                        }
                        if let Some(suppressed) = inner.log_up.admit() {
                            tracing::info!(suppressed, "connected to redis");
                        }
                        break;
                    }
                    Err(why) => {
                        if let Some(suppressed) = inner.log_down.admit() {
                            tracing::warn!(error = %why, suppressed, "cannot connect to redis; retrying");
                        }
                        if let Ok(mut pace) = inner.pace.lock() {
                            pace.backoff = (pace.backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
                        }
                    }
                }
            }
            inner.reconnecting.store(false, Ordering::Release);
        });
    }
}

/// `TB.ACQUIREEACH` over `buckets`, on the backend `backends` has found.
async fn acquire_each(
    backends: &Backends,
    connection: Connection,
    buckets: &[BucketWithCost<'_>],
) -> Result<AcquiredEach, redis_tb_client::Error> {
    match connection {
        Connection::Single(mut connection) => backends.acquire_each(&mut connection, buckets).await,
        Connection::Cluster(mut connection) => {
            let slot = key_slot(buckets.first().map_or("", |bucket| bucket.key));
            backends
                .acquire_each(&mut Routed::new(&mut connection, slot), buckets)
                .await
        }
    }
}

async fn query(connection: Connection, command: &Cmd) -> redis::RedisResult<Value> {
    match connection {
        Connection::Single(mut connection) => command.query_async(&mut connection).await,
        Connection::Cluster(mut connection) => command.query_async(&mut connection).await,
    }
}

/// A connection, used only once a PING has answered on it within the timeout.
async fn connect(inner: &Inner) -> Result<Connection, String> {
    let attempt = async {
        let connection = match &inner.target {
            Target::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(inner.timeout)
                    .set_response_timeout(inner.timeout);
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(Connection::Single)?
            }
            Target::Cluster(client) => client
                .get_async_connection()
                .await
                .map(Connection::Cluster)?,
        };
        query(connection.clone(), &redis::cmd("PING")).await?;
        Ok::<_, redis::RedisError>(connection)
    };
    match tokio::time::timeout(inner.timeout.max(Duration::from_millis(200)) * 2, attempt).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err("connection attempt timed out".to_owned()),
    }
}

/// `host:port` (envoyproxy/ratelimit's form) or a `redis://` URL.
fn redis_url(text: &str) -> String {
    if text.contains("://") {
        text.to_owned()
    } else {
        format!("redis://{text}")
    }
}

/// A Redis URL fit for a log line (the password replaced by `***`): the client crate's.
pub use redis_tb_client::redact;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_a_message() {
        for (url, shown) in [
            (
                "redis://ann:s3cret@host:6379/0",
                "redis://ann:***@host:6379/0",
            ),
            ("redis://:s3cret@host:6379", "redis://***@host:6379"),
            ("rediss://s3cret@host", "rediss://***@host"),
            ("redis://ann:s3@cret@host:x", "redis://ann:***@host:x"),
            ("redis//ann:s3cret@host", "redis//ann:***@host"),
            ("host:6379", "host:6379"),
            ("redis://host:6379", "redis://host:6379"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }

    #[tokio::test]
    async fn a_malformed_url_is_refused_without_its_password() {
        let metrics = Arc::new(Metrics::default());
        for topology in [
            Topology::Single("redis://ann:s3cret@host:notaport".to_owned()),
            Topology::Single("unix+weird://ann:s3cret@host".to_owned()),
            Topology::Cluster(vec!["redis://ann:s3cret@host:notaport".to_owned()]),
        ] {
            let Err(message) =
                Backend::new(&topology, Duration::from_millis(100), Arc::clone(&metrics))
            else {
                panic!("{topology:?} was accepted");
            };
            assert!(!message.contains("s3cret"), "{message}");
            assert!(message.starts_with("REDIS_URL "), "{message}");
        }
    }

    /// Every reply of fixtures/failures.json, through redis-rs's parser and tb-rls's own answer: the fail-mode rows
    /// UNAVAILABLE, every other action INTERNAL (docs/gateway.md maps the table's actions to tb-rls's answers).
    #[test]
    fn every_reply_of_the_shared_failure_table_gets_its_answer() {
        let fixture = tb_test_support::fixture("failures.json");
        let mut checked = 0;
        for case in fixture["cases"].as_array().expect("cases") {
            let Some(reply) = case["reply"].as_str() else {
                continue;
            };
            let err = match redis::parse_redis_value(format!("-{reply}\r\n").as_bytes()) {
                Ok(redis::Value::ServerError(err)) => redis_tb_client::Error::Redis(err.into()),
                other => panic!("{reply}: {other:?}"),
            };
            let answer = BackendError::of(&err);
            match case["action"].as_str().expect("an action") {
                "fail-mode" => assert!(
                    matches!(answer, BackendError::Unavailable(_)),
                    "{reply}: {answer:?}"
                ),
                "error-fail-mode" | "reload-retry" | "script-retry" => assert!(
                    matches!(answer, BackendError::Reply(_)),
                    "{reply}: {answer:?}"
                ),
                other => panic!("an action tb-rls does not map: {other}"),
            }
            checked += 1;
        }
        assert!(checked >= 30, "{checked} replies");
    }

    /// The failure table's rows as tb-rls answers them: UNAVAILABLE for what passes by itself, INTERNAL for a
    /// configuration error (every row of fixtures/failures.json is checked above and in the client crate's tests).
    #[test]
    fn server_states_that_pass_are_unavailable_and_the_rest_reply_errors() {
        let parse = |text: &str| -> redis_tb_client::Error {
            match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
                Ok(redis::Value::ServerError(err)) => redis_tb_client::Error::Redis(err.into()),
                other => panic!("{text}: {other:?}"),
            }
        };
        for text in [
            "BUSY Redis is busy running a script.",
            "LOADING Redis is loading the dataset in memory",
            "READONLY You can't write against a read only replica.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "MASTERDOWN Link with MASTER is down",
            "CLUSTERDOWN The cluster is down",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
            "MOVED 3999 127.0.0.1:6381",
            "ASK 3999 127.0.0.1:6381",
            "ERR max number of clients reached",
            "ERR user_script:795: OOM command not allowed when used memory > 'maxmemory'.",
        ] {
            assert!(
                matches!(BackendError::of(&parse(text)), BackendError::Unavailable(_)),
                "{text}"
            );
        }
        for text in [
            "CROSSSLOT Keys in request don't hash to the same slot",
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair",
            "NOPERM this user has no permissions",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "FOO bar",
        ] {
            assert!(
                matches!(BackendError::of(&parse(text)), BackendError::Reply(_)),
                "{text}"
            );
        }
    }
}
