//! The top of the range under a controlled clock: rate 1e308 tokens/s with burst 1.7e308 fills in 1.7 s, and a
//! bucket in debt by 1.7e308 is full 3.4 s later. Every reply and expiry is the true one (before, `burst -
//! tokens` overflowed: a 100-year TTL and saturated waits), from the module and from `lua/tb.lua` alike.
mod common;

use common::*;

const START: i64 = CLOCK_2030_US;

fn script() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/tb.lua")).expect("lua/tb.lua")
}

/// `TB.RESERVE k 1e308 1.7e308 1.7e308 10000` through the module, or through the Lua script.
fn reserve(conn: &mut redis::Connection, via_script: bool) -> Vec<i64> {
    let args = ["1e308", "1.7e308", "1.7e308", "10000"];
    let mut command = if via_script {
        let mut command = redis::cmd("EVAL");
        command.arg(script()).arg(1).arg("k").arg("TB.RESERVE");
        command
    } else {
        let mut command = redis::cmd("TB.RESERVE");
        command.arg("k");
        command
    };
    command.arg(&args).query(conn).expect("TB.RESERVE")
}

#[test]
fn top_of_the_range_replies_and_expiry_are_true() {
    let clock = Clock::new(START);
    let server = start_clocked(&clock, Options::default());
    if !module_follows_clock(&server, &clock, START) {
        eprintln!("skipped: the module on this server does not read the controlled clock");
        return;
    }
    let mut conn = server.conn();
    // The script reads the server's TIME, which Valkey runs up to 1 ms past the controlled clock
    // (tests/clock/README.md): its replies would differ by that millisecond there.
    let valkey = info_field(&mut conn, "server", "server_name").as_deref() == Some("valkey");
    let runs: &[bool] = if valkey { &[false] } else { &[false, true] };
    for &via_script in runs {
        clock.set_us(START);
        let _: i64 = redis::cmd("DEL").arg("k").query(&mut conn).expect("DEL");
        let who = if via_script { "lua/tb.lua" } else { "module" };
        assert_eq!(reserve(&mut conn, via_script), [1, 0, 0, 1_700], "{who}");
        assert_eq!(
            pexpiretime(&mut conn, "k"),
            START / 1_000 + 1_700 + 1_000,
            "{who}"
        );
        // Granted after 1.7 s, leaving a debt of 1.7e308: full 3.4 s from now, expiry moved there.
        assert_eq!(
            reserve(&mut conn, via_script),
            [1, 1_700, 0, 3_400],
            "{who}"
        );
        assert_eq!(hgetall(&mut conn, "k")[0].1, "-1.7e308", "{who}");
        assert_eq!(
            pexpiretime(&mut conn, "k"),
            START / 1_000 + 3_400 + 1_000,
            "{who}"
        );
        // A third would wait 3.4 s, but a debt of 3.4e308 does not fit a double: refused, with the true wait.
        assert_eq!(
            reserve(&mut conn, via_script),
            [0, 3_400, 0, 3_400],
            "{who}"
        );
        clock.set_us(START + 3_400_000);
        assert_eq!(reserve(&mut conn, via_script)[..2], [1, 0], "{who}");
    }
    ping(&mut conn);
}
