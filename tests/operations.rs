//! What operators see next to native commands: COMMAND INFO/DOCS, INFO tb, keyspace events, ACL, loading.

mod common;

use std::path::Path;

use common::Server;
use common::{acquire, acquire_error, block, charge, command_error, error_text, flat, lower};
use redis::Value;

/// The value that follows `name` in a flattened reply.
fn after<'a>(items: &'a [String], name: &str) -> &'a str {
    let at = items
        .iter()
        .position(|item| item == name)
        .unwrap_or_else(|| panic!("{name} in {items:?}"));
    &items[at + 1]
}

fn info_tb(conn: &mut redis::Connection) -> Vec<(String, String)> {
    let text: String = redis::cmd("INFO").arg("tb").query(conn).expect("INFO tb");
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn stat(stats: &[(String, String)], name: &str) -> f64 {
    stats
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("{name} in {stats:?}"))
        .1
        .parse()
        .expect("number")
}

/// Whether the server has `COMMAND DOCS` (7.0+), and with it `RedisModule_SetCommandInfo`.
fn has_command_docs(conn: &mut redis::Connection) -> bool {
    redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("GET")
        .query::<Value>(conn)
        .is_ok()
}

#[test]
fn command_info_describes_arity_flags_and_key() {
    let server = Server::start();
    let mut conn = server.conn();
    let info = flat(&mut conn, &["COMMAND", "INFO", "TB.ACQUIRE"]);
    assert_eq!(info[0], "tb.acquire");
    if !has_command_docs(&mut conn) {
        // Redis 6.2: no RedisModule_SetCommandInfo, so no arity or key spec; the module checks arity itself.
        println!("skipped: arity and key spec (this server has no RedisModule_SetCommandInfo)");
        assert!(info.contains(&"write".to_string()), "{info:?}");
        return;
    }
    assert_eq!(info[1], "-4");
    for flag in ["write", "fast"] {
        assert!(info.contains(&flag.to_string()), "{flag} in {info:?}");
    }
    // Not deny-oom: above maxmemory a call that writes nothing is answered (tests/maxmemory.rs).
    assert!(!info.contains(&"denyoom".to_string()), "{info:?}");
    // first key, last key, step.
    let at = info.iter().position(|item| item == "fast").expect("flags") + 1;
    assert_eq!(info[at..at + 3], ["1", "1", "1"], "{info:?}");
    // The key spec: read-write, update, index 1.
    assert!(
        info.contains(&"RW".to_string()) && info.contains(&"update".to_string()),
        "{info:?}"
    );
    assert_eq!(after(&info, "index"), "spec");
}

#[test]
fn command_docs_lists_summary_and_arguments() {
    let server = Server::start();
    let mut conn = server.conn();
    if !has_command_docs(&mut conn) {
        println!("skipped: this server has no COMMAND DOCS");
        return;
    }
    let docs = flat(&mut conn, &["COMMAND", "DOCS", "TB.ACQUIRE"]);
    assert!(after(&docs, "summary").contains("token bucket"), "{docs:?}");
    assert_eq!(after(&docs, "complexity"), "O(1)");
    assert_eq!(after(&docs, "since"), "0.1.0");
    assert_eq!(after(&docs, "group"), "module");
    assert!(docs.windows(2).any(|w| w == ["module", "tb"]), "{docs:?}");
    let names: Vec<&str> = docs
        .windows(4)
        .filter(|w| w[0] == "name" && w[2] == "type")
        .map(|w| w[1].as_str())
        .collect();
    assert_eq!(names, ["key", "rate", "burst", "cost"]);
    assert_eq!(after(&docs, "key"), "type");
    assert_eq!(docs.iter().filter(|item| *item == "double").count(), 3);
    assert_eq!(
        docs.last().map(String::as_str),
        Some("optional"),
        "cost is optional: {docs:?}"
    );
}

#[test]
fn info_tb_counts_outcomes() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire(&mut conn, "k", "0.001", "5", Some("2"));
    acquire(&mut conn, "k", "0.001", "5", Some("2.5"));
    acquire(&mut conn, "k", "0.001", "5", Some("2")); // denied: 0.5 left
    acquire(&mut conn, "k", "0.001", "5", Some("6")); // cost > burst
    acquire(&mut conn, "k", "0.001", "5", Some("0")); // peek
    acquire_error(&mut conn, &["k", "nope", "5"]);
    // A charge always lands (into debt here): neither a grant nor a denial. A zero charge is a peek, one beyond a
    // day of refill an error. Every block counts, also one that keeps a longer debt.
    charge(&mut conn, "k", "0.001", "5", "1.25");
    charge(&mut conn, "k", "0.001", "5", "0");
    command_error(&mut conn, "TB.CHARGE", &["k", "0.001", "5", "1000"]);
    block(&mut conn, "k", "0.001", "5", "1000");
    block(&mut conn, "b", "0.001", "5", "1000");
    command_error(&mut conn, "TB.BLOCK", &["b", "0.001", "5", "0"]);
    // Every lower that replies counts, also one that found the bucket already below its tokens.
    lower(&mut conn, "l", "0.001", "5", "2");
    lower(&mut conn, "l", "0.001", "5", "4");
    command_error(&mut conn, "TB.LOWER", &["l", "0.001", "5", "-100"]);
    let stats = info_tb(&mut conn);
    let expected = [
        ("tb_calls", 15.0),
        ("tb_allowed", 2.0),
        ("tb_denied", 1.0),
        ("tb_denied_cost_exceeds_burst", 1.0),
        ("tb_peeks", 2.0),
        ("tb_charges", 1.0),
        ("tb_blocks", 2.0),
        ("tb_lowers", 2.0),
        ("tb_errors", 4.0),
        ("tb_tokens_granted", 4.5),
        ("tb_tokens_charged", 1.25),
    ];
    for (name, value) in expected {
        assert_eq!(stat(&stats, name), value, "{name}: {stats:?}");
    }
    // Counted since the module loaded: CONFIG RESETSTAT leaves them (tests/hardening.rs).
    let outcomes = [
        "tb_allowed",
        "tb_reserved_with_wait",
        "tb_denied",
        "tb_denied_cost_exceeds_burst",
        "tb_peeks",
        "tb_refunds",
        "tb_refunds_ignored",
        "tb_charges",
        "tb_blocks",
        "tb_lowers",
        "tb_errors",
    ];
    let sum: f64 = outcomes.iter().map(|name| stat(&stats, name)).sum();
    assert_eq!(
        sum,
        stat(&stats, "tb_calls"),
        "the outcomes add up to the calls"
    );
    acquire(&mut conn, "k2", "1", "5", None);
    assert_eq!(stat(&info_tb(&mut conn), "tb_allowed"), 3.0);
}

#[test]
fn writes_fire_keyspace_events_and_denials_fire_none() {
    let server = Server::start();
    let mut conn = server.conn();
    let mut events = common::KeyspaceEvents::subscribe(&server);
    let mut next_event = || events.next();

    acquire(&mut conn, "bucket", "0.001", "2", Some("2"));
    assert_eq!(next_event(), ("bucket".to_string(), "hset".to_string()));
    assert_eq!(next_event(), ("bucket".to_string(), "expire".to_string()));
    // A denial and a peek fire nothing: the next event is the marker written after them.
    acquire(&mut conn, "bucket", "0.001", "2", Some("1"));
    acquire(&mut conn, "bucket", "0.001", "2", Some("0"));
    acquire(&mut conn, "fresh", "1", "2", Some("0"));
    // Charges and blocks fire what their writes replicate as; a zero charge, a block that keeps a longer debt and
    // a refused charge fire nothing.
    charge(&mut conn, "charged", "0.001", "2", "5");
    assert_eq!(next_event(), ("charged".to_string(), "hset".to_string()));
    assert_eq!(next_event(), ("charged".to_string(), "expire".to_string()));
    block(&mut conn, "blocked", "0.001", "2", "1000");
    assert_eq!(next_event(), ("blocked".to_string(), "hset".to_string()));
    assert_eq!(next_event(), ("blocked".to_string(), "expire".to_string()));
    // So does a lower that brings the bucket down; one that finds it already low enough fires nothing.
    lower(&mut conn, "lowered", "0.001", "2", "1");
    assert_eq!(next_event(), ("lowered".to_string(), "hset".to_string()));
    assert_eq!(next_event(), ("lowered".to_string(), "expire".to_string()));
    charge(&mut conn, "charged", "0.001", "2", "0");
    block(&mut conn, "charged", "0.001", "2", "1000");
    command_error(&mut conn, "TB.CHARGE", &["charged", "0.001", "2", "100"]);
    lower(&mut conn, "charged", "0.001", "2", "1");
    command_error(&mut conn, "TB.LOWER", &["lowered", "0.001", "2", "-100"]);
    let _: () = redis::cmd("SET")
        .arg("marker")
        .arg(1)
        .query(&mut conn)
        .expect("SET");
    assert_eq!(next_event(), ("marker".to_string(), "set".to_string()));
}

#[test]
fn acl_rules_grant_and_deny_the_command() {
    let server = Server::start();
    let mut admin = server.conn();
    let setuser = |conn: &mut redis::Connection, rules: &[&str]| {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(rules)
            .query(conn)
            .expect("ACL SETUSER");
    };
    // docs/operating.md's rule: every TB command by name.
    setuser(
        &mut admin,
        &[
            "limiter",
            "on",
            ">pw",
            "~*",
            "+tb.acquire",
            "+tb.acquireall",
            "+tb.charge",
            "+tb.block",
            "+tb.lower",
        ],
    );
    setuser(
        &mut admin,
        &["nolimit", "on", ">pw", "~*", "+@all", "-tb.acquire"],
    );
    let mut limiter = server.login("limiter", "pw");
    assert_eq!(acquire(&mut limiter, "k", "1", "5", None)[0], 1);
    assert_eq!(charge(&mut limiter, "k", "1", "5", "1")[0], 3);
    assert_eq!(block(&mut limiter, "k", "1", "5", "1")[0], 0);
    assert_eq!(lower(&mut limiter, "k", "1", "5", "-1")[0], 0);
    assert_eq!(
        common::acquire_all(&mut limiter, &["1", "all", "1", "5"])[0],
        1
    );
    let denied: redis::RedisResult<Value> = redis::cmd("HGETALL").arg("k").query(&mut limiter);
    assert!(error_text(&denied.expect_err("HGETALL is not granted")).starts_with("NOPERM"));
    let mut nolimit = server.login("nolimit", "pw");
    assert!(acquire_error(&mut nolimit, &["k", "1", "5"]).starts_with("NOPERM"));

    // Where the server lets modules declare ACL categories (Redis 7.2+, Valkey), the command is in
    // @write, @fast and the module's own @ratelimit; on Redis 7.0 it is in none, as docs/operating.md says.
    let categories: Vec<String> = redis::cmd("ACL")
        .arg("CAT")
        .query(&mut admin)
        .expect("ACL CAT");
    if categories.iter().any(|c| c == "ratelimit") {
        setuser(
            &mut admin,
            &["bycategory", "on", ">pw", "~*", "+@ratelimit"],
        );
        let mut by_category = server.login("bycategory", "pw");
        assert_eq!(acquire(&mut by_category, "k2", "1", "5", None)[0], 1);
        assert_eq!(
            common::acquire_all(&mut by_category, &["1", "all2", "1", "5"])[0],
            1
        );
        let fast: Vec<String> = redis::cmd("ACL")
            .arg("CAT")
            .arg("fast")
            .query(&mut admin)
            .expect("ACL CAT");
        assert_eq!(charge(&mut by_category, "k3", "1", "5", "1")[0], 4);
        assert_eq!(block(&mut by_category, "k3", "1", "5", "1")[0], 0);
        let ratelimit: Vec<String> = redis::cmd("ACL")
            .arg("CAT")
            .arg("ratelimit")
            .query(&mut admin)
            .expect("ACL CAT");
        for command in [
            "tb.acquire",
            "tb.acquireall",
            "tb.reserve",
            "tb.refund",
            "tb.acquireeach",
            "tb.acquireatmost",
            "tb.charge",
            "tb.block",
            "tb.lower",
        ] {
            assert!(fast.iter().any(|c| c == command), "{command} in {fast:?}");
            assert!(
                ratelimit.iter().any(|c| c == command),
                "{command} in {ratelimit:?}"
            );
        }
        assert_eq!(
            common::acquire_each(&mut by_category, &["each", "1", "5", "2"]).allowed,
            1
        );
        assert_eq!(
            common::acquire_at_most(&mut by_category, "atmost", "1", "5", "2")[0],
            2
        );
    }
}

#[test]
fn module_list_shows_the_version_and_unload_is_refused() {
    let server = Server::start_with(common::module_command_options(&[]));
    let mut conn = server.conn();
    let list = flat(&mut conn, &["MODULE", "LIST"]);
    // Other modules may be listed too (Valkey lists its built-in `lua`): look at ours.
    let ours = list
        .windows(2)
        .position(|w| w == ["name", "tb"])
        .expect("tb in MODULE LIST");
    let list = &list[ours..];
    let version: Vec<i64> = env!("CARGO_PKG_VERSION")
        .split('.')
        .map(|p| p.parse().expect("digit"))
        .collect();
    let expected = version[0] * 10_000 + version[1] * 100 + version[2];
    assert_eq!(after(list, "ver"), expected.to_string());

    // Unloading is refused (tests/hardening.rs has why); the command stays.
    acquire(&mut conn, "k", "0.001", "5", Some("3"));
    let refused: redis::RedisResult<()> = redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("tb")
        .query(&mut conn);
    assert!(error_text(&refused.expect_err("MODULE UNLOAD is refused")).starts_with("ERR"));
    assert_eq!(acquire(&mut conn, "k", "0.001", "5", Some("0"))[1], 2);
}

#[test]
fn unknown_module_argument_refuses_to_load() {
    let (refused, text) = common::start_refused(&[], &["no-such-option"]);
    assert!(refused, "the server must refuse to start:\n{text}");
    assert!(
        text.contains("refusing to load: unknown module argument 'no-such-option'"),
        "{text}"
    );
}

/// The README's Python snippet (`examples/ratelimit.py`) against a spawned server.
#[test]
fn python_client_example_runs() {
    let server = Server::start();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ratelimit.py");
    common::run_example(
        &common::python_binary(),
        &example,
        &server,
        "python client example: ok",
    );
}

/// The harness's own guard: a server answering on a port is taken for the one a test spawned only when its
/// process id is that one's, and no port is handed out twice in one process. Without it, a test whose server lost
/// its port to another test's could run against that one and fail once the other test stopped it.
#[test]
fn the_harness_knows_its_own_server() {
    let server = Server::start();
    assert!(tb_test_support::answers_as(server.port, server.pid()));
    assert!(!tb_test_support::answers_as(server.port, server.pid() + 1));
    let ports: Vec<u16> = (0..500).map(|_| common::free_port()).collect();
    let distinct: std::collections::HashSet<&u16> = ports.iter().collect();
    assert_eq!(distinct.len(), ports.len());
    assert!(!ports.contains(&server.port));
}
