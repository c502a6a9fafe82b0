//! `TB.LOWER` (bring a bucket down to `tokens`, never up): replies, idempotence, a missing key, debt and its
//! day-long bound, errors that change nothing, command docs, INFO, a module-less replica and an AOF reload holding
//! what the primary holds, and the Lua script (EVALSHA and FCALL) answering and storing exactly what the module
//! does at the same frozen instants.

mod common;

use common::{
    acquire, assert_refused, buckets, charge, command_error, dirty, hgetall, info_int, lower,
    pexpiretime, ping, start_clocked, untouched, wrong_keys, Clock, Options, Server, CLOCK_2030_US,
    NOT_A_BUCKET, WRONGTYPE,
};
use redis::Value;

fn tokens(conn: &mut redis::Connection, key: &str) -> String {
    let fields = hgetall(conn, key);
    fields
        .iter()
        .find(|(field, _)| field == "tokens")
        .unwrap_or_else(|| panic!("{key} holds a bucket: {fields:?}"))
        .1
        .clone()
}

/// One token per 1000 s: nothing refills measurably while a test runs, so replies are exact on the real clock.
const SLOW: &str = "0.001";

#[test]
fn lowers_to_tokens_and_never_raises() {
    let server = Server::start();
    let mut conn = server.conn();
    // A missing bucket is full (5): lowered to 2, it is written with 2, full again 3000 s later.
    assert_eq!(lower(&mut conn, "k", SLOW, "5", "2"), [2, 0, 3_000_000]);
    assert_eq!(tokens(&mut conn, "k"), "2");
    let expiry = pexpiretime(&mut conn, "k");
    // Higher floors change nothing: no write, no expiry move.
    let before = (hgetall(&mut conn, "k"), dirty(&mut conn));
    for floor in ["2.5", "4", "5", "1e300"] {
        let [remaining, retry_ms, _] = lower(&mut conn, "k", SLOW, "5", floor);
        assert_eq!((remaining, retry_ms), (2, 0), "floor {floor}");
    }
    assert_eq!((hgetall(&mut conn, "k"), dirty(&mut conn)), before);
    assert_eq!(pexpiretime(&mut conn, "k"), expiry);
    // The same floor a moment later takes back only what refilled since: the bucket is at 2 again, not 0.
    assert_eq!(lower(&mut conn, "k", SLOW, "5", "2")[..2], [2, 0]);
    assert_eq!(tokens(&mut conn, "k"), "2");
    // A lower floor lowers again, to exactly that level.
    assert_eq!(lower(&mut conn, "k", SLOW, "5", "0.5")[..2], [0, 500_000]);
    assert_eq!(tokens(&mut conn, "k"), "0.5");
    // A floor at or above the burst on a missing key creates nothing.
    assert_eq!(lower(&mut conn, "missing", SLOW, "5", "5"), [5, 0, 0]);
    assert_eq!(lower(&mut conn, "missing", SLOW, "5", "7.5"), [5, 0, 0]);
    assert!(
        hgetall(&mut conn, "missing").is_empty(),
        "a lower created a full bucket"
    );
    // What TB.ACQUIRE sees afterwards: the lowered level.
    lower(&mut conn, "used", SLOW, "5", "3");
    assert_eq!(
        acquire(&mut conn, "used", SLOW, "5", Some("3"))[..2],
        [1, 0]
    );
    assert_eq!(acquire(&mut conn, "used", SLOW, "5", Some("1"))[0], 0);
    assert_eq!(info_int(&mut conn, "tb", "tb_lowers"), 10);
    ping(&mut conn);
}

/// A negative `tokens` leaves the bucket in debt, as TB.CHARGE does, down to a day of refill and no further.
#[test]
fn lowers_into_debt_down_to_a_day_of_refill() {
    let server = Server::start();
    let mut conn = server.conn();
    // rate 1/s, burst 5, lowered to -3: a token in 4 s, full in 8 s, and TB.ACQUIRE waits for it.
    assert_eq!(lower(&mut conn, "k", "1", "5", "-3"), [0, 4_000, 8_000]);
    assert_eq!(tokens(&mut conn, "k"), "-3");
    let [allowed, _, retry_ms, _] = acquire(&mut conn, "k", "1", "5", None);
    assert_eq!(allowed, 0);
    assert!((3_900..=4_000).contains(&retry_ms), "{retry_ms}");
    // A deeper debt is kept, whatever the floor above it.
    charge(&mut conn, "deep", "1", "5", "20");
    let before = (hgetall(&mut conn, "deep"), dirty(&mut conn));
    assert_eq!(lower(&mut conn, "deep", "1", "5", "-3")[0], 0);
    assert_eq!((hgetall(&mut conn, "deep"), dirty(&mut conn)), before);
    // 10 tokens/s: a day of refill is 864,000 tokens; the edge lands, a hair below it is refused.
    assert_eq!(
        lower(&mut conn, "edge", "10", "5", "-864000"),
        [0, 86_400_100, 86_400_500]
    );
    assert_eq!(tokens(&mut conn, "edge"), "-864000");
    assert_eq!(
        command_error(&mut conn, "TB.LOWER", &["other", "10", "5", "-864000.001"]),
        "ERR tokens must be a number no lower than -(rate * 86400)"
    );
    assert!(hgetall(&mut conn, "other").is_empty());
    // -0 is 0, stored as `0`.
    lower(&mut conn, "zero", SLOW, "5", "-0");
    assert_eq!(tokens(&mut conn, "zero"), "0");
    ping(&mut conn);
}

#[test]
fn bad_arguments_name_themselves_and_change_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    lower(&mut conn, "k", SLOW, "5", "1");
    wrong_keys(&mut conn);
    let before = untouched(&mut conn, "k");
    let errors_before = info_int(&mut conn, "tb", "tb_errors");
    const ARITY: &str = "ERR wrong number of arguments for 'tb.lower' command";
    const TOKENS: &str = "ERR tokens must be a number no lower than -(rate * 86400)";
    const LOWER: &str = "TB.LOWER";
    let mut refusals: Vec<(&str, Vec<&str>, &str)> = vec![
        (LOWER, vec!["k", "1", "5"], ARITY),
        (LOWER, vec!["k", "1", "5", "1", "1"], ARITY),
        (LOWER, vec!["s", "1", "5", "1"], WRONGTYPE),
        (LOWER, vec!["corrupt", "1", "5", "1"], NOT_A_BUCKET),
        // 0.001/s: a day of refill is 86.4 tokens.
        (LOWER, vec!["k", SLOW, "5", "-86.5"], TOKENS),
        (LOWER, vec!["fresh", SLOW, "5", "-1e300"], TOKENS),
    ];
    for bad in ["0", "-1", "abc", "inf", "nan", ""] {
        refusals.push((
            LOWER,
            vec!["k", bad, "5", "1"],
            "ERR rate must be a positive number",
        ));
        refusals.push((
            LOWER,
            vec!["k", "1", bad, "1"],
            "ERR burst must be a positive number",
        ));
    }
    for bad in [
        "abc", "inf", "-inf", "nan", "1e400", "-1e400", "", "0x10", " 1", "1 ",
    ] {
        refusals.push((LOWER, vec!["k", "1", "5", bad], TOKENS));
    }
    // The arguments are checked in order, before the key is read: a bad tokens on a string key names tokens.
    refusals.push((LOWER, vec!["s", "1", "5", "abc"], TOKENS));
    assert_refused(&mut conn, &refusals);
    assert_eq!(untouched(&mut conn, "k"), before);
    assert!(hgetall(&mut conn, "fresh").is_empty());
    // Every refusal counts as an error, but for the two of arity where the server checks it itself (7.0+: the
    // module's command docs carry the arity) and never calls the module.
    let counted = info_int(&mut conn, "tb", "tb_errors") - errors_before;
    let total = refusals.len() as i64;
    assert!(
        counted == total || counted == total - 2,
        "{counted} of {total}"
    );
    ping(&mut conn);
}

#[test]
fn lower_describes_itself() {
    let server = Server::start();
    let mut conn = server.conn();
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("tb.lower")
        .query(&mut conn)
        .expect("COMMAND INFO");
    let text = format!("{info:?}");
    assert!(
        !text.contains("denyoom") && text.contains("fast") && text.contains("write"),
        "{text}"
    );
    let docs: redis::RedisResult<Value> = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("tb.lower")
        .query(&mut conn);
    match docs {
        Ok(docs) if format!("{docs:?}").contains("summary") => {
            assert!(text.contains("int(5)") && text.contains("access"), "{text}");
            let docs = format!("{docs:?}");
            for name in ["key", "rate", "burst", "tokens"] {
                assert!(docs.contains(&format!("\"{name}\"")), "{name} in {docs}");
            }
            assert!(
                docs.contains("never raises") && docs.contains("0.5.0"),
                "{docs}"
            );
        }
        _ => println!("skipped COMMAND DOCS checks: this server has no RedisModule_SetCommandInfo"),
    }
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("TB.LOWER")
        .arg("user:42")
        .arg(1)
        .arg(5)
        .arg(1)
        .query(&mut conn)
        .expect("COMMAND GETKEYS");
    assert_eq!(keys, ["user:42"]);
}

/// A module-less replica and an AOF loaded without the module hold byte for byte what the primary holds, and a
/// lower that changes nothing sends nothing down the stream.
#[test]
fn replica_and_aof_hold_identical_state() {
    let mut primary_options = common::aof_options(None, true);
    primary_options
        .args
        .extend(["--repl-diskless-sync-delay".into(), "0".into()]);
    let primary = Server::start_with(primary_options);
    let replica = Server::start_with(common::replica_of(primary.port, false));
    common::wait_replicas_online(&primary, 1);
    let mut conn = primary.conn();
    lower(&mut conn, "created", SLOW, "5", "2");
    lower(&mut conn, "debt", "1", "5", "-3.25");
    acquire(&mut conn, "lowered", SLOW, "5", Some("1"));
    lower(&mut conn, "lowered", SLOW, "5", "1.5");
    charge(&mut conn, "deeper", SLOW, "5", "9");
    let offset = info_int(&mut conn, "replication", "master_repl_offset");
    lower(&mut conn, "created", SLOW, "5", "2.5");
    lower(&mut conn, "created", SLOW, "5", "4");
    lower(&mut conn, "deeper", SLOW, "5", "-1");
    lower(&mut conn, "missing", SLOW, "5", "5");
    command_error(&mut conn, "TB.LOWER", &["created", SLOW, "5", "-1000"]);
    assert_eq!(
        info_int(&mut conn, "replication", "master_repl_offset"),
        offset,
        "a lower that changed nothing sent something to the replica"
    );
    common::wait_acked(&mut conn, 1, 5_000);
    let on_primary = buckets(&mut conn);
    assert_eq!(on_primary.len(), 4, "{on_primary:?}");
    assert_eq!(
        buckets(&mut replica.conn()),
        on_primary,
        "the module-less replica differs"
    );
    let dir = primary.shutdown_into_dir(&[]);
    let restarted = Server::start_with(common::aof_options(Some(dir), false));
    assert_eq!(
        buckets(&mut restarted.conn()),
        on_primary,
        "the AOF, loaded without the module, differs"
    );
    ping(&mut restarted.conn());
}

// ---------------------------------------------------------------------------------------------------------------
// The Lua script against the module.
// ---------------------------------------------------------------------------------------------------------------

fn script() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/tb.lua")).expect("lua/tb.lua")
}

/// The function library's name for this version (`tb_0_5_0`), as the packages generate it.
fn library_name() -> String {
    format!("tb_{}", env!("CARGO_PKG_VERSION").replace('.', "_"))
}

/// How a call reaches the bucket arithmetic.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Form {
    Module,
    Eval,
    Fcall,
}

/// One call in `form` on `key`; an error reply is a result too.
fn run(
    conn: &mut redis::Connection,
    form: Form,
    sha: &str,
    command: &str,
    key: &str,
    args: &[&str],
) -> Result<Vec<i64>, String> {
    let mut cmd = match form {
        Form::Module => {
            let mut cmd = redis::cmd(command);
            cmd.arg(key);
            cmd
        }
        Form::Eval => {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha).arg(1).arg(key).arg(command);
            cmd
        }
        Form::Fcall => {
            let name = command.trim_start_matches("TB.").to_lowercase();
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(format!("{}_{name}", library_name()))
                .arg(1)
                .arg(key);
            cmd
        }
    };
    cmd.arg(args)
        .query(conn)
        .map_err(|e| common::error_text(&e))
}

/// The stored hash and the key's remaining time to live (exact under a frozen clock, on every server).
fn stored(conn: &mut redis::Connection, key: &str) -> (Vec<(String, String)>, i64) {
    let ttl: i64 = redis::cmd("PTTL").arg(key).query(conn).expect("PTTL");
    (hgetall(conn, key), ttl)
}

/// At the same frozen instants, the script in each of its forms answers every call as the module does and leaves
/// the same hash and expiry: lowers of missing, partial, full and indebted buckets, floors above the burst, at the
/// day's bound, refused, `-0`, and a clock that steps back; TB.ACQUIRE and TB.CHARGE in between.
#[test]
fn script_lowers_as_the_module_does() {
    let clock = Clock::new(CLOCK_2030_US);
    let server = start_clocked(&clock, Options::default());
    if !common::module_follows_clock(&server, &clock, CLOCK_2030_US) {
        eprintln!("skipped: the module on this server does not read the controlled clock");
        return;
    }
    let mut conn = server.conn();
    // The script reads the server's TIME, which Valkey runs up to 1 ms past the controlled clock
    // (tests/clock/README.md).
    if common::info_field(&mut conn, "server", "server_name").as_deref() == Some("valkey") {
        eprintln!("skipped: Valkey's TIME in a script is not exact under the controlled clock");
        return;
    }
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script())
        .query(&mut conn)
        .expect("SCRIPT LOAD");
    let mut forms = vec![Form::Module, Form::Eval];
    let library = format!(
        "#!lua name={lib}\nlocal TB_LIBRARY = '{lib}'\n{script}",
        lib = library_name(),
        script = script()
    );
    if redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&library)
        .query::<String>(&mut conn)
        .is_ok()
    {
        forms.push(Form::Fcall);
    }
    // (ms after the previous step, command, arguments after the key); the key is the form's own.
    #[rustfmt::skip]
    let steps: &[(i64, &str, &[&str])] = &[
        (0, "TB.LOWER", &["10", "5", "2"]),
        (0, "TB.LOWER", &["10", "5", "2"]),
        (0, "TB.LOWER", &["10", "5", "4"]),
        (150, "TB.LOWER", &["10", "5", "3"]),
        (0, "TB.ACQUIRE", &["10", "5", "1"]),
        (37, "TB.LOWER", &["10", "5", "-2.5"]),
        (1, "TB.LOWER", &["10", "5", "-0"]),
        (0, "TB.LOWER", &["10", "5", "1e300"]),
        (250, "TB.LOWER", &["3.3", "5.5", "1.1"]),
        (999, "TB.LOWER", &["123456.789", "33.3", "7"]),
        (0, "TB.CHARGE", &["10", "5", "2"]),
        (0, "TB.LOWER", &["10", "5", "-864000"]),
        (0, "TB.LOWER", &["10", "5", "-864000.0001"]),
        (0, "TB.LOWER", &["10", "5", "abc"]),
        (0, "TB.LOWER", &["10", "5", "inf"]),
        (0, "TB.LOWER", &["10", "5", "1e400"]),
        (0, "TB.LOWER", &["10", "5", ""]),
        (0, "TB.LOWER", &["10", "5", ".5"]),
        (0, "TB.LOWER", &["0", "5", "1"]),
        (0, "TB.LOWER", &["10", "nan", "1"]),
        (0, "TB.LOWER", &["10", "5"]),
        // Long enough for the key to expire: a missing bucket again.
        (86_500_000, "TB.LOWER", &["10", "5", "4.25"]),
        (300, "TB.LOWER", &["0.001", "5", "1"]),
        // The clock steps back a second: the bucket keeps its tokens; a floor above them records the new time base.
        (-1_000, "TB.LOWER", &["0.001", "5", "2"]),
        (0, "TB.LOWER", &["0.001", "5", "0.25"]),
        (5, "TB.LOWER", &["0.001", "5", "1e-3"]),
    ];
    let mut now_us = CLOCK_2030_US;
    let mut compared = 0;
    for (number, (step_ms, command, args)) in steps.iter().enumerate() {
        now_us += step_ms * 1_000;
        clock.set_us(now_us);
        let dirty_before = dirty(&mut conn);
        let mut results = Vec::new();
        for &form in &forms {
            let key = format!("{form:?}");
            let reply = run(&mut conn, form, &sha, command, &key, args);
            results.push((form, reply, stored(&mut conn, &key)));
        }
        if number == 1 {
            // The same lower again at the same instant: nothing written, in any form.
            assert_eq!(dirty(&mut conn), dirty_before, "a repeated lower wrote");
        }
        let (_, expected_reply, expected_state) = &results[0];
        for (form, reply, state) in &results[1..] {
            assert_eq!(
                reply, expected_reply,
                "step {number} {command} {args:?}: {form:?} replies otherwise"
            );
            assert_eq!(
                state, expected_state,
                "step {number} {command} {args:?}: {form:?} stores otherwise"
            );
            compared += 1;
        }
    }
    println!("{compared} calls compared with the module ({forms:?})");
    ping(&mut conn);
}
