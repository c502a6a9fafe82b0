//! A server clock that steps back, under the controlled clock of tests/clock/ so that every reply is exact: a
//! bucket keeps its tokens and refills from the new reading, whatever the size of the step; the first call of
//! any command to see the step records the new time base, once, and replicates it; a promoted replica whose clock
//! is behind does the same.
mod common;

use std::time::Duration;

use common::*;

const MS: i64 = 1_000;
const HOUR: i64 = 3_600_000_000;
/// Ten years of 365.25 days, in µs.
const TEN_YEARS: i64 = 10 * 36_525 * 24 * HOUR / 100;
/// Where the clock starts: 2040-01-01, so that 10 years back is still well after 1970.
const START: i64 = CLOCK_2030_US + TEN_YEARS;

/// A server under `clock`, or `None` (with a note) where the module cannot follow it.
fn clocked(clock: &Clock, options: Options) -> Option<Server> {
    let server = start_clocked(clock, options);
    if module_follows_clock(&server, clock, START) {
        Some(server)
    } else {
        eprintln!("skipped: the module on this server does not read the controlled clock");
        None
    }
}

/// Moves the controlled clock to `at_us` and waits until the server itself reads it. Valkey caches its time between
/// event-loop turns, and an active-expiry pass on the reading before a step back expired what the next call wrote
/// (3 runs in 25 on Valkey 9.1); on Redis the poll returns at once.
fn set_clock(clock: &Clock, conn: &mut redis::Connection, at_us: i64) {
    clock.set_us(at_us);
    assert!(
        wait_until(Duration::from_secs(5), || {
            (server_now_ms(conn) - at_us.div_euclid(MS)).abs() <= 1
        }),
        "the server never read the clock at {at_us} µs"
    );
}

fn fields(tokens: &str, ts_us: i64) -> Vec<(String, String)> {
    vec![
        ("tokens".to_string(), tokens.to_string()),
        ("ts".to_string(), ts_us.to_string()),
    ]
}

fn call(conn: &mut redis::Connection, command: &str, args: &[&str]) -> Vec<i64> {
    redis::cmd(command)
        .arg(args)
        .query(conn)
        .unwrap_or_else(|e| panic!("{command} {args:?}: {e}"))
}

#[test]
fn drained_bucket_after_a_step_back_waits_only_its_own_refill() {
    let clock = Clock::new(START);
    let Some(server) = clocked(&clock, Options::default()) else {
        return;
    };
    let mut conn = server.conn();
    for (step, key) in [(MS, "1ms"), (HOUR, "1h"), (TEN_YEARS, "10y")] {
        set_clock(&clock, &mut conn, START);
        // rate 10/s, burst 3: drained now, one token per 100 ms.
        assert_eq!(
            acquire(&mut conn, key, "10", "3", Some("3")),
            [1, 0, 0, 300]
        );
        let back = START - step;
        set_clock(&clock, &mut conn, back);
        let before = dirty(&mut conn);
        // Before, this answered the step plus 100 ms (for 10 years: 315,576,000,100 ms).
        assert_eq!(
            acquire(&mut conn, key, "10", "3", None),
            [0, 0, 100, 300],
            "{key}"
        );
        assert_eq!(hgetall(&mut conn, key), fields("0", back), "{key}");
        // Full at back + 300 ms, plus the 1 s slack.
        assert_eq!(pexpiretime(&mut conn, key), back / MS + 1_300, "{key}");
        assert_eq!(
            dirty(&mut conn) - before,
            2,
            "{key}: one HSET and one PEXPIREAT"
        );
        set_clock(&clock, &mut conn, back + 50 * MS);
        assert_eq!(
            acquire(&mut conn, key, "10", "3", None),
            [0, 0, 50, 250],
            "{key}"
        );
        assert_eq!(
            dirty(&mut conn) - before,
            2,
            "{key}: a later denial writes nothing"
        );
        set_clock(&clock, &mut conn, back + 100 * MS);
        assert_eq!(
            acquire(&mut conn, key, "10", "3", None),
            [1, 0, 0, 300],
            "{key}"
        );
    }
    ping(&mut conn);
}

#[test]
fn every_command_records_the_new_time_base_once_and_replicates_it() {
    let clock = Clock::new(START);
    let Some(primary) = clocked(&clock, primary_options()) else {
        return;
    };
    let replica = start_clocked(
        &clock,
        Options {
            clock: Some(clock.path()),
            ..replica_of(primary.port, false)
        },
    );
    wait_replicas_online(&primary, 1);
    let mut conn = primary.conn();
    for key in [
        "acquire", "all", "reserve", "each", "atmost", "charge", "lower",
    ] {
        assert_eq!(
            acquire(&mut conn, key, "10", "3", Some("3")),
            [1, 0, 0, 300]
        );
    }
    assert_eq!(acquire(&mut conn, "peek", "10", "3", None), [1, 2, 0, 100]);
    assert_eq!(
        call(&mut conn, "TB.RESERVE", &["debt", "10", "3", "3", "0"]),
        [1, 0, 0, 300]
    );
    assert_eq!(
        call(&mut conn, "TB.RESERVE", &["debt", "10", "3", "2", "1000"]),
        [1, 200, 0, 500]
    );
    assert_eq!(
        call(&mut conn, "TB.BLOCK", &["block", "10", "3", "1000"]),
        [0, 1_100, 1_300]
    );

    let back = START - HOUR;
    clock.set_us(back);
    let before = dirty(&mut conn);
    let denials = |conn: &mut redis::Connection| {
        assert_eq!(acquire(conn, "acquire", "10", "3", None), [0, 0, 100, 300]);
        assert_eq!(
            call(conn, "TB.ACQUIREALL", &["1", "all", "10", "3"]),
            [0, 0, 100, 300, 0]
        );
        assert_eq!(
            call(conn, "TB.RESERVE", &["reserve", "10", "3", "1", "50"]),
            [0, 100, 0, 300]
        );
        assert_eq!(
            call(conn, "TB.REFUND", &["debt", "10", "3", "1"]),
            [0, 0, 500]
        );
        assert_eq!(acquire(conn, "peek", "10", "3", Some("0")), [1, 2, 0, 100]);
        let each = acquire_each(conn, &["each", "10", "3", "1"]);
        assert_eq!((each.allowed, each.buckets), (0, vec![[0, 0, 100, 300]]));
        assert_eq!(
            acquire_at_most(conn, "atmost", "10", "3", "2"),
            [0, 0, 100, 300]
        );
        assert_eq!(
            call(conn, "TB.CHARGE", &["charge", "10", "3", "0"]),
            [0, 100, 300]
        );
        // A shorter block than the one the bucket holds keeps it.
        assert_eq!(
            call(conn, "TB.BLOCK", &["block", "10", "3", "500"]),
            [0, 1_100, 1_300]
        );
        // A lower above what the bucket holds keeps it.
        assert_eq!(
            call(conn, "TB.LOWER", &["lower", "10", "3", "1"]),
            [0, 100, 300]
        );
    };
    denials(&mut conn);
    // Ten buckets, each an HSET and a PEXPIREAT (the old expiry lies an hour beyond the new window).
    assert_eq!(dirty(&mut conn) - before, 20);
    for (key, tokens) in [
        ("acquire", "0"),
        ("all", "0"),
        ("reserve", "0"),
        ("debt", "-2"),
        ("peek", "2"),
        ("each", "0"),
        ("atmost", "0"),
        ("charge", "0"),
        ("block", "-10"),
        ("lower", "0"),
    ] {
        assert_eq!(hgetall(&mut conn, key), fields(tokens, back), "{key}");
    }
    // The same calls again: same replies, nothing written.
    denials(&mut conn);
    assert_eq!(dirty(&mut conn) - before, 20);

    wait_acked(&mut conn, 1, 5_000);
    let mut on_replica = replica.conn();
    assert_eq!(buckets(&mut on_replica), buckets(&mut conn));
}

#[test]
fn jump_forward_then_back_moves_the_expiry_back_too() {
    let clock = Clock::new(START);
    let Some(server) = clocked(&clock, Options::default()) else {
        return;
    };
    let mut conn = server.conn();
    assert_eq!(
        acquire(&mut conn, "k", "10", "3", Some("3")),
        [1, 0, 0, 300]
    );
    // Ten years ahead, the bucket is full again (as far as any clock can tell, that time passed); drain it there.
    let ahead = START + TEN_YEARS;
    set_clock(&clock, &mut conn, ahead);
    assert_eq!(
        acquire(&mut conn, "k", "10", "3", Some("3")),
        [1, 0, 0, 300]
    );
    assert_eq!(pexpiretime(&mut conn, "k"), ahead / MS + 1_300);
    // The clock is corrected to 1 s after the start: no ten-year lockout, and no ten-year key either.
    let fixed = START + 1_000 * MS;
    set_clock(&clock, &mut conn, fixed);
    assert_eq!(acquire(&mut conn, "k", "10", "3", None), [0, 0, 100, 300]);
    assert_eq!(hgetall(&mut conn, "k"), fields("0", fixed));
    assert_eq!(pexpiretime(&mut conn, "k"), fixed / MS + 1_300);
    set_clock(&clock, &mut conn, fixed + 100 * MS);
    assert_eq!(acquire(&mut conn, "k", "10", "3", None), [1, 0, 0, 300]);
}

#[test]
fn promoted_replica_with_a_clock_behind_keeps_tokens_and_refills_from_its_own_clock() {
    // The primary's clock runs 5 s ahead of its replica's.
    let primary_clock = Clock::new(START + 5_000 * MS);
    let replica_clock = Clock::new(START);
    let Some(mut primary) = clocked(&primary_clock, primary_options()) else {
        return;
    };
    primary_clock.set_us(START + 5_000 * MS);
    let replica = start_clocked(
        &replica_clock,
        Options {
            clock: Some(replica_clock.path()),
            ..replica_of(primary.port, true)
        },
    );
    wait_replicas_online(&primary, 1);
    let mut conn = primary.conn();
    // rate 1000/s, burst 10: 3 tokens left as of the primary's clock.
    assert_eq!(
        acquire(&mut conn, "k", "1000", "10", Some("7")),
        [1, 3, 0, 7]
    );
    wait_acked(&mut conn, 1, 5_000);
    primary.kill();
    let mut conn = replica.conn();
    promote(&mut conn);

    // The promoted server reads 5 s earlier than the stored time: the 3 tokens stay 3 (the 5 s do not become
    // 5000 tokens at 1000/s), and the refill runs from its own clock, which the first write records. That write
    // also moves the expiry set on the primary's clock into the new window (full at +8 ms, plus the 1 s slack),
    // where the next two writes may leave it.
    for left in [2, 1, 0] {
        assert_eq!(
            acquire(&mut conn, "k", "1000", "10", None),
            [1, left, 0, 10 - left]
        );
        assert_eq!(hgetall(&mut conn, "k"), fields(&left.to_string(), START));
        assert_eq!(pexpiretime(&mut conn, "k"), START / MS + 1_008);
    }
    let before = dirty(&mut conn);
    assert_eq!(acquire(&mut conn, "k", "1000", "10", None), [0, 0, 1, 10]);
    assert_eq!(dirty(&mut conn), before, "a denial wrote");
    replica_clock.set_us(START + MS);
    assert_eq!(acquire(&mut conn, "k", "1000", "10", None), [1, 0, 0, 10]);
}
