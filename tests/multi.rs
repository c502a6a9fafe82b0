//! TB.ACQUIREALL: several buckets, one atomic all-or-nothing call.

mod common;

use std::time::Duration;

use common::{
    acquire, acquire_all, acquire_error, hgetall, pexpiretime, ping, wait_until, Options, Server,
    Stopwatch,
};

const ARITY: &str = "ERR wrong number of arguments for 'tb.acquireall' command";

fn acquire_all_error(conn: &mut redis::Connection, args: &[&str]) -> String {
    common::command_error(conn, "TB.ACQUIREALL", args)
}

#[test]
fn takes_from_all_or_none_and_names_the_limit() {
    let server = Server::start();
    let mut conn = server.conn();
    // user: burst 2, tenant: burst 5, global: burst 100; all slow enough not to refill during the test.
    let call = [
        "1", "user", "0.001", "2", "tenant", "0.001", "5", "global", "0.001", "100",
    ];
    let first = acquire_all(&mut conn, &call);
    assert_eq!(first[..3], [1, 1, 0]);
    assert_eq!(first[4], 0, "the user bucket has the fewest tokens left");
    assert_eq!(acquire_all(&mut conn, &call)[..2], [1, 0]);
    let tenant_before = hgetall(&mut conn, "tenant");
    let global_before = hgetall(&mut conn, "global");
    let refused = acquire_all(&mut conn, &call);
    assert_eq!(
        (refused[0], refused[1], refused[4]),
        (0, 0, 0),
        "refused by the user bucket: {refused:?}"
    );
    assert!(
        refused[2] > 900_000,
        "a token at 0.001/s takes 1000 s: {refused:?}"
    );
    // Nothing was taken from the buckets that could have paid.
    assert_eq!(hgetall(&mut conn, "tenant"), tenant_before);
    assert_eq!(hgetall(&mut conn, "global"), global_before);
    assert_eq!(acquire(&mut conn, "tenant", "0.001", "5", Some("0"))[1], 3);
    // A cost above one bucket's burst can never pass: -1, and that bucket's index.
    let impossible = acquire_all(
        &mut conn,
        &["4", "global", "0.001", "100", "tenant", "0.001", "3"],
    );
    assert_eq!((impossible[0], impossible[2], impossible[4]), (0, -1, 1));
}

#[test]
fn longest_wait_and_reset_win() {
    let server = Server::start();
    let mut conn = server.conn();
    // a refills 100/s, b 10/s: draining both, b decides the wait.
    let drain = ["2", "a", "100", "2", "b", "10", "2"];
    let watch = Stopwatch::start();
    assert_eq!(acquire_all(&mut conn, &drain)[0], 1);
    let refused = acquire_all(&mut conn, &["1", "a", "100", "2", "b", "10", "2"]);
    assert_eq!((refused[0], refused[4]), (0, 1));
    // Less whatever time passed since the drain.
    assert!(
        watch.since(100).contains(&refused[2]),
        "b needs ~100 ms: {refused:?}"
    );
    assert!(
        watch.since(200).contains(&refused[3]),
        "b is full in ~200 ms: {refused:?}"
    );
    assert!(wait_until(Duration::from_secs(2), || acquire_all(
        &mut conn,
        &["1", "a", "100", "2", "b", "10", "2"]
    )[0] == 1));
}

#[test]
fn every_written_bucket_expires_when_full() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire_all(&mut conn, &["1", "fast", "10", "5", "slow", "1", "5"]);
    let fast = pexpiretime(&mut conn, "fast").at_ms;
    let slow = pexpiretime(&mut conn, "slow").at_ms;
    assert!(fast > 0 && slow > 0);
    // One token refills in 100 ms for `fast`, 1 s for `slow`.
    assert!((850..=950).contains(&(slow - fast)), "{fast} {slow}");
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire_all(&mut conn, &["1", "a", "0.001", "5", "b", "0.001", "5"]);
    let before = (hgetall(&mut conn, "a"), hgetall(&mut conn, "b"));
    let cases: [(&[&str], &str); 9] = [
        (
            &["1", "a", "1", "5", "a", "1", "5"],
            "ERR each key may appear only once",
        ),
        (&["1", "a", "1", "5", "b", "1"], ARITY),
        (&["1", "a", "1", "5", "b"], ARITY),
        (&["1"], ARITY),
        (&["1", "a", "1"], ARITY),
        (
            &["x", "a", "1", "5"],
            "ERR cost must be a non-negative number",
        ),
        (
            &["1", "a", "1", "5", "b", "0", "5"],
            "ERR rate must be a positive number",
        ),
        (
            &["1", "a", "1", "5", "b", "1", "inf"],
            "ERR burst must be a positive number",
        ),
        (
            &["1", "a", "1", "5", "s", "1", "5"],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
    ];
    let _: () = redis::cmd("SET")
        .arg("s")
        .arg("x")
        .query(&mut conn)
        .expect("SET");
    for (args, expected) in cases {
        assert_eq!(acquire_all_error(&mut conn, args), expected, "{args:?}");
    }
    let _: i64 = redis::cmd("HSET")
        .arg("h")
        .arg("x")
        .arg("1")
        .query(&mut conn)
        .expect("HSET");
    assert!(
        acquire_all_error(&mut conn, &["1", "a", "1", "5", "h", "1", "5"])
            .starts_with("ERR key is not a valid")
    );
    assert_eq!((hgetall(&mut conn, "a"), hgetall(&mut conn, "b")), before);
    assert_eq!(
        acquire_error(&mut conn, &["a"]),
        "ERR wrong number of arguments for 'tb.acquire' command"
    );
    ping(&mut conn);
}

#[test]
fn replica_without_the_module_holds_identical_buckets() {
    let primary = Server::start();
    let replica = Server::start_with(Options {
        without_module: true,
        args: vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary.port.to_string(),
        ],
        ..Options::default()
    });
    let mut conn = primary.conn();
    let mut replica_conn = replica.conn();
    assert!(wait_until(Duration::from_secs(10), || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica_conn)
            .expect("INFO");
        info.contains("master_link_status:up")
    }));
    for n in 0..50 {
        let cost = (n % 3).to_string();
        acquire_all(
            &mut conn,
            &[&cost, "u", "5", "3", "t", "50", "10", "g", "0.5", "7.5"],
        );
    }
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5_000)
        .query(&mut conn)
        .expect("WAIT");
    assert_eq!(acked, 1);
    for key in ["u", "t", "g"] {
        assert_eq!(
            hgetall(&mut replica_conn, key),
            hgetall(&mut conn, key),
            "{key}"
        );
        assert_eq!(
            pexpiretime(&mut replica_conn, key),
            pexpiretime(&mut conn, key),
            "{key}"
        );
    }
    let log = replica.log();
    assert!(
        !log.contains("Unknown command") && !log.contains("unknown command"),
        "{log}"
    );
}

#[test]
fn cluster_refuses_buckets_in_different_slots() {
    let server = Server::start_with(Options {
        args: vec!["--cluster-enabled".into(), "yes".into()],
        cluster_bus: true,
        ..Options::default()
    });
    let mut conn = server.conn();
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTS")
        .arg((0..16_384).collect::<Vec<i64>>())
        .query(&mut conn)
        .expect("ADDSLOTS");
    assert!(wait_until(Duration::from_secs(10), || {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut conn)
            .expect("CLUSTER INFO");
        info.contains("cluster_state:ok")
    }));
    let error = acquire_all_error(&mut conn, &["1", "user:1", "1", "5", "tenant:9", "1", "5"]);
    assert!(error.starts_with("CROSSSLOT"), "{error}");
    // A shared hash tag puts them in one slot.
    let ok = acquire_all(
        &mut conn,
        &["1", "{acme}:user:1", "1", "5", "{acme}:tenant", "1", "50"],
    );
    assert_eq!(ok[0], 1);
}
