//! Buckets survive restarts (issue #4): the AOF holds the replicated effects (MULTI, HSET, PEXPIREAT, EXEC),
//! so a server loads it with or without the module, after a clean SHUTDOWN, after a kill -9 under load, and
//! after BGREWRITEAOF; RDB snapshots (SAVE, BGSAVE, `save` rules) hold plain hashes with absolute expiries.
//!
//! Every bucket here refills at most one token per 1000 s, so no key's TTL runs out while a test runs: whatever
//! a restart loses or adds is the persistence's doing, not the clock's.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    acquire, aof_options as aof, buckets, info_field, info_int, mixed_workload, wait_until, Bucket,
    Expiry, Options, Server,
};

/// Slow rates only: tokens per second.
const SLOW: [&str; 2] = ["0.001", "0.0005"];

/// An RDB-only server over `dir` (the harness's defaults: `--save ""`, `--appendonly no`).
fn rdb(dir: PathBuf, with_module: bool) -> Options {
    Options {
        without_module: !with_module,
        args: Vec::new(),
        dir: Some(dir),
        ..Options::default()
    }
}

/// Where the server counts finished background jobs of one kind: `rdb_saves` or `aof_rewrites` in INFO
/// persistence (Redis 7.0+, Valkey). Redis 6.2 has neither counter; there it is `total_forks` in INFO stats, which
/// counts every child the server started. In these tests only BGSAVE, BGREWRITEAOF and `save` rules fork, so it
/// counts the same jobs, at their start rather than their end; callers wait for the job to be no longer in
/// progress as well.
#[derive(Debug, Clone, Copy)]
struct JobCount {
    section: &'static str,
    field: &'static str,
}

impl JobCount {
    fn of(conn: &mut redis::Connection, field: &'static str) -> JobCount {
        if info_field(conn, "persistence", field).is_some() {
            JobCount {
                section: "persistence",
                field,
            }
        } else {
            println!("INFO persistence has no {field} (Redis 6.2): counting total_forks from INFO stats instead");
            JobCount {
                section: "stats",
                field: "total_forks",
            }
        }
    }

    fn read(self, conn: &mut redis::Connection) -> i64 {
        info_int(conn, self.section, self.field)
    }
}

/// Sends BGREWRITEAOF and waits until it finished, successfully.
fn rewrite_aof(conn: &mut redis::Connection) {
    let rewrites = JobCount::of(conn, "aof_rewrites");
    let before = rewrites.read(conn);
    let _: String = redis::cmd("BGREWRITEAOF")
        .query(conn)
        .expect("BGREWRITEAOF");
    // Its reply means the rewrite started or is scheduled, so once neither holds it is over.
    let done = wait_until(Duration::from_secs(10), || {
        rewrites.read(conn) > before
            && info_int(conn, "persistence", "aof_rewrite_in_progress") == 0
            && info_int(conn, "persistence", "aof_rewrite_scheduled") == 0
    });
    assert!(done, "BGREWRITEAOF did not finish");
    assert_eq!(
        info_field(conn, "persistence", "aof_last_bgrewrite_status").as_deref(),
        Some("ok")
    );
}

/// Sends BGSAVE and waits until it finished, successfully.
fn bgsave(conn: &mut redis::Connection) {
    let saves = JobCount::of(conn, "rdb_saves");
    let before = saves.read(conn);
    let _: String = redis::cmd("BGSAVE").query(conn).expect("BGSAVE");
    let done = wait_until(Duration::from_secs(10), || {
        saves.read(conn) > before && info_int(conn, "persistence", "rdb_bgsave_in_progress") == 0
    });
    assert!(done, "BGSAVE did not finish");
    assert_eq!(
        info_field(conn, "persistence", "rdb_last_bgsave_status").as_deref(),
        Some("ok")
    );
}

/// What the last RDB load did: (keys loaded, keys dropped because they had expired). INFO persistence has them
/// as `rdb_last_load_keys_loaded` and `rdb_last_load_keys_expired` (Redis 7.0+, Valkey); Redis 6.2 reports them
/// only in its log, as `Done loading RDB, keys loaded: N, keys expired: M.`
fn rdb_load_counts(server: &Server, conn: &mut redis::Connection) -> (i64, i64) {
    let loaded = info_field(conn, "persistence", "rdb_last_load_keys_loaded");
    let expired = info_field(conn, "persistence", "rdb_last_load_keys_expired");
    if let (Some(loaded), Some(expired)) = (loaded, expired) {
        return (
            loaded.parse().expect("keys loaded"),
            expired.parse().expect("keys expired"),
        );
    }
    println!("INFO persistence has no rdb_last_load_keys_* (Redis 6.2): reading them from the server's log");
    let log = server.log();
    let line = log
        .lines()
        .rev()
        .find_map(|line| line.split_once("Done loading RDB, keys loaded: "))
        .map(|(_, counts)| counts.to_string())
        .unwrap_or_else(|| panic!("no RDB load reported in the log:\n{log}"));
    let (loaded, expired) = line
        .trim_end_matches('.')
        .split_once(", keys expired: ")
        .unwrap_or_else(|| panic!("unexpected load report: {line}"));
    (
        loaded.parse().expect("keys loaded"),
        expired.parse().expect("keys expired"),
    )
}

/// Loads `options`, checks it holds exactly `expected`, and returns the server.
fn restart_holding(options: Options, expected: &BTreeMap<String, Bucket>, what: &str) -> Server {
    let server = Server::start_with(options);
    let mut conn = server.conn();
    assert_eq!(&buckets(&mut conn), expected, "{what}");
    server
}

#[test]
fn aof_restarts_hold_the_same_buckets_with_and_without_module() {
    let first = Server::start_with(aof(None, true));
    let mut conn = first.conn();
    let mix = mixed_workload(&mut conn, "aof:", 30, &SLOW, 300, 11);
    assert!(mix.allowed > 50 && mix.denied > 50, "{mix:?}");
    assert!(mix.each >= 10 && mix.at_most >= 10, "{mix:?}");
    assert!(mix.charged >= 5 && mix.blocked >= 3, "{mix:?}");
    let written = buckets(&mut conn);
    assert_eq!(written.len(), 30);
    let dir = first.shutdown_into_dir(&[]);

    let plain = restart_holding(
        aof(Some(dir), false),
        &written,
        "AOF loaded without the module",
    );
    let dir = plain.shutdown_into_dir(&[]);

    let second = restart_holding(aof(Some(dir), true), &written, "AOF loaded with the module");
    let mut conn = second.conn();
    mixed_workload(&mut conn, "aof:", 30, &SLOW, 100, 12);
    rewrite_aof(&mut conn);
    // After the rewrite, new calls go to a fresh incremental file on top of the rewritten base (7.0+), or are
    // appended to the rewritten file (6.2).
    mixed_workload(&mut conn, "aof:", 30, &SLOW, 100, 13);
    let rewritten = buckets(&mut conn);
    assert_ne!(rewritten, written);
    let dir = second.into_dir();

    let plain = restart_holding(
        aof(Some(dir), false),
        &rewritten,
        "rewritten AOF loaded without the module",
    );
    let dir = plain.into_dir();
    let third = restart_holding(
        aof(Some(dir), true),
        &rewritten,
        "rewritten AOF loaded with the module",
    );
    let mut conn = third.conn();
    // And the loaded buckets are live ones: a drained bucket stays drained, a full one grants.
    let drained = rewritten
        .iter()
        .find(|(_, (fields, _))| fields[0].1.parse::<f64>().expect("tokens") < 0.5)
        .map(|(key, _)| key.clone())
        .expect("the workload drains some bucket");
    assert_eq!(
        acquire(&mut conn, &drained, "0.001", "10", Some("0.5"))[0],
        0
    );
    assert_eq!(
        acquire(&mut conn, "aof:new", "0.001", "2", None)[..2],
        [1, 1]
    );
}

/// The replies of `TB.ACQUIRE`, `HGETALL` and `PEXPIRETIME` run in one transaction.
type Readback = (Vec<i64>, Vec<(String, String)>, i64);
/// What one acknowledged call left: its reply, the bucket's fields and its expiry.
type Acknowledged = (Vec<i64>, Vec<(String, String)>, Expiry);
/// The same where the server lacks `PEXPIRETIME` (Redis 6.2): `TIME` and `PTTL` instead.
type ReadbackByTtl = (Vec<i64>, Vec<(String, String)>, (i64, i64), i64);

/// Calls `MULTI; TB.ACQUIRE; HGETALL; PEXPIRETIME; EXEC` on its keys until the server goes away, and returns
/// the last acknowledged state of each key. Reading back inside the transaction gives the exact bytes the
/// acknowledged call wrote.
fn hammer(
    mut conn: redis::Connection,
    worker: usize,
    acked: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> BTreeMap<String, Bucket> {
    let mut last = BTreeMap::new();
    let mut call = 0usize;
    let exact = common::has_pexpiretime(&mut conn);
    while !stop.load(Ordering::Relaxed) {
        let key = format!("hammer:{worker}:{}", call % 5);
        let cost = [1.0, 2.5, 0.25][call % 3];
        call += 1;
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("TB.ACQUIRE")
            .arg(&key)
            .arg("0.001")
            .arg("1000000")
            .arg(cost)
            .cmd("HGETALL")
            .arg(&key);
        let reply: redis::RedisResult<Acknowledged> = if exact {
            pipe.cmd("PEXPIRETIME").arg(&key);
            pipe.query::<Readback>(&mut conn)
                .map(|(decision, fields, at_ms)| (decision, fields, Expiry { at_ms, exact: true }))
        } else {
            pipe.cmd("TIME").cmd("PTTL").arg(&key);
            pipe.query::<ReadbackByTtl>(&mut conn).map(
                |(decision, fields, (secs, micros), ttl_ms)| {
                    let at_ms = secs * 1_000 + micros / 1_000 + ttl_ms;
                    (
                        decision,
                        fields,
                        Expiry {
                            at_ms,
                            exact: false,
                        },
                    )
                },
            )
        };
        let Ok((decision, mut fields, expire_at_ms)) = reply else {
            break;
        };
        assert_eq!(decision[0], 1, "a bucket of a million tokens denied");
        fields.sort();
        last.insert(key, (fields, expire_at_ms));
        acked.fetch_add(1, Ordering::Relaxed);
    }
    last
}

fn tokens_and_ts(bucket: &Bucket) -> (f64, i64) {
    let [(_, tokens), (_, ts)] = &bucket.0[..] else {
        panic!("not a bucket: {bucket:?}");
    };
    (
        tokens.parse().expect("tokens"),
        ts.parse().expect("ts microseconds"),
    )
}

#[test]
fn aof_keeps_every_acknowledged_call_after_kill_9_under_load() {
    const WORKERS: usize = 4;
    let mut server = Server::start_with(aof(None, true));
    let acked = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let conn = server.conn();
            let (acked, stop) = (acked.clone(), stop.clone());
            thread::spawn(move || hammer(conn, worker, acked, stop))
        })
        .collect();
    let started = Instant::now();
    assert!(wait_until(Duration::from_secs(10), || acked
        .load(Ordering::Relaxed)
        >= 400));
    // SIGKILL while every worker has a call in flight.
    server.kill();
    let rate = acked.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut last = BTreeMap::new();
    for worker in workers {
        last.extend(worker.join().expect("worker"));
    }
    let total = acked.load(Ordering::Relaxed);
    let dir = server.into_dir();

    let restarted = Server::start_with(aof(Some(dir), true));
    let mut conn = restarted.conn();
    let recovered = buckets(&mut conn);
    assert_eq!(recovered.len(), WORKERS * 5, "{recovered:?}");
    let mut one_more = 0;
    for (key, acked_bucket) in &last {
        let found = recovered
            .get(key)
            .unwrap_or_else(|| panic!("acknowledged bucket {key} lost"));
        if found == acked_bucket {
            continue;
        }
        // The call in flight at the kill reached the AOF but not its client: exactly one more grant of the
        // next cost, at a later time. Anything else, fewer grants above all, is a lost acknowledgement.
        one_more += 1;
        let (tokens, ts) = tokens_and_ts(found);
        let (acked_tokens, acked_ts) = tokens_and_ts(acked_bucket);
        assert!(
            ts >= acked_ts && found.1 >= acked_bucket.1,
            "{key}: {found:?} vs {acked_bucket:?}"
        );
        assert!(
            tokens < acked_tokens,
            "{key} holds more tokens than acknowledged: {found:?} vs {acked_bucket:?}"
        );
        assert!(
            acked_tokens - tokens <= 2.5 + 1e-3,
            "{key}: more than one unacknowledged grant: {found:?} vs {acked_bucket:?}"
        );
    }
    println!(
        "kill -9 after {total} acknowledged calls ({rate:.0}/s with appendfsync always): {} keys exact, {one_more} \
         one in-flight call ahead",
        last.len() - one_more
    );
    assert!(
        one_more <= WORKERS,
        "at most one call per worker can be in flight"
    );

    // The same files without the module, then rewritten and loaded once more.
    let dir = restarted.into_dir();
    let plain = restart_holding(
        aof(Some(dir), false),
        &recovered,
        "AOF after kill -9, loaded without the module",
    );
    let mut conn = plain.conn();
    rewrite_aof(&mut conn);
    let dir = plain.into_dir();
    restart_holding(
        aof(Some(dir), true),
        &recovered,
        "AOF rewritten by a module-less server, loaded with the module",
    );
}

#[test]
fn rdb_save_and_bgsave_restore_the_same_buckets() {
    let first = Server::start();
    let mut conn = first.conn();
    mixed_workload(&mut conn, "rdb:", 30, &SLOW, 300, 21);
    let saved = buckets(&mut conn);
    let _: String = redis::cmd("SAVE").query(&mut conn).expect("SAVE");
    let dir = first.into_dir();

    let second = restart_holding(rdb(dir, true), &saved, "SAVE loaded with the module");
    let mut conn = second.conn();
    assert_eq!(
        rdb_load_counts(&second, &mut conn),
        (saved.len() as i64, 0),
        "keys loaded and keys expired"
    );
    mixed_workload(&mut conn, "rdb:", 30, &SLOW, 200, 22);
    let bgsaved = buckets(&mut conn);
    assert_ne!(bgsaved, saved);
    bgsave(&mut conn);
    let dir = second.into_dir();

    let plain = restart_holding(
        rdb(dir, false),
        &bgsaved,
        "BGSAVE loaded without the module",
    );
    let dir = plain.into_dir();
    restart_holding(rdb(dir, true), &bgsaved, "BGSAVE loaded with the module");
}

#[test]
fn allowed_calls_dirty_the_dataset_so_save_rules_fire() {
    // `save 1 1`: snapshot once a second has passed since the last save and one change was made. The seconds and
    // the changes go as two arguments: Redis 6.2 silently ignores `--save "1 1"` given as one.
    let server = Server::start_with(Options {
        args: ["--save", "1", "1"].map(String::from).to_vec(),
        ..Options::default()
    });
    let mut conn = server.conn();
    let rule: (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query(&mut conn)
        .expect("CONFIG GET save");
    assert_eq!(rule.1, "1 1", "the save rule was not configured");
    // Read before the first write: the rule may fire as soon as the dataset is dirty.
    let saves = JobCount::of(&mut conn, "rdb_saves");
    let saves_before = saves.read(&mut conn);
    // Each call runs between two reads of the dirty counter inside one MULTI, so the rule cannot save in between.
    let dirty_around = |conn: &mut redis::Connection, cost: &str| -> (i64, i64, i64) {
        let (info_before, reply, info_after): (String, Vec<i64>, String) = redis::pipe()
            .atomic()
            .cmd("INFO")
            .arg("persistence")
            .cmd("TB.ACQUIRE")
            .arg("k")
            .arg("0.001")
            .arg("2")
            .arg(cost)
            .cmd("INFO")
            .arg("persistence")
            .query(conn)
            .expect("MULTI");
        let changes = |info: &str| -> i64 {
            info.lines()
                .find_map(|line| line.strip_prefix("rdb_changes_since_last_save:"))
                .and_then(|value| value.trim().parse().ok())
                .expect("rdb_changes_since_last_save")
        };
        (changes(&info_before), reply[0], changes(&info_after))
    };
    let (before, allowed, after_allowed) = dirty_around(&mut conn, "2");
    assert_eq!(allowed, 1);
    assert!(
        after_allowed > before,
        "an allowed call left rdb_changes_since_last_save at {before}"
    );
    let (before_denial, allowed, after_denial) = dirty_around(&mut conn, "1");
    assert_eq!(allowed, 0);
    assert_eq!(before_denial, after_denial, "a denial dirtied the dataset");
    let dirty =
        |conn: &mut redis::Connection| info_int(conn, "persistence", "rdb_changes_since_last_save");
    println!("one allowed call: rdb_changes_since_last_save {before} -> {after_allowed}");

    assert!(
        wait_until(Duration::from_secs(5), || saves.read(&mut conn)
            > saves_before
            && dirty(&mut conn) == 0),
        "the save rule never fired"
    );
    let saved = buckets(&mut conn);
    let dir = server.into_dir();
    restart_holding(
        rdb(dir, false),
        &saved,
        "the rule's snapshot, without the module",
    );
}
