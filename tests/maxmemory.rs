//! Above `maxmemory` (with `noeviction`, where nothing can be evicted), every command answers a call that writes
//! nothing, as it would at any memory: a refusal, a peek, a call that finds nothing to change. A call that would
//! write is refused with Redis's own OOM reply and changes nothing, on every key it names. `TB.REFUND` is performed
//! (a limiter that cannot give tokens back would over-count). `CL.THROTTLE`'s peek is answered without its write.
mod common;

use common::*;

const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";
/// One token per 1000 s: nothing refills while the test runs.
const RATE: &str = "0.001";

fn out_of_memory(conn: &mut redis::Connection, on: bool) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query(conn)
        .expect("CONFIG SET maxmemory-policy");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(if on { "1" } else { "0" })
        .query(conn)
        .expect("CONFIG SET maxmemory");
}

/// The first integer of a reply, or the error text.
fn first(conn: &mut redis::Connection, command: &str, args: &[&str]) -> Result<i64, String> {
    redis::cmd(command)
        .arg(args)
        .query::<redis::Value>(conn)
        .map(|value| match value {
            redis::Value::Array(items) => match items.first() {
                Some(redis::Value::Int(n)) => *n,
                other => panic!("{command} {args:?}: {other:?}"),
            },
            other => panic!("{command} {args:?}: {other:?}"),
        })
        .map_err(|e| error_text(&e))
}

/// What a client can see of a key: its value (hash fields or string) and expiry (`None` on Redis 6.2, which has
/// no PEXPIRETIME, and whose TIME + PTTL in a MULTI is refused above maxmemory).
fn seen(conn: &mut redis::Connection, key: &str) -> (String, Option<i64>) {
    let kind: String = redis::cmd("TYPE").arg(key).query(conn).expect("TYPE");
    let value = match kind.as_str() {
        "hash" => format!("{:?}", hgetall(conn, key)),
        "string" => redis::cmd("GET")
            .arg(key)
            .query::<String>(conn)
            .expect("GET"),
        other => other.to_string(),
    };
    let expiry = redis::cmd("PEXPIRETIME").arg(key).query::<i64>(conn).ok();
    (value, expiry)
}

#[test]
fn calls_that_write_are_refused_and_the_others_answered() {
    let server = Server::start();
    let mut conn = server.conn();
    assert_eq!(
        first(&mut conn, "TB.ACQUIRE", &["b", RATE, "5", "3"]),
        Ok(1)
    );
    assert_eq!(
        first(&mut conn, "CL.THROTTLE", &["t", "0", "1", "3600"]),
        Ok(0)
    );
    let (bucket, throttle) = (seen(&mut conn, "b"), seen(&mut conn, "t"));
    out_of_memory(&mut conn, true);
    // (command, arguments, the first integer of the reply, or the OOM error)
    let cases: [(&str, &[&str], Result<i64, &str>); 19] = [
        // Calls that would write: refused, on an existing key and on a new one.
        ("TB.ACQUIRE", &["b", RATE, "5", "1"], Err(OOM)),
        ("TB.ACQUIRE", &["new", RATE, "5", "1"], Err(OOM)),
        (
            "TB.ACQUIREALL",
            &["1", "b", RATE, "5", "new", RATE, "5"],
            Err(OOM),
        ),
        (
            "TB.ACQUIREEACH",
            &["new", RATE, "5", "1", "b", RATE, "5", "1"],
            Err(OOM),
        ),
        ("TB.ACQUIREATMOST", &["b", RATE, "5", "2"], Err(OOM)),
        ("TB.RESERVE", &["b", RATE, "5", "1", "0"], Err(OOM)),
        ("TB.CHARGE", &["b", RATE, "5", "1"], Err(OOM)),
        ("TB.BLOCK", &["b", RATE, "5", "1000"], Err(OOM)),
        ("TB.LOWER", &["b", RATE, "5", "0"], Err(OOM)),
        ("CL.THROTTLE", &["new", "0", "1", "3600"], Err(OOM)),
        // Peeks, refusals and calls with nothing to change: answered.
        ("TB.ACQUIRE", &["b", RATE, "5", "0"], Ok(1)),
        ("TB.ACQUIRE", &["b", RATE, "5", "3"], Ok(0)),
        (
            "TB.ACQUIREALL",
            &["3", "b", RATE, "5", "new", RATE, "5"],
            Ok(0),
        ),
        (
            "TB.ACQUIREEACH",
            &["new", RATE, "5", "1", "b", RATE, "5", "3"],
            Ok(0),
        ),
        ("TB.RESERVE", &["b", RATE, "5", "3", "0"], Ok(0)),
        ("TB.CHARGE", &["b", RATE, "5", "0"], Ok(2)),
        ("TB.LOWER", &["b", RATE, "5", "4"], Ok(2)),
        ("CL.THROTTLE", &["t", "0", "1", "3600"], Ok(1)),
        // A peek is answered without its write, on a new key and on a live one.
        ("CL.THROTTLE", &["new", "0", "1", "3600", "0"], Ok(0)),
    ];
    for (command, args, want) in cases {
        let got = first(&mut conn, command, args);
        assert_eq!(got, want.map_err(str::to_string), "{command} {args:?}");
        assert_eq!(seen(&mut conn, "b"), bucket, "{command} {args:?}");
        assert_eq!(seen(&mut conn, "t"), throttle, "{command} {args:?}");
        assert_eq!(seen(&mut conn, "new").0, "none", "{command} {args:?}");
    }
    assert_eq!(
        first(&mut conn, "CL.THROTTLE", &["t", "0", "1", "3600", "0"]),
        Ok(0)
    );
    assert_eq!(seen(&mut conn, "t"), throttle);
    // A call from a script is refused likewise, and changes nothing (Redis before 7.0 refuses every call there).
    let script: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
        .arg("return redis.call('TB.ACQUIRE', KEYS[1], ARGV[1], '5', '1')")
        .arg(1)
        .arg("b")
        .arg(RATE)
        .query(&mut conn);
    if !scripts_refused(&mut conn) {
        // The server adds where in the script the error came from.
        let error = script.map_err(|e| error_text(&e)).expect_err("refused");
        assert!(error.starts_with(OOM), "{error}");
        assert_eq!(seen(&mut conn, "b"), bucket);
    }
    // TB.REFUND gives tokens back at any memory.
    assert_eq!(first(&mut conn, "TB.REFUND", &["b", RATE, "5", "1"]), Ok(1));
    assert_ne!(seen(&mut conn, "b"), bucket);
    out_of_memory(&mut conn, false);
    assert_eq!(
        first(&mut conn, "TB.ACQUIRE", &["b", RATE, "5", "1"]),
        Ok(1)
    );
    assert_eq!(
        first(&mut conn, "CL.THROTTLE", &["new", "0", "1", "3600"]),
        Ok(0)
    );
    ping(&mut conn);
}

#[test]
fn no_command_is_deny_oom() {
    let server = Server::start();
    let mut conn = server.conn();
    let info: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(&[
            "tb.acquire",
            "tb.acquireall",
            "tb.acquireeach",
            "tb.acquireatmost",
            "tb.reserve",
            "tb.refund",
            "tb.charge",
            "tb.block",
            "tb.lower",
            "cl.throttle",
        ])
        .query(&mut conn)
        .expect("COMMAND INFO");
    let text = format!("{info:?}");
    assert_eq!(text.matches("\"write\"").count(), 10, "{text}");
    assert!(!text.contains("denyoom"), "{text}");
}
