//! A bucket is an ordinary key (issue #4): expiry, DEL, RENAME, COPY and WATCH treat it like any hash, and it
//! stays a small listpack-encoded hash (ziplist on Redis 6.2, which predates listpacks).

mod common;

use std::time::Duration;

use common::{acquire, hgetall, pexpiretime, server_now_ms, wait_until, Options, Server};

fn exists(conn: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(conn)
        .expect("EXISTS")
        == 1
}

fn dbsize(conn: &mut redis::Connection) -> i64 {
    redis::cmd("DBSIZE").query(conn).expect("DBSIZE")
}

/// A server that accepts `DEBUG`. Redis 7.0 and Valkey refuse it unless started with `--enable-debug-command yes`;
/// Redis 6.2 has no such option (it refuses to start when given one) and always accepts `DEBUG`. Which kind this
/// is shows in `CONFIG GET enable-debug-command`: empty where the option does not exist.
fn server_with_debug_command() -> Server {
    let server = Server::start();
    let mut conn = server.conn();
    let option: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("enable-debug-command")
        .query(&mut conn)
        .expect("CONFIG GET");
    if option.is_empty() {
        println!(
            "no enable-debug-command option on this server (Redis 6.2): DEBUG is always enabled"
        );
        return server;
    }
    drop(server);
    Server::start_with(Options {
        args: vec!["--enable-debug-command".into(), "yes".into()],
        ..Options::default()
    })
}

#[test]
fn expired_bucket_is_full_even_before_it_is_reclaimed() {
    let server = server_with_debug_command();
    let mut conn = server.conn();
    // With active expiry off, an expired key stays in memory until something looks it up.
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query(&mut conn)
        .expect("DEBUG SET-ACTIVE-EXPIRE");
    // Drained at one token per 1000 s: by its own arithmetic it stays empty for the whole test, so only the
    // expiry can make it full.
    assert_eq!(
        acquire(&mut conn, "k", "0.001", "3", Some("3"))[..2],
        [1, 0]
    );
    let _: i64 = redis::cmd("PEXPIRE")
        .arg("k")
        .arg(20)
        .query(&mut conn)
        .expect("PEXPIRE");
    // Where the expiry is reconstructed from PTTL (6.2), it may read up to its slack early: wait past that too.
    let expire_at = pexpiretime(&mut conn, "k");
    assert!(wait_until(Duration::from_secs(2), || server_now_ms(
        &mut conn
    ) > expire_at.at_ms
        + expire_at.slack_ms()));
    assert_eq!(dbsize(&mut conn), 1, "the expired key is still in memory");
    assert_eq!(
        acquire(&mut conn, "k", "0.001", "3", Some("0")),
        [1, 3, 0, 0]
    );
    assert_eq!(dbsize(&mut conn), 0, "the lookup reclaimed the expired key");
    assert_eq!(acquire(&mut conn, "k", "0.001", "3", None)[..2], [1, 2]);
}

#[test]
fn bucket_key_expires_when_full_and_then_reads_full() {
    let server = Server::start();
    let mut conn = server.conn();
    // Two tokens at 100 per second: full again, and gone, 20 ms later.
    assert_eq!(acquire(&mut conn, "k", "100", "2", Some("2"))[..2], [1, 0]);
    assert!(wait_until(Duration::from_secs(2), || !exists(
        &mut conn, "k"
    )));
    assert_eq!(acquire(&mut conn, "k", "100", "2", Some("0")), [1, 2, 0, 0]);
}

#[test]
fn del_resets_a_bucket() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire(&mut conn, "k", "0.001", "4", Some("4"));
    assert_eq!(acquire(&mut conn, "k", "0.001", "4", None)[0], 0);
    let deleted: i64 = redis::cmd("DEL").arg("k").query(&mut conn).expect("DEL");
    assert_eq!(deleted, 1);
    assert_eq!(acquire(&mut conn, "k", "0.001", "4", None)[..2], [1, 3]);
}

#[test]
fn rename_carries_a_working_bucket() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire(&mut conn, "old", "0.001", "5", Some("3"));
    let before = (hgetall(&mut conn, "old"), pexpiretime(&mut conn, "old"));
    let _: () = redis::cmd("RENAME")
        .arg("old")
        .arg("new")
        .query(&mut conn)
        .expect("RENAME");
    assert_eq!(
        (hgetall(&mut conn, "new"), pexpiretime(&mut conn, "new")),
        before
    );
    // The two tokens left moved with the key; the old name is a fresh, full bucket.
    assert_eq!(
        acquire(&mut conn, "new", "0.001", "5", Some("2"))[..2],
        [1, 0]
    );
    assert_eq!(acquire(&mut conn, "new", "0.001", "5", None)[0], 0);
    assert!(!exists(&mut conn, "old"));
    assert_eq!(acquire(&mut conn, "old", "0.001", "5", Some("0"))[1], 5);
}

#[test]
fn copy_makes_an_independent_bucket() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire(&mut conn, "a", "0.001", "5", Some("3"));
    let original = (hgetall(&mut conn, "a"), pexpiretime(&mut conn, "a"));
    let copied: i64 = redis::cmd("COPY")
        .arg("a")
        .arg("b")
        .query(&mut conn)
        .expect("COPY");
    assert_eq!(copied, 1);
    assert_eq!(
        (hgetall(&mut conn, "b"), pexpiretime(&mut conn, "b")),
        original
    );
    assert_eq!(
        acquire(&mut conn, "b", "0.001", "5", Some("2"))[..2],
        [1, 0]
    );
    assert_eq!(acquire(&mut conn, "b", "0.001", "5", None)[0], 0);
    // Draining the copy left the original as it was.
    assert_eq!(
        (hgetall(&mut conn, "a"), pexpiretime(&mut conn, "a")),
        original
    );
    assert_eq!(
        acquire(&mut conn, "a", "0.001", "5", Some("2"))[..2],
        [1, 0]
    );
}

/// The name of the compact hash encoding: `listpack` from Redis 7.0 (and Valkey), `ziplist` on servers that
/// predate listpacks (6.2). Only servers with listpack hashes have the `hash-max-listpack-value` option.
fn compact_hash_encoding(conn: &mut redis::Connection) -> &'static str {
    let option: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("hash-max-listpack-value")
        .query(conn)
        .expect("CONFIG GET");
    if option.is_empty() {
        println!(
            "no listpack hashes on this server (Redis 6.2): expecting the ziplist encoding instead"
        );
        "ziplist"
    } else {
        "listpack"
    }
}

#[test]
fn buckets_stay_listpack_encoded() {
    let server = Server::start();
    let mut conn = server.conn();
    let compact = compact_hash_encoding(&mut conn);
    // Integral, fractional, huge, tiny and long-mantissa token counts: the longest text is a 17-digit mantissa
    // with an exponent, far below hash-max-listpack-value (hash-max-ziplist-value on 6.2; 64 bytes on both).
    let cases = [
        ("int", "0.001", "10", "3"),
        ("frac", "7", "10", "0.3"),
        ("huge", "1e-9", "1e15", "1"),
        ("tiny", "1e-300", "1e-300", "1e-301"),
        ("long", "3", "10", "0.1234567890123"),
    ];
    for (key, rate, burst, cost) in cases {
        assert_eq!(
            acquire(&mut conn, key, rate, burst, Some(cost))[0],
            1,
            "{key}"
        );
        // A second call refills a fraction of a token first, for a less round number.
        acquire(&mut conn, key, rate, burst, Some(cost));
        let encoding: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(key)
            .query(&mut conn)
            .expect("OBJECT ENCODING");
        assert_eq!(encoding, compact, "{key}: {:?}", hgetall(&mut conn, key));
    }
}

/// `WATCH key; MULTI; PING; EXEC` around `between`: whether the transaction still ran.
fn exec_survives(server: &Server, key: &str, between: impl FnOnce(&mut redis::Connection)) -> bool {
    let mut watcher = server.conn();
    let mut other = server.conn();
    let _: () = redis::cmd("WATCH")
        .arg(key)
        .query(&mut watcher)
        .expect("WATCH");
    between(&mut other);
    let _: () = redis::cmd("MULTI").query(&mut watcher).expect("MULTI");
    let _: String = redis::cmd("PING").query(&mut watcher).expect("PING queued");
    let exec: Option<Vec<String>> = redis::cmd("EXEC").query(&mut watcher).expect("EXEC");
    exec.is_some()
}

/// Regression test for issue #4: the server signals every key a module opened for writing as modified; denials
/// and peeks change nothing, so they must leave a WATCH on the bucket standing.
#[test]
fn only_writes_abort_transactions_watching_a_bucket() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire(&mut conn, "k", "0.001", "2", Some("2"));
    assert!(
        exec_survives(&server, "k", |other| {
            assert_eq!(acquire(other, "k", "0.001", "2", None)[0], 0);
            assert_eq!(acquire(other, "k", "0.001", "2", Some("5"))[2], -1);
        }),
        "a denial aborted a transaction watching the bucket"
    );
    assert!(
        exec_survives(&server, "k", |other| {
            acquire(other, "k", "0.001", "2", Some("0"));
        }),
        "a peek aborted a transaction watching the bucket"
    );
    assert!(
        exec_survives(&server, "missing", |other| {
            acquire(other, "missing", "0.001", "2", Some("0"));
        }),
        "a peek at a missing bucket aborted a transaction watching it"
    );
    assert!(
        !exec_survives(&server, "fresh", |other| {
            assert_eq!(acquire(other, "fresh", "0.001", "2", None)[0], 1);
        }),
        "an allowed call must abort a transaction watching the bucket"
    );
}
