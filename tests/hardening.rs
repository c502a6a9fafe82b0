//! Nothing a client or an operator does can crash, stall or half-write the server (issue #12): huge
//! `TB.ACQUIREALL` calls, `MODULE UNLOAD` under a queued transaction, renamed commands, huge finite parameters,
//! stats that only grow, and ACL key permissions.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    acquire, error_text, hgetall, info_field, module_path, pexpiretime, ping, Options, Server,
};
use redis::Value;

/// `TB.ACQUIREALL 1 b0 1 5 b1 1 5 ...` over `count` buckets named `{prefix}N`.
fn acquire_all_over(count: usize, prefix: &str) -> redis::Cmd {
    let mut command = redis::cmd("TB.ACQUIREALL");
    command.arg(1);
    for n in 0..count {
        command.arg(format!("{prefix}{n}")).arg(1).arg(5);
    }
    command
}

/// A call naming 30,000 buckets is refused at once, before anything is read or written; the largest call allowed
/// (1,000 buckets, with a duplicate at the very end or not) answers quickly, and other clients do not wait on it
/// for long. Each call's own time is the server's (INFO commandstats: the command alone, not the megabyte on the
/// wire or the client's encoding, which a loaded machine stretches past any bound); the bounds are generous, for
/// a loaded machine, and still catch a pairwise duplicate check, which holds the server for seconds at that size.
#[test]
fn acquireall_over_many_buckets_answers_without_stalling_others() {
    const BOUND: Duration = Duration::from_millis(250);
    let server = Server::start();
    let mut conn = server.conn();
    let stop = Arc::new(AtomicBool::new(false));
    let pinger = {
        let stop = Arc::clone(&stop);
        let mut pinger_conn = server.conn();
        thread::spawn(move || {
            let mut slowest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                ping(&mut pinger_conn);
                slowest = slowest.max(start.elapsed());
            }
            slowest
        })
    };
    let timed = |conn: &mut redis::Connection, command: &redis::Cmd| {
        let before = server_time(conn);
        let result: redis::RedisResult<Vec<i64>> = command.query(conn);
        (result, server_time(conn).saturating_sub(before))
    };

    let (huge, huge_in) = timed(&mut conn, &acquire_all_over(30_000, "h"));
    assert_eq!(
        error_text(&huge.expect_err("30,000 buckets are refused")),
        "ERR too many buckets: TB.ACQUIREALL takes at most 1000"
    );
    let mut duplicated = acquire_all_over(999, "d");
    duplicated.arg("d0").arg(1).arg(5);
    let (refused, refused_in) = timed(&mut conn, &duplicated);
    assert_eq!(
        error_text(&refused.expect_err("a duplicate key is refused")),
        "ERR each key may appear only once"
    );
    let size: i64 = redis::cmd("DBSIZE").query(&mut conn).expect("DBSIZE");
    assert_eq!(size, 0, "a refused call wrote");

    let (reply, answered_in) = timed(&mut conn, &acquire_all_over(1_000, "b"));
    stop.store(true, Ordering::Relaxed);
    let slowest_ping = pinger.join().expect("pinger");
    assert_eq!(reply.expect("1,000 buckets are allowed")[0], 1);
    let size: i64 = redis::cmd("DBSIZE").query(&mut conn).expect("DBSIZE");
    assert_eq!(size, 1_000);
    println!("30,000 refused in {huge_in:?}; 1,000 with a duplicate refused in {refused_in:?}; 1,000 allowed in {answered_in:?}; slowest PING {slowest_ping:?}");
    for (what, took) in [
        ("refusing 30,000", huge_in),
        ("refusing a duplicate", refused_in),
        ("1,000 buckets", answered_in),
    ] {
        assert!(took < BOUND, "{what} took {took:?} of the server's time");
    }
    // A PING's round trip also waits for this test's own threads and whatever else the machine runs; a server
    // held by a quadratic check would still show as seconds.
    assert!(
        slowest_ping < 4 * BOUND,
        "a PING meanwhile took {slowest_ping:?}"
    );
}

/// How long the server has spent in TB.ACQUIREALL calls so far (`INFO commandstats`: the time inside the command,
/// refusals included), zero before the first.
fn server_time(conn: &mut redis::Connection) -> Duration {
    let micros = info_field(conn, "commandstats", "cmdstat_tb.acquireall")
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|field| field.strip_prefix("usec="))
                .and_then(|usec| usec.parse::<u64>().ok())
        })
        .unwrap_or(0);
    Duration::from_micros(micros)
}

/// A command queued in a `MULTI` before `MODULE UNLOAD` crashed the server at `EXEC` (signal 11). The module now
/// refuses to be unloaded, so the transaction runs and the server lives.
#[test]
fn module_unload_is_refused_so_a_queued_transaction_cannot_crash_the_server() {
    let mut server = Server::start_with(common::module_command_options(&[]));
    let mut client_a = server.conn();
    let mut client_b = server.conn();
    let _: () = redis::cmd("MULTI").query(&mut client_a).expect("MULTI");
    let queued: String = redis::cmd("TB.ACQUIRE")
        .arg("k")
        .arg(1)
        .arg(5)
        .query(&mut client_a)
        .expect("queued");
    assert_eq!(queued, "QUEUED");
    let unload: redis::RedisResult<Value> = redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("tb")
        .query(&mut client_b);
    let error = error_text(&unload.expect_err("MODULE UNLOAD is refused"));
    assert!(error.starts_with("ERR Error unloading module"), "{error}");
    let replies: Vec<Vec<i64>> = redis::cmd("EXEC").query(&mut client_a).expect("EXEC");
    assert_eq!(replies, vec![vec![1, 4, 0, 1_000]]);
    ping(&mut client_b);
    assert!(server.is_alive());
    assert!(
        server.log().contains("redis-tb cannot be unloaded"),
        "the log says why:\n{}",
        server.log()
    );
    let list: Value = redis::cmd("MODULE")
        .arg("LIST")
        .query(&mut client_b)
        .expect("MODULE LIST");
    assert!(format!("{list:?}").contains("tb"), "{list:?}");
}

/// With `HSET` or `PEXPIREAT` (or `DEL`, which a refund that fills a bucket replicates) renamed away, an allowed call wrote the hash and then failed to replicate it
/// (`ERR failed to write the token bucket`), and `TB.ACQUIREALL` wrote some buckets and not others. The module now
/// refuses to load on such a server, naming the command, so no call can half-write.
#[test]
fn renamed_replicated_command_refuses_the_load() {
    for (name, new_name) in [
        ("PEXPIREAT", ""),
        ("HSET", ""),
        ("HSET", "hset-renamed"),
        ("DEL", ""),
        // CL.THROTTLE replicates as SET.
        ("SET", ""),
    ] {
        let (refused, log) = common::start_refused(&["--rename-command", name, new_name], &[]);
        assert!(refused, "the server must refuse to start:\n{log}");
        let line = format!("redis-tb: refusing to load: the command {name} is renamed or disabled");
        assert!(log.contains(&line), "{line}\n{log}");
    }
    // Renaming a command the module does not replicate as is fine.
    let server = Server::start_with(Options {
        args: vec!["--rename-command".into(), "HDEL".into(), "".into()],
        ..Options::default()
    });
    assert_eq!(acquire(&mut server.conn(), "k", "1", "5", None)[0], 1);
}

/// Without CL.THROTTLE (`cl-throttle no`) the module writes no string, so a renamed `SET` does not stop it loading.
#[test]
fn renamed_set_loads_without_cl_throttle() {
    let server = Server::start_with(Options {
        args: vec!["--rename-command".into(), "SET".into(), "".into()],
        module_args: vec!["cl-throttle".into(), "no".into()],
        ..Options::default()
    });
    assert_eq!(acquire(&mut server.conn(), "k", "1", "5", None)[0], 1);
}

/// At run time, `MODULE LOAD` on such a server is refused and leaves every key, value and expiry as it was.
#[test]
fn renamed_replicated_command_refuses_module_load_and_changes_nothing() {
    let mut options = common::module_command_options(&["--rename-command", "PEXPIREAT", ""]);
    options.without_module = true;
    let server = Server::start_with(options);
    let mut conn = server.conn();
    let _: () = redis::pipe()
        .cmd("HSET")
        .arg("bucket")
        .arg("tokens")
        .arg("2")
        .arg("ts")
        .arg("1700000000000000")
        .ignore()
        .cmd("PEXPIRE")
        .arg("bucket")
        .arg(600_000)
        .ignore()
        .query(&mut conn)
        .expect("seed");
    let before = (
        hgetall(&mut conn, "bucket"),
        pexpiretime(&mut conn, "bucket"),
    );
    let load: redis::RedisResult<Value> = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(module_path().to_string_lossy().as_ref())
        .query(&mut conn);
    assert!(load.is_err(), "MODULE LOAD must be refused");
    for command in ["TB.ACQUIRE", "TB.ACQUIREALL"] {
        let result: redis::RedisResult<Value> = redis::cmd(command)
            .arg("1")
            .arg("bucket")
            .arg("1")
            .arg("5")
            .query(&mut conn);
        let error = error_text(&result.expect_err("no such command"));
        assert!(error.to_lowercase().contains("unknown command"), "{error}");
    }
    let after = (
        hgetall(&mut conn, "bucket"),
        pexpiretime(&mut conn, "bucket"),
    );
    assert_eq!(after, before);
    assert!(server.log().contains("the command PEXPIREAT is renamed"));
}

/// `elapsed_us · rate` overflowed to infinity for a huge finite rate and refilled a drained bucket at once: with
/// rate 1e307, eleven calls in a row were all granted. Each call here comes well under a second after the
/// drain, so the true refill (under 1e307 tokens) never covers the cost.
#[test]
fn huge_finite_rate_never_refills_a_drained_bucket_early() {
    let server = Server::start();
    let mut conn = server.conn();
    let drained = acquire(&mut conn, "huge", "1e307", "1e308", Some("1e308"));
    assert_eq!(drained[0], 1);
    let start = Instant::now();
    let mut granted = 0;
    for _ in 0..11 {
        granted += acquire(&mut conn, "huge", "1e307", "1e308", Some("1e307"))[0];
    }
    if start.elapsed() < Duration::from_millis(900) {
        assert_eq!(granted, 0, "granted tokens the bucket had not earned");
    }
    // Multi-bucket calls use the same refill.
    let buckets = ["h1", "1e307", "1e308", "h2", "1e303", "1e308"];
    let drained = common::acquire_all(&mut conn, &[&["1e308"][..], &buckets].concat());
    assert_eq!(drained[0], 1, "{drained:?}");
    let again = common::acquire_all(&mut conn, &[&["1e307"][..], &buckets].concat());
    assert_eq!(again[0], 0, "{again:?}");
}

/// `tb_tokens_granted` summed finite grants to `inf`. It now saturates at the largest finite value, and no
/// field of `INFO tb` is ever infinite or NaN.
#[test]
fn info_counters_stay_finite() {
    let server = Server::start();
    let mut conn = server.conn();
    for key in ["a", "b", "c"] {
        assert_eq!(
            acquire(&mut conn, key, "1", "1.7e308", Some("1.7e308"))[0],
            1
        );
    }
    let info: String = redis::cmd("INFO").arg("tb").query(&mut conn).expect("INFO");
    for line in info.lines().filter(|line| line.starts_with("tb_")) {
        let (name, value) = line.split_once(':').expect("name:value");
        let number: f64 = value.trim().parse().unwrap_or_else(|_| panic!("{line}"));
        assert!(number.is_finite(), "{name} is {value}");
    }
    let granted: f64 = info_field(&mut conn, "tb", "tb_tokens_granted")
        .expect("tb_tokens_granted")
        .parse()
        .expect("a number");
    assert_eq!(granted, f64::MAX);
}

/// The counters only grow: `CONFIG RESETSTAT` leaves them as they are, whoever sends it, so neither an
/// administrator's nor a refused one (a client that never authenticated) zeroes them.
#[test]
fn info_counters_are_monotonic_whoever_sends_config_resetstat() {
    let server = Server::start();
    let mut admin = server.conn();
    // Set after start, so that the harness's readiness PING needs no password; this connection stays
    // authenticated.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("secret")
        .query(&mut admin)
        .expect("CONFIG SET requirepass");
    acquire(&mut admin, "k", "1", "5", None);
    acquire(&mut admin, "k", "1", "5", Some("9"));
    let calls = |conn: &mut redis::Connection| common::info_int(conn, "tb", "tb_calls");
    assert_eq!(calls(&mut admin), 2);

    let mut stranger = server.conn();
    let refused: redis::RedisResult<()> =
        redis::cmd("CONFIG").arg("RESETSTAT").query(&mut stranger);
    assert!(error_text(&refused.expect_err("NOAUTH")).starts_with("NOAUTH"));
    assert_eq!(
        calls(&mut admin),
        2,
        "an unauthenticated client reset the counters"
    );

    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut admin)
        .expect("RESETSTAT");
    assert_eq!(
        calls(&mut admin),
        2,
        "INFO tb counts since the module loaded"
    );
    acquire(&mut admin, "k", "1", "5", None);
    assert_eq!(calls(&mut admin), 3);
}

/// The key specs say every command reads the bucket and returns it (RW + ACCESS + UPDATE): a user with only write
/// or only read permission on the key is refused; read and write together work. Servers without key
/// permissions (Redis 6.2) or key specs skip this.
#[test]
fn acl_needs_read_and_write_permission_on_the_bucket() {
    let server = Server::start();
    let mut admin = server.conn();
    let selectors_supported = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("probe")
        .arg("%R~x")
        .query::<()>(&mut admin)
        .is_ok();
    if !selectors_supported {
        eprintln!("skipped: this server has no read/write key permissions (%R~, %W~)");
        return;
    }
    for (user, keys) in [("writer", "%W~*"), ("reader", "%R~*"), ("both", "%RW~*")] {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(user)
            .arg("on")
            .arg(">pw")
            .arg(keys)
            .arg("+tb.acquire")
            .arg("+tb.acquireall")
            .arg("+tb.reserve")
            .arg("+tb.refund")
            .arg("+tb.acquireeach")
            .arg("+tb.acquireatmost")
            .arg("+tb.charge")
            .arg("+tb.block")
            .arg("+tb.lower")
            .query(&mut admin)
            .expect("ACL SETUSER");
    }
    for (user, allowed) in [("writer", false), ("reader", false), ("both", true)] {
        let mut conn = server.login(user, "pw");
        let calls: [(&str, &[&str]); 9] = [
            ("TB.ACQUIRE", &["k", "1", "5"]),
            ("TB.ACQUIREALL", &["1", "k2", "1", "5"]),
            ("TB.RESERVE", &["k3", "1", "5", "1", "0"]),
            ("TB.REFUND", &["k4", "1", "5", "1"]),
            (
                "TB.ACQUIREEACH",
                &["k5", "1", "5", "1", "k6", "1", "5", "0"],
            ),
            ("TB.ACQUIREATMOST", &["k7", "1", "5", "2"]),
            ("TB.CHARGE", &["k8", "1", "5", "1"]),
            ("TB.BLOCK", &["k9", "1", "5", "1000"]),
            ("TB.LOWER", &["k10", "1", "5", "1"]),
        ];
        for (command, args) in calls {
            let result: redis::RedisResult<redis::Value> =
                redis::cmd(command).arg(args).query(&mut conn);
            match result {
                Ok(reply) => assert!(allowed, "{user} ran {command}: {reply:?}"),
                Err(e) => {
                    assert!(!allowed, "{user} was refused {command}: {e}");
                    assert!(error_text(&e).starts_with("NOPERM"), "{e}");
                }
            }
        }
    }
}
