//! The async client: sends each command to the first backend the server offers (docs/clients.md, "Which backend
//! runs the calls"), within a deadline, never twice.
//!
//! ```text
//! backend     the module (TB.ACQUIRE ...) while its commands answer; else the Functions library (FCALL, loaded
//!             with FUNCTION LOAD on the call that meets "ERR Function not found"); else the script (EVALSHA,
//!             EVAL on NOSCRIPT). A switch moves down this list and retries the call once on the next backend,
//!             found from the replies, never by an extra round trip. A client that left a module that had
//!             answered tries it again once a minute (a failback). TIME refused inside scripts: the call is
//!             retried once with the caller's clock (`@<µs>`), which is then kept.
//! deadline    every call, with its retries, its connection and its wait for a slot, ends within `timeout`.
//!             A call that misses it drops the connection it used, so nothing more is written there; until a
//!             probe (PING on a new connection, a few a second at most) answers, calls fail at once.
//! no resend   redis-rs's multiplexed connection is used as is: it never resends a command, and the client
//!             reconnects by itself instead of through ConnectionManager, whose reconnect could re-run a call
//!             that may have been charged. At most 64 calls are out at once, so a stalled server runs at most
//!             64 calls of this client when it resumes.
//! ```
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, Value};
use tokio::sync::Semaphore;

use crate::command::{self, Bucket, BucketWithCost, Call};
use crate::error::{ConfigError, Error};
use crate::failure;
use crate::replies::{
    Acquired, AcquiredAll, AcquiredEach, Charged, PartialGrant, Refunded, Reservation,
};
use crate::script;

/// The deadline of a call unless one is set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Calls one client has out at once, at most; the others wait for a slot within their deadline.
pub const MAX_IN_FLIGHT: usize = 64;
/// How often a client that left a module that had answered tries it again.
const MODULE_RETRY: Duration = Duration::from_secs(60);
/// Waits between probes while Redis is away: the first soon, then doubling up to a second.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Where a command runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The module's commands (`TB.ACQUIRE` ...).
    Module,
    /// The Redis Functions library (`FCALL tb_0_4_0_acquire ...`), Redis 7.0+ and Valkey.
    Function,
    /// The Lua script (`EVALSHA`), where functions are unavailable.
    Script,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Module => "module",
            Backend::Function => "function",
            Backend::Script => "script",
        }
    }

    fn describe(self) -> String {
        match self {
            Backend::Module => "the redis-tb module".to_owned(),
            Backend::Function => format!(
                "the Redis Functions library {} (FCALL)",
                script::library_name()
            ),
            Backend::Script => "the Lua script (EVALSHA)".to_owned(),
        }
    }
}

/// Builds a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    url: String,
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
                "timeout must be longer than zero".to_owned(),
            ));
        }
        let client = redis::Client::open(self.url.as_str())
            .map_err(|err| ConfigError::new(format!("redis URL {}: {err}", redact(&self.url))))?;
        Ok(Client {
            inner: Arc::new(Inner {
                client,
                timeout: self.timeout,
                connection: Mutex::new(None),
                generation: AtomicU64::new(0),
                down: AtomicBool::new(false),
                reconnecting: AtomicBool::new(false),
                first_connect: tokio::sync::Mutex::new(()),
                slots: Semaphore::new(MAX_IN_FLIGHT),
                selection: Mutex::new(Selection {
                    current: self.backend.unwrap_or(Backend::Module),
                    forced: self.backend.is_some(),
                    module_answered: false,
                    functions_unavailable: false,
                    next_module_try: None,
                    answered: Vec::with_capacity(3),
                    caller_clock: false,
                }),
            }),
        })
    }
}

/// A token-bucket client over one multiplexed connection; clones share it.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("timeout", &self.inner.timeout)
            .field("backend", &self.backend_in_use())
            .finish()
    }
}

struct Live {
    generation: u64,
    connection: MultiplexedConnection,
}

/// Which backend runs the calls, and what the replies have shown so far.
struct Selection {
    current: Backend,
    /// Set by [`ClientBuilder::backend`]: never switch.
    forced: bool,
    /// Whether the module answered a call at least once (only then is it tried again after a switch).
    module_answered: bool,
    /// FCALL or FUNCTION LOAD was refused: the library is skipped for good.
    functions_unavailable: bool,
    next_module_try: Option<Instant>,
    /// The backends that answered at least once: a switch away from one that did is a warning.
    answered: Vec<Backend>,
    /// TIME is refused inside scripts: the library and the script get the caller's clock.
    caller_clock: bool,
}

struct Inner {
    client: redis::Client,
    timeout: Duration,
    connection: Mutex<Option<Live>>,
    generation: AtomicU64,
    /// A call failed for want of Redis: no call is sent until a probe answers.
    down: AtomicBool,
    reconnecting: AtomicBool,
    /// Serialises the first connection, which a call makes itself (within its deadline).
    first_connect: tokio::sync::Mutex<()>,
    slots: Semaphore,
    selection: Mutex<Selection>,
}

/// What one attempt on one backend came to.
enum Step {
    Done(Value),
    /// Move to this backend (the reason is the server's error) and retry once.
    Switch(Backend, Error),
    /// TIME was refused inside the script: retry with the caller's clock.
    ClockRefused(Error),
    Fail(Error),
}

impl Client {
    /// A client for `url` (`redis://host:port/db`, `rediss://`, `unix:///path`) with the default deadline.
    pub fn new(url: &str) -> Result<Client, ConfigError> {
        Client::builder(url).build()
    }

    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder {
            url: url.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            backend: None,
        }
    }

    /// The deadline of each call.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The backend calls go to now.
    pub fn backend_in_use(&self) -> Backend {
        self.inner
            .selection
            .lock()
            .map(|selection| selection.current)
            .unwrap_or(Backend::Module)
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
        let _slot = self
            .inner
            .slots
            .acquire()
            .await
            .map_err(|_| Error::Unavailable("the client is closing".to_owned()))?;
        let (generation, mut connection) = self.connection().await?;
        used.store(generation, Ordering::Release);
        let result = self.dispatch(&mut connection, call).await;
        if let Err(err) = &result {
            if err.stops_calls() {
                self.drop_connection(generation);
            }
        }
        result
    }

    /// Sends `call` to the backend in use, switching and retrying as the replies say (a few attempts at most).
    async fn dispatch<T>(
        &self,
        connection: &mut MultiplexedConnection,
        call: &Call<T>,
    ) -> Result<T, Error> {
        let mut backend = self.pick();
        for _ in 0..4 {
            let caller_clock = self.with_selection(|s| s.caller_clock).unwrap_or(false);
            let step = match backend {
                Backend::Module => {
                    module_attempt(connection, call, self.functions_unavailable()).await
                }
                Backend::Function => function_attempt(connection, call, caller_clock).await,
                Backend::Script => script_attempt(connection, call, caller_clock).await,
            };
            match step {
                Step::Done(value) => {
                    self.answered(backend);
                    return (call.parse)(&value);
                }
                Step::Switch(next, err) => {
                    if self.with_selection(|s| s.forced).unwrap_or(true) {
                        return Err(err);
                    }
                    self.switch(backend, next, &err.server_text().unwrap_or_default());
                    backend = next;
                }
                Step::ClockRefused(err) => {
                    let first = self
                        .with_selection(|s| !std::mem::replace(&mut s.caller_clock, true))
                        .unwrap_or(false);
                    if !first {
                        // Refused with the caller's clock too: another command is refused (an ACL too narrow).
                        return Err(err);
                    }
                    tracing::warn!(
                        "redis-tb: the server refuses TIME inside scripts; {} now runs on this process's clock",
                        backend.describe()
                    );
                }
                Step::Fail(err) => return Err(err),
            }
        }
        Err(Error::Unavailable(
            "no backend answered the call after several switches".to_owned(),
        ))
    }

    fn with_selection<R>(&self, f: impl FnOnce(&mut Selection) -> R) -> Option<R> {
        self.inner.selection.lock().ok().map(|mut s| f(&mut s))
    }

    fn functions_unavailable(&self) -> bool {
        self.with_selection(|s| s.functions_unavailable)
            .unwrap_or(false)
    }

    /// The backend for the next call: the one in use, or the module once a minute after a switch away from a
    /// module that had answered.
    fn pick(&self) -> Backend {
        self.with_selection(|s| {
            if s.forced || s.current == Backend::Module || !s.module_answered {
                return s.current;
            }
            let now = Instant::now();
            match s.next_module_try {
                Some(at) if now < at => s.current,
                _ => {
                    s.next_module_try = Some(now + MODULE_RETRY);
                    Backend::Module
                }
            }
        })
        .unwrap_or(Backend::Module)
    }

    fn answered(&self, backend: Backend) {
        let back = self
            .with_selection(|s| {
                if !s.answered.contains(&backend) {
                    s.answered.push(backend);
                }
                if backend == Backend::Module {
                    s.module_answered = true;
                }
                let back = s.current != backend;
                s.current = backend;
                back
            })
            .unwrap_or(false);
        if back {
            tracing::warn!(
                "redis-tb: {} answers again; calls go to it",
                backend.describe()
            );
        }
    }

    fn switch(&self, from: Backend, to: Backend, why: &str) {
        let had_answered = self
            .with_selection(|s| {
                if to == Backend::Script && from == Backend::Function {
                    s.functions_unavailable = true;
                }
                if from == Backend::Module {
                    s.next_module_try = Some(Instant::now() + MODULE_RETRY);
                }
                let changed = s.current != to;
                s.current = to;
                changed.then_some(s.answered.contains(&from))
            })
            .flatten();
        let why = failure::summary(why);
        match had_answered {
            Some(true) => tracing::warn!(
                "redis-tb: {} went away ({why}); calls go to {}",
                from.describe(),
                to.describe()
            ),
            Some(false) => tracing::info!(
                "redis-tb: {} is not available ({why}); calls go to {}",
                from.describe(),
                to.describe()
            ),
            None => {}
        }
    }

    /// The connection to send on: the live one; else, on the first call, a new one made within the call's
    /// deadline; else (Redis was lost) none until the probe answers.
    async fn connection(&self) -> Result<(u64, MultiplexedConnection), Error> {
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
        match connect(&self.inner).await {
            Ok(connection) => Ok(install(&self.inner, connection)),
            Err(err) => {
                self.inner.down.store(true, Ordering::Release);
                tracing::warn!("redis-tb: cannot connect to redis: {err}");
                self.reconnect();
                Err(err)
            }
        }
    }

    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
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
            let mut backoff = MIN_BACKOFF;
            loop {
                tokio::time::sleep(backoff).await;
                match connect(&inner).await {
                    Ok(connection) => {
                        install(&inner, connection);
                        tracing::debug!(
                            "redis-tb: a probe answered; limiter calls go to redis again"
                        );
                        break;
                    }
                    Err(_) => backoff = (backoff * 2).min(MAX_BACKOFF),
                }
            }
            inner.reconnecting.store(false, Ordering::Release);
        });
    }
}

fn install(inner: &Inner, connection: MultiplexedConnection) -> (u64, MultiplexedConnection) {
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

/// A connection, used only once a PING has answered on it within the deadline.
async fn connect(inner: &Inner) -> Result<MultiplexedConnection, Error> {
    let attempt = async {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(inner.timeout)
            .set_response_timeout(inner.timeout);
        let mut connection = inner
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("PING")
            .query_async::<Value>(&mut connection)
            .await?;
        Ok::<_, redis::RedisError>(connection)
    };
    match tokio::time::timeout(inner.timeout, attempt).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(err)) => Err(Error::Redis(err)),
        Err(_) => Err(Error::Timeout(inner.timeout)),
    }
}

async fn query(connection: &mut MultiplexedConnection, command: &Cmd) -> Result<Value, Error> {
    command
        .query_async::<Value>(connection)
        .await
        .map_err(Error::Redis)
}

/// The server's error text of a failed query, if it is an error reply.
fn reply_text(err: &Error) -> Option<String> {
    err.server_text()
}

async fn module_attempt<T>(
    connection: &mut MultiplexedConnection,
    call: &Call<T>,
    functions_unavailable: bool,
) -> Step {
    let mut command = redis::cmd(call.name);
    command.arg(&call.module_args);
    match query(connection, &command).await {
        Ok(value) => Step::Done(value),
        Err(err) => match reply_text(&err) {
            Some(text) if failure::is_unknown_command(&text) => {
                let next = if functions_unavailable {
                    Backend::Script
                } else {
                    Backend::Function
                };
                Step::Switch(next, err)
            }
            _ => Step::Fail(err),
        },
    }
}

/// `@<µs>`: this process's clock, for servers that refuse TIME inside scripts.
fn caller_time() -> String {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_micros())
        .unwrap_or(0);
    format!("@{micros}")
}

fn script_arguments<T>(command: &mut Cmd, call: &Call<T>, caller_clock: bool) {
    command.arg(call.keys.len()).arg(&call.keys);
    if caller_clock {
        command.arg(caller_time());
    }
}

/// FCALL, loading the library first where the server lacks it, and retrying once.
async fn function_attempt<T>(
    connection: &mut MultiplexedConnection,
    call: &Call<T>,
    caller_clock: bool,
) -> Step {
    let mut fcall = redis::cmd("FCALL");
    fcall.arg(script::function_name(call.name));
    script_arguments(&mut fcall, call, caller_clock);
    fcall.arg(&call.script_args);
    let err = match query(connection, &fcall).await {
        Ok(value) => return Step::Done(value),
        Err(err) => err,
    };
    let Some(text) = reply_text(&err) else {
        return Step::Fail(err);
    };
    if failure::is_functions_unavailable(&text) {
        return Step::Switch(Backend::Script, err);
    }
    if failure::is_time_refused(&text) {
        return Step::ClockRefused(err);
    }
    if !failure::is_function_missing(&text) {
        return Step::Fail(err);
    }
    let mut load = redis::cmd("FUNCTION");
    load.arg("LOAD").arg(script::library());
    if let Err(load_err) = query(connection, &load).await {
        match reply_text(&load_err) {
            Some(text) if failure::is_library_loaded(&text) => {}
            Some(text)
                if failure::is_functions_unavailable(&text)
                    || failure::is_library_refused(&text) =>
            {
                return Step::Switch(Backend::Script, load_err);
            }
            _ => return Step::Fail(load_err),
        }
    }
    match query(connection, &fcall).await {
        Ok(value) => Step::Done(value),
        Err(err) => match reply_text(&err) {
            Some(text) if failure::is_time_refused(&text) => Step::ClockRefused(err),
            _ => Step::Fail(err),
        },
    }
}

/// EVALSHA; on NOSCRIPT (a restart, a failover, SCRIPT FLUSH), EVAL, which runs the script and caches it.
async fn script_attempt<T>(
    connection: &mut MultiplexedConnection,
    call: &Call<T>,
    caller_clock: bool,
) -> Step {
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(script::script_sha());
    script_arguments(&mut evalsha, call, caller_clock);
    evalsha.arg(call.name).arg(&call.script_args);
    let err = match query(connection, &evalsha).await {
        Ok(value) => return Step::Done(value),
        Err(err) => err,
    };
    let outcome = match reply_text(&err) {
        Some(text) if text.starts_with("NOSCRIPT") => {
            let mut eval = redis::cmd("EVAL");
            eval.arg(script::SCRIPT);
            script_arguments(&mut eval, call, caller_clock);
            eval.arg(call.name).arg(&call.script_args);
            query(connection, &eval).await
        }
        _ => Err(err),
    };
    match outcome {
        Ok(value) => Step::Done(value),
        Err(err) => match reply_text(&err) {
            Some(text) if failure::is_time_refused(&text) => Step::ClockRefused(err),
            _ => Step::Fail(err),
        },
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
