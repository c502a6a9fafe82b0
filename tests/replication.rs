//! Effects replication, end to end: a replica without the module, and an AOF reloaded by a server without the
//! module, hold exactly the hash and the absolute expiry that the primary wrote. (Issue #5 changed how the
//! replicated `HSET` is built: interned field names and the value strings shared with the hash write.)

mod common;

use std::time::Duration;

use common::{acquire, hgetall, pexpiretime, wait_until, Options, Server};

/// Calls that write integral and fractional token counts on two keys. The rates are slow enough that no bucket
/// is full again (and so expires) for minutes.
fn write_some_buckets(conn: &mut redis::Connection) {
    assert_eq!(acquire(conn, "a", "0.01", "10", Some("1.3"))[0], 1);
    assert_eq!(acquire(conn, "a", "0.01", "10", Some("2"))[0], 1);
    assert_eq!(acquire(conn, "b", "0.01", "5", None)[0], 1);
}

type Snapshot = Vec<(Vec<(String, String)>, i64)>;

fn snapshot(conn: &mut redis::Connection) -> Snapshot {
    ["a", "b"]
        .iter()
        .map(|key| (hgetall(conn, key), pexpiretime(conn, key)))
        .collect()
}

#[test]
fn replica_without_module_holds_identical_state() {
    let primary = Server::start();
    let replica = Server::start_with(Options {
        without_module: true,
        args: vec![
            "--replicaof".to_string(),
            "127.0.0.1".to_string(),
            primary.port.to_string(),
        ],
        dir: None,
    });
    let mut conn = primary.conn();
    let mut replica_conn = replica.conn();
    let linked = wait_until(Duration::from_secs(20), || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica_conn)
            .expect("INFO replication");
        info.contains("master_link_status:up")
    });
    assert!(linked, "replica never linked; log:\n{}", replica.log());

    write_some_buckets(&mut conn);
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5_000)
        .query(&mut conn)
        .expect("WAIT");
    assert_eq!(acked, 1, "the replica did not acknowledge the writes");

    let on_primary = snapshot(&mut conn);
    assert!(on_primary
        .iter()
        .all(|(hash, at_ms)| hash.len() == 2 && *at_ms > 0));
    assert_eq!(snapshot(&mut replica_conn), on_primary);
}

#[test]
fn aof_reload_without_module_restores_identical_state() {
    let dir = common::fresh_dir();
    let aof = vec![
        "--appendonly".to_string(),
        "yes".to_string(),
        "--appendfsync".to_string(),
        "always".to_string(),
    ];
    let mut writer = Server::start_with(Options {
        without_module: false,
        args: aof.clone(),
        dir: Some(dir.clone()),
    });
    let mut conn = writer.conn();
    write_some_buckets(&mut conn);
    let written = snapshot(&mut conn);
    writer.kill();

    let reloaded = Server::start_with(Options {
        without_module: true,
        args: aof,
        dir: Some(dir),
    });
    assert_eq!(snapshot(&mut reloaded.conn()), written);
}
