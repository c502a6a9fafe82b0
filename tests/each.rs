//! TB.ACQUIREEACH (several buckets, each with its own cost, all or nothing, a result per bucket) and
//! TB.ACQUIREATMOST (up to `max` whole tokens) against a real server: replies, writes and expiry, errors that
//! change nothing, INFO tb, keyspace events and the command's self-description. Replication and AOF reloads
//! without the module run them through the harness's mixed workload (tests/replication.rs,
//! tests/persistence.rs); cluster routing is in tests/cluster.rs, ACL key permissions in tests/hardening.rs.

mod common;

use common::{
    acquire, acquire_all, acquire_at_most, acquire_each, command_error, flat, hgetall, info_int,
    pexpiretime, ping, EachReply, Expiry, Server, Stopwatch,
};
use redis::Value;

const EACH_ARITY: &str = "ERR wrong number of arguments for 'tb.acquireeach' command";
const AT_MOST_ARITY: &str = "ERR wrong number of arguments for 'tb.acquireatmost' command";
const MAX_TEXT: &str = "ERR max must be an integer from 1 to 9007199254740992";

/// A bucket's hash and expiry, to show a refused call changed nothing.
fn snapshot(conn: &mut redis::Connection, key: &str) -> (Vec<(String, String)>, Expiry) {
    (hgetall(conn, key), pexpiretime(conn, key))
}

fn in_range(value: i64, low: i64, high: i64) -> bool {
    (low..=high).contains(&value)
}

#[test]
fn each_takes_every_own_cost_or_none_and_reports_every_bucket() {
    let server = Server::start();
    let mut conn = server.conn();
    // requests: burst 3, bytes: burst 2,000; both refill one token per 1000 s, so nothing refills meaningfully
    // while the test runs. A waiting time or reset is then `missing tokens · 1,000,000 ms`, minus the few ms the
    // test has been running.
    let first = acquire_each(
        &mut conn,
        &["req", "0.001", "3", "1", "bytes", "0.001", "2000", "1500"],
    );
    assert_eq!(
        first,
        EachReply {
            allowed: 1,
            limiting_index: 0,
            buckets: vec![[1, 2, 0, 1_000_000], [1, 500, 0, 1_500_000_000]],
        }
    );
    let before = (snapshot(&mut conn, "req"), snapshot(&mut conn, "bytes"));
    // bytes holds 500 < 1,000: nothing is taken, req reports as it stands (fits, 2 left), bytes its own wait.
    let refused = acquire_each(
        &mut conn,
        &["req", "0.001", "3", "1", "bytes", "0.001", "2000", "1000"],
    );
    assert_eq!((refused.allowed, refused.limiting_index), (0, 1));
    let [req, bytes] = [refused.buckets[0], refused.buckets[1]];
    assert_eq!(req[..3], [1, 2, 0]);
    assert!(in_range(req[3], 999_000, 1_000_000), "{refused:?}");
    assert_eq!(bytes[..2], [0, 500]);
    assert!(in_range(bytes[2], 499_999_000, 500_000_000), "{refused:?}");
    assert!(
        in_range(bytes[3], 1_499_999_000, 1_500_000_000),
        "{refused:?}"
    );
    assert_eq!(
        (snapshot(&mut conn, "req"), snapshot(&mut conn, "bytes")),
        before
    );
    // Each bucket's reply is what TB.ACQUIRE says of it alone: a peek of req, the same denial for bytes.
    assert_eq!(acquire(&mut conn, "req", "0.001", "3", Some("0"))[1], 2);
    assert_eq!(
        acquire(&mut conn, "bytes", "0.001", "2000", Some("1000"))[..2],
        [0, 500]
    );
    // A cost above a bucket's burst decides first and answers -1; a cost of 0 reports without taking.
    let impossible = acquire_each(
        &mut conn,
        &[
            "bytes", "0.001", "2000", "1000", "req", "0.001", "3", "4", "fresh", "1", "5", "0",
        ],
    );
    assert_eq!((impossible.allowed, impossible.limiting_index), (0, 1));
    assert_eq!(impossible.buckets[1][..3], [0, 2, -1]);
    assert_eq!(impossible.buckets[2], [1, 5, 0, 0]);
    let reports = acquire_each(
        &mut conn,
        &["req", "0.001", "3", "0", "fresh", "1", "5", "0"],
    );
    assert_eq!((reports.allowed, reports.limiting_index), (1, 0));
    assert_eq!(reports.buckets[1], [1, 5, 0, 0]);
    assert_eq!(hgetall(&mut conn, "fresh"), []);
    assert_eq!(
        (snapshot(&mut conn, "req"), snapshot(&mut conn, "bytes")),
        before
    );
}

#[test]
fn each_with_one_cost_matches_acquireall() {
    let server = Server::start();
    let mut conn = server.conn();
    let shapes = [
        ("u", "0.001", "2"),
        ("t", "0.001", "5"),
        ("g", "0.001", "3.5"),
    ];
    for round in 0..5 {
        let cost = ["1", "0.5", "2", "0", "1"][round];
        let mut each_args: Vec<String> = Vec::new();
        let mut all_args: Vec<String> = vec![cost.to_string()];
        for (key, rate, burst) in shapes {
            each_args.extend([
                format!("each:{{{key}}}"),
                rate.into(),
                burst.into(),
                cost.into(),
            ]);
            all_args.extend([format!("all:{{{key}}}"), rate.into(), burst.into()]);
        }
        let each_args: Vec<&str> = each_args.iter().map(String::as_str).collect();
        let all_args: Vec<&str> = all_args.iter().map(String::as_str).collect();
        let each = acquire_each(&mut conn, &each_args);
        let all = acquire_all(&mut conn, &all_args);
        assert_eq!(
            (each.allowed, each.limiting_index),
            (all[0], all[4]),
            "round {round}"
        );
        let remaining = each.buckets.iter().map(|b| b[1]).min();
        assert_eq!(remaining, Some(all[1]), "round {round}");
        for (key, _, _) in shapes {
            // The two calls ran a few microseconds apart: the same tokens, give or take that refill.
            let tokens = |conn: &mut redis::Connection, prefix: &str| -> Option<f64> {
                hgetall(conn, &format!("{prefix}:{{{key}}}"))
                    .into_iter()
                    .find(|(field, _)| field == "tokens")
                    .map(|(_, value)| value.parse().expect("tokens"))
            };
            let (each, all) = (tokens(&mut conn, "each"), tokens(&mut conn, "all"));
            assert_eq!(each.is_some(), all.is_some(), "round {round}, {key}");
            if let (Some(each), Some(all)) = (each, all) {
                assert!(
                    (each - all).abs() < 1e-3,
                    "round {round}, {key}: {each} {all}"
                );
            }
        }
    }
}

#[test]
fn each_writes_only_what_it_takes_and_expires_each_bucket_when_full() {
    let server = Server::start();
    let mut conn = server.conn();
    let reply = acquire_each(
        &mut conn,
        &[
            "fast", "10", "5", "1", "slow", "1", "5", "1", "report", "1", "5", "0",
        ],
    );
    assert_eq!(reply.allowed, 1);
    let fast = pexpiretime(&mut conn, "fast").at_ms;
    let slow = pexpiretime(&mut conn, "slow").at_ms;
    // One token refills in 100 ms for `fast`, 1 s for `slow`; both keys may outlive that by their 1 s slack.
    assert!(in_range(slow - fast, 850, 950), "{fast} {slow}");
    assert_eq!(
        hgetall(&mut conn, "report"),
        [],
        "a cost of 0 writes nothing"
    );
}

#[test]
fn each_errors_name_their_argument_and_change_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire_each(&mut conn, &["a", "0.001", "5", "1", "b", "0.001", "5", "2"]);
    let before = (snapshot(&mut conn, "a"), snapshot(&mut conn, "b"));
    let _: () = redis::cmd("SET")
        .arg("s")
        .arg("x")
        .query(&mut conn)
        .expect("SET");
    let _: i64 = redis::cmd("HSET")
        .arg("h")
        .arg("x")
        .arg("1")
        .query(&mut conn)
        .expect("HSET");
    let errors_before = info_int(&mut conn, "tb", "tb_errors");
    let cases: [(&[&str], &str); 12] = [
        (&["a", "1", "5", "1", "a", "1", "5", "1"], "ERR each key may appear only once"),
        (&["a", "1", "5", "1", "b", "1", "5"], EACH_ARITY),
        (&["a", "1", "5", "1", "b"], EACH_ARITY),
        (&["a", "0", "5", "1"], "ERR rate must be a positive number"),
        (&["a", "1", "inf", "1"], "ERR burst must be a positive number"),
        (&["a", "1", "5", "-1"], "ERR cost must be a non-negative number"),
        (&["a", "1", "5", "nan"], "ERR cost must be a non-negative number"),
        // The first bad argument is reported, in argument order.
        (&["a", "1", "5", "1", "b", "1", "5", "x"], "ERR cost must be a non-negative number"),
        (&["a", "1", "5", "x", "b", "x", "5", "1"], "ERR cost must be a non-negative number"),
        (&["a", "1", "5", "1", "b", "1e400", "5", "1"], "ERR rate must be a positive number"),
        (
            &["a", "1", "5", "1", "s", "1", "5", "1"],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            &["a", "1", "5", "1", "h", "1", "5", "1"],
            "ERR key is not a valid token bucket (expected a hash with only the fields tokens and ts)",
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(
            command_error(&mut conn, "TB.ACQUIREEACH", args),
            expected,
            "{args:?}"
        );
    }
    // 1,001 buckets: refused before any key is opened.
    let mut many: Vec<String> = Vec::new();
    for n in 0..1_001 {
        many.extend([format!("m{n}"), "1".into(), "5".into(), "1".into()]);
    }
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(
        command_error(&mut conn, "TB.ACQUIREEACH", &many),
        "ERR too many buckets: TB.ACQUIREEACH takes at most 1000"
    );
    assert_eq!(
        info_int(&mut conn, "tb", "tb_errors") - errors_before,
        13,
        "every refusal the module answered counts as an error"
    );
    // Too few arguments: refused by the server's arity check (-5) where it has one, else by the module.
    assert_eq!(
        command_error(&mut conn, "TB.ACQUIREEACH", &["a", "1", "5"]),
        EACH_ARITY
    );
    assert_eq!((snapshot(&mut conn, "a"), snapshot(&mut conn, "b")), before);
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut conn).expect("DBSIZE");
    assert_eq!(dbsize, 4, "only a, b, s and h exist");
    // 1,000 buckets are accepted.
    let cap: Vec<&str> = many[..4_000].to_vec();
    assert_eq!(acquire_each(&mut conn, &cap).buckets.len(), 1_000);
    ping(&mut conn);
}

#[test]
fn at_most_takes_what_is_there_up_to_max() {
    let server = Server::start();
    let mut conn = server.conn();
    // burst 5, one token per 1000 s.
    assert_eq!(
        acquire_at_most(&mut conn, "k", "0.001", "5", "3"),
        [3, 2, 0, 3_000_000]
    );
    let taken = acquire_at_most(&mut conn, "k", "0.001", "5", "10");
    assert_eq!(taken[..3], [2, 0, 0]);
    assert!(in_range(taken[3], 4_999_000, 5_000_000), "{taken:?}");
    let before = snapshot(&mut conn, "k");
    let empty = acquire_at_most(&mut conn, "k", "0.001", "5", "1");
    assert_eq!(empty[..2], [0, 0]);
    assert!(in_range(empty[2], 999_000, 1_000_000), "{empty:?}");
    assert_eq!(
        snapshot(&mut conn, "k"),
        before,
        "nothing granted, nothing written"
    );
    // A fraction of a token is not granted; a burst below one token never grants (-1).
    acquire(&mut conn, "half", "0.001", "2", Some("1.5"));
    let half = acquire_at_most(&mut conn, "half", "0.001", "2", "4");
    assert_eq!(half[..2], [0, 0]);
    // The wait is 500 s less whatever passed between the two calls.
    assert!(in_range(half[2], 499_000, 500_000), "{half:?}");
    assert_eq!(
        acquire_at_most(&mut conn, "tiny", "1", "0.5", "1"),
        [0, 0, -1, 0]
    );
    assert_eq!(hgetall(&mut conn, "tiny"), []);
    // A bucket in debt (a reservation made with a wait) holds no whole token.
    let watch = Stopwatch::start();
    for _ in 0..2 {
        let reserved: Vec<i64> = redis::cmd("TB.RESERVE")
            .arg(&["debt", "10", "2", "2", "1000"])
            .query(&mut conn)
            .expect("TB.RESERVE");
        assert_eq!(reserved[0], 1);
    }
    // Two tokens of debt at 10/s: one whole token is there after about 300 ms.
    let in_debt = acquire_at_most(&mut conn, "debt", "10", "2", "1");
    assert_eq!(in_debt[..2], [0, 0]);
    assert!(watch.since(300).contains(&in_debt[2]), "{in_debt:?}");
    // max 2^53 on a huge burst: exactly 2^53 tokens.
    assert_eq!(
        acquire_at_most(&mut conn, "huge", "1", "1e300", "9007199254740992")[0],
        9_007_199_254_740_992
    );
}

#[test]
fn at_most_errors_name_their_argument_and_change_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire_at_most(&mut conn, "k", "0.001", "5", "2");
    let before = snapshot(&mut conn, "k");
    let cases: [(&[&str], &str); 11] = [
        (&["k", "1", "5"], AT_MOST_ARITY),
        (&["k", "1", "5", "1", "1"], AT_MOST_ARITY),
        (&["k", "0", "5", "1"], "ERR rate must be a positive number"),
        (
            &["k", "1", "-5", "1"],
            "ERR burst must be a positive number",
        ),
        (&["k", "1", "5", "0"], MAX_TEXT),
        (&["k", "1", "5", "-1"], MAX_TEXT),
        (&["k", "1", "5", "1.5"], MAX_TEXT),
        (&["k", "1", "5", "1e3"], MAX_TEXT),
        (&["k", "1", "5", "9007199254740993"], MAX_TEXT),
        (&["k", "1", "5", "abc"], MAX_TEXT),
        (&["k", "1", "5", ""], MAX_TEXT),
    ];
    for (args, expected) in cases {
        assert_eq!(
            command_error(&mut conn, "TB.ACQUIREATMOST", args),
            expected,
            "{args:?}"
        );
    }
    let _: () = redis::cmd("SET")
        .arg("s")
        .arg("x")
        .query(&mut conn)
        .expect("SET");
    assert_eq!(
        command_error(&mut conn, "TB.ACQUIREATMOST", &["s", "1", "5", "1"]),
        "WRONGTYPE Operation against a key holding the wrong kind of value"
    );
    assert_eq!(snapshot(&mut conn, "k"), before);
    ping(&mut conn);
}

#[test]
fn info_tb_counts_each_call_once() {
    let server = Server::start();
    let mut conn = server.conn();
    let stat = |conn: &mut redis::Connection, name: &str| -> f64 {
        common::info_field(conn, "tb", name)
            .unwrap_or_else(|| panic!("{name} in INFO tb"))
            .parse()
            .expect("number")
    };
    // Allowed: counts the largest cost it took from one bucket (as TB.ACQUIREALL counts its cost once).
    acquire_each(
        &mut conn,
        &["a", "0.001", "10", "2", "b", "0.001", "10", "7.5"],
    );
    // Denied (b holds 2.5), cost above a burst, and costs of 0 only (a peek).
    acquire_each(
        &mut conn,
        &["a", "0.001", "10", "1", "b", "0.001", "10", "3"],
    );
    acquire_each(
        &mut conn,
        &["a", "0.001", "10", "11", "b", "0.001", "10", "1"],
    );
    acquire_each(
        &mut conn,
        &["a", "0.001", "10", "0", "b", "0.001", "10", "0"],
    );
    // A partial grant counts as allowed with the tokens it took; nothing to take is a denial, and a burst below
    // one token can never grant.
    assert_eq!(acquire_at_most(&mut conn, "b", "0.001", "10", "5")[0], 2);
    assert_eq!(acquire_at_most(&mut conn, "b", "0.001", "10", "5")[0], 0);
    assert_eq!(acquire_at_most(&mut conn, "c", "1", "0.5", "5")[0], 0);
    command_error(&mut conn, "TB.ACQUIREATMOST", &["c", "1", "5", "0"]);
    let expected = [
        ("tb_calls", 8.0),
        ("tb_allowed", 2.0),
        ("tb_denied", 2.0),
        ("tb_denied_cost_exceeds_burst", 2.0),
        ("tb_peeks", 1.0),
        ("tb_errors", 1.0),
        ("tb_tokens_granted", 9.5),
    ];
    for (name, value) in expected {
        assert_eq!(stat(&mut conn, name), value, "{name}");
    }
}

#[test]
fn writes_fire_the_native_keyspace_events_and_refusals_none() {
    let server = Server::start();
    let mut conn = server.conn();
    let mut events = common::KeyspaceEvents::subscribe(&server);
    let mut next_event = || events.next();
    let event = |key: &str, name: &str| (key.to_string(), name.to_string());

    acquire_each(
        &mut conn,
        &["x", "0.001", "2", "2", "peeked", "1", "2", "0"],
    );
    assert_eq!(next_event(), event("x", "hset"));
    assert_eq!(next_event(), event("x", "expire"));
    acquire_at_most(&mut conn, "y", "0.001", "2", "5");
    assert_eq!(next_event(), event("y", "hset"));
    assert_eq!(next_event(), event("y", "expire"));
    // A refused ACQUIREEACH, an empty ACQUIREATMOST and an error fire nothing.
    acquire_each(&mut conn, &["z", "0.001", "2", "1", "x", "0.001", "2", "1"]);
    acquire_at_most(&mut conn, "y", "0.001", "2", "1");
    command_error(&mut conn, "TB.ACQUIREEACH", &["z", "1", "2", "-1"]);
    let _: () = redis::cmd("SET")
        .arg("marker")
        .arg(1)
        .query(&mut conn)
        .expect("SET");
    assert_eq!(next_event(), event("marker", "set"));
}

#[test]
fn commands_describe_their_keys_and_arguments() {
    let server = Server::start();
    let mut conn = server.conn();
    let info = flat(
        &mut conn,
        &["COMMAND", "INFO", "TB.ACQUIREEACH", "TB.ACQUIREATMOST"],
    );
    assert!(info.contains(&"tb.acquireeach".to_string()), "{info:?}");
    assert!(info.contains(&"tb.acquireatmost".to_string()), "{info:?}");
    let has_docs = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("GET")
        .query::<Value>(&mut conn)
        .is_ok();
    if !has_docs {
        // Redis 6.2: no key specs or docs; the legacy key triple still names every key.
        println!(
            "skipped: arity, key specs and docs (this server has no RedisModule_SetCommandInfo)"
        );
    } else {
        let each = flat(&mut conn, &["COMMAND", "INFO", "TB.ACQUIREEACH"]);
        assert_eq!(each[..2], ["tb.acquireeach", "-5"]);
        let at = each.iter().position(|item| item == "fast").expect("flags") + 1;
        assert_eq!(each[at..at + 3], ["1", "-1", "4"], "{each:?}");
        let at_most = flat(&mut conn, &["COMMAND", "INFO", "TB.ACQUIREATMOST"]);
        assert_eq!(at_most[..2], ["tb.acquireatmost", "5"]);
        let docs = flat(&mut conn, &["COMMAND", "DOCS", "TB.ACQUIREEACH"]);
        let names: Vec<&str> = docs
            .windows(4)
            .filter(|w| w[0] == "name" && w[2] == "type")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(
            names,
            ["bucket", "key", "rate", "burst", "cost"],
            "{docs:?}"
        );
        let docs = flat(&mut conn, &["COMMAND", "DOCS", "TB.ACQUIREATMOST"]);
        let names: Vec<&str> = docs
            .windows(4)
            .filter(|w| w[0] == "name" && w[2] == "type")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(names, ["key", "rate", "burst", "max"], "{docs:?}");
        assert!(docs.contains(&"integer".to_string()), "{docs:?}");
    }
    let keys = flat(
        &mut conn,
        &[
            "COMMAND",
            "GETKEYS",
            "TB.ACQUIREEACH",
            "a",
            "1",
            "5",
            "1",
            "b",
            "1",
            "5",
            "0",
            "c",
            "1",
            "5",
            "2",
        ],
    );
    assert_eq!(keys, ["a", "b", "c"]);
    let keys = flat(
        &mut conn,
        &["COMMAND", "GETKEYS", "TB.ACQUIREATMOST", "k", "1", "5", "3"],
    );
    assert_eq!(keys, ["k"]);
}

#[test]
fn each_and_at_most_work_inside_multi_and_lua() {
    let server = Server::start();
    let mut conn = server.conn();
    let replies: (Value, Vec<i64>) = redis::pipe()
        .atomic()
        .cmd("TB.ACQUIREEACH")
        .arg(&["m1", "0.001", "5", "2", "m2", "0.001", "5", "1"])
        .cmd("TB.ACQUIREATMOST")
        .arg(&["m1", "0.001", "5", "10"])
        .query(&mut conn)
        .expect("MULTI/EXEC");
    assert_eq!(EachReply::from_value(&replies.0).allowed, 1);
    assert_eq!(replies.1[..2], [3, 0]);
    let from_lua: redis::RedisResult<Value> = redis::Script::new(
        "return redis.call('TB.ACQUIREEACH', KEYS[1], '0.001', '5', '1', KEYS[2], '0.001', '5', '5')",
    )
    .key("m2")
    .key("m3")
    .invoke(&mut conn);
    if common::scripts_refused(&mut conn) {
        // Redis 6.2 refuses TB commands inside scripts (tests/scripts.rs).
        common::assert_script_refused(from_lua);
        return;
    }
    let reply = EachReply::from_value(&from_lua.expect("EVAL"));
    assert_eq!(
        (reply.allowed, reply.buckets[0][1], reply.buckets[1][1]),
        (1, 3, 0)
    );
}
