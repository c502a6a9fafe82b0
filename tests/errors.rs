//! Bad input: every refusal carries a clear Redis error, changes nothing, and the server lives on.

mod common;

use common::{acquire, acquire_error, hgetall, pexpiretime, ping, Server};

const ARITY: &str = "ERR wrong number of arguments for 'tb.acquire' command";
const RATE: &str = "ERR rate must be a positive number";
const BURST: &str = "ERR burst must be a positive number";
const COST: &str = "ERR cost must be a non-negative number";
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_A_BUCKET: &str =
    "ERR key is not a valid token bucket (expected a hash with only the fields tokens and ts)";

/// Values that are not finite decimals, or not positive.
const NOT_POSITIVE: [&str; 14] = [
    "abc", "0", "-1", "nan", "NaN", "inf", "-inf", "1e400", "0x10", "", "1abc", " 1", "1e-400",
    "-0",
];

/// Snapshot of a key: its fields and absolute expiry.
fn snapshot(conn: &mut redis::Connection, key: &str) -> (Vec<(String, String)>, common::Expiry) {
    (hgetall(conn, key), pexpiretime(conn, key))
}

#[test]
fn wrong_argument_count_is_refused() {
    let server = Server::start();
    let mut conn = server.conn();
    for args in [&[][..], &["k"], &["k", "1"], &["k", "1", "2", "3", "4"]] {
        assert_eq!(acquire_error(&mut conn, args), ARITY, "{args:?}");
    }
    ping(&mut conn);
}

#[test]
fn bad_numbers_name_their_argument_and_change_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    acquire(&mut conn, "k", "0.001", "5", Some("2"));
    let before = snapshot(&mut conn, "k");
    for bad in NOT_POSITIVE {
        assert_eq!(
            acquire_error(&mut conn, &["k", bad, "5"]),
            RATE,
            "rate {bad:?}"
        );
        assert_eq!(
            acquire_error(&mut conn, &["k", "1", bad, "1"]),
            BURST,
            "burst {bad:?}"
        );
    }
    // Two bad numbers: the error names the first in argument order (`TB.ACQUIRE k 0 inf` named the burst).
    for bad_rate in NOT_POSITIVE {
        for bad_burst in NOT_POSITIVE {
            assert_eq!(
                acquire_error(&mut conn, &["k", bad_rate, bad_burst]),
                RATE,
                "rate {bad_rate:?}, burst {bad_burst:?}"
            );
        }
    }
    for bad in ["abc", "-1", "-0.5", "nan", "inf", "1e400", "0x1", "", "2x"] {
        assert_eq!(
            acquire_error(&mut conn, &["k", "1", "5", bad]),
            COST,
            "cost {bad:?}"
        );
    }
    assert_eq!(snapshot(&mut conn, "k"), before);
    // A refused call on a missing key creates nothing.
    assert_eq!(acquire_error(&mut conn, &["nokey", "0", "5"]), RATE);
    let exists: i64 = redis::cmd("EXISTS")
        .arg("nokey")
        .query(&mut conn)
        .expect("EXISTS");
    assert_eq!(exists, 0);
    ping(&mut conn);
}

#[test]
fn zero_cost_is_a_valid_peek_but_negative_zero_rate_is_not() {
    let server = Server::start();
    let mut conn = server.conn();
    assert_eq!(acquire(&mut conn, "k", "1", "2", Some("0"))[0], 1);
    assert_eq!(acquire(&mut conn, "k", "1", "2", Some("-0"))[0], 1);
    assert_eq!(acquire_error(&mut conn, &["k", "-0", "2"]), RATE);
}

#[test]
fn key_of_another_type_is_wrongtype() {
    let server = Server::start();
    let mut conn = server.conn();
    let _: () = redis::cmd("SET")
        .arg("s")
        .arg("value")
        .query(&mut conn)
        .expect("SET");
    let _: i64 = redis::cmd("RPUSH")
        .arg("l")
        .arg("a")
        .query(&mut conn)
        .expect("RPUSH");
    assert_eq!(acquire_error(&mut conn, &["s", "1", "1"]), WRONGTYPE);
    assert_eq!(acquire_error(&mut conn, &["l", "1", "1", "0"]), WRONGTYPE);
    let value: String = redis::cmd("GET").arg("s").query(&mut conn).expect("GET");
    assert_eq!(value, "value");
    let ttl: i64 = redis::cmd("PTTL").arg("s").query(&mut conn).expect("PTTL");
    assert_eq!(ttl, -1);
    ping(&mut conn);
}

#[test]
fn hash_that_is_not_a_bucket_is_refused_and_kept() {
    let server = Server::start();
    let mut conn = server.conn();
    let corrupt: [&[(&str, &str)]; 8] = [
        &[("a", "b")],
        &[("tokens", "1")],
        &[("tokens", "1"), ("ts", "5"), ("extra", "x")],
        &[("tokens", "abc"), ("ts", "5")],
        &[("tokens", "-inf"), ("ts", "5")],
        &[("tokens", "inf"), ("ts", "5")],
        &[("tokens", "1"), ("ts", "soon")],
        &[("tokens", "1"), ("other", "5")],
    ];
    for (n, fields) in corrupt.iter().enumerate() {
        let key = format!("h{n}");
        let mut hset = redis::cmd("HSET");
        hset.arg(&key);
        for (field, value) in fields.iter() {
            hset.arg(*field).arg(*value);
        }
        let _: i64 = hset.query(&mut conn).expect("HSET");
        let before = snapshot(&mut conn, &key);
        assert_eq!(
            acquire_error(&mut conn, &[&key, "1", "5"]),
            NOT_A_BUCKET,
            "{fields:?}"
        );
        assert_eq!(
            acquire_error(&mut conn, &[&key, "1", "5", "0"]),
            NOT_A_BUCKET,
            "{fields:?}"
        );
        assert_eq!(snapshot(&mut conn, &key), before, "{fields:?}");
    }
    ping(&mut conn);
}

#[test]
fn random_argument_vectors_never_hurt_the_server() {
    let server = Server::start();
    let mut conn = server.conn();
    const POOL: [&str; 22] = [
        "k",
        "1",
        "0",
        "-1",
        "0.5",
        "1e15",
        "1e-9",
        "1e12",
        "1e400",
        "nan",
        "inf",
        "",
        "abc",
        "2.5e-3",
        "999999999999999999999",
        "1e308",
        "5e-324",
        "-0",
        "0x10",
        "\u{0}",
        "k2",
        "10",
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut pipe = redis::pipe();
    for round in 0..3_000 {
        // Half the rounds TB.ACQUIRE, the others the commands that take several buckets or a `max`.
        let name = [
            "TB.ACQUIRE",
            "TB.ACQUIREEACH",
            "TB.ACQUIRE",
            "TB.ACQUIREATMOST",
        ][(next() % 4) as usize];
        let argc = (next() % 10) as usize;
        let mut command = redis::cmd(name);
        for _ in 0..argc {
            if next() % 5 == 0 {
                let bytes: Vec<u8> = (0..next() % 12).map(|_| next() as u8).collect();
                command.arg(bytes);
            } else {
                command.arg(POOL[(next() % POOL.len() as u64) as usize]);
            }
        }
        pipe.add_command(command).ignore();
        if round % 500 == 499 {
            // Errors inside an ignored pipeline still come back as the first error; we only care that the
            // server keeps answering.
            let _: redis::RedisResult<()> = pipe.query(&mut conn);
            pipe = redis::pipe();
            ping(&mut conn);
        }
    }
    ping(&mut conn);
    let log = server.log();
    assert!(
        !log.contains("crashed"),
        "server log reports a crash:\n{log}"
    );
}
