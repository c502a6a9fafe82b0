//! Replicas hold the same buckets as their primary (issue #4): the module replicates its effects
//! (`HSET key tokens T ts TS` + `PEXPIREAT key MS`, wrapped in MULTI/EXEC by the server), so a replica needs no
//! module and no clock of its own, denials and peeks send nothing, and a promoted replica carries on from the
//! replicated state without minting tokens.

mod common;

use common::{
    acquire, block, buckets, charge, command_error, error_text, hgetall, info_field, info_int,
    mixed_workload, pexpiretime, primary_options, replica_of, server_now_ms, wait_acked,
    wait_replicas_online, Bucket, Server,
};
use std::collections::BTreeMap;

/// How long `WAIT` may block for the replica to acknowledge the stream.
const WAIT_MS: i64 = 5_000;

/// Compares a primary's and a replica's buckets, read one after the other. A key that one side has and the
/// other lacks is tolerated only if it expired in between (its expiry is at or before `read_done_ms`, read from
/// the server after both snapshots); every key both hold must match byte for byte, expiry included.
fn assert_same_buckets(
    primary: &BTreeMap<String, Bucket>,
    replica: &BTreeMap<String, Bucket>,
    read_done_ms: i64,
) -> usize {
    let mut compared = 0;
    for (key, bucket) in primary {
        match replica.get(key) {
            Some(on_replica) => {
                assert_eq!(on_replica, bucket, "bucket {key} differs on the replica");
                compared += 1;
            }
            None => assert!(
                bucket.1 != -1 && bucket.1 <= read_done_ms,
                "bucket {key} {bucket:?} missing on the replica without having expired"
            ),
        }
    }
    for (key, bucket) in replica {
        assert!(
            primary.contains_key(key) || (bucket.1 != -1 && bucket.1 <= read_done_ms),
            "replica holds {key} {bucket:?} that the primary does not"
        );
    }
    compared
}

/// Lines of a server log that report a problem with what it was sent.
fn complaints(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| {
            let lower = line.to_ascii_lowercase();
            lower.contains("unknown command")
                || lower.contains("error")
                || lower.contains("critical")
                || (lower.contains("module") && !lower.contains("static module"))
        })
        .collect()
}

/// Bytes a command takes in the replication stream (RESP multi-bulk).
fn resp_len(args: &[&str]) -> i64 {
    let header = format!("*{}\r\n", args.len()).len();
    let body: usize = args
        .iter()
        .map(|arg| format!("${}\r\n", arg.len()).len() + arg.len() + 2)
        .sum();
    (header + body) as i64
}

/// How many times a server has run each of `commands` (INFO commandstats; 0 for one it never ran).
fn calls(conn: &mut redis::Connection, commands: &[&str]) -> Vec<i64> {
    let commandstats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    commands
        .iter()
        .map(|command| {
            commandstats
                .lines()
                .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |count| count.parse().expect("calls"))
        })
        .collect()
}

/// Bytes the primary sends down the stream for a Lua script whose only write command changes nothing (it deletes
/// a missing key), measured by the offset. Redis 7.0 and Valkey send nothing. Redis 6.2 sends an empty
/// `MULTI`/`EXEC`: it opens the transaction in the stream before a script's first write-flagged command runs,
/// whether or not that command then propagates anything, and closes it when the script ends
/// (`luaRedisGenericCommand` in its scripting.c). `TB.ACQUIRE` is write-flagged, so a script that only peeks or
/// is denied sends that pair too.
fn empty_script_framing(conn: &mut redis::Connection) -> i64 {
    let before = info_int(conn, "replication", "master_repl_offset");
    let _: () = redis::cmd("EVAL")
        .arg("redis.call('DEL', KEYS[1])")
        .arg(1)
        .arg("redis-tb:probe")
        .query(conn)
        .expect("EVAL");
    let framing = info_int(conn, "replication", "master_repl_offset") - before;
    assert!(
        framing == 0 || framing == resp_len(&["MULTI"]) + resp_len(&["EXEC"]),
        "a script that changed nothing sent {framing} bytes"
    );
    framing
}

#[test]
fn module_less_replica_holds_identical_buckets() {
    let primary = Server::start_with(primary_options());
    let replica = Server::start_with(replica_of(primary.port, false));
    wait_replicas_online(&primary, 1);
    let mut conn = primary.conn();
    let mut on_replica = replica.conn();
    // The redis crate's connection handshake (CLIENT SETINFO, 7.2+) already drew errors; count from here.
    let errors_before = info_int(&mut on_replica, "stats", "total_error_replies");
    // Rates from one token per 1000 s to 1000 per second: the fast buckets refill to fractional token counts
    // and expire during the run (their DELs travel down the stream too), the slow ones stay drained.
    let mix = mixed_workload(&mut conn, "b:", 40, &["0.001", "0.5", "20", "1000"], 400, 4);
    println!("workload: {mix:?}");
    assert!(mix.allowed > 50 && mix.denied > 50, "{mix:?}");
    // Redis 6.2 refuses TB commands inside scripts (tests/scripts.rs), so the workload makes no script calls there.
    let lua_calls_ok = if common::scripts_refused(&mut conn) {
        mix.in_lua == 0
    } else {
        mix.in_lua > 20
    };
    assert!(mix.in_multi > 20 && lua_calls_ok, "{mix:?}");
    assert!(mix.each >= 10 && mix.at_most >= 10, "{mix:?}");
    assert!(mix.charged >= 5 && mix.blocked >= 3, "{mix:?}");
    wait_acked(&mut conn, 1, WAIT_MS);
    // Counted before this test reads the replica itself: on Redis 6.2 each of its reads of an expiry starts with
    // a PEXPIRETIME that the server does not know, an error reply of our own making.
    assert_eq!(
        info_int(&mut on_replica, "stats", "total_error_replies"),
        errors_before,
        "the replica answered its primary with errors"
    );

    let primary_buckets = buckets(&mut conn);
    let replica_buckets = buckets(&mut on_replica);
    let read_done_ms = server_now_ms(&mut conn);
    let compared = assert_same_buckets(&primary_buckets, &replica_buckets, read_done_ms);
    println!(
        "{compared} buckets identical on the module-less replica ({} on the primary)",
        primary_buckets.len()
    );
    assert!(
        compared >= 10,
        "too few buckets survived to compare: {compared}"
    );

    let commandstats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut on_replica)
        .expect("INFO commandstats");
    println!("replica {commandstats}");
    for command in ["hset", "pexpireat", "multi", "exec"] {
        let line = commandstats
            .lines()
            .find(|line| line.starts_with(&format!("cmdstat_{command}:")))
            .unwrap_or_else(|| panic!("the replica never ran {command}"));
        assert!(line.contains("rejected_calls=0,failed_calls=0"), "{line}");
    }
    let log = replica.log();
    assert!(
        complaints(&log).is_empty(),
        "the replica's log complains:\n{log}"
    );
}

#[test]
fn denials_and_peeks_send_nothing_down_the_stream() {
    // The primary pings its replicas every repl-ping-replica-period seconds, which also moves the offset; 30 s
    // keeps that ping out of this test's window.
    let mut options = primary_options();
    options
        .args
        .extend(["--repl-ping-replica-period".into(), "30".into()]);
    let primary = Server::start_with(options);
    let replica = Server::start_with(replica_of(primary.port, false));
    wait_replicas_online(&primary, 1);
    let mut conn = primary.conn();
    // Slow rates: nothing expires (an expiry would send a DEL) and nothing refills during the test.
    acquire(&mut conn, "drained", "0.001", "2", Some("2"));
    acquire(&mut conn, "partial", "0.001", "5", Some("3"));
    // 48 tokens owed at 0.001/s (13 hours): a day of refill is 86.4 tokens.
    charge(&mut conn, "indebted", "0.001", "2", "50");
    wait_acked(&mut conn, 1, WAIT_MS);
    let script = redis::Script::new(
        "local a = redis.call('TB.ACQUIRE', KEYS[1], '0.001', '2') \
         local b = redis.call('TB.ACQUIRE', KEYS[2], '0.001', '5', '0') \
         return {a[1], b[1]}",
    );
    // Loaded before the window: the client's SCRIPT LOAD is not the module's doing, and Redis 6.2 replicates it.
    script
        .prepare_invoke()
        .load(&mut conn)
        .expect("SCRIPT LOAD");
    let framing = empty_script_framing(&mut conn);
    // The data commands a bucket can reach a replica as: its write, and the deletion when it expires.
    const DATA: [&str; 4] = ["hset", "pexpireat", "del", "unlink"];
    let mut on_replica = replica.conn();
    let data_before = calls(&mut on_replica, &DATA);
    let offset = info_int(&mut conn, "replication", "master_repl_offset");

    for _ in 0..20 {
        assert_eq!(acquire(&mut conn, "drained", "0.001", "2", None)[0], 0);
        assert_eq!(acquire(&mut conn, "drained", "0.001", "2", Some("0"))[0], 1);
        assert_eq!(
            acquire(&mut conn, "partial", "0.001", "5", Some("9"))[2],
            -1
        );
        assert_eq!(
            acquire(&mut conn, "missing", "1", "5", Some("0")),
            [1, 5, 0, 0]
        );
        // A zero charge, a block shorter than the debt, and refused charges and blocks change nothing.
        assert_eq!(charge(&mut conn, "indebted", "0.001", "2", "0")[0], 0);
        assert_eq!(block(&mut conn, "indebted", "0.001", "2", "1000")[0], 0);
        assert!(
            command_error(&mut conn, "TB.CHARGE", &["indebted", "0.001", "2", "40"])
                .starts_with("ERR charge would put")
        );
        command_error(&mut conn, "TB.BLOCK", &["missing", "1", "5", "0"]);
    }
    let in_multi: Vec<Vec<i64>> = redis::pipe()
        .atomic()
        .cmd("TB.ACQUIRE")
        .arg("drained")
        .arg("0.001")
        .arg("2")
        .cmd("TB.ACQUIRE")
        .arg("partial")
        .arg("0.001")
        .arg("5")
        .arg("0")
        .cmd("TB.ACQUIRE")
        .arg("missing")
        .arg("1")
        .arg("5")
        .arg("0")
        .query(&mut conn)
        .expect("MULTI/EXEC");
    assert_eq!(
        in_multi.iter().map(|reply| reply[0]).collect::<Vec<_>>(),
        [0, 1, 1]
    );
    let from_lua: redis::RedisResult<Vec<i64>> =
        script.key("drained").key("partial").invoke(&mut conn);
    if common::scripts_refused(&mut conn) {
        // Redis 6.2 refuses TB commands inside scripts (tests/scripts.rs): a refusal sends nothing either.
        common::assert_script_refused(from_lua);
    } else {
        assert_eq!(from_lua.expect("EVALSHA"), [0, 1]);
    }
    // Nothing at all, except on a server that frames even a script that wrote nothing (6.2): there exactly that
    // empty MULTI/EXEC, once, for the one script.
    if framing > 0 {
        println!(
            "this server (Redis 6.2) sends an empty MULTI/EXEC ({framing} bytes) for any script that calls a \
             write command, even one that writes nothing: expecting exactly that from the one script, and no \
             data command on the replica"
        );
    }
    assert_eq!(
        info_int(&mut conn, "replication", "master_repl_offset") - offset,
        framing,
        "a denial or a peek sent something to the replica"
    );
    wait_acked(&mut conn, 1, WAIT_MS);
    assert_eq!(
        calls(&mut on_replica, &DATA),
        data_before,
        "a data command ({DATA:?}) reached the replica"
    );

    // The control: one allowed call sends exactly MULTI, HSET, PEXPIREAT and EXEC, with the bytes now stored.
    let offset = info_int(&mut conn, "replication", "master_repl_offset");
    acquire(&mut conn, "partial", "0.001", "5", Some("1"));
    let fields = hgetall(&mut conn, "partial");
    let [(tokens_field, tokens), (ts_field, ts)] = &fields[..] else {
        panic!("two fields: {fields:?}");
    };
    let expiry = pexpiretime(&mut conn, "partial");
    let expire_at = expiry.to_string();
    let expected = resp_len(&["MULTI"])
        + resp_len(&["HSET", "partial", tokens_field, tokens, ts_field, ts])
        + resp_len(&["PEXPIREAT", "partial", &expire_at])
        + resp_len(&["EXEC"]);
    assert_eq!(
        info_int(&mut conn, "replication", "master_repl_offset") - offset,
        expected,
        "an allowed call sends MULTI, HSET, PEXPIREAT, EXEC and nothing else"
    );
    wait_acked(&mut conn, 1, WAIT_MS);
    assert_eq!(hgetall(&mut on_replica, "partial"), fields);
    assert_eq!(pexpiretime(&mut on_replica, "partial"), expiry);
    // A charge replicates as any write does: here it moves the expiry 1,000 s later, beyond the 20 s slack.
    let offset = info_int(&mut conn, "replication", "master_repl_offset");
    charge(&mut conn, "indebted", "0.001", "2", "1");
    let fields = hgetall(&mut conn, "indebted");
    let [(tokens_field, tokens), (ts_field, ts)] = &fields[..] else {
        panic!("two fields: {fields:?}");
    };
    let charged_expiry = pexpiretime(&mut conn, "indebted");
    let expected = resp_len(&["MULTI"])
        + resp_len(&["HSET", "indebted", tokens_field, tokens, ts_field, ts])
        + resp_len(&["PEXPIREAT", "indebted", &charged_expiry.to_string()])
        + resp_len(&["EXEC"]);
    assert_eq!(
        info_int(&mut conn, "replication", "master_repl_offset") - offset,
        expected,
        "a charge sends MULTI, HSET, PEXPIREAT, EXEC and nothing else"
    );
    wait_acked(&mut conn, 1, WAIT_MS);
    assert_eq!(hgetall(&mut on_replica, "indebted"), fields);
    assert_eq!(pexpiretime(&mut on_replica, "indebted"), charged_expiry);
    let exists: i64 = redis::cmd("EXISTS")
        .arg("missing")
        .query(&mut on_replica)
        .expect("EXISTS");
    assert_eq!(exists, 0, "a peek created the bucket on the replica");

    // On the live bucket, whose expiry still covers its new moment of full, an allowed call sends one HSET and
    // nothing else (issue #13): no PEXPIREAT, hence no MULTI/EXEC on servers that send a lone command alone.
    // (5 tokens at 0.001/s fill in 5,000 s: the slack is 50 s, and 0.01 tokens move the moment of full 10 s.)
    let offset = info_int(&mut conn, "replication", "master_repl_offset");
    acquire(&mut conn, "partial", "0.001", "5", Some("0.01"));
    let fields = hgetall(&mut conn, "partial");
    let [(tokens_field, tokens), (ts_field, ts)] = &fields[..] else {
        panic!("two fields: {fields:?}");
    };
    assert_eq!(
        pexpiretime(&mut conn, "partial"),
        expiry,
        "the expiry moved"
    );
    let hset = resp_len(&["HSET", "partial", tokens_field, tokens, ts_field, ts]);
    let sent = info_int(&mut conn, "replication", "master_repl_offset") - offset;
    // Redis 6.2 wraps even a single propagated command in MULTI/EXEC.
    let wrapped = resp_len(&["MULTI"]) + hset + resp_len(&["EXEC"]);
    assert!(
        sent == hset || sent == wrapped,
        "a live bucket's allowed call sent {sent} bytes, not one HSET ({hset})"
    );
    wait_acked(&mut conn, 1, WAIT_MS);
    assert_eq!(hgetall(&mut on_replica, "partial"), fields);
    assert_eq!(pexpiretime(&mut on_replica, "partial"), expiry);
}

#[test]
fn failover_keeps_drained_buckets_drained() {
    let mut primary = Server::start_with(primary_options());
    let mut replica = Server::start_with(replica_of(primary.port, true));
    wait_replicas_online(&primary, 1);
    let mut conn = primary.conn();
    // One token per 1000 s: nothing refills while the test runs, so any grant after the failover beyond what
    // the replicated tokens allow would be an over-grant.
    for n in 0..20 {
        assert_eq!(
            acquire(&mut conn, &format!("drained:{n}"), "0.001", "5", Some("5"))[0],
            1
        );
        assert_eq!(
            acquire(&mut conn, &format!("partial:{n}"), "0.001", "5", Some("3"))[0],
            1
        );
    }
    // A bucket written by a primary whose clock runs an hour ahead of the replica's (far enough that the test's
    // own pace never catches up with it).
    let ahead_us = (server_now_ms(&mut conn) + 3_600_000) * 1_000;
    let _: i64 = redis::cmd("HSET")
        .arg("ahead")
        .arg("tokens")
        .arg("0")
        .arg("ts")
        .arg(ahead_us)
        .query(&mut conn)
        .expect("HSET");
    wait_acked(&mut conn, 1, WAIT_MS);
    let before = buckets(&mut conn);

    let mut on_replica = replica.conn();
    let refused: redis::RedisResult<Vec<i64>> = redis::cmd("TB.ACQUIRE")
        .arg("partial:0")
        .arg("0.001")
        .arg("5")
        .query(&mut on_replica);
    let refused = error_text(&refused.expect_err("a replica refuses writes"));
    assert!(refused.starts_with("READONLY "), "{refused}");

    primary.kill();
    common::promote(&mut on_replica);
    assert_eq!(
        info_field(&mut on_replica, "replication", "role").as_deref(),
        Some("master")
    );
    assert_eq!(
        buckets(&mut on_replica),
        before,
        "the promoted replica lost state"
    );

    for n in 0..20 {
        let drained = format!("drained:{n}");
        let reply = acquire(&mut on_replica, &drained, "0.001", "5", None);
        assert_eq!(reply[..2], [0, 0], "{drained} granted after failover");
        assert!(
            reply[2] > 990_000,
            "{drained}: a token takes 1000 s, got {reply:?}"
        );
        let partial = format!("partial:{n}");
        assert_eq!(
            acquire(&mut on_replica, &partial, "0.001", "5", Some("2"))[..2],
            [1, 0]
        );
        assert_eq!(acquire(&mut on_replica, &partial, "0.001", "5", None)[0], 0);
    }
    assert_eq!(
        acquire(&mut on_replica, "new", "0.001", "5", None)[..3],
        [1, 4, 0]
    );
    assert_eq!(
        hgetall(&mut on_replica, "new")[0],
        ("tokens".into(), "4".into())
    );

    // The promoted server's clock is an hour behind the one that wrote `ahead`: the bucket keeps its 0 tokens
    // (the hour does not turn into tokens at 1000 tokens/s) and refills from the promoted server's clock, which the
    // first call records (tests/clock_steps.rs checks this with exact times).
    let asked_ms = server_now_ms(&mut on_replica);
    let denied = acquire(&mut on_replica, "ahead", "1000", "10", None);
    let answered_ms = server_now_ms(&mut on_replica);
    assert_eq!(denied[..3], [0, 0, 1], "tokens minted from a clock behind");
    let fields = hgetall(&mut on_replica, "ahead");
    assert_eq!(fields[0], ("tokens".to_string(), "0".to_string()));
    let rebased_ms = fields[1].1.parse::<i64>().expect("ts") / 1_000;
    assert!(
        (asked_ms..=answered_ms).contains(&rebased_ms),
        "ts {rebased_ms} is not the promoted server's time ({asked_ms}..={answered_ms})"
    );
    assert!(replica.is_alive());
}
