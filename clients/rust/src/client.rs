//! The async client: sends each command to the first backend the server offers (`backends.rs`), within a
//! deadline, never twice.
//!
//! ```text
//! deadline    every call, with its retries, its connection and its wait for a slot, ends within `timeout`.
//!             A call that misses it drops the connection it used, so nothing more is written there; until a
//!             probe (PING on a new connection, a few a second at most) answers, calls fail at once.
//! no resend   redis-rs's multiplexed connection is used as is: it never resends a command, and the client
//!             reconnects by itself instead of through ConnectionManager, whose reconnect could re-run a call
//!             that may have been charged. At most 64 calls are out at once, and none is sent while one has
//!             waited more than a quarter of the deadline, so a stalled server runs at most the calls sent
//!             before that (64 at most) when it resumes.
//! cluster     `Client::cluster(nodes)`: redis-rs's cluster connection (retries(0), so it resends nothing), each
//!             call sent to the primary of its keys' slot with MOVED and ASK followed (`cluster.rs`). The
//!             deadline, the probes and the stall hold apply to the whole cluster connection.
//! ```
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio::sync::Semaphore;

use crate::backends::{Backend, Backends};
use crate::cluster::{self, Routed};
use crate::command::{self, Bucket, BucketWithCost, Call};
use crate::error::{ConfigError, Error};
use crate::replies::{
    Acquired, AcquiredAll, AcquiredEach, Charged, PartialGrant, Refunded, Reservation,
};

/// The deadline of a call unless one is set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Calls one client has out at once, at most; the others wait for a slot within their deadline.
pub const MAX_IN_FLIGHT: usize = 64;
/// While a call has been out longer than this part of the deadline, no new call is sent: the new ones wait
/// unsent, within their own deadline (the Python and Node packages hold them the same way).
pub const STALL_FRACTION: f64 = 0.25;
/// Waits before each probe while Redis is away: the first soon, then spaced out, the last repeating while
/// probes fail (the Python and Node packages use the same, `fixtures/deadlines.json`).
pub const PROBE_DELAYS: [Duration; 3] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
];

/// The wait before probe number `attempt` (0 first) of one fault.
pub fn probe_delay(attempt: usize) -> Duration {
    let [.., last] = PROBE_DELAYS;
    PROBE_DELAYS.get(attempt).copied().unwrap_or(last)
}

/// Builds a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    nodes: Nodes,
    timeout: Duration,
    backend: Option<Backend>,
}

impl ClientBuilder {
    /// The deadline of each call (default 1 s): connection, retries and the reply included.
    pub fn timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.timeout = timeout;
        self
    }

    /// One backend for good, never switching (default: found from the replies).
    pub fn backend(mut self, backend: Backend) -> ClientBuilder {
        self.backend = Some(backend);
        self
    }

    /// The client; connects on its first call. Refuses a malformed URL (the message never holds a password) and
    /// a zero timeout.
    pub fn build(self) -> Result<Client, ConfigError> {
        if self.timeout.is_zero() {
            return Err(ConfigError::new(
                "timeout must be a positive finite number, not 0 s".to_owned(),
            ));
        }
        let target = match &self.nodes {
            Nodes::Single(url) => Target::Single(
                redis::Client::open(url.as_str())
                    .map_err(|err| ConfigError::new(format!("redis URL {}: {err}", redact(url))))?,
            ),
            Nodes::Cluster(urls) => Target::Cluster(cluster_client(urls, self.timeout)?),
        };
        Ok(Client {
            inner: Arc::new(Inner {
                target,
                timeout: self.timeout,
                connection: Mutex::new(None),
                generation: AtomicU64::new(0),
                down: AtomicBool::new(false),
                reconnecting: AtomicBool::new(false),
                first_connect: tokio::sync::Mutex::new(()),
                slots: Semaphore::new(MAX_IN_FLIGHT),
                out: Mutex::new(BTreeMap::new()),
                next_out: AtomicU64::new(0),
                backends: Backends::new(self.backend),
            }),
        })
    }
}

/// Where the client connects: one server, or the seed nodes of a Redis Cluster.
#[derive(Clone, Debug)]
enum Nodes {
    Single(String),
    Cluster(Vec<String>),
}

/// redis-rs's cluster client for `urls`, with the call's deadline for connecting and for each reply, and no
/// retries: in redis-rs 0.27 its one retry count covers timeouts and lost connections too, which may have been
/// charged (MOVED and ASK are followed by `cluster::Routed` instead).
fn cluster_client(urls: &[String], timeout: Duration) -> Result<ClusterClient, ConfigError> {
    let shown = || {
        urls.iter()
            .map(|url| redact(url))
            .collect::<Vec<_>>()
            .join(",")
    };
    if urls.is_empty() {
        return Err(ConfigError::new(
            "cluster nodes must name at least one node URL".to_owned(),
        ));
    }
    for url in urls {
        redis::Client::open(url.as_str())
            .map_err(|err| ConfigError::new(format!("redis URL {}: {err}", redact(url))))?;
    }
    ClusterClient::builder(urls.iter().cloned())
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .retries(0)
        .build()
        .map_err(|err| ConfigError::new(format!("cluster nodes {}: {err}", shown())))
}

enum Target {
    Single(redis::Client),
    Cluster(ClusterClient),
}

/// The connection calls go out on; clones share it.
#[derive(Clone)]
enum Connection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// A token-bucket client over one multiplexed connection (or one cluster connection); clones share it.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("timeout", &self.inner.timeout)
            .field("cluster", &self.is_cluster())
            .field("backend", &self.backend_in_use())
            .finish()
    }
}

struct Live {
    generation: u64,
    connection: Connection,
}

struct Inner {
    target: Target,
    timeout: Duration,
    connection: Mutex<Option<Live>>,
    generation: AtomicU64,
    /// A call failed for want of Redis: no call is sent until a probe answers.
    down: AtomicBool,
    reconnecting: AtomicBool,
    /// Serialises the first connection, which a call makes itself (within its deadline).
    first_connect: tokio::sync::Mutex<()>,
    slots: Semaphore,
    /// When each call out now was sent, by a number that grows with time (so the first is the oldest).
    out: Mutex<BTreeMap<u64, Instant>>,
    next_out: AtomicU64,
    backends: Backends,
}

/// A call out on the connection, from its sending until it ends or is dropped at its deadline.
struct Out<'a> {
    inner: &'a Inner,
    id: u64,
}

impl Drop for Out<'_> {
    fn drop(&mut self) {
        if let Ok(mut out) = self.inner.out.lock() {
            out.remove(&self.id);
        }
    }
}

impl Client {
    /// A client for `url` (`redis://host:port/db`, `rediss://`, `unix:///path`) with the default deadline.
    pub fn new(url: &str) -> Result<Client, ConfigError> {
        Client::builder(url).build()
    }

    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder {
            nodes: Nodes::Single(url.to_owned()),
            timeout: DEFAULT_TIMEOUT,
            backend: None,
        }
    }

    /// A client for a Redis Cluster, from the URLs of some of its nodes (as redis-rs's `ClusterClient::new`
    /// takes them), with the default deadline. Each call goes to the primary of its keys' slot; the keys of one
    /// call must share a slot (a hash tag, as the layer's keys do).
    pub fn cluster<I, S>(nodes: I) -> Result<Client, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Client::cluster_builder(nodes).build()
    }

    /// A builder for a Redis Cluster client (see [`Client::cluster`]), for the deadline or a forced backend.
    pub fn cluster_builder<I, S>(nodes: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        ClientBuilder {
            nodes: Nodes::Cluster(
                nodes
                    .into_iter()
                    .map(|node| node.as_ref().to_owned())
                    .collect(),
            ),
            timeout: DEFAULT_TIMEOUT,
            backend: None,
        }
    }

    /// Whether this client talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.target, Target::Cluster(_))
    }

    /// The deadline of each call.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The backend calls go to now.
    pub fn backend_in_use(&self) -> Backend {
        self.inner.backends.in_use()
    }

    /// Whether calls are sent: false from a timeout or a lost connection until a probe answers.
    pub fn is_available(&self) -> bool {
        !self.inner.down.load(Ordering::Acquire)
    }

    /// Takes `cost` tokens from the bucket at `key` if it holds them (`TB.ACQUIRE`).
    pub async fn acquire(
        &self,
        key: &str,
        rate: f64,
        burst: f64,
        cost: f64,
    ) -> Result<Acquired, Error> {
        self.run(command::acquire(key, rate, burst, cost)).await
    }

    /// Takes `cost` from every bucket, or nothing from any (`TB.ACQUIREALL`).
    pub async fn acquire_all(
        &self,
        buckets: &[Bucket<'_>],
        cost: f64,
    ) -> Result<AcquiredAll, Error> {
        self.run(command::acquire_all(buckets, cost)).await
    }

    /// Takes each bucket's own cost from every bucket, or nothing from any, and reports on each
    /// (`TB.ACQUIREEACH`).
    pub async fn acquire_each(
        &self,
        buckets: &[BucketWithCost<'_>],
    ) -> Result<AcquiredEach, Error> {
        self.run(command::acquire_each(buckets)).await
    }

    /// Takes as many whole tokens as are there, up to `max` (`TB.ACQUIREATMOST`).
    pub async fn acquire_at_most(
        &self,
        key: &str,
        rate: f64,
        burst: f64,
        max: u64,
    ) -> Result<PartialGrant, Error> {
        self.run(command::acquire_at_most(key, rate, burst, max))
            .await
    }

    /// Takes `cost` now and says when to act, unless that is more than `max_wait_ms` away (`TB.RESERVE`).
    pub async fn reserve(
        &self,
        key: &str,
        rate: f64,
        burst: f64,
        cost: f64,
        max_wait_ms: u64,
    ) -> Result<Reservation, Error> {
        self.run(command::reserve(key, rate, burst, cost, max_wait_ms))
            .await
    }

    /// Gives `amount` tokens back, unless the bucket is in debt (`TB.REFUND`).
    pub async fn refund(
        &self,
        key: &str,
        rate: f64,
        burst: f64,
        amount: f64,
    ) -> Result<Refunded, Error> {
        self.run(command::refund(key, rate, burst, amount)).await
    }

    /// Takes `cost` whether or not the bucket holds it, into debt (`TB.CHARGE`).
    pub async fn charge(
        &self,
        key: &str,
        rate: f64,
        burst: f64,
        cost: f64,
    ) -> Result<Charged, Error> {
        self.run(command::charge(key, rate, burst, cost)).await
    }

    /// Brings the bucket down to `tokens` if it holds more after refilling, never up (`TB.LOWER`): a minimum,
    /// so sending it twice changes nothing. `tokens` may be negative, down to a day of refill in debt.
    pub async fn lower(
        &self,
        key: &str,
        rate: f64,
        burst: f64,
        tokens: f64,
    ) -> Result<Charged, Error> {
        self.run(command::lower(key, rate, burst, tokens)).await
    }

    /// Denies the bucket for `ms` milliseconds (`TB.BLOCK`).
    pub async fn block(&self, key: &str, rate: f64, burst: f64, ms: u64) -> Result<Charged, Error> {
        self.run(command::block(key, rate, burst, ms)).await
    }

    /// Runs `call` within the deadline.
    async fn run<T>(&self, call: Call<T>) -> Result<T, Error> {
        // The generation of the connection the call went out on, for dropping it at the deadline.
        let used = AtomicU64::new(0);
        let outcome =
            tokio::time::timeout(self.inner.timeout, self.run_unbounded(&call, &used)).await;
        match outcome {
            Ok(result) => result,
            Err(_) => {
                let generation = used.load(Ordering::Acquire);
                if generation != 0 {
                    self.drop_connection(generation);
                }
                Err(Error::Timeout(self.inner.timeout))
            }
        }
    }

    async fn run_unbounded<T>(&self, call: &Call<T>, used: &AtomicU64) -> Result<T, Error> {
        // On a cluster, the keys' one slot, or the error of several, before anything waits or is sent.
        let hash_slot = match self.inner.target {
            Target::Cluster(_) => Some(cluster::slot_of(&call.keys)?),
            Target::Single(_) => None,
        };
        let _slot = self
            .inner
            .slots
            .acquire()
            .await
            .map_err(|_| Error::Unavailable("the client is closing".to_owned()))?;
        while self.stalled() && !self.inner.down.load(Ordering::Acquire) {
            tokio::time::sleep(self.inner.timeout.mul_f64(STALL_FRACTION / 4.0)).await;
        }
        // Fails at once when the call it waited behind missed its deadline.
        let (generation, mut connection) = self.connection().await?;
        used.store(generation, Ordering::Release);
        let _out = self.out();
        let result = match &mut connection {
            Connection::Single(connection) => self.inner.backends.run(connection, call).await,
            Connection::Cluster(connection) => {
                let mut routed = Routed::new(connection, hash_slot.unwrap_or(0));
                self.inner.backends.run(&mut routed, call).await
            }
        };
        if let Err(err) = &result {
            if err.stops_calls() {
                self.drop_connection(generation);
            }
        }
        result
    }

    /// Whether a call out now has waited more than `STALL_FRACTION` of the deadline: Redis may have stalled, and a
    /// call sent now would be run, and charged, when it resumes.
    fn stalled(&self) -> bool {
        let oldest = self
            .inner
            .out
            .lock()
            .ok()
            .and_then(|out| out.first_key_value().map(|(_, at)| *at));
        oldest.is_some_and(|at| at.elapsed() > self.inner.timeout.mul_f64(STALL_FRACTION))
    }

    /// Counts a call as out until the returned guard is dropped.
    fn out(&self) -> Out<'_> {
        let id = self.inner.next_out.fetch_add(1, Ordering::AcqRel);
        if let Ok(mut out) = self.inner.out.lock() {
            out.insert(id, Instant::now());
        }
        Out {
            inner: &self.inner,
            id,
        }
    }

    /// The connection to send on: the live one; else, on the first call, a new one made within the call's
    /// deadline; else (Redis was lost) none until the probe answers.
    async fn connection(&self) -> Result<(u64, Connection), Error> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        if self.inner.down.load(Ordering::Acquire) {
            self.reconnect();
            return Err(Error::Unavailable(
                "waiting for redis to answer a probe".to_owned(),
            ));
        }
        let _first = self.inner.first_connect.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        if self.inner.down.load(Ordering::Acquire) {
            return Err(Error::Unavailable(
                "waiting for redis to answer a probe".to_owned(),
            ));
        }
        // Boxed: the connect path runs once per connection, and unboxed it would make every call's future as large
        // as a connection handshake's, moved at each await on the way down.
        match Box::pin(connect(&self.inner)).await {
            Ok(connection) => Ok(install(&self.inner, connection)),
            Err(err) => {
                self.inner.down.store(true, Ordering::Release);
                tracing::warn!("redis-tb: cannot connect to redis: {err}");
                self.reconnect();
                Err(err)
            }
        }
    }

    fn current(&self) -> Option<(u64, Connection)> {
        let live = self.inner.connection.lock().ok()?;
        live.as_ref()
            .map(|live| (live.generation, live.connection.clone()))
    }

    /// Forgets connection `generation` (never a newer one), closes the gate and starts the probes.
    fn drop_connection(&self, generation: u64) {
        let dropped = match self.inner.connection.lock() {
            Ok(mut live) => match live.as_ref() {
                Some(current) if current.generation == generation => {
                    *live = None;
                    true
                }
                _ => false,
            },
            Err(_) => false,
        };
        if dropped {
            self.inner.down.store(true, Ordering::Release);
            tracing::debug!("redis-tb: dropped the redis connection after a failed call; probing");
            self.reconnect();
        }
    }

    /// Starts the probe task unless one runs: a new connection and a PING on it, a few a second at most; the
    /// gate opens when one answers.
    fn reconnect(&self) {
        if self.inner.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.reconnecting.store(false, Ordering::Release);
            return;
        };
        let inner = Arc::clone(&self.inner);
        runtime.spawn(async move {
            let mut attempt = 0;
            loop {
                tokio::time::sleep(probe_delay(attempt)).await;
                match connect(&inner).await {
                    Ok(connection) => {
                        install(&inner, connection);
                        tracing::debug!(
                            "redis-tb: a probe answered; limiter calls go to redis again"
                        );
                        break;
                    }
                    Err(_) => attempt = attempt.saturating_add(1),
                }
            }
            inner.reconnecting.store(false, Ordering::Release);
        });
    }
}

fn install(inner: &Inner, connection: Connection) -> (u64, Connection) {
    let generation = inner.generation.fetch_add(1, Ordering::AcqRel) + 1;
    if let Ok(mut slot) = inner.connection.lock() {
        *slot = Some(Live {
            generation,
            connection: connection.clone(),
        });
    }
    inner.down.store(false, Ordering::Release);
    (generation, connection)
}

/// A connection, used only once a PING has answered on it within the deadline (on a cluster, every primary's).
async fn connect(inner: &Inner) -> Result<Connection, Error> {
    let attempt = async {
        let connection = match &inner.target {
            Target::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(inner.timeout)
                    .set_response_timeout(inner.timeout);
                let mut connection = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                redis::cmd("PING")
                    .query_async::<Value>(&mut connection)
                    .await?;
                Connection::Single(connection)
            }
            Target::Cluster(client) => {
                let mut connection = client.get_async_connection().await?;
                redis::cmd("PING")
                    .query_async::<Value>(&mut connection)
                    .await?;
                Connection::Cluster(connection)
            }
        };
        Ok::<_, redis::RedisError>(connection)
    };
    match tokio::time::timeout(inner.timeout, attempt).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(err)) => Err(Error::Redis(err)),
        Err(_) => Err(Error::Timeout(inner.timeout)),
    }
}

/// A Redis URL fit for a log line: whatever stands between the scheme and the last `@` (user and password, or
/// something malformed that may hold one) keeps only its user name: `redis://ann:***@host:6379`.
pub fn redact(url: &str) -> String {
    let start = url.find("://").map_or(0, |at| at + 3);
    let Some(at) = url.rfind('@').filter(|&at| at >= start) else {
        return url.to_owned();
    };
    let userinfo = url.get(start..at).unwrap_or("");
    let user = userinfo.split_once(':').map_or("", |(user, _)| user);
    format!(
        "{}{user}{}***{}",
        url.get(..start).unwrap_or(""),
        if user.is_empty() { "" } else { ":" },
        url.get(at..).unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_needs_a_node_and_its_errors_hide_passwords() {
        let none = Client::cluster(Vec::<String>::new()).expect_err("no node");
        assert_eq!(
            none.to_string(),
            "cluster nodes must name at least one node URL"
        );
        let bad = Client::cluster(["redis://127.0.0.1:7000", "redis://ann:s3cret@host:notaport"])
            .expect_err("a malformed URL");
        let message = bad.to_string();
        assert!(
            message.contains("redis://ann:***@host:notaport"),
            "{message}"
        );
        assert!(!message.contains("s3cret"), "{message}");
        let zero = Client::cluster_builder(["redis://127.0.0.1:7000"])
            .timeout(Duration::ZERO)
            .build()
            .expect_err("a zero timeout");
        assert!(zero.to_string().contains("timeout"), "{zero}");
    }

    #[test]
    fn building_a_cluster_client_connects_to_nothing() {
        // Nothing listens there: building never connects.
        let client = Client::cluster(["redis://127.0.0.1:1"]).expect("a client");
        assert!(client.is_cluster());
        assert!(!Client::new("redis://127.0.0.1:1")
            .expect("a client")
            .is_cluster());
    }
}
