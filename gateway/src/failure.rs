//! The failure table of docs/clients.md ("When Redis fails"), as tb-rls answers it. Pure: it reads an error and
//! says which kind it is; `backend` acts on the answer. `fixtures/failures.json` holds the table's example
//! replies; the Python and Node packages classify the same texts alike.
//!
//! ```text
//! fixture action     tb-rls          answered      health            log
//! fail-mode          Failure::Outage  UNAVAILABLE   NOT_SERVING (2 s)  warning, at most once a second
//! error-fail-mode    Failure::Config  INTERNAL      unchanged          error, at most once a second
//! reload-retry       Failure::Config  INTERNAL      unchanged          error, at most once a second
//! script-retry       Failure::Config  INTERNAL      unchanged          error, at most once a second
//! ```
//!
//! Envoy's `failure_mode_deny` decides the request either way. The two retry rows are the packages' way back from
//! a missing script or module; tb-rls sends only `TB.ACQUIREEACH` and has no script to fall back on, so there a
//! missing module is a configuration error like the others: it does not go away by itself.
#![forbid(unsafe_code)]

/// What a failed call means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Redis cannot serve now (no connection, a timeout, a failover, a full server...): passes by itself.
    Outage,
    /// Anything else (a password, an ACL, a key of another type, the module missing, an error tb-rls does not
    /// know): does not pass by itself.
    Config,
}

/// Error codes, first word of a reply, of a server that cannot take the call now.
const OUTAGE_CODES: [&str; 11] = [
    "CLUSTERDOWN",
    "MASTERDOWN",
    "LOADING",
    "BUSY",
    "READONLY",
    "OOM",
    "NOREPLICAS",
    "MISCONF",
    "MOVED",
    "ASK",
    "TRYAGAIN",
];

/// The one `ERR` reply that is an outage: the server's `maxclients` is reached.
const TOO_MANY_CLIENTS: &str = "ERR max number of clients reached";

/// A command refused inside a script comes back as the script's error (`ERR user_script:795: OOM ...`).
const SCRIPT_PREFIX: &str = "ERR user_script:";

/// The kind of an error reply: `line` as Redis sends it, without the leading `-`.
pub fn classify_reply(line: &str) -> Failure {
    let line = without_script_prefix(line);
    let code = line.split(' ').next().unwrap_or_default();
    if line.starts_with(TOO_MANY_CLIENTS) || OUTAGE_CODES.contains(&code) {
        Failure::Outage
    } else {
        Failure::Config
    }
}

/// The kind of what a redis-rs call failed with: a lost, refused or timed-out connection is an outage; a
/// server's reply goes by `classify_reply`; any other client-side error is a configuration error.
pub fn classify(err: &redis::RedisError) -> Failure {
    if err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.kind() == redis::ErrorKind::ClusterConnectionNotFound
    {
        return Failure::Outage;
    }
    match err.code() {
        Some(code) => classify_reply(&format!("{code} {}", err.detail().unwrap_or_default())),
        None => Failure::Config,
    }
}

/// `line` without a leading `ERR user_script:<digits>: `, or `line` itself.
fn without_script_prefix(line: &str) -> &str {
    let Some(rest) = line.strip_prefix(SCRIPT_PREFIX) else {
        return line;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    match rest.get(digits..).and_then(|tail| tail.strip_prefix(": ")) {
        Some(inner) if digits > 0 => inner,
        _ => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply parsed as redis-rs parses it off the wire.
    fn parsed(line: &str) -> redis::RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(err)) => err.into(),
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn every_reply_of_the_shared_fixture_gets_its_action() {
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("../../fixtures/failures.json"))
                .expect("fixtures/failures.json parses");
        let cases = fixture["cases"].as_array().expect("cases");
        let mut checked = 0;
        for case in cases {
            let Some(reply) = case["reply"].as_str() else {
                continue;
            };
            let expected = match case["action"].as_str().expect("an action") {
                "fail-mode" => Failure::Outage,
                "error-fail-mode" | "reload-retry" | "script-retry" => Failure::Config,
                other => panic!("an action this table does not map: {other}"),
            };
            assert_eq!(classify_reply(reply), expected, "{reply}");
            assert_eq!(
                classify(&parsed(reply)),
                expected,
                "{reply} through redis-rs"
            );
            checked += 1;
        }
        assert!(checked >= 30, "{checked} replies");
    }

    #[test]
    fn a_script_prefix_counts_only_with_its_line_number() {
        assert_eq!(
            classify_reply("ERR user_script:12: READONLY You can't write"),
            Failure::Outage
        );
        assert_eq!(
            classify_reply("ERR user_script:: READONLY x"),
            Failure::Config
        );
        assert_eq!(
            classify_reply("ERR user_script:x: READONLY x"),
            Failure::Config
        );
        assert_eq!(classify_reply("ERR user_script:1"), Failure::Config);
        assert_eq!(classify_reply(""), Failure::Config);
    }

    #[test]
    fn client_side_errors_are_outages_when_the_connection_failed() {
        let io = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        ));
        assert_eq!(classify(&io), Failure::Outage);
        let timeout =
            redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "slow"));
        assert_eq!(classify(&timeout), Failure::Outage);
        let typed = redis::RedisError::from((redis::ErrorKind::TypeError, "not an integer"));
        assert_eq!(classify(&typed), Failure::Config);
        let auth = redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, "no password"));
        assert_eq!(classify(&auth), Failure::Config);
    }
}
