//! No script can make a bucket on a replica or in the AOF differ from the primary's. On Redis 7.0+ a script's
//! effects always replicate, and `redis.set_repl` does not filter the module's writes: every mode is allowed and
//! replicated. On Redis 6.2 `redis.set_repl` (anything but `REPL_ALL`) drops the module's writes from replicas
//! or the AOF, and `lua-replicate-commands no` replicates the `EVAL` itself (which a module-less replica cannot
//! run and a module replica re-runs on its own clock). A module cannot see either setting, so there every call
//! from a script is refused and changes nothing. Either way, a module-less replica and an AOF restart without
//! the module hold what the primary holds.
mod common;

use common::*;

const MODES: [&str; 4] = ["REPL_ALL", "REPL_NONE", "REPL_AOF", "REPL_SLAVE"];

/// A primary with an AOF that fsyncs every write, ready for a replica at once.
fn primary_with_aof() -> Options {
    let mut options = aof_options(None, true);
    options
        .args
        .extend(["--repl-diskless-sync-delay".into(), "0".into()]);
    options
}

fn eval(conn: &mut redis::Connection, script: &str, key: &str) -> redis::RedisResult<Vec<i64>> {
    redis::cmd("EVAL").arg(script).arg(1).arg(key).query(conn)
}

#[test]
fn no_script_makes_a_replica_or_the_aof_differ_from_the_primary() {
    let primary = Server::start_with(primary_with_aof());
    let replica = Server::start_with(replica_of(primary.port, false));
    wait_replicas_online(&primary, 1);
    let mut conn = primary.conn();
    let refused = scripts_refused(&mut conn);

    // One token per 1000 s: nothing refills while the test runs. Each bucket holds 2 of 5 tokens, then a script
    // under one `set_repl` mode asks for both.
    let mut keys: Vec<String> = MODES.iter().map(|mode| mode.to_lowercase()).collect();
    for (mode, key) in MODES.iter().zip(&keys) {
        assert_eq!(
            acquire(&mut conn, key, "0.001", "5", Some("3"))[..2],
            [1, 2]
        );
        let script =
            format!("redis.set_repl(redis.{mode}) return redis.call('TB.ACQUIRE', KEYS[1], '0.001', '5', '2')");
        let reply = eval(&mut conn, &script, key);
        if refused {
            assert_script_refused(reply);
        } else {
            assert_eq!(reply.expect("EVAL")[..2], [1, 0], "{mode}");
        }
    }
    if refused {
        // Redis 6.2's verbatim script replication, with and without the script asking for effects replication.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("lua-replicate-commands")
            .arg("no")
            .query(&mut conn)
            .expect("CONFIG SET lua-replicate-commands no");
        for (key, script) in [
            ("verbatim", "return redis.call('TB.ACQUIRE', KEYS[1], '0.001', '5', '2')"),
            (
                "verbatim_effects",
                "redis.replicate_commands() return redis.call('TB.ACQUIRE', KEYS[1], '0.001', '5', '2')",
            ),
        ] {
            assert_eq!(acquire(&mut conn, key, "0.001", "5", Some("3"))[..2], [1, 2]);
            assert_script_refused(eval(&mut conn, script, key));
            keys.push(key.to_string());
        }
    }
    wait_acked(&mut conn, 1, 5_000);
    let on_primary = buckets(&mut conn);
    assert_eq!(on_primary.len(), keys.len());
    for key in &keys {
        let tokens = &on_primary[key].0[0];
        assert_eq!(tokens.0, "tokens");
        if refused {
            assert_eq!(tokens.1, "2", "{key}: a refused call changed the bucket");
        } else {
            // 2 tokens, plus a tiny refill, minus 2.
            assert!(
                tokens.1.parse::<f64>().expect("tokens") < 0.01,
                "{key}: {tokens:?}"
            );
        }
    }
    assert_eq!(
        buckets(&mut replica.conn()),
        on_primary,
        "the module-less replica differs"
    );
    assert!(!replica.log().contains("Unknown"), "{}", replica.log());

    let dir = primary.shutdown_into_dir(&[]);
    let restarted = Server::start_with(aof_options(Some(dir), false));
    assert_eq!(
        buckets(&mut restarted.conn()),
        on_primary,
        "the AOF, loaded without the module, differs"
    );
    ping(&mut restarted.conn());
}

#[test]
fn a_refused_call_counts_as_an_error_and_the_server_carries_on() {
    let server = Server::start();
    let mut conn = server.conn();
    if !scripts_refused(&mut conn) {
        return;
    }
    let commands = [
        "TB.ACQUIRE",
        "TB.ACQUIREALL",
        "TB.RESERVE",
        "TB.REFUND",
        "TB.ACQUIREEACH",
        "TB.ACQUIREATMOST",
        "TB.CHARGE",
        "TB.BLOCK",
        "TB.LOWER",
    ];
    for command in commands {
        let script = format!("return redis.pcall('{command}', KEYS[1])");
        let reply: redis::RedisResult<Vec<i64>> = eval(&mut conn, &script, "k");
        assert_script_refused(reply);
    }
    assert_eq!(
        info_int(&mut conn, "tb", "tb_errors"),
        commands.len() as i64
    );
    assert_eq!(acquire(&mut conn, "k", "1", "5", None)[..2], [1, 4]);
    ping(&mut conn);
}
