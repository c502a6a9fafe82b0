//! `TB.RESERVE` (take now, act after a bounded wait, first come first served) and `TB.REFUND` (give back tokens
//! for work that did not happen), issue #15: replies, debt, errors, replication without the module, INFO,
//! command docs, and fair slots under many concurrent clients.

mod common;

use std::thread;

use common::{
    acquire, buckets, command_error, hgetall, info_int, pexpiretime, ping, primary_options,
    replica_of, untouched, wait_acked, wait_replicas_online, wrong_keys, Server, Stopwatch,
};
use redis::Value;

/// `TB.RESERVE key rate burst cost max_wait_ms`, expecting its 4 integers.
fn reserve(
    conn: &mut redis::Connection,
    key: &str,
    rate: &str,
    burst: &str,
    cost: &str,
    max_wait_ms: &str,
) -> [i64; 4] {
    let reply: Vec<i64> = redis::cmd("TB.RESERVE")
        .arg(key)
        .arg(rate)
        .arg(burst)
        .arg(cost)
        .arg(max_wait_ms)
        .query(conn)
        .expect("TB.RESERVE reply");
    reply.try_into().expect("four integers")
}

/// `TB.REFUND key rate burst amount`, expecting its 3 integers.
fn refund(
    conn: &mut redis::Connection,
    key: &str,
    rate: &str,
    burst: &str,
    amount: &str,
) -> [i64; 3] {
    let reply: Vec<i64> = redis::cmd("TB.REFUND")
        .arg(key)
        .arg(rate)
        .arg(burst)
        .arg(amount)
        .query(conn)
        .expect("TB.REFUND reply");
    reply.try_into().expect("three integers")
}

/// The issue's example: burst 2, 10 tokens/s, full. Five reservations in a row wait 0, 0, 100, 200 and 300 ms,
/// and the bucket is left 3 tokens in debt.
#[test]
fn reservations_get_increasing_slots() {
    let server = Server::start();
    let mut conn = server.conn();
    let mut pipe = redis::pipe();
    pipe.atomic();
    for _ in 0..5 {
        pipe.cmd("TB.RESERVE")
            .arg("q")
            .arg(10)
            .arg(2)
            .arg(1)
            .arg(1_000);
    }
    // TB.ACQUIRE on a bucket in debt is denied, its retry counting the debt; a peek is still allowed.
    pipe.cmd("TB.ACQUIRE").arg("q").arg(10).arg(2);
    pipe.cmd("TB.ACQUIRE").arg("q").arg(10).arg(2).arg(0);
    let watch = Stopwatch::start();
    let mut replies: Vec<Vec<i64>> = pipe.query(&mut conn).expect("MULTI");
    // Each command reads the clock: the calls run back to back inside the transaction, but a busy machine may
    // hold the server between two of them. No more than the whole round trip, and at least 2 ms.
    let late = watch.ms().max(2);
    let peek = replies.pop().expect("peek");
    let denied = replies.pop().expect("acquire");
    // Each wait is its slot, 100 ms apart, seen from a moment a little later than the first call's.
    let waits: Vec<i64> = replies.iter().map(|reply| reply[1]).collect();
    for (wait, slot) in waits.iter().zip([0, 0, 100, 200, 300]) {
        assert!(
            (slot - late..=slot).contains(wait) && (*wait > 0) == (slot > 0),
            "{replies:?} (late {late} ms)"
        );
    }
    let remaining: Vec<i64> = replies.iter().map(|reply| reply[2]).collect();
    assert_eq!(remaining, [1, 0, 0, 0, 0], "never below 0, even in debt");
    assert!(replies.iter().all(|reply| reply[0] == 1));
    // Full again once the debt of 3 is repaid and 2 more tokens came: 500 ms.
    assert!((500 - late..=500).contains(&replies[4][3]), "{replies:?}");
    assert_eq!(denied[..2], [0, 0]);
    assert!((400 - late..=400).contains(&denied[2]), "{denied:?}");
    assert_eq!(peek[..3], [1, 0, 0]);
    let fields = hgetall(&mut conn, "q");
    let tokens: f64 = fields[0].1.parse().expect("tokens");
    // The debt of 3, less what 10/s refilled between the first call and the last write.
    assert!(
        (-3.0..=-3.0 + 0.01 * late as f64).contains(&tokens),
        "{fields:?}"
    );
    // The key outlives the repaid debt.
    assert!(pexpiretime(&mut conn, "q").at_ms > common::server_now_ms(&mut conn) + 490);
}

/// A wait beyond `max_wait_ms` takes nothing and writes nothing, and says how long it would have been;
/// `cost > burst` is never granted; `max_wait_ms 0` decides exactly as `TB.ACQUIRE`.
#[test]
fn refusals_change_nothing_and_max_wait_zero_is_acquire() {
    let server = Server::start();
    let mut conn = server.conn();
    let watch = common::Stopwatch::start();
    assert_eq!(reserve(&mut conn, "k", "1", "2", "2", "0")[..3], [1, 0, 0]);
    let before = (hgetall(&mut conn, "k"), pexpiretime(&mut conn, "k"));
    let dirty = info_int(&mut conn, "persistence", "rdb_changes_since_last_save");
    let refused = reserve(&mut conn, "k", "1", "2", "1", "500");
    // The drained bucket is about 1 s from a token, less the round trips since it was drained.
    assert_eq!(refused[0], 0, "{refused:?}");
    assert!(watch.since(1_000).contains(&refused[1]), "{refused:?}");
    let impossible = reserve(&mut conn, "k", "1", "2", "3", "86400000");
    assert_eq!(impossible[..3], [0, -1, 0]);
    let peek = reserve(&mut conn, "k", "1", "2", "0", "10");
    assert_eq!(peek[..3], [1, 0, 0]);
    assert_eq!(
        (hgetall(&mut conn, "k"), pexpiretime(&mut conn, "k")),
        before
    );
    assert_eq!(
        info_int(&mut conn, "persistence", "rdb_changes_since_last_save"),
        dirty
    );

    // Same history on two keys, one driven by TB.ACQUIRE, the other by TB.RESERVE ... 0, in one transaction
    // (the same instant, to the microsecond or so).
    let mut pipe = redis::pipe();
    pipe.atomic();
    for cost in ["1", "1", "0.5", "1", "0", "3"] {
        pipe.cmd("TB.ACQUIRE").arg("a").arg(1).arg(2).arg(cost);
        pipe.cmd("TB.RESERVE")
            .arg("r")
            .arg(1)
            .arg(2)
            .arg(cost)
            .arg(0);
    }
    let replies: Vec<Vec<i64>> = pipe.query(&mut conn).expect("MULTI");
    for pair in replies.chunks(2) {
        let (acquired, reserved) = (&pair[0], &pair[1]);
        assert_eq!(acquired[0], reserved[0], "{pair:?}");
        assert_eq!(acquired[1], reserved[2], "remaining: {pair:?}");
        assert!((acquired[2] - reserved[1]).abs() <= 1, "wait: {pair:?}");
    }
}

#[test]
fn refund_gives_back_up_to_the_burst_and_never_to_a_debt() {
    let server = Server::start();
    let mut conn = server.conn();
    // A missing key is a full bucket: nothing to give back.
    assert_eq!(refund(&mut conn, "k", "0.001", "5", "2"), [0, 5, 0]);
    acquire(&mut conn, "k", "0.001", "5", Some("3"));
    let given = refund(&mut conn, "k", "0.001", "5", "1");
    assert_eq!(given[..2], [1, 3], "{given:?}");
    let tokens: f64 = hgetall(&mut conn, "k")[0].1.parse().expect("tokens");
    assert!((3.0..3.01).contains(&tokens), "{tokens}");
    // Amount 0 changes nothing.
    assert_eq!(refund(&mut conn, "k", "0.001", "5", "0")[..2], [0, 3]);
    // Full again: the key goes (a missing key is a full bucket).
    assert_eq!(refund(&mut conn, "k", "0.001", "5", "10"), [1, 5, 0]);
    let exists: i64 = redis::cmd("EXISTS")
        .arg("k")
        .query(&mut conn)
        .expect("EXISTS");
    assert_eq!(exists, 0);

    // A bucket in debt refunds nothing: later callers hold its slots.
    let watch = common::Stopwatch::start();
    reserve(&mut conn, "d", "0.001", "1", "1", "0");
    let in_debt = reserve(&mut conn, "d", "1", "1", "1", "5000");
    assert_eq!(in_debt[0], 1);
    assert!(watch.since(1_000).contains(&in_debt[1]), "{in_debt:?}");
    let before = hgetall(&mut conn, "d");
    let nothing = refund(&mut conn, "d", "1", "1", "1");
    assert_eq!(nothing[..2], [0, 0], "{nothing:?}");
    assert_eq!(hgetall(&mut conn, "d"), before);

    let stats: Vec<(&str, i64)> = vec![
        ("tb_refunds", 2),
        ("tb_refunds_ignored", 3),
        ("tb_reserved_with_wait", 1),
    ];
    for (name, want) in stats {
        assert_eq!(info_int(&mut conn, "tb", name), want, "{name}");
    }
    let refunded: f64 = common::info_field(&mut conn, "tb", "tb_tokens_refunded")
        .expect("field")
        .parse()
        .expect("a number");
    // 1 token, then the 2 (less a trickle of refill) that filled the bucket.
    assert!((2.99..=3.0).contains(&refunded), "{refunded}");
}

#[test]
fn bad_arguments_name_themselves_and_change_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    reserve(&mut conn, "k", "1", "5", "2", "0");
    wrong_keys(&mut conn);
    let before = untouched(&mut conn, "k");
    for bad in ["-1", "1.5", "86400001", "abc", "", "1e3", " 1"] {
        assert_eq!(
            command_error(&mut conn, "TB.RESERVE", &["k", "1", "5", "1", bad]),
            "ERR max_wait_ms must be an integer from 0 to 86400000",
            "{bad:?}"
        );
    }
    for bad in ["-1", "nan", "inf", "x", "1e400"] {
        assert_eq!(
            command_error(&mut conn, "TB.REFUND", &["k", "1", "5", bad]),
            "ERR amount must be a non-negative number",
            "{bad:?}"
        );
    }
    assert_eq!(
        command_error(&mut conn, "TB.RESERVE", &["k", "0", "5", "1", "10"]),
        "ERR rate must be a positive number"
    );
    assert_eq!(
        command_error(&mut conn, "TB.RESERVE", &["k", "1", "5", "-1", "10"]),
        "ERR cost must be a non-negative number"
    );
    assert_eq!(
        command_error(&mut conn, "TB.REFUND", &["k", "1", "-5", "1"]),
        "ERR burst must be a positive number"
    );
    for (command, args) in [
        ("TB.RESERVE", &["k", "1", "5", "1"][..]),
        ("TB.RESERVE", &["k", "1", "5", "1", "10", "extra"][..]),
        ("TB.REFUND", &["k", "1", "5"][..]),
        ("TB.REFUND", &["k", "1", "5", "1", "extra"][..]),
    ] {
        let error = command_error(&mut conn, command, args);
        assert!(
            error.starts_with("ERR wrong number of arguments for"),
            "{command} {args:?}: {error}"
        );
    }
    for command in ["TB.RESERVE", "TB.REFUND"] {
        let args: &[&str] = if command == "TB.RESERVE" {
            &["s", "1", "5", "1", "10"]
        } else {
            &["s", "1", "5", "1"]
        };
        assert!(command_error(&mut conn, command, args).starts_with("WRONGTYPE"));
    }
    assert!(
        command_error(&mut conn, "TB.REFUND", &["corrupt", "1", "5", "1"])
            .starts_with("ERR key is not a valid token bucket")
    );
    assert_eq!(untouched(&mut conn, "k"), before);
    ping(&mut conn);
}

/// Debts (negative tokens), refunds and deletions reach a replica without the module byte for byte.
#[test]
fn module_less_replica_holds_debts_and_refunds() {
    let primary = Server::start_with(primary_options());
    let replica = Server::start_with(replica_of(primary.port, false));
    wait_replicas_online(&primary, 1);
    let mut conn = primary.conn();
    for n in 0..20 {
        let key = format!("q{}", n % 4);
        reserve(&mut conn, &key, "5", "2", "1", "2000");
        if n % 3 == 0 {
            refund(&mut conn, &key, "5", "2", "0.5");
        }
    }
    acquire(&mut conn, "gone", "0.001", "3", Some("1"));
    refund(&mut conn, "gone", "0.001", "3", "1");
    wait_acked(&mut conn, 1, 5_000);
    let on_primary = buckets(&mut conn);
    assert!(on_primary
        .values()
        .any(|(fields, _)| fields[0].1.starts_with('-')));
    assert!(!on_primary.contains_key("gone"));
    assert_eq!(buckets(&mut replica.conn()), on_primary);
}

/// Many clients reserving on one key get distinct slots, evenly spaced: 50 ms apart at 20 tokens/s. Each
/// client reads the bucket's `ts` in the same transaction as its reservation: the module's clock at that call,
/// so its act time (`ts` plus `wait_ms`, which is rounded up to the millisecond) is known to within 1 ms.
#[test]
fn concurrent_reservations_get_distinct_evenly_spaced_slots() {
    const CLIENTS: usize = 16;
    const EACH: usize = 4;
    const SLOT_US: i64 = 50_000;
    let server = Server::start();
    let workers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let mut conn = server.conn();
            thread::spawn(move || {
                (0..EACH)
                    .map(|_| {
                        let (reply, ts): (Vec<i64>, i64) = redis::pipe()
                            .atomic()
                            .cmd("TB.RESERVE")
                            .arg("shared")
                            .arg(20)
                            .arg(1)
                            .arg(1)
                            .arg(60_000)
                            .cmd("HGET")
                            .arg("shared")
                            .arg("ts")
                            .query(&mut conn)
                            .expect("TB.RESERVE + HGET");
                        assert_eq!(reply[0], 1, "not granted: {reply:?}");
                        ts + reply[1] * 1_000
                    })
                    .collect::<Vec<i64>>()
            })
        })
        .collect();
    let mut act_us: Vec<i64> = workers
        .into_iter()
        .flat_map(|worker| worker.join().expect("worker"))
        .collect();
    act_us.sort_unstable();
    // Each act time is the reservation's own clock (the `ts` it wrote) plus `wait_ms`, which is rounded up to
    // the millisecond: each lies within 1 ms after its slot, so neighbours are 50 ms apart within 1 ms.
    for pair in act_us.windows(2) {
        let gap_us = pair[1] - pair[0];
        assert!(
            (SLOT_US - 1_000..=SLOT_US + 1_000).contains(&gap_us),
            "slots {} µs apart: {act_us:?}",
            gap_us
        );
    }
}

#[test]
fn commands_describe_themselves() {
    let server = Server::start();
    let mut conn = server.conn();
    let has_docs = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("tb.reserve")
        .query::<Value>(&mut conn)
        .map(|docs| format!("{docs:?}").contains("max_wait_ms"))
        .unwrap_or(false);
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("tb.reserve")
        .arg("tb.refund")
        .query(&mut conn)
        .expect("COMMAND INFO");
    let text = format!("{info:?}");
    assert!(
        !text.contains("denyoom"),
        "no command is deny-oom (tests/maxmemory.rs): {text}"
    );
    if has_docs {
        // Arity: exactly 6 and 5 arguments with the name; RW + access + update on the key.
        assert!(text.contains("int(6)") && text.contains("int(5)"), "{text}");
        assert!(text.contains("access"), "{text}");
    } else {
        println!("skipped COMMAND DOCS checks: this server has no RedisModule_SetCommandInfo");
    }
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("TB.REFUND")
        .arg("user:42")
        .arg(1)
        .arg(5)
        .arg(1)
        .query(&mut conn)
        .expect("COMMAND GETKEYS");
    assert_eq!(keys, ["user:42"]);
}

/// The README's pacing worker loop, `examples/pacing.py`, run against a spawned server.
#[test]
fn python_pacing_example_runs() {
    let server = Server::start();
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/pacing.py");
    common::run_example(
        &common::python_binary(),
        &example,
        &server,
        "python pacing example: ok",
    );
}
