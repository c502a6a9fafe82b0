//! `CL.THROTTLE` as a client sees it: redis-cell's replies at controlled instants, its key (a decimal TAT with an
//! expiry), errors that change nothing, replication to a replica without the module, AOF reload, and the module
//! argument that leaves the command to redis-cell. With `REDIS_CELL_MODULE` naming a built redis-cell
//! (`libredis_cell.so`), the same calls run against it on the same clock and every reply, value and expiry must
//! agree; without it those tests say so and pass.
mod common;

use std::path::PathBuf;

use common::*;

/// 2030-01-01 00:00:00.123456789 UTC in ns.
const START_NS: i64 = CLOCK_2030_US * 1_000 + 123_456_789;
const NS_PER_MS: i64 = 1_000_000;

/// An instant in ns as Unix ms, rounded up: when the key holding it as its TAT expires.
fn ceil_ms(instant_ns: i64) -> i64 {
    instant_ns.div_euclid(NS_PER_MS) + i64::from(instant_ns.rem_euclid(NS_PER_MS) > 0)
}

fn throttle(conn: &mut redis::Connection, args: &[&str]) -> [i64; 5] {
    let reply: Vec<i64> = redis::cmd("CL.THROTTLE")
        .arg(args)
        .query(conn)
        .unwrap_or_else(|e| panic!("CL.THROTTLE {args:?}: {e}"));
    reply.try_into().expect("five integers")
}

fn throttle_error(conn: &mut redis::Connection, args: &[&str]) -> String {
    command_error(conn, "CL.THROTTLE", args)
}

fn get(conn: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(conn).expect("GET")
}

/// A server with the module under `clock`, set to `START_NS`; `None` (with a note) where the module cannot follow
/// the clock.
fn clocked(clock: &Clock, options: Options) -> Option<Server> {
    let server = start_clocked(clock, options);
    if !module_follows_clock(&server, clock, START_NS / 1_000) {
        eprintln!("skipped: the module on this server does not read the controlled clock");
        return None;
    }
    clock.set_ns(START_NS);
    Some(server)
}

/// A redis-cell build to compare with, from `REDIS_CELL_MODULE`.
fn redis_cell() -> Option<PathBuf> {
    let path = std::env::var_os("REDIS_CELL_MODULE").map(PathBuf::from);
    if path.as_ref().is_none_or(|path| !path.exists()) {
        eprintln!(
            "skipped: set REDIS_CELL_MODULE to a built libredis_cell.so to compare with redis-cell"
        );
        return None;
    }
    path
}

#[rustfmt::skip]
#[test]
fn answers_redis_cells_rate_limit_table() {
    // redis-cell's own `it_rate_limits` cases, in the reply's whole seconds: max_burst 4, 1 per second.
    let clock = Clock::new(START_NS / 1_000);
    let Some(server) = clocked(&clock, Options::default()) else { return };
    let mut conn = server.conn();
    // (ms after the start, quantity, reply)
    let cases: [(i64, &str, [i64; 5]); 15] = [
        (   0, "6", [1, 5, 5, -1, 0]),
        (   0, "1", [0, 5, 4, -1, 1]),
        (   0, "1", [0, 5, 3, -1, 2]),
        (   0, "1", [0, 5, 2, -1, 3]),
        (   0, "1", [0, 5, 1, -1, 4]),
        (   0, "1", [0, 5, 0, -1, 5]),
        (   0, "1", [1, 5, 0, 1, 5]),
        (3000, "1", [0, 5, 2, -1, 3]),
        (3100, "1", [0, 5, 1, -1, 4]),
        (4000, "1", [0, 5, 1, -1, 4]),
        (8000, "1", [0, 5, 4, -1, 1]),
        (9500, "1", [0, 5, 4, -1, 1]),
        (9500, "0", [0, 5, 4, -1, 1]),
        (9500, "2", [0, 5, 2, -1, 3]),
        (9500, "5", [1, 5, 2, 3, 3]),
    ];
    for (case, (offset_ms, quantity, reply)) in cases.into_iter().enumerate() {
        let now_ns = START_NS + offset_ms * NS_PER_MS;
        clock.set_ns(now_ns);
        assert_eq!(throttle(&mut conn, &["k", "4", "1", "1", quantity]), reply, "case {case}");
    }
    // The last allowed call (case 13) stored the TAT 3 s after 9.5 s, expiring at that instant rounded up to the ms.
    let tat_ns = START_NS + 12_500 * NS_PER_MS;
    assert_eq!(get(&mut conn, "k"), Some(tat_ns.to_string()));
    assert_eq!(pexpiretime(&mut conn, "k"), ceil_ms(tat_ns));
}

#[test]
fn denied_calls_change_nothing_and_a_peek_refreshes_the_expiry() {
    let clock = Clock::new(START_NS / 1_000);
    let Some(server) = clocked(&clock, Options::default()) else {
        return;
    };
    let mut conn = server.conn();
    // 2 per 10 s, max_burst 1: T = 5 s, tau = 10 s.
    assert_eq!(
        throttle(&mut conn, &["k", "1", "2", "10", "2"]),
        [0, 2, 0, -1, 10]
    );
    let tat = get(&mut conn, "k");
    assert_eq!(tat, Some((START_NS + 10_000 * NS_PER_MS).to_string()));
    clock.set_ns(START_NS + 2_000 * NS_PER_MS);
    // Denied: 3 s until one fits; the key and its expiry stay as they were.
    assert_eq!(throttle(&mut conn, &["k", "1", "2", "10"]), [1, 2, 0, 3, 8]);
    assert_eq!(get(&mut conn, "k"), tat);
    assert_eq!(
        pexpiretime(&mut conn, "k"),
        ceil_ms(START_NS + 10_000 * NS_PER_MS)
    );
    // More than the limit can ever hold: -1.
    assert_eq!(
        throttle(&mut conn, &["k", "1", "2", "10", "3"]),
        [1, 2, 0, -1, 8]
    );
    // Exactly 3 s later (5 s after the start) one fits again.
    clock.set_ns(START_NS + 5_000 * NS_PER_MS);
    assert_eq!(
        throttle(&mut conn, &["k", "1", "2", "10", "0"]),
        [0, 2, 1, -1, 5]
    );
    // The peek wrote the same TAT, with the same expiry.
    assert_eq!(get(&mut conn, "k"), tat);
    assert_eq!(
        pexpiretime(&mut conn, "k"),
        ceil_ms(START_NS + 10_000 * NS_PER_MS)
    );
    assert_eq!(
        throttle(&mut conn, &["k", "1", "2", "10"]),
        [0, 2, 0, -1, 10]
    );
    // Once the TAT has passed, the key has expired: a fresh limit.
    clock.set_ns(START_NS + 16_000 * NS_PER_MS);
    assert!(wait_until(std::time::Duration::from_secs(5), || get(
        &mut conn, "k"
    )
    .is_none()));
    assert_eq!(
        throttle(&mut conn, &["k", "1", "2", "10"]),
        [0, 2, 1, -1, 5]
    );
}

#[test]
fn bad_arguments_are_refused_by_name_and_change_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("1893456000000000000")
        .query(&mut conn)
        .expect("SET");
    let cases: [(&[&str], &str); 16] = [
        (&["k", "1", "1"], "ERR wrong number of arguments for 'cl.throttle' command"),
        (&["k", "1", "1", "1", "1", "1"], "ERR wrong number of arguments for 'cl.throttle' command"),
        (&["k", "-1", "1", "1"], "ERR max_burst must be an integer from 0 to 9223372036854775806"),
        (&["k", "x", "1", "1"], "ERR max_burst must be an integer from 0 to 9223372036854775806"),
        (&["k", "9223372036854775807", "1", "1"], "ERR max_burst must be an integer from 0 to 9223372036854775806"),
        (&["k", "1", "-1", "1"], "ERR count_per_period must be a positive integer"),
        (&["k", "1", "0", "1"], "ERR count_per_period must be a positive integer"),
        (&["k", "1", "1.5", "1"], "ERR count_per_period must be a positive integer"),
        (&["k", "1", "1", "0"], "ERR period must be a positive integer (seconds)"),
        (&["k", "1", "1", "-60"], "ERR period must be a positive integer (seconds)"),
        (&["k", "1", "1", "1", "-1"], "ERR quantity must be a non-negative integer"),
        (&["k", "1", "1", "1", "1e3"], "ERR quantity must be a non-negative integer"),
        (
            &["k", "1", "2000000000", "1"],
            "ERR count_per_period / period must be at most 1000000000 a second (requests at least 1 ns apart)",
        ),
        (
            &["k", "1", "1", "9223372036854775807"],
            "ERR (max_burst + 1) * period / count_per_period must be under 2^63 ns (about 292 years)",
        ),
        (
            &["k", "1000", "1", "31536000"],
            "ERR (max_burst + 1) * period / count_per_period must be under 2^63 ns (about 292 years)",
        ),
        // A fresh key's TAT 237 years from now is past 2262.
        (
            &["fresh", "0", "1", "7500000000"],
            "ERR the key's theoretical arrival time would pass 2^63 ns since the epoch (the year 2262)",
        ),
    ];
    for (args, error) in cases {
        assert_eq!(throttle_error(&mut conn, args), error, "{args:?}");
    }
    assert_eq!(get(&mut conn, "k"), Some("1893456000000000000".to_string()));
    assert_eq!(get(&mut conn, "fresh"), None);
    ping(&mut conn);
}

#[test]
fn keys_of_other_kinds_are_refused() {
    let server = Server::start();
    let mut conn = server.conn();
    let _: () = redis::cmd("SET")
        .arg("text")
        .arg("soon")
        .query(&mut conn)
        .expect("SET");
    let _: () = redis::cmd("RPUSH")
        .arg("list")
        .arg("a")
        .query(&mut conn)
        .expect("RPUSH");
    acquire(&mut conn, "bucket", "1", "5", None);
    assert_eq!(
        throttle_error(&mut conn, &["text", "1", "1", "1"]),
        "ERR key does not hold a CL.THROTTLE state (expected a string of decimal nanoseconds since the epoch)"
    );
    for key in ["list", "bucket"] {
        assert_eq!(
            throttle_error(&mut conn, &[key, "1", "1", "1"]),
            "WRONGTYPE Operation against a key holding the wrong kind of value"
        );
    }
    assert_eq!(get(&mut conn, "text"), Some("soon".to_string()));
    // TB.ACQUIRE refuses a CL.THROTTLE key likewise.
    throttle(&mut conn, &["gcra", "1", "1", "1"]);
    assert_eq!(
        acquire_error(&mut conn, &["gcra", "1", "5"]),
        "WRONGTYPE Operation against a key holding the wrong kind of value"
    );
    ping(&mut conn);
}

#[test]
fn reads_a_tat_written_by_set_in_any_encoding() {
    // A key restored from an RDB holds its digits as an integer-encoded string; SET leaves a short one embedded.
    let clock = Clock::new(START_NS / 1_000);
    let Some(server) = clocked(&clock, Options::default()) else {
        return;
    };
    let mut conn = server.conn();
    let tat = START_NS + 3_000 * NS_PER_MS;
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg(tat)
        .query(&mut conn)
        .expect("SET");
    // max_burst 4, 1 per second: 3 s used, so 1 left after this call.
    assert_eq!(throttle(&mut conn, &["k", "4", "1", "1"]), [0, 5, 1, -1, 4]);
    assert_eq!(
        get(&mut conn, "k"),
        Some((tat + 1_000 * NS_PER_MS).to_string())
    );
}

#[test]
fn replica_without_the_module_holds_the_same_value_and_expiry() {
    let clock = Clock::new(START_NS / 1_000);
    let Some(primary) = clocked(&clock, primary_options()) else {
        return;
    };
    let replica = Server::start_with(Options {
        clock: Some(clock.path()),
        ..replica_of(primary.port, false)
    });
    wait_replicas_online(&primary, 1);
    let mut conn = primary.conn();
    for step in 0..5 {
        clock.set_ns(START_NS + step * 1_234_567);
        throttle(&mut conn, &["a", "9", "10", "60"]);
        // One call, then peeks, which rewrite the value and its expiry.
        let quantity = if step == 0 { "1" } else { "0" };
        throttle(&mut conn, &["b", "0", "1", "3600", quantity]);
    }
    // A denied call replicates nothing, the next allowed one does.
    throttle(&mut conn, &["c", "0", "1", "60"]);
    assert_eq!(throttle(&mut conn, &["c", "0", "1", "60"])[0], 1);
    wait_acked(&mut conn, 1, 5_000);
    let mut replica_conn = replica.conn();
    for key in ["a", "b", "c"] {
        let value = get(&mut conn, key);
        assert!(value.is_some(), "{key}");
        assert_eq!(get(&mut replica_conn, key), value, "{key}");
        assert_eq!(
            pexpiretime(&mut replica_conn, key),
            pexpiretime(&mut conn, key).at_ms,
            "{key}"
        );
    }
}

#[test]
fn aof_reload_without_the_module_restores_value_and_expiry() {
    let server = Server::start_with(aof_options(None, true));
    let mut conn = server.conn();
    throttle(&mut conn, &["k", "9", "1", "3600", "3"]);
    throttle(&mut conn, &["k", "9", "1", "3600", "0"]);
    let (value, expiry) = (get(&mut conn, "k"), pexpiretime(&mut conn, "k").at_ms);
    assert!(value.is_some());
    let dir = server.shutdown_into_dir(&["NOSAVE"]);
    let reloaded = Server::start_with(aof_options(Some(dir), false));
    let mut conn = reloaded.conn();
    assert_eq!(get(&mut conn, "k"), value);
    assert_eq!(pexpiretime(&mut conn, "k"), expiry);
}

#[test]
fn module_argument_leaves_cl_throttle_out() {
    let server = Server::start_with(Options {
        module_args: vec!["cl-throttle".into(), "no".into()],
        ..Options::default()
    });
    let mut conn = server.conn();
    let error = throttle_error(&mut conn, &["k", "1", "1", "1"]);
    assert!(error.starts_with("ERR unknown command"), "{error}");
    assert_eq!(
        acquire(&mut conn, "bucket", "1", "5", None),
        [1, 4, 0, 1000]
    );
    let (refused, log) = start_refused(&[], &["cl-throttle", "maybe"]);
    assert!(refused, "{log}");
    assert!(
        log.contains("`cl-throttle` takes yes or no, got 'maybe'"),
        "{log}"
    );
    let (refused, log) = start_refused(&[], &["speed", "fast"]);
    assert!(refused, "{log}");
    assert!(log.contains("unknown module argument 'speed'"), "{log}");
}

#[test]
fn loads_beside_redis_cell_only_when_told() {
    let Some(cell) = redis_cell() else { return };
    let cell = cell.display().to_string();
    // redis-cell first: refused, with the way out in the log.
    let (refused, log) = start_refused(&["--loadmodule", &cell], &[]);
    assert!(refused, "{log}");
    assert!(
        log.contains("Load redis-tb with the module argument `cl-throttle no`"),
        "{log}"
    );
    // Told to leave it out: both load and CL.THROTTLE is redis-cell's.
    let server = Server::start_with(Options {
        module_args: vec!["cl-throttle".into(), "no".into()],
        args: vec!["--loadmodule".into(), cell],
        ..Options::default()
    });
    let mut conn = server.conn();
    assert_eq!(throttle(&mut conn, &["k", "4", "1", "1"]), [0, 5, 4, -1, 1]);
    let modules: redis::Value = redis::cmd("MODULE")
        .arg("LIST")
        .query(&mut conn)
        .expect("MODULE LIST");
    assert!(format!("{modules:?}").contains("redis-cell"), "{modules:?}");
}

#[test]
fn agrees_with_redis_cell_call_for_call() {
    // The last two have intervals under 1 µs, where redis-cell's remaining divides by zero whole microseconds.
    let limits: [[&str; 3]; 8] = [
        ["4", "1", "1"],
        ["0", "3", "1"],
        ["9", "10", "60"],
        ["2", "7", "3"],
        ["100", "1000000", "1"],
        ["5", "1", "86400"],
        ["10000", "1000000000", "1"],
        ["3", "2000000", "1"],
    ];
    // Steps from 0 to 2 s, odd nanoseconds included; now and then a long idle.
    compare_with_redis_cell(&limits, 0x5eed_ce11, |rng| match rng.below(10) {
        0 => 0,
        9 => i64::try_from(rng.below(200_000)).expect("small") * NS_PER_MS,
        _ => i64::try_from(rng.below(2_000_000_000)).expect("small"),
    });
}

#[test]
fn agrees_with_redis_cell_at_sub_millisecond_gaps_wherever_its_key_lasts() {
    // Limits whose state lasts under a few ms, at gaps of 0 to 1.5 ms: redis-cell's key vanishes before its TAT
    // now and then (and the next call sees a fresh key); every other reply is its reply.
    let limits: [[&str; 3]; 6] = [
        ["0", "1500", "1"],
        ["0", "2000", "1"],
        ["1", "5000", "1"],
        ["0", "900", "1"],
        ["2", "3000", "2"],
        ["0", "100000", "1"],
    ];
    compare_with_redis_cell(&limits, 0x5eed_ce12, |rng| match rng.below(4) {
        0 => 0,
        _ => i64::try_from(rng.below(1_500_000)).expect("small"),
    });
}

/// 600 calls with random limits, quantities and keys, each at `step(rng)` ns after the last, on our module and on
/// redis-cell (`REDIS_CELL_MODULE`) under one controlled clock: the same replies and values, and expiries as each
/// sets them.
fn compare_with_redis_cell(limits: &[[&str; 3]], seed: u64, step: impl Fn(&mut Rng) -> i64) {
    let Some(cell) = redis_cell() else { return };
    let clock = Clock::new(START_NS / 1_000);
    let Some(ours) = clocked(&clock, Options::default()) else {
        return;
    };
    let theirs = Server::start_with(Options {
        module: Some(cell),
        clock: Some(clock.path()),
        ..Options::default()
    });
    let (mut ours_conn, mut theirs_conn) = (ours.conn(), theirs.conn());
    if info_field(&mut theirs_conn, "server", "valkey_version").is_some() {
        // Valkey's own clock (key expiry) may run up to 1 ms off the controlled clock (tests/clock/README.md), and
        // redis-cell sets its expiry relative to that clock, so keys expire at different moments.
        eprintln!("skipped: Valkey's expiry clock does not follow the controlled clock exactly");
        return;
    }
    let quantities = ["0", "1", "1", "1", "2", "3", "7", "12"];
    let keys = ["a", "b", "c"];
    let mut rng = Rng::new(seed);
    let mut now_ns = START_NS;
    // How often redis-cell's key had vanished while ours held a TAT still ahead.
    let mut vanished_ahead = 0;
    for call in 0..600 {
        now_ns += step(&mut rng);
        clock.set_ns(now_ns);
        let key = keys[rng.below(keys.len())];
        let limit = limits[rng.below(limits.len())];
        let quantity = quantities[rng.below(quantities.len())];
        let args = [key, limit[0], limit[1], limit[2], quantity];
        // Our key lasts until its TAT (expiring at it rounded up to the ms); redis-cell's expires trunc_ms(TAT -
        // now) after the ms of the call that wrote it, which can be before the TAT, and is never after ours. Where
        // its key has gone and ours has not, ours is carried over to it, so that both decide from the same state.
        let ours_tat = get(&mut ours_conn, key);
        match (&ours_tat, get(&mut theirs_conn, key)) {
            (Some(tat), None) => {
                let tat_ns: i64 = tat.parse().expect("a TAT");
                vanished_ahead += usize::from(tat_ns > now_ns);
                let _: () = redis::cmd("SET")
                    .arg(key)
                    .arg(tat)
                    .arg("PXAT")
                    .arg(pexpiretime(&mut ours_conn, key).at_ms)
                    .query(&mut theirs_conn)
                    .expect("SET");
            }
            (None, Some(tat)) => panic!("call {call}: redis-cell's {key} ({tat}) outlived ours"),
            _ => {}
        }
        let ours_reply = throttle(&mut ours_conn, &args);
        let theirs_reply = throttle(&mut theirs_conn, &args);
        assert_eq!(
            ours_reply, theirs_reply,
            "call {call} at {now_ns}: {args:?}"
        );
        assert_eq!(
            get(&mut ours_conn, key),
            get(&mut theirs_conn, key),
            "call {call}: {key}"
        );
        if let Some(tat) = get(&mut ours_conn, key) {
            let tat_ns: i64 = tat.parse().expect("a TAT");
            let ours_expiry = pexpiretime(&mut ours_conn, key).at_ms;
            assert_eq!(ours_expiry, ceil_ms(tat_ns), "call {call}: {key}");
            assert!(
                pexpiretime(&mut theirs_conn, key).at_ms <= ours_expiry,
                "call {call}: {key}"
            );
        }
    }
    eprintln!("redis-cell's key vanished before its TAT {vanished_ahead} times in 600 calls");
}

#[test]
fn command_info_and_docs_describe_it() {
    let server = Server::start();
    let mut conn = server.conn();
    if redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("GET")
        .query::<redis::Value>(&mut conn)
        .is_err()
    {
        eprintln!("skipped: this server has no COMMAND DOCS (Redis < 7.0)");
        return;
    }
    let info: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("CL.THROTTLE")
        .query(&mut conn)
        .expect("INFO");
    let info = format!("{info:?}");
    for part in [
        "\"cl.throttle\"",
        "int(-5)",
        "write",
        "fast",
        "RW",
        "update",
    ] {
        assert!(info.contains(part), "{part} in {info}");
    }
    // Not deny-oom: above maxmemory a limited call or a peek is answered (tests/maxmemory.rs).
    assert!(!info.contains("denyoom"), "{info}");
    let docs: redis::Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("CL.THROTTLE")
        .query(&mut conn)
        .expect("DOCS");
    let docs = format!("{docs:?}");
    for name in [
        "max_burst",
        "count_per_period",
        "period",
        "quantity",
        "optional",
        "redis-cell",
    ] {
        assert!(docs.contains(name), "{name} in {docs}");
    }
}

#[test]
fn only_allowed_calls_fire_events_abort_a_watch_and_count_as_grants() {
    let server = Server::start();
    let mut conn = server.conn();
    let mut events = KeyspaceEvents::subscribe(&server);
    let mut next_event = || {
        let (key, event) = events.next();
        format!("{key} {event}")
    };
    // One a minute, max_burst 0: the first call is allowed, the second limited.
    throttle(&mut conn, &["k", "0", "1", "60"]);
    throttle(&mut conn, &["k", "0", "1", "60"]);
    assert_eq!(next_event(), "k set");
    assert_eq!(next_event(), "k expire");
    // A limited call on a watched key leaves the transaction standing; an allowed one aborts it.
    let mut watcher = server.conn();
    let mut transaction_ran = |key: &str, args: &[&str]| {
        let _: () = redis::cmd("WATCH")
            .arg(key)
            .query(&mut watcher)
            .expect("WATCH");
        let _: () = redis::cmd("MULTI").query(&mut watcher).expect("MULTI");
        let _: () = redis::cmd("PING").query(&mut watcher).expect("PING queued");
        throttle(&mut conn, args);
        let ran: Option<Vec<String>> = redis::cmd("EXEC").query(&mut watcher).expect("EXEC");
        ran.is_some()
    };
    assert!(transaction_ran("k", &["k", "0", "1", "60", "1"]));
    assert!(!transaction_ran("other", &["other", "0", "1", "60", "1"]));
    let _: () = redis::cmd("SET")
        .arg("marker")
        .arg(1)
        .query(&mut conn)
        .expect("SET");
    // The limited call fired nothing: the next events are the allowed call on "other", then the marker.
    assert_eq!(next_event(), "other set");
    assert_eq!(next_event(), "other expire");
    assert_eq!(next_event(), "marker set");
    let _: () = redis::cmd("DEL")
        .arg("other")
        .query(&mut conn)
        .expect("DEL");
    // Counted as the TB commands are: 2 granted, 2 limited, 1 beyond the limit, 1 peek.
    throttle(&mut conn, &["k", "0", "1", "60", "5"]);
    throttle(&mut conn, &["fresh", "0", "1", "60", "0"]);
    assert_eq!(info_int(&mut conn, "tb", "tb_allowed"), 2);
    assert_eq!(info_int(&mut conn, "tb", "tb_denied"), 2);
    assert_eq!(info_int(&mut conn, "tb", "tb_denied_cost_exceeds_burst"), 1);
    assert_eq!(info_int(&mut conn, "tb", "tb_peeks"), 1);
    assert_eq!(info_int(&mut conn, "tb", "tb_tokens_granted"), 2);
}
