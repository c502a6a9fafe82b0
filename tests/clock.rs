//! The controlled server clock itself (tests/clock/): a server under it, and the module inside, read exactly the
//! microsecond the test wrote, until the test moves it. Other suites build on this to assert exact replies.
mod common;

use common::*;

/// 2030-01-01 00:00:00.123456 UTC.
const START_US: i64 = CLOCK_2030_US + 123_456;

/// A clocked server, or `None` (with a note) where the module cannot follow the clock.
fn clocked(clock: &Clock) -> Option<Server> {
    let server = start_clocked(clock, Options::default());
    if module_follows_clock(&server, clock, START_US) {
        Some(server)
    } else {
        eprintln!("skipped: the module on this server does not read the controlled clock");
        None
    }
}

#[test]
fn faketime_text_is_utc_with_microseconds() {
    assert_eq!(faketime_text(0), "1970-01-01 00:00:00.000000");
    assert_eq!(faketime_text(START_US), "2030-01-01 00:00:00.123456");
    assert_eq!(
        faketime_text(951_782_400_999_999),
        "2000-02-29 00:00:00.999999"
    );
    assert_eq!(
        faketime_text(2_147_483_647_000_001),
        "2038-01-19 03:14:07.000001"
    );
}

#[test]
fn server_and_module_read_the_set_microsecond() {
    let clock = Clock::new(START_US);
    let Some(server) = clocked(&clock) else {
        return;
    };
    let mut conn = server.conn();
    // Valkey's own clock (TIME, key expiry) reads the wall clock at most once a millisecond and adds monotonic
    // time in between, so there it may run up to 1 ms of real time ahead of the written instant. The module reads
    // the wall clock on every call, so its replies are exact everywhere.
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
    assert_eq!(secs, 1_893_456_000);
    assert!((123_456..124_456).contains(&micros), "TIME µs {micros}");

    assert_eq!(acquire(&mut conn, "k", "10", "5", None), [1, 4, 0, 100]);
    assert_eq!(
        hgetall(&mut conn, "k"),
        [("tokens", "4"), ("ts", "1893456000123456")].map(|(f, v)| (f.to_string(), v.to_string()))
    );
    // Full again at .223456, rounded up to the ms, plus the 1 s expiry slack.
    assert_eq!(pexpiretime(&mut conn, "k"), 1_893_456_001_224);
}

#[test]
fn the_clock_moves_only_when_the_test_moves_it() {
    let clock = Clock::new(START_US);
    let Some(server) = clocked(&clock) else {
        return;
    };
    let mut conn = server.conn();
    assert_eq!(
        acquire(&mut conn, "k", "10", "5", Some("5")),
        [1, 0, 0, 500]
    );
    // Real time passes, the server's clock does not: still drained.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(acquire(&mut conn, "k", "10", "5", None), [0, 0, 100, 500]);
    // Exactly 100 ms later one token is back.
    clock.set_us(START_US + 100_000);
    assert_eq!(acquire(&mut conn, "k", "10", "5", None), [1, 0, 0, 500]);
    // Years later the key has expired: a full bucket. (Valkey's own clock catches up within 1 ms of real time.)
    clock.set_us(START_US + 3 * 365 * 86_400_000_000);
    assert!(wait_until(std::time::Duration::from_secs(5), || {
        redis::cmd("EXISTS")
            .arg("k")
            .query::<i64>(&mut conn)
            .expect("EXISTS")
            == 0
    }));
    assert_eq!(acquire(&mut conn, "k", "10", "5", None), [1, 4, 0, 100]);
}
