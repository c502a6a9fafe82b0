//! Which backend runs a call (docs/clients.md, "Which backend runs the calls"), over any redis-rs async
//! connection: the client's own, or a caller's (tb-rls's standalone and cluster connections).
//!
//! ```text
//! order       the module (TB.ACQUIRE ...) while its commands answer; else the Functions library (FCALL, loaded
//!             with FUNCTION LOAD on the call that meets "ERR Function not found"); else the script (EVALSHA,
//!             EVAL on NOSCRIPT). A switch moves down this list and retries the call once on the next backend,
//!             found from the replies, never by an extra round trip
//! failback    a caller that left a module that had answered tries it again once a minute
//! clock       TIME refused inside scripts: the call is retried once with the caller's clock (`@<us>`), which is
//!             then kept; refused again, the error goes to the caller (an ACL too narrow)
//! ```
//!
//! Every retry here answers an error that proves the call ran nowhere (an unknown command, a missing function or
//! script, TIME refused before any write); nothing that may have been charged is sent twice.
#![forbid(unsafe_code)]

use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};

use crate::command::{self, BucketWithCost, Call};
use crate::error::Error;
use crate::failure;
use crate::replies::AcquiredEach;
use crate::script;

/// How often a caller that left a module that had answered tries it again.
const MODULE_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

/// Where a command runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The module's commands (`TB.ACQUIRE` ...).
    Module,
    /// The Redis Functions library (`FCALL tb_0_5_0_acquire ...`), Redis 7.0+ and Valkey.
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

/// The backend state of one client (or one tb-rls): which backend runs the calls, and what the replies showed.
pub struct Backends {
    selection: Mutex<Selection>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("in_use", &self.in_use())
            .finish()
    }
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

impl Backends {
    /// Found from the replies (`None`), or one backend for good.
    pub fn new(forced: Option<Backend>) -> Backends {
        Backends {
            selection: Mutex::new(Selection {
                current: forced.unwrap_or(Backend::Module),
                forced: forced.is_some(),
                module_answered: false,
                functions_unavailable: false,
                next_module_try: None,
                answered: Vec::with_capacity(3),
                caller_clock: false,
            }),
        }
    }

    /// The backend calls go to now.
    pub fn in_use(&self) -> Backend {
        self.with_selection(|s| s.current)
            .unwrap_or(Backend::Module)
    }

    /// `TB.ACQUIREEACH` over `buckets`, sent on `connection` to the first backend the server offers (as
    /// [`Client::acquire_each`](crate::Client::acquire_each) over a connection the caller keeps): one result per
    /// bucket, in call order, or [`Error::Protocol`] for a reply of another shape.
    pub async fn acquire_each<C>(
        &self,
        connection: &mut C,
        buckets: &[BucketWithCost<'_>],
    ) -> Result<AcquiredEach, Error>
    where
        C: ConnectionLike + Send,
    {
        let reply = self
            .run(connection, &command::acquire_each(buckets))
            .await?;
        if reply.buckets.len() != buckets.len() {
            return Err(Error::Protocol(format!(
                "TB.ACQUIREEACH: {} results for {} buckets",
                reply.buckets.len(),
                buckets.len()
            )));
        }
        Ok(reply)
    }

    /// Sends `call` to the backend in use, switching and retrying as the replies say (a few attempts at most).
    pub(crate) async fn run<C, T>(&self, connection: &mut C, call: &Call<T>) -> Result<T, Error>
    where
        C: ConnectionLike + Send,
    {
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
        self.selection.lock().ok().map(|mut s| f(&mut s))
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
}

async fn query<C: ConnectionLike + Send>(
    connection: &mut C,
    command: &Cmd,
) -> Result<Value, Error> {
    command
        .query_async::<Value>(connection)
        .await
        .map_err(Error::Redis)
}

/// The server's error text of a failed query, if it is an error reply.
fn reply_text(err: &Error) -> Option<String> {
    err.server_text()
}

async fn module_attempt<C: ConnectionLike + Send, T>(
    connection: &mut C,
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
async fn function_attempt<C: ConnectionLike + Send, T>(
    connection: &mut C,
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
async fn script_attempt<C: ConnectionLike + Send, T>(
    connection: &mut C,
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
