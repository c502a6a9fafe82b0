//! The failure table of docs/clients.md and the backend errors of "Which backend runs the calls", without I/O:
//! which row an error belongs to, and which errors move a call to another backend. `fixtures/failures.json` and
//! `fixtures/backends.json` hold example texts for each; the tests read them.
//!
//! Every row ends in a middleware's fail mode. What differs is how loudly: a fault of the server or the network
//! (refused, timeout, OOM, READONLY, ...) passes by itself and is logged once per fault as a warning; a
//! configuration error (a password, an ACL, a key of another type, an error this crate does not know) does not,
//! so it is logged at error level whatever the fail mode. Two rows are the client's own business first: a
//! missing script or library is loaded and the call retried once; a missing command moves to the next backend.
#![forbid(unsafe_code)]

/// What a middleware does about a failed call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The fail mode, with a warning once per fault.
    FailMode,
    /// Logged at error level (at most once a minute per row), then the fail mode: a configuration error.
    ErrorFailMode,
    /// The client loads the script or library and retries once (`NOSCRIPT`, `ERR Function not found`).
    ReloadRetry,
    /// The client moves to the next backend and retries once (`ERR unknown command ...`).
    ScriptRetry,
}

/// One row of the failure table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The row's name, as `fixtures/failures.json` spells it (`"timeout"`, `"OOM"`, `"other ERR"`).
    pub row: &'static str,
    /// The row's short name, as every package reports it (`"timeout"`, `"oom"`, `"other"`): a metric's label.
    pub class: &'static str,
    pub action: Action,
}

impl Failure {
    /// Whether the row is a configuration error, logged at error level whatever the fail mode.
    pub fn is_config_error(self) -> bool {
        self.action == Action::ErrorFailMode
    }
}

const fn row(row: &'static str, class: &'static str, action: Action) -> Failure {
    Failure { row, class, action }
}

/// Codes of a server that cannot run the call now, with their rows and classes.
const UNAVAILABLE_CODES: [(&str, &str, &str); 11] = [
    ("CLUSTERDOWN", "CLUSTERDOWN", "clusterdown"),
    ("MASTERDOWN", "MASTERDOWN", "masterdown"),
    ("LOADING", "LOADING", "loading"),
    ("BUSY", "BUSY", "busy"),
    ("READONLY", "READONLY", "readonly"),
    ("OOM", "OOM", "oom"),
    ("NOREPLICAS", "NOREPLICAS", "noreplicas"),
    ("MISCONF", "MISCONF", "misconf"),
    ("MOVED", "MOVED/ASK that do not settle", "moved"),
    ("ASK", "MOVED/ASK that do not settle", "moved"),
    ("TRYAGAIN", "TRYAGAIN", "tryagain"),
];
/// Codes of a configuration error, with their rows and classes.
const CONFIG_CODES: [(&str, &str, &str); 5] = [
    ("NOAUTH", "NOAUTH", "noauth"),
    ("WRONGPASS", "WRONGPASS", "wrongpass"),
    ("NOPERM", "NOPERM", "noperm"),
    ("WRONGTYPE", "WRONGTYPE", "wrongtype"),
    ("CROSSSLOT", "CROSSSLOT", "crossslot"),
];

/// The row of an error reply, given as the server sends it without the leading `-`
/// (`OOM command not allowed ...`). A command refused inside the script or library comes back as the script's
/// error (`ERR user_script:795: OOM ...`): its row is the refused command's.
pub fn classify_reply(text: &str) -> Failure {
    let text = without_script_prefix(text);
    let code = text.split(' ').next().unwrap_or("");
    if let Some(&(_, name, class)) = UNAVAILABLE_CODES
        .iter()
        .find(|(known, _, _)| *known == code)
    {
        return row(name, class, Action::FailMode);
    }
    if let Some(&(_, name, class)) = CONFIG_CODES.iter().find(|(known, _, _)| *known == code) {
        return row(name, class, Action::ErrorFailMode);
    }
    if code == "NOSCRIPT" {
        return row("NOSCRIPT", "noscript", Action::ReloadRetry);
    }
    if text.starts_with("ERR max number of clients reached") {
        return row("too many clients", "max_clients", Action::FailMode);
    }
    if is_function_missing(text) {
        return row("function missing", "function_missing", Action::ReloadRetry);
    }
    if is_unknown_command(text) {
        return row("unknown command", "unknown_command", Action::ScriptRetry);
    }
    row("other ERR", "other", Action::ErrorFailMode)
}

/// `text` without a leading `ERR user_script:<line>: `, or `text` itself.
fn without_script_prefix(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("ERR user_script:") else {
        return text;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    match rest.get(digits..).and_then(|tail| tail.strip_prefix(": ")) {
        Some(inner) if digits > 0 => inner,
        _ => text,
    }
}

/// The row of a call that got no reply within its deadline.
pub(crate) const TIMEOUT: Failure = row("timeout", "timeout", Action::FailMode);
/// The row of a call that found no connection to be sent on.
pub(crate) const CONNECTION_REFUSED: Failure =
    row("connection refused", "connection", Action::FailMode);
/// The row of an error of the client's own that says nothing of the server (an unexpected reply, a bad argument).
pub(crate) const ANY_OTHER: Failure = row("any other error", "other", Action::ErrorFailMode);

/// The row of redis-rs's error: the server's error reply by its text, else the condition it stands for.
pub(crate) fn classify_redis(err: &redis::RedisError) -> Failure {
    if let Some(text) = wire_text(err) {
        return classify_reply(&text);
    }
    if err.is_timeout() {
        TIMEOUT
    } else if err.is_connection_refusal() {
        CONNECTION_REFUSED
    } else if err.kind() == redis::ErrorKind::ClusterConnectionNotFound {
        row(
            "cluster unreachable",
            "cluster_unreachable",
            Action::FailMode,
        )
    } else if err.is_io_error() || err.is_connection_dropped() {
        row("connection reset", "connection", Action::FailMode)
    } else {
        ANY_OTHER
    }
}

/// A server's error reply as it was sent (`CODE detail`), or `None` for an error of the client's own (I/O, a
/// timeout, a parse failure).
pub fn wire_text(err: &redis::RedisError) -> Option<String> {
    use redis::ErrorKind as K;
    let from_server = matches!(
        err.kind(),
        K::ResponseError
            | K::ExecAbortError
            | K::BusyLoadingError
            | K::NoScriptError
            | K::Moved
            | K::Ask
            | K::TryAgain
            | K::ClusterDown
            | K::CrossSlot
            | K::MasterDown
            | K::ReadOnly
            | K::NotBusy
            | K::ExtensionError
    );
    if !from_server {
        return None;
    }
    let code = err.code()?;
    Some(match err.detail() {
        Some(detail) => format!("{code} {detail}"),
        None => code.to_owned(),
    })
}

/// An error's text for a log line, without the arguments a server quotes after it (they hold keys, so
/// identities).
pub fn summary(text: &str) -> String {
    text.split(", with args beginning with")
        .next()
        .unwrap_or(text)
        .to_owned()
}

/// Whether the server does not know the command sent: no module, or no FCALL (Redis 6.2). A command unknown to
/// a script's `redis.call` is not this: see [`is_time_refused`].
pub fn is_unknown_command(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    if lower.contains("from script") || lower.contains("from lua script") {
        return false;
    }
    lower.contains("unknown command") || lower.contains("doesn't exist in redis commands")
}

/// Whether Redis Functions cannot serve this client: no FCALL/FUNCTION (Redis 6.2), or an ACL user that may not
/// run them.
pub fn is_functions_unavailable(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("permissions to run the 'fcall'")
        || lower.contains("permissions to run the 'function")
        || is_unknown_command(text)
}

/// FCALL of a function the server does not hold: never loaded, or lost (FUNCTION FLUSH, a restart without
/// persistence, a failover).
pub fn is_function_missing(text: &str) -> bool {
    text.to_ascii_lowercase().contains("function not found")
}

/// FUNCTION LOAD refused because another client loaded the same library first.
pub fn is_library_loaded(text: &str) -> bool {
    text.to_ascii_lowercase().contains("already exists")
}

/// Whether a script or function call failed on a command the server refuses inside scripts (TIME: a provider's
/// rule, `rename-command`, an ACL). The script calls TIME before any write, so such a call wrote nothing.
pub fn is_time_refused(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("not allowed from script")
        || lower.contains("unknown command called from")
        || lower.contains("unknown redis command called from")
        || lower.contains("user executing the script can't run")
        || lower.contains("acl failure in script")
}

/// A plain `ERR` reply to FUNCTION LOAD that is not "already exists": the library cannot be loaded on this
/// server (it does not compile or register there), so the client goes on to the script.
pub fn is_library_refused(text: &str) -> bool {
    text.starts_with("ERR ") && !is_library_loaded(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_prefix_counts_only_with_its_line_number() {
        assert_eq!(
            classify_reply("ERR user_script:12: READONLY You can't write").row,
            "READONLY"
        );
        for text in [
            "ERR user_script:: READONLY x",
            "ERR user_script:x: READONLY x",
            "ERR user_script:1",
            "",
        ] {
            assert_eq!(classify_reply(text).row, "other ERR", "{text:?}");
        }
    }
}
