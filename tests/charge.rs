//! `TB.CHARGE` (take a cost even when the bucket lacks it, leaving a debt) and `TB.BLOCK` (deny a key for a
//! while): replies, how every other command treats their debt, the day-long bound, errors that change nothing,
//! and command docs. Replication, AOF, INFO, ACL, keyspace events and cluster routing are covered by the themed
//! suites (replication.rs, persistence.rs, operations.rs, hardening.rs, cluster.rs).

mod common;

use std::time::{Duration, Instant};

use common::{
    acquire, assert_refused, block, charge, command_error, dirty, hgetall, pexpiretime, ping,
    untouched, wrong_keys, Server, NOT_A_BUCKET, WRONGTYPE,
};
use redis::Value;

fn tokens(conn: &mut redis::Connection, key: &str) -> f64 {
    let fields = hgetall(conn, key);
    let (_, tokens) = fields
        .iter()
        .find(|(field, _)| field == "tokens")
        .unwrap_or_else(|| panic!("{key} holds a bucket: {fields:?}"));
    tokens.parse().expect("a number")
}

/// `TB.RESERVE key rate burst cost max_wait_ms`: `[granted, wait_ms, remaining, reset_after_ms]`.
fn reserve(conn: &mut redis::Connection, args: &[&str]) -> [i64; 4] {
    let reply: Vec<i64> = redis::cmd("TB.RESERVE")
        .arg(args)
        .query(conn)
        .expect("TB.RESERVE reply");
    reply.try_into().expect("four integers")
}

/// `TB.REFUND key rate burst amount`: `[refunded, remaining, reset_after_ms]`.
fn refund(conn: &mut redis::Connection, args: &[&str]) -> [i64; 3] {
    let reply: Vec<i64> = redis::cmd("TB.REFUND")
        .arg(args)
        .query(conn)
        .expect("TB.REFUND reply");
    reply.try_into().expect("three integers")
}

/// A charge on a missing (full) bucket is exact whatever the clock says: 5 tokens at 1/s, charged 7, owe 2.
#[test]
fn charge_lands_into_debt_and_every_command_waits_for_it() {
    let server = Server::start();
    let mut conn = server.conn();
    assert_eq!(charge(&mut conn, "k", "1", "5", "7"), [0, 3_000, 7_000]);
    assert_eq!(tokens(&mut conn, "k"), -2.0);
    // TB.ACQUIRE: denied until the debt and the cost are refilled.
    let [allowed, remaining, retry_ms, reset_ms] = acquire(&mut conn, "k", "1", "5", None);
    assert_eq!((allowed, remaining), (0, 0));
    assert!((2_900..=3_000).contains(&retry_ms), "{retry_ms}");
    assert!((6_900..=7_000).contains(&reset_ms), "{reset_ms}");
    // TB.REFUND gives nothing back to a bucket in debt.
    assert_eq!(refund(&mut conn, &["k", "1", "5", "1"])[..2], [0, 0]);
    // TB.RESERVE queues behind the debt.
    let [granted, wait_ms, _, _] = reserve(&mut conn, &["k", "1", "5", "1", "10000"]);
    assert_eq!(granted, 1);
    assert!((2_900..=3_000).contains(&wait_ms), "{wait_ms}");
    assert!(tokens(&mut conn, "k") < -2.9);
    // A zero charge reports the bucket and writes nothing.
    let before = (hgetall(&mut conn, "k"), dirty(&mut conn));
    let [remaining, retry_ms, _] = charge(&mut conn, "k", "1", "5", "0");
    assert_eq!(remaining, 0);
    assert!((3_900..=4_000).contains(&retry_ms), "{retry_ms}");
    assert_eq!((hgetall(&mut conn, "k"), dirty(&mut conn)), before);
    // A charge the bucket holds is a plain take; one above the burst lands too.
    assert_eq!(charge(&mut conn, "j", "1", "5", "2"), [3, 0, 2_000]);
    assert_eq!(
        charge(&mut conn, "big", "1", "5", "12.5"),
        [0, 8_500, 12_500]
    );
    // A burst below one token: one token never comes.
    assert_eq!(charge(&mut conn, "tiny", "1", "0.5", "0.25"), [0, -1, 250]);
}

#[test]
fn charge_beyond_a_day_of_refill_is_refused_and_changes_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    // 10 tokens/s: a day of refill is 864,000 tokens. From full (5), 864,005 lands exactly at the edge.
    assert_eq!(
        charge(&mut conn, "edge", "10", "5", "864005"),
        [0, 86_400_100, 86_400_500]
    );
    assert_eq!(tokens(&mut conn, "edge"), -864_000.0);
    let expiry = pexpiretime(&mut conn, "edge");
    let before = (hgetall(&mut conn, "edge"), dirty(&mut conn));
    const REFUSED: &str = "ERR charge would put the bucket more than 24 hours of refill into debt";
    // The refill since is a few milliseconds' worth (0.01 tokens each): a whole token is too much.
    assert_eq!(
        command_error(&mut conn, "TB.CHARGE", &["edge", "10", "5", "1"]),
        REFUSED
    );
    assert_eq!(
        command_error(&mut conn, "TB.CHARGE", &["fresh", "10", "5", "864005.5"]),
        REFUSED
    );
    assert_eq!((hgetall(&mut conn, "edge"), dirty(&mut conn)), before);
    assert_eq!(pexpiretime(&mut conn, "edge"), expiry);
    assert!(
        hgetall(&mut conn, "fresh").is_empty(),
        "a refused charge created its key"
    );
    // A zero charge still answers.
    assert_eq!(charge(&mut conn, "edge", "10", "5", "0")[0], 0);
    ping(&mut conn);
}

#[test]
fn block_denies_until_it_ends_then_refills_from_empty() {
    let server = Server::start();
    let mut conn = server.conn();
    let started = Instant::now();
    // 10 tokens/s, burst 5: a 300 ms block, then 100 ms per token, full 500 ms after the block.
    assert_eq!(block(&mut conn, "k", "10", "5", "300"), [0, 400, 800]);
    assert_eq!(tokens(&mut conn, "k"), -3.0);
    let [allowed, _, retry_ms, _] = acquire(&mut conn, "k", "10", "5", Some("0.001"));
    assert_eq!(allowed, 0);
    assert!(retry_ms <= 301, "{retry_ms}");
    // The first call with any cost above 0 gets through only once the block has ended, and finds the bucket
    // empty: a whole token takes another 100 ms.
    let opened = common::wait_until(Duration::from_secs(5), || {
        acquire(&mut conn, "k", "10", "5", Some("0.001"))[0] == 1
    });
    assert!(opened, "the block never ended");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(300),
        "open after {elapsed:?}"
    );
    assert!(tokens(&mut conn, "k") < 1.0);
    // On a bucket that still holds tokens, the block takes them all.
    acquire(&mut conn, "partial", "0.001", "5", Some("2"));
    assert_eq!(
        block(&mut conn, "partial", "0.001", "5", "1000")[..2],
        [0, 1_001_000]
    );
    assert_eq!(tokens(&mut conn, "partial"), -0.001);
    // The longest block is a day.
    assert_eq!(
        block(&mut conn, "day", "10", "5", "86400000"),
        [0, 86_400_100, 86_400_500]
    );
}

#[test]
fn block_keeps_a_longer_debt_and_never_shortens_it() {
    let server = Server::start();
    let mut conn = server.conn();
    // 10 tokens owed at 1/s: one token is 11 s away.
    charge(&mut conn, "k", "1", "5", "15");
    let before = (hgetall(&mut conn, "k"), dirty(&mut conn));
    let expiry = pexpiretime(&mut conn, "k");
    let [remaining, retry_ms, reset_ms] = block(&mut conn, "k", "1", "5", "1000");
    assert_eq!(remaining, 0);
    assert!((10_900..=11_000).contains(&retry_ms), "{retry_ms}");
    assert!((14_900..=15_000).contains(&reset_ms), "{reset_ms}");
    assert_eq!((hgetall(&mut conn, "k"), dirty(&mut conn)), before);
    assert_eq!(pexpiretime(&mut conn, "k"), expiry);
    // A longer block deepens the debt.
    assert_eq!(block(&mut conn, "k", "1", "5", "60000")[1], 61_000);
    assert_eq!(tokens(&mut conn, "k"), -60.0);
}

#[test]
fn bad_arguments_name_themselves_and_change_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    charge(&mut conn, "k", "0.001", "5", "7");
    wrong_keys(&mut conn);
    let before = untouched(&mut conn, "k");
    let mut refusals: Vec<(&str, Vec<&str>, &str)> = Vec::new();
    for command in ["TB.CHARGE", "TB.BLOCK"] {
        let arity: &'static str = if command == "TB.CHARGE" {
            "ERR wrong number of arguments for 'tb.charge' command"
        } else {
            "ERR wrong number of arguments for 'tb.block' command"
        };
        refusals.push((command, vec!["k", "1", "5"], arity));
        refusals.push((command, vec!["k", "1", "5", "1", "1"], arity));
        for bad in ["0", "-1", "abc", "inf", "nan", ""] {
            refusals.push((
                command,
                vec!["k", bad, "5", "1"],
                "ERR rate must be a positive number",
            ));
            refusals.push((
                command,
                vec!["k", "1", bad, "1"],
                "ERR burst must be a positive number",
            ));
        }
        refusals.push((command, vec!["s", "1", "5", "1"], WRONGTYPE));
        refusals.push((command, vec!["corrupt", "1", "5", "1"], NOT_A_BUCKET));
    }
    for bad in ["-1", "-0.5", "abc", "inf", "nan", "1e400", ""] {
        refusals.push((
            "TB.CHARGE",
            vec!["k", "1", "5", bad],
            "ERR cost must be a non-negative number",
        ));
    }
    refusals.push((
        "TB.CHARGE",
        vec!["k", "0.001", "5", "1000"],
        "ERR charge would put the bucket more than 24 hours of refill into debt",
    ));
    for bad in [
        "0",
        "-1",
        "86400001",
        "1.5",
        "1e3",
        "abc",
        "",
        "99999999999999999999",
    ] {
        refusals.push((
            "TB.BLOCK",
            vec!["k", "1", "5", bad],
            "ERR ms must be an integer from 1 to 86400000",
        ));
    }
    assert_refused(&mut conn, &refusals);
    assert_eq!(untouched(&mut conn, "k"), before);
    ping(&mut conn);
}

#[test]
fn commands_describe_themselves() {
    let server = Server::start();
    let mut conn = server.conn();
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("tb.charge")
        .arg("tb.block")
        .query(&mut conn)
        .expect("COMMAND INFO");
    let text = format!("{info:?}");
    // Not deny-oom: above maxmemory a call that writes nothing is answered (tests/maxmemory.rs).
    assert!(!text.contains("denyoom") && text.contains("fast"), "{text}");
    let docs: redis::RedisResult<Value> = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("tb.charge")
        .arg("tb.block")
        .query(&mut conn);
    match docs {
        Ok(docs) if format!("{docs:?}").contains("summary") => {
            // Exactly 5 arguments with the name; RW + access + update on the one key.
            assert!(text.contains("int(5)") && text.contains("access"), "{text}");
            let docs = format!("{docs:?}");
            for name in ["key", "rate", "burst", "cost", "ms"] {
                assert!(docs.contains(&format!("\"{name}\"")), "{name} in {docs}");
            }
            assert!(
                docs.contains("debt") && docs.contains("refills from empty"),
                "{docs}"
            );
        }
        _ => println!("skipped COMMAND DOCS checks: this server has no RedisModule_SetCommandInfo"),
    }
    for command in ["TB.CHARGE", "TB.BLOCK"] {
        let keys: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(command)
            .arg("user:42")
            .arg(1)
            .arg(5)
            .arg(1)
            .query(&mut conn)
            .expect("COMMAND GETKEYS");
        assert_eq!(keys, ["user:42"], "{command}");
    }
}
