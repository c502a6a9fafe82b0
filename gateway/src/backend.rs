//! Redis, standalone or Cluster: sends one `TB.ACQUIREEACH` and bounds how long that may take. It never waits
//! for a connection on a request's behalf: without one it answers `Unavailable` at once and a background task
//! reconnects (backoff 50 ms doubling to 1 s), so Envoy hears UNAVAILABLE within the timeout at worst and
//! requests succeed again by themselves once Redis is back.
//!
//! Standalone uses one multiplexed connection (concurrent requests are pipelined on it). Cluster uses redis-rs's
//! cluster client, which routes by the first key and follows MOVED/ASK; every key of one call shares the hash tag
//! `{domain}` (see `decision`), so the call never spans slots.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, Value};

/// The command the service sends.
pub const ACQUIRE_EACH: &str = "TB.ACQUIREEACH";

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
    /// No connection, a dropped one, or no reply within the timeout: worth retrying, answered UNAVAILABLE.
    Unavailable(String),
    /// Redis answered with an error (`ERR ...`, e.g. the module is not loaded): answered INTERNAL.
    Reply(String),
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Unavailable(why) => write!(f, "redis unavailable: {why}"),
            BackendError::Reply(why) => write!(f, "redis error: {why}"),
        }
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

struct Inner {
    target: Target,
    /// Longest a call (or a connection attempt) may take.
    timeout: Duration,
    connection: Mutex<Option<Connection>>,
    reconnecting: AtomicBool,
}

/// A handle to Redis; clones share one connection.
#[derive(Clone)]
pub struct Backend {
    inner: Arc<Inner>,
}

impl Backend {
    /// Prepares the client and starts connecting in the background; fails only on a malformed URL.
    pub fn new(topology: &Topology, timeout: Duration) -> Result<Backend, String> {
        let target = match topology {
            Topology::Single(url) => Target::Single(
                Client::open(redis_url(url).as_str())
                    .map_err(|err| format!("REDIS_URL {url}: {err}"))?,
            ),
            Topology::Cluster(urls) => Target::Cluster(
                ClusterClient::builder(urls.iter().map(|url| redis_url(url)))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(1)
                    .build()
                    .map_err(|err| format!("REDIS_URL {}: {err}", urls.join(",")))?,
            ),
        };
        let backend = Backend {
            inner: Arc::new(Inner {
                target,
                timeout,
                connection: Mutex::new(None),
                reconnecting: AtomicBool::new(false),
            }),
        };
        backend.reconnect();
        Ok(backend)
    }

    /// Whether a connection is up (for the health service).
    pub fn is_connected(&self) -> bool {
        self.inner
            .connection
            .lock()
            .map(|connection| connection.is_some())
            .unwrap_or(false)
    }

    /// Sends `TB.ACQUIREEACH` with `args` and returns the raw reply.
    pub async fn acquire_each(&self, args: &[String]) -> Result<Value, BackendError> {
        let Some(connection) = self.current() else {
            self.reconnect();
            return Err(BackendError::Unavailable("not connected".to_owned()));
        };
        let mut command = Cmd::new();
        command.arg(ACQUIRE_EACH).arg(args);
        let outcome = match connection {
            Connection::Single(mut connection) => {
                tokio::time::timeout(
                    self.inner.timeout,
                    command.query_async::<Value>(&mut connection),
                )
                .await
            }
            Connection::Cluster(mut connection) => {
                tokio::time::timeout(
                    self.inner.timeout,
                    command.query_async::<Value>(&mut connection),
                )
                .await
            }
        };
        match outcome {
            // A late reply is no reason to drop the connection: every request pipelined on it would fail too,
            // and under load that cascades. A dead server shows up as an I/O error, handled below.
            Err(_) => Err(BackendError::Unavailable(format!(
                "no reply within {} ms",
                self.inner.timeout.as_millis()
            ))),
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => {
                if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
                    self.drop_connection();
                    return Err(BackendError::Unavailable(err.to_string()));
                }
                match err.kind() {
                    // Transient server states: a failover, a reload, a cluster reconfiguring.
                    redis::ErrorKind::BusyLoadingError
                    | redis::ErrorKind::TryAgain
                    | redis::ErrorKind::ClusterDown
                    | redis::ErrorKind::MasterDown
                    | redis::ErrorKind::ClusterConnectionNotFound
                    | redis::ErrorKind::IoError => Err(BackendError::Unavailable(err.to_string())),
                    _ => Err(BackendError::Reply(err.to_string())),
                }
            }
        }
    }

    fn current(&self) -> Option<Connection> {
        self.inner
            .connection
            .lock()
            .ok()
            .and_then(|connection| connection.clone())
    }

    /// Forgets a standalone connection that failed, and starts reconnecting. A cluster connection is kept: it
    /// reconnects to its nodes by itself.
    fn drop_connection(&self) {
        if let Ok(mut connection) = self.inner.connection.lock() {
            if matches!(*connection, Some(Connection::Single(_))) {
                *connection = None;
            }
        }
        if !self.is_connected() {
            self.reconnect();
        }
    }

    /// Starts the reconnect task unless one is running.
    fn reconnect(&self) {
        if self.inner.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            let mut logged = false;
            loop {
                match connect(&inner).await {
                    Ok(connection) => {
                        if let Ok(mut slot) = inner.connection.lock() {
                            *slot = Some(connection);
                        }
                        tracing::info!("connected to redis");
                        break;
                    }
                    Err(why) => {
                        if !logged {
                            tracing::warn!(error = %why, "cannot connect to redis; retrying");
                            logged = true;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                }
            }
            inner.reconnecting.store(false, Ordering::Release);
        });
    }
}

async fn connect(inner: &Inner) -> Result<Connection, String> {
    let attempt = async {
        match &inner.target {
            Target::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(inner.timeout)
                    .set_response_timeout(inner.timeout);
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(Connection::Single)
            }
            Target::Cluster(client) => client.get_async_connection().await.map(Connection::Cluster),
        }
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
