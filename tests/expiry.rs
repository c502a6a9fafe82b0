//! The expiry window (issue #13): an allowed call on a live bucket replicates one `HSET` and leaves the expiry
//! alone while it still covers the bucket's moment of full; the expiry moves (with a `PEXPIREAT`) only when it
//! must, to the moment of full plus the slack. What must hold everywhere, on the primary, on a module-less
//! replica, after a failover and after an AOF reload: a key never expires before its bucket is full, and outlives
//! that moment by at most the slack (1% of burst / rate, at least 1 s, at most a day).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{
    acquire, buckets, hgetall, info_int, primary_options, replica_of, wait_acked,
    wait_replicas_online, Bucket, Server,
};

/// A bucket the workload drives: name, rate per second, burst.
const BUCKETS: [(&str, f64, f64); 3] = [
    // Drained at its rate: its moment of full keeps moving later. Half a second to fill.
    ("hot", 20.0, 10.0),
    // Plenty of headroom: nearly full at every call.
    ("roomy", 1e6, 1e6),
    // Slow: 1,000 s to fill, so 10 s of slack.
    ("slow", 1.0, 1_000.0),
];

fn slack_ms(rate: f64, burst: f64) -> i64 {
    ((burst / rate * 10.0).ceil() as i64).clamp(1_000, 86_400_000)
}

/// The moment (Unix ms, rounded up) the bucket stored in `fields` is full again.
fn full_at_ms(fields: &[(String, String)], rate: f64, burst: f64) -> i64 {
    let field = |name: &str| -> f64 {
        fields
            .iter()
            .find(|(field, _)| field == name)
            .unwrap_or_else(|| panic!("{name} in {fields:?}"))
            .1
            .parse()
            .expect("a number")
    };
    let full_us = field("ts") + ((burst - field("tokens")).max(0.0) / rate * 1e6).ceil();
    (full_us / 1_000.0).ceil() as i64
}

/// Asserts every workload bucket in `held` expires no earlier than its moment of full and no later than that
/// plus the slack (and the expiry read's own slack on servers without PEXPIRETIME).
fn assert_expiry_window(held: &BTreeMap<String, Bucket>, where_: &str) {
    for (name, rate, burst) in BUCKETS {
        let Some((fields, expiry)) = held.get(name) else {
            continue; // expired: fine once it is full, which the next call checks
        };
        let full_ms = full_at_ms(fields, rate, burst);
        let read_slack = expiry.slack_ms();
        assert!(
            expiry.at_ms + read_slack >= full_ms,
            "{where_}: {name} expires at {} before it is full at {full_ms}",
            expiry.at_ms
        );
        assert!(
            expiry.at_ms - read_slack <= full_ms + slack_ms(rate, burst),
            "{where_}: {name} expires at {}, beyond full ({full_ms}) plus the slack",
            expiry.at_ms
        );
    }
}

/// Runs allowed-and-denied calls on every bucket for `duration`; returns the allowed calls and how many bytes
/// the primary sent its replicas per allowed call.
fn workload(conn: &mut redis::Connection, duration: Duration) -> (i64, f64) {
    let offset = info_int(conn, "replication", "master_repl_offset");
    let start = Instant::now();
    let mut allowed = 0;
    while start.elapsed() < duration {
        for (name, rate, burst) in BUCKETS {
            let reply = acquire(conn, name, &rate.to_string(), &burst.to_string(), Some("1"));
            allowed += reply[0];
        }
    }
    let sent = info_int(conn, "replication", "master_repl_offset") - offset;
    (allowed, sent as f64 / allowed.max(1) as f64)
}

#[test]
fn expiry_window_holds_on_a_module_less_replica_and_after_failover() {
    let mut primary = Server::start_with(primary_options());
    let plain_replica = Server::start_with(replica_of(primary.port, false));
    let module_replica = Server::start_with(replica_of(primary.port, true));
    wait_replicas_online(&primary, 2);
    let mut conn = primary.conn();
    let (allowed, bytes_per_call) = workload(&mut conn, Duration::from_millis(1_500));
    wait_acked(&mut conn, 2, 5_000);
    println!("{allowed} allowed calls, {bytes_per_call:.1} bytes each down the replication stream");
    // One HSET of a hot bucket is about 80 bytes; MULTI + HSET + PEXPIREAT + EXEC about 170. Mostly the former.
    assert!(
        bytes_per_call < 120.0,
        "{bytes_per_call:.1} bytes per allowed call: the expiry moves too often"
    );
    let on_primary = buckets(&mut conn);
    assert_expiry_window(&on_primary, "primary");
    for replica in [&plain_replica, &module_replica] {
        let held = buckets(&mut replica.conn());
        assert_eq!(held, on_primary, "a replica differs from the primary");
        assert_expiry_window(&held, "replica");
    }

    // Failover: the drained bucket stays drained on the promoted replica.
    let hot_before = hgetall(&mut conn, "hot");
    primary.kill();
    let mut promoted = module_replica.conn();
    common::promote(&mut promoted);
    // The bucket may have filled and expired while the primary was killed and the replica promoted; if it is
    // still there, it is the one the primary last wrote.
    let hot_after = hgetall(&mut promoted, "hot");
    assert!(
        hot_after.is_empty() || hot_after == hot_before,
        "{hot_after:?}"
    );
    assert_still_drained(&mut promoted, &hot_before, "after failover");
    workload(&mut promoted, Duration::from_millis(300));
    assert_expiry_window(&buckets(&mut promoted), "promoted replica");
}

/// A full burst from the hot bucket stored as `fields` is refused while its moment of full is still ahead.
fn assert_still_drained(conn: &mut redis::Connection, fields: &[(String, String)], when: &str) {
    let (_, rate, burst) = BUCKETS[0];
    let asked_ms = common::server_now_ms(conn);
    let reply = acquire(
        conn,
        "hot",
        &rate.to_string(),
        &burst.to_string(),
        Some("10"),
    );
    if full_at_ms(fields, rate, burst) > asked_ms + 5 {
        assert_eq!(reply[0], 0, "a drained bucket came back full {when}");
    }
}

#[test]
fn expiry_window_holds_after_an_aof_reload_with_and_without_the_module() {
    let server = Server::start_with(common::aof_options(None, true));
    let mut conn = server.conn();
    workload(&mut conn, Duration::from_millis(1_000));
    let before = buckets(&mut conn);
    assert_expiry_window(&before, "before restart");
    let dir = server.into_dir();
    let plain = Server::start_with(common::aof_options(Some(dir), false));
    let reloaded = buckets(&mut plain.conn());
    for (name, (fields, expiry)) in &reloaded {
        assert_eq!(before.get(name), Some(&(fields.clone(), *expiry)), "{name}");
    }
    assert_expiry_window(&reloaded, "AOF reloaded without the module");
    let dir = plain.into_dir();
    let with_module = Server::start_with(common::aof_options(Some(dir), true));
    let mut conn = with_module.conn();
    assert_expiry_window(&buckets(&mut conn), "AOF reloaded with the module");
    if let Some((fields, _)) = before.get("hot") {
        assert_still_drained(&mut conn, fields, "after an AOF reload");
    }
}
