//! `CL.THROTTLE` keeps the GCRA bound at every rate its arguments allow, in each form a client can call: the
//! module's command, the script (`EVALSHA` of `lua/tb.lua`) and the function library (`FCALL`). Random limits up to
//! 10^9 a second (T = 1 ns) take calls in tight loops (many at one instant) and at random sub-millisecond gaps on a
//! controlled clock, with now and then a few idle milliseconds so that keys expire as Redis expires them; over every
//! window between two allowed calls, the requests allowed never exceed `L + t / T` (L = max_burst + 1, T the
//! emission interval, `period / count_per_period` truncated to the ns: at least `rate * t`).
//!
//! `TB_SCRIPT` names another script file to try (default: the repository's `lua/tb.lua`).
mod common;

use common::*;

/// 2030-01-01 00:00:00.123456789 UTC in ns.
const START_NS: i64 = CLOCK_2030_US * 1_000 + 123_456_789;
/// Random limits per form, and calls per limit.
const LIMITS: usize = 16;
const CALLS: usize = 300;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    Module,
    Script,
    Library,
}

/// The library's name in these tests; any name will do.
const LIBRARY: &str = "tb_bound";

fn script() -> String {
    let path = std::env::var("TB_SCRIPT")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/lua/tb.lua").to_string());
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One random limit: half of them where a key's state lasts under a few ms (max_burst 0-3, 1,000 to 10^6 a
/// second: where a state cut short shows), the others anywhere (max_burst 0-19, count_per_period over every order
/// of magnitude up to 10^9 a second); periods of 1-3 s.
struct Limit {
    max_burst: i64,
    count: i64,
    period: i64,
}

impl Limit {
    fn random(rng: &mut Rng) -> Limit {
        let period = 1 + rng.below(3) as i64;
        let (max_burst, magnitude) = if rng.below(2) == 0 {
            (rng.below(4) as i64, 3 + rng.below(4))
        } else {
            (rng.below(20) as i64, rng.below(10))
        };
        let magnitude = u32::try_from(magnitude).expect("small");
        let digit = 1 + rng.below(9) as i64;
        Limit {
            max_burst,
            count: (digit * 10i64.pow(magnitude)).min(1_000_000_000 * period),
            period,
        }
    }

    /// T in ns: period * 10^9 / count, truncated (exact in f64 below 2^53, as redis-cell divides it).
    fn interval_ns(&self) -> i128 {
        i128::from(self.period) * 1_000_000_000 / i128::from(self.count)
    }

    fn args(&self) -> [String; 3] {
        [self.max_burst, self.count, self.period].map(|n| n.to_string())
    }
}

/// Gaps in ns: none (a tight loop), up to the limit's interval (capped at 1 ms), under a millisecond, and now and
/// then a few ms.
fn gap_ns(rng: &mut Rng, interval_ns: i128) -> i64 {
    let pick = |rng: &mut Rng, below: i64| {
        i64::try_from(rng.next() % below.unsigned_abs()).expect("small")
    };
    let interval = i64::try_from(interval_ns.min(1_000_000)).expect("small");
    match rng.below(10) {
        0..=2 => 0,
        3..=6 => 1 + pick(rng, interval),
        7..=8 => 1 + pick(rng, 1_000_000),
        _ => 1_000_000 + pick(rng, 4_000_000),
    }
}

fn quantity(rng: &mut Rng) -> i64 {
    match rng.below(10) {
        0 => 0,
        1 => 2 + rng.below(2) as i64,
        _ => 1,
    }
}

/// One call in `form`; the reply's first element (1: limited).
fn call(
    conn: &mut redis::Connection,
    form: Form,
    sha: &str,
    key: &str,
    limit: &Limit,
    quantity: i64,
) -> i64 {
    let mut command = match form {
        Form::Module => redis::cmd("CL.THROTTLE"),
        Form::Script => {
            let mut command = redis::cmd("EVALSHA");
            command.arg(sha).arg(1);
            command
        }
        Form::Library => {
            let mut command = redis::cmd("FCALL");
            command.arg(format!("{LIBRARY}_cl_throttle")).arg(1);
            command
        }
    };
    command.arg(key);
    if form == Form::Script {
        command.arg("CL.THROTTLE");
    }
    let reply: Vec<i64> = command
        .arg(&limit.args())
        .arg(quantity)
        .query(conn)
        .unwrap_or_else(|e| panic!("{form:?} {key} {:?} {quantity}: {e}", limit.args()));
    reply[0]
}

/// Runs every limit's schedule in `form` on `server` and checks the bound over every window of allowed calls.
fn check_form(server: &Server, clock: &Clock, form: Form, seed: u64) {
    let mut conn = server.conn();
    let script = script();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(&script)
        .query(&mut conn)
        .expect("SCRIPT LOAD");
    if form == Form::Library {
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(format!(
                "#!lua name={LIBRARY}\nlocal TB_LIBRARY = '{LIBRARY}'\n{script}"
            ))
            .query(&mut conn)
            .expect("FUNCTION LOAD");
    }
    let mut rng = Rng::new(seed);
    let mut now_ns = START_NS;
    for round in 0..LIMITS {
        let limit = Limit::random(&mut rng);
        let key = format!("{form:?}:{round}");
        // The script reads TIME, to the µs: its instants are the clock's, truncated to the µs.
        let seen = |ns: i64| match form {
            Form::Module => ns,
            Form::Script | Form::Library => ns - ns.rem_euclid(1_000),
        };
        let mut allowed: Vec<(i64, i64)> = Vec::new();
        for _ in 0..CALLS {
            now_ns += gap_ns(&mut rng, limit.interval_ns());
            clock.set_ns(now_ns);
            let quantity = quantity(&mut rng);
            if call(&mut conn, form, &sha, &key, &limit, quantity) == 0 {
                allowed.push((seen(now_ns), quantity));
            }
        }
        let interval = limit.interval_ns();
        let tolerance = interval * i128::from(limit.max_burst + 1);
        for first in 0..allowed.len() {
            let mut taken = 0i128;
            for &(at, quantity) in &allowed[first..] {
                taken += i128::from(quantity);
                let window = i128::from(at - allowed[first].0);
                assert!(
                    taken * interval <= tolerance + window,
                    "{form:?} CL.THROTTLE {key} {:?}: {taken} allowed in {window} ns, more than {} + t / {interval} ns",
                    limit.args(),
                    limit.max_burst + 1,
                );
            }
        }
        now_ns += 10_000_000_000;
    }
}

/// A server under the controlled clock, or `None` (with a note) where the forms cannot be checked on it.
fn clocked(clock: &Clock, form: Form) -> Option<Server> {
    let server = start_clocked(clock, Options::default());
    if !module_follows_clock(&server, clock, START_NS / 1_000) {
        eprintln!("skipped: the module on this server does not read the controlled clock");
        return None;
    }
    let mut conn = server.conn();
    if form != Form::Module {
        // Valkey's TIME may run up to 1 ms off the controlled clock (tests/clock/README.md): the script's instants
        // would not be the ones the windows are counted over.
        if info_field(&mut conn, "server", "server_name").as_deref() == Some("valkey") {
            eprintln!("skipped: Valkey's TIME does not stand at the controlled clock");
            return None;
        }
    }
    if form == Form::Library
        && redis::cmd("FUNCTION")
            .arg("LIST")
            .query::<redis::Value>(&mut conn)
            .is_err()
    {
        eprintln!("skipped: this server has no functions (Redis < 7.0)");
        return None;
    }
    Some(server)
}

fn check(form: Form, seed: u64) {
    let clock = Clock::new(START_NS / 1_000);
    if let Some(server) = clocked(&clock, form) {
        check_form(&server, &clock, form, seed);
    }
}

#[test]
fn module_keeps_the_bound_at_any_rate() {
    check(Form::Module, 0xb0_0d01);
}

#[test]
fn script_keeps_the_bound_at_any_rate() {
    check(Form::Script, 0xb0_0d02);
}

#[test]
fn library_keeps_the_bound_at_any_rate() {
    check(Form::Library, 0xb0_0d03);
}
