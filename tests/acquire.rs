//! TB.ACQUIRE against a real server: every reply field, refill, expiry, what denials and peeks (don't) write,
//! and the command inside MULTI/EXEC and Lua.

mod common;

use std::time::Duration;

use common::{acquire, dirty, hgetall, pexpiretime, wait_until, Server, Stopwatch};

use common::server_now_ms as now_ms;

#[test]
fn reply_fields_follow_the_contract() {
    let server = Server::start();
    let mut conn = server.conn();
    // rate 1/s, burst 3: slow enough that nothing refills meaningfully during the test.
    let watch = Stopwatch::start();
    assert_eq!(acquire(&mut conn, "k", "1", "3", None), [1, 2, 0, 1_000]);
    let drained = acquire(&mut conn, "k", "1", "3", Some("2"));
    assert_eq!(drained[..3], [1, 0, 0]);
    assert!(watch.since(3_000).contains(&drained[3]), "{drained:?}");
    let denied = acquire(&mut conn, "k", "1", "3", None);
    assert_eq!(denied[..2], [0, 0]);
    assert!(
        watch.since(1_000).contains(&denied[2]),
        "retry_after_ms {}",
        denied[2]
    );
    assert!(
        watch.since(3_000).contains(&denied[3]),
        "reset_after_ms {}",
        denied[3]
    );
    // cost > burst can never succeed.
    let impossible = acquire(&mut conn, "k", "1", "3", Some("4"));
    assert_eq!((impossible[0], impossible[2]), (0, -1));
}

#[test]
fn state_is_a_plain_hash_with_tokens_and_ts() {
    let server = Server::start();
    let mut conn = server.conn();
    let before_us = now_ms(&mut conn) * 1_000;
    acquire(&mut conn, "k", "1", "10", Some("2.5"));
    let fields = hgetall(&mut conn, "k");
    assert_eq!(fields.len(), 2);
    assert_eq!(fields[0].0, "tokens");
    assert_eq!(fields[0].1.parse::<f64>().expect("decimal tokens"), 7.5);
    assert_eq!(fields[1].0, "ts");
    let ts: i64 = fields[1].1.parse().expect("integer microseconds");
    assert!(
        ts >= before_us && ts < before_us + 5_000_000,
        "ts {ts} vs {before_us}"
    );
}

#[test]
fn tokens_refill_over_time() {
    let server = Server::start();
    let mut conn = server.conn();
    // 100 tokens/s: one token every 10 ms, taken whole by one call. The next is refused with the rest of those
    // 10 ms, unless a busy machine let 10 ms pass in between: then it must be allowed.
    let watch = Stopwatch::start();
    assert_eq!(acquire(&mut conn, "k", "100", "5", Some("5"))[..2], [1, 0]);
    let denied = acquire(&mut conn, "k", "100", "5", None);
    if denied[0] == 1 {
        assert!(watch.ms() >= 10, "a token back after {} ms", watch.ms());
    } else {
        let range = watch.since(10);
        assert!(
            range.contains(&denied[2]) && denied[2] >= 1,
            "retry_after_ms {}",
            denied[2]
        );
    }
    // Poll until a token is back; it must come within a few refill periods, not instantly, not never.
    assert!(wait_until(Duration::from_secs(2), || acquire(
        &mut conn, "k", "100", "5", None
    )[0] == 1));
    let peek = acquire(&mut conn, "k", "100", "5", Some("0"));
    assert!(
        peek[1] <= watch.ms() / 10,
        "a refill of 10 ms per token, less the one taken, in {} ms: {peek:?}",
        watch.ms()
    );
}

/// How long a key may outlive its bucket's moment of full: 1% of the time to fill from empty, at least 1 s, at
/// most a day (docs/commands.md's contract).
const MIN_SLACK_MS: i64 = 1_000;
const MAX_SLACK_MS: i64 = 86_400_000;

#[test]
fn key_expires_after_full_within_the_slack() {
    let server = Server::start();
    let mut conn = server.conn();
    let before_ms = now_ms(&mut conn);
    acquire(&mut conn, "k", "10", "5", Some("2"));
    let after_ms = now_ms(&mut conn);
    // Two tokens at 10/s refill in 200 ms; 5 tokens fill in 0.5 s, so the slack is its 1 s minimum.
    let expiry = pexpiretime(&mut conn, "k");
    let (expire_at, slack) = (expiry.at_ms, expiry.slack_ms());
    assert!(
        expire_at >= before_ms + 200 - slack && expire_at <= after_ms + 201 + MIN_SLACK_MS + slack,
        "{before_ms} {expire_at} {after_ms}"
    );
    assert!(wait_until(Duration::from_secs(3), || {
        let exists: i64 = redis::cmd("EXISTS")
            .arg("k")
            .query(&mut conn)
            .expect("EXISTS");
        exists == 0
    }));
    assert_eq!(acquire(&mut conn, "k", "10", "5", Some("0")), [1, 5, 0, 0]);
}

#[test]
fn denied_call_writes_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire(&mut conn, "k", "0.001", "2", Some("2"));
    let fields = hgetall(&mut conn, "k");
    let expire_at = pexpiretime(&mut conn, "k");
    let dirty_before = dirty(&mut conn);
    for _ in 0..20 {
        assert_eq!(acquire(&mut conn, "k", "0.001", "2", None)[0], 0);
        assert_eq!(acquire(&mut conn, "k", "0.001", "2", Some("5"))[2], -1);
    }
    assert_eq!(hgetall(&mut conn, "k"), fields);
    assert_eq!(pexpiretime(&mut conn, "k"), expire_at);
    assert_eq!(
        dirty(&mut conn),
        dirty_before,
        "a denial must not touch the dataset"
    );
}

#[test]
fn peek_creates_and_writes_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    assert_eq!(
        acquire(&mut conn, "fresh", "1", "4", Some("0")),
        [1, 4, 0, 0]
    );
    let exists: i64 = redis::cmd("EXISTS")
        .arg("fresh")
        .query(&mut conn)
        .expect("EXISTS");
    assert_eq!(exists, 0);
    acquire(&mut conn, "k", "0.001", "4", Some("3"));
    let fields = hgetall(&mut conn, "k");
    let peek = acquire(&mut conn, "k", "0.001", "4", Some("0"));
    assert_eq!(peek[..3], [1, 1, 0]);
    assert_eq!(hgetall(&mut conn, "k"), fields);
}

#[test]
fn smaller_burst_caps_tokens() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire(&mut conn, "k", "0.001", "100", None);
    // The plan shrinks to burst 5: the 99 stored tokens count as 5.
    assert_eq!(acquire(&mut conn, "k", "0.001", "5", None)[..2], [1, 4]);
}

#[test]
fn fractional_arguments_work() {
    let server = Server::start();
    let mut conn = server.conn();
    let watch = Stopwatch::start();
    assert_eq!(
        acquire(&mut conn, "k", "0.5", "1.5", Some("1"))[..2],
        [1, 0]
    );
    let denied = acquire(&mut conn, "k", "0.5", "1.5", Some("1"));
    assert_eq!(denied[0], 0);
    assert!(
        watch.since(1_000).contains(&denied[2]),
        "half a token at 0.5/s: about 1 s, got {}",
        denied[2]
    );
    assert_eq!(acquire(&mut conn, "k", "2.5e-3", "1.5", Some("0.25"))[0], 1);
}

#[test]
fn extreme_values_saturate() {
    let server = Server::start();
    let mut conn = server.conn();
    let now = now_ms(&mut conn);
    let huge = acquire(&mut conn, "slow", "1e-9", "1e15", Some("1e15"));
    assert_eq!(huge[..3], [1, 0, 0]);
    assert!(huge[3] > 0);
    let ttl_ms: i64 = redis::cmd("PTTL")
        .arg("slow")
        .query(&mut conn)
        .expect("PTTL");
    // The TTL saturates at 100 years plus the slack, at most a day (measured against the server's cached
    // clock: a few ms more).
    assert!(
        ttl_ms > 3_155_000_000_000 && ttl_ms <= 3_155_760_000_000 + MAX_SLACK_MS + 10,
        "{ttl_ms}"
    );
    assert!(pexpiretime(&mut conn, "slow").at_ms >= now + 3_155_000_000_000);
    let fast = acquire(&mut conn, "fast", "1e12", "1e15", Some("1"));
    assert_eq!(fast[0], 1);
    let watch = Stopwatch::start();
    let tiny = acquire(&mut conn, "tiny", "1e-300", "1e-300", Some("1e-300"));
    assert_eq!(tiny[0], 1);
    let denied = acquire(&mut conn, "tiny", "1e-300", "1e-300", Some("1e-300"));
    assert_eq!(denied[0], 0);
    assert!(
        watch.since(1_000).contains(&denied[2]),
        "1e-300 tokens at 1e-300 per second: one second, got {}",
        denied[2]
    );
    acquire(&mut conn, "glacial", "1e-300", "1", Some("1"));
    let never = acquire(&mut conn, "glacial", "1e-300", "1", Some("1"));
    assert_eq!(
        never[..3],
        [0, 0, i64::MAX],
        "a wait beyond i64 milliseconds saturates"
    );
    assert_eq!(never[3], i64::MAX);
    common::ping(&mut conn);
}

#[test]
fn works_inside_multi_and_lua() {
    let server = Server::start();
    let mut conn = server.conn();
    let replies: Vec<Vec<i64>> = redis::pipe()
        .atomic()
        .cmd("TB.ACQUIRE")
        .arg("k")
        .arg(1)
        .arg(2)
        .cmd("TB.ACQUIRE")
        .arg("k")
        .arg(1)
        .arg(2)
        .cmd("TB.ACQUIRE")
        .arg("k")
        .arg(1)
        .arg(2)
        .query(&mut conn)
        .expect("MULTI/EXEC");
    assert_eq!(replies.iter().map(|r| r[0]).collect::<Vec<_>>(), [1, 1, 0]);
    let script = redis::Script::new("return redis.call('TB.ACQUIRE', KEYS[1], ARGV[1], ARGV[2])");
    let from_lua: redis::RedisResult<Vec<i64>> = script.key("lua").arg(1).arg(5).invoke(&mut conn);
    if common::scripts_refused(&mut conn) {
        // Redis 6.2: refused, and nothing written (tests/scripts.rs says why).
        common::assert_script_refused(from_lua);
        assert!(common::hgetall(&mut conn, "lua").is_empty());
    } else {
        assert_eq!(from_lua.expect("EVAL")[..2], [1, 4]);
    }
}

#[test]
fn command_getkeys_finds_the_key() {
    let server = Server::start();
    let mut conn = server.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("TB.ACQUIRE")
        .arg("user:42")
        .arg(1)
        .arg(2)
        .query(&mut conn)
        .expect("COMMAND GETKEYS");
    assert_eq!(keys, ["user:42"]);
}

#[test]
fn expired_or_deleted_bucket_is_full() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire(&mut conn, "k", "0.001", "3", Some("3"));
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut conn).expect("DEL");
    assert_eq!(acquire(&mut conn, "k", "0.001", "3", Some("0"))[1], 3);
    acquire(&mut conn, "k", "0.001", "3", Some("3"));
    let _: i64 = redis::cmd("PEXPIRE")
        .arg("k")
        .arg(1)
        .query(&mut conn)
        .expect("PEXPIRE");
    assert!(wait_until(Duration::from_secs(2), || acquire(
        &mut conn,
        "k",
        "0.001",
        "3",
        Some("0")
    )[1] == 3));
}

#[test]
fn extreme_stored_values_never_hurt_the_server() {
    let server = Server::start();
    let mut conn = server.conn();
    let hset = |conn: &mut redis::Connection, key: &str, tokens: &str, ts: &str| {
        let _: i64 = redis::cmd("HSET")
            .arg(key)
            .arg("tokens")
            .arg(tokens)
            .arg("ts")
            .arg(ts)
            .query(conn)
            .expect("HSET");
    };
    // A timestamp at the end of time is a clock far behind it: the bucket keeps its tokens and refills from
    // now (rate 1/s: a token in 1 s, full in 5 s), and the first call records the server's time as `ts`.
    hset(&mut conn, "future", "0", &i64::MAX.to_string());
    assert_eq!(
        acquire(&mut conn, "future", "1", "5", None),
        [0, 0, 1_000, 5_000]
    );
    assert_ne!(hgetall(&mut conn, "future")[1].1, i64::MAX.to_string());
    hset(&mut conn, "future", "3", &i64::MAX.to_string());
    assert_eq!(
        acquire(&mut conn, "future", "1", "5", None),
        [1, 2, 0, 3_000]
    );
    let ttl_ms: i64 = redis::cmd("PTTL")
        .arg("future")
        .query(&mut conn)
        .expect("PTTL");
    // Full in 3 s (rounded up to the next whole ms), plus the 1 s slack.
    assert!(ttl_ms > 3_000 - 100 && ttl_ms <= 4_001, "{ttl_ms}");
    // The epoch, and tokens far above the burst: refilled or capped to the burst.
    hset(&mut conn, "epoch", "0", "0");
    assert_eq!(
        acquire(&mut conn, "epoch", "1", "5", Some("0")),
        [1, 5, 0, 0]
    );
    hset(&mut conn, "huge", "1e308", "0");
    assert_eq!(acquire(&mut conn, "huge", "1", "5", None)[..2], [1, 4]);
    common::ping(&mut conn);
}
