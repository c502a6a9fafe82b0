//! Leased limits (`Limit::lease`) in front of a spawned Redis: three layers, each with its own client and leases
//! as three processes have, on one hot limit. Together they admit no more than `burst + rate * t` over the run and
//! over a burst after a quiet spell, with few Redis calls per decision; a refill whose request goes away leaves no
//! request waiting; a limit whose bucket stays full is decided by calls of their own; while Redis fails, leased
//! tokens are spent first, then the fail mode answers.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use common::Server;
use http::{Request, Response};
use redis_tb_client::{Client, FailMode, GlobalKey, Limit, RateLimit, RateLimitLayer};
use tower::{Layer, ServiceExt};

type App = RateLimit<tower::util::ServiceFn<fn(Request<()>) -> Ready>>;
type Ready = std::future::Ready<Result<Response<()>, Infallible>>;

fn hello(_request: Request<()>) -> Ready {
    std::future::ready(Ok(Response::new(())))
}

fn client(url: &str) -> Client {
    Client::builder(url)
        .timeout(Duration::from_millis(500))
        .build()
        .expect("a client")
}

/// A process of the app: its own client, its own leases, one global bucket for the limit `hot`.
fn process(url: &str, rate: f64, burst: f64, fail: FailMode) -> App {
    let limit = Limit::new("hot", rate, burst).expect("a limit").lease(true);
    let layer = RateLimitLayer::builder(client(url), [limit])
        .key(GlobalKey)
        .fail(fail)
        .build()
        .expect("a layer");
    layer.layer(tower::service_fn(hello as fn(Request<()>) -> Ready))
}

/// One request's status.
async fn status(app: &App) -> u16 {
    let response = app
        .clone()
        .oneshot(Request::new(()))
        .await
        .expect("infallible");
    response.status().as_u16()
}

/// `tasks` concurrent loops per process, each sending requests back to back for `length`: (admitted, decided).
async fn flood(apps: &[App], tasks: usize, length: Duration) -> (u64, u64) {
    let until = Instant::now() + length;
    let mut handles = Vec::new();
    for app in apps {
        for _ in 0..tasks {
            let app = app.clone();
            handles.push(tokio::spawn(async move {
                let (mut admitted, mut decided) = (0u64, 0u64);
                while Instant::now() < until {
                    decided += 1;
                    if status(&app).await == 200 {
                        admitted += 1;
                    }
                }
                (admitted, decided)
            }));
        }
    }
    let mut totals = (0, 0);
    for handle in handles {
        let (admitted, decided) = handle.await.expect("a task");
        totals = (totals.0 + admitted, totals.1 + decided);
    }
    totals
}

/// The calls Redis ran of `command` (lower case), from `INFO commandstats`.
fn calls(conn: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO");
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

/// Holds every write for `ms` (`CLIENT PAUSE ms WRITE`): a refill sent meanwhile stays in flight.
fn pause_writes(conn: &mut redis::Connection, ms: u64) {
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query(conn)
        .expect("CLIENT PAUSE");
}

/// Three processes flood one leased limit, go quiet until the bucket is full again, and flood it together: over
/// each flood, and over the whole run, they admit no more than `burst + rate * t` (`t` from before the first
/// request to after the last decision); the held tokens of the first flood are worth nothing after the quiet
/// spell, so the second is bounded alone. A refusal is remembered until the bucket's retry time, so the floods
/// cost Redis few calls per decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_one_leased_limit_keep_the_bound() {
    let server = Server::start();
    let mut conn = server.conn();
    let (rate, burst) = (200.0, 50.0);
    // Fail mode closed: a call slower than the client's timeout on a loaded machine is a fault, and fail mode
    // local would then admit per process, as documented; this test is of the leases alone.
    let apps: Vec<App> = (0..3)
        .map(|_| process(&server.url(), rate, burst, FailMode::Closed))
        .collect();
    let bound = |seconds: f64| (burst + rate * seconds).floor() as u64;

    let run = Instant::now();
    let (first, first_decided) = flood(&apps, 8, Duration::from_millis(700)).await;
    let first_s = run.elapsed().as_secs_f64();
    assert!(
        first <= bound(first_s),
        "first flood: {first} admitted in {first_s:.3} s, more than {}",
        bound(first_s)
    );
    // Full again after burst / rate = 0.25 s; every grant of the first flood has reached its reset.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let second_start = Instant::now();
    let (second, second_decided) = flood(&apps, 8, Duration::from_millis(500)).await;
    let second_s = second_start.elapsed().as_secs_f64();
    let run_s = run.elapsed().as_secs_f64();
    assert!(
        second <= bound(second_s),
        "after the quiet spell: {second} admitted in {second_s:.3} s, more than {}",
        bound(second_s)
    );
    assert!(first + second <= bound(run_s), "the whole run");
    // Not starved either: at least half of what the bucket gave in each flood went to requests.
    assert!(
        first as f64 >= 0.5 * rate * first_s && second as f64 >= 0.5 * rate * second_s,
        "admitted {first} in {first_s:.3} s and {second} in {second_s:.3} s"
    );
    let decided = first_decided + second_decided;
    let refills = calls(&mut conn, "tb.acquireatmost");
    // A request that waited the client's timeout for a share of the refills (a loaded machine) is decided by a
    // call of its own: a few at most.
    let own = calls(&mut conn, "tb.acquire");
    eprintln!("flood: {first} + {second} admitted, {decided} decided, {refills} refills, {own} of their own");
    assert!(
        refills * 10 <= decided,
        "{refills} refill calls for {decided} decisions"
    );
    assert!(
        own * 20 <= decided,
        "{own} calls of their own for {decided} decisions"
    );
}

/// Under steady load on a hot limit (its bucket low: the processes use nearly its rate), each process calls Redis
/// about once per lease, each lease sized from about 50 ms of its own use: far fewer calls than requests, and
/// every request admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_load_on_a_hot_limit_takes_leases_of_many_requests_each() {
    let server = Server::start();
    let mut conn = server.conn();
    let (rate, burst) = (2_000.0, 2_000.0);
    // The bucket emptied, as a hot limit's is: what the processes then use, 1,500 a second, keeps it below half.
    let drained: Vec<i64> = redis::cmd("TB.ACQUIRE")
        .arg("ratelimit:{global}:hot")
        .arg(rate)
        .arg(burst)
        .arg(burst)
        .query(&mut conn)
        .expect("TB.ACQUIRE");
    assert_eq!(drained[0], 1);
    let apps: Vec<App> = (0..3)
        .map(|_| process(&server.url(), rate, burst, FailMode::Local))
        .collect();
    let mut handles = Vec::new();
    for app in &apps {
        let app = app.clone();
        handles.push(tokio::spawn(async move {
            let mut refused = 0;
            // About 500 requests a second per process: a request every 2 ms, for 1 s.
            let mut tick = tokio::time::interval(Duration::from_millis(2));
            for _ in 0..500 {
                tick.tick().await;
                if status(&app).await != 200 {
                    refused += 1;
                }
            }
            refused
        }));
    }
    let mut refused = 0;
    for handle in handles {
        refused += handle.await.expect("a task");
    }
    let refills = calls(&mut conn, "tb.acquireatmost");
    eprintln!("steady: {refused} refused, {refills} refills");
    assert!(
        refills * 10 <= 1_500,
        "{refills} refill calls for 1,500 requests"
    );
    assert!(
        refused * 20 <= 1_500,
        "{refused} of 1,500 refused under the rate"
    );
}

/// A leased limit far from its rate: its bucket stays full, so a grant is worth nothing a millisecond later. The
/// requests after the first grant are decided by calls of their own (`TB.ACQUIRE`), side by side, instead of one
/// refill after another, each waited on by the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_limit_on_a_full_bucket_decides_by_calls_of_their_own() {
    let server = Server::start();
    let mut conn = server.conn();
    let apps = [process(&server.url(), 1e6, 1e6, FailMode::Local)];
    let (admitted, decided) = flood(&apps, 8, Duration::from_millis(300)).await;
    let (refills, own) = (
        calls(&mut conn, "tb.acquireatmost"),
        calls(&mut conn, "tb.acquire"),
    );
    eprintln!(
        "full bucket: {admitted} of {decided} admitted, {refills} refills, {own} of their own"
    );
    assert_eq!(admitted, decided, "a limit far above the load");
    assert!(refills <= 3, "{refills} refills for {decided} requests");
    assert!(
        own + refills >= decided,
        "{own} calls of their own, {refills} refills for {decided} requests"
    );
}

/// A request whose refill is in flight goes away (its client disconnected): the requests waiting on that refill
/// are decided again, not left waiting for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refill_whose_request_went_away_leaves_no_one_waiting() {
    let server = Server::start();
    let mut conn = server.conn();
    let app = process(&server.url(), 100.0, 100.0, FailMode::Local);
    // Writes paused: the first request's refill stays in flight.
    pause_writes(&mut conn, 400);
    let sender = {
        let app = app.clone();
        tokio::spawn(async move { status(&app).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let waiter = {
        let app = app.clone();
        tokio::spawn(async move { status(&app).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    sender.abort();
    let waited = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiting request was decided")
        .expect("a task");
    assert_eq!(waited, 200);
}

/// While Redis fails (out of memory), a process spends the tokens it holds first, then the fail mode answers
/// (closed: 503): it admits no more than its lease, at most a tenth of the burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_spends_the_leased_tokens_then_the_fail_mode_answers() {
    let server = Server::start();
    let mut conn = server.conn();
    let (rate, burst) = (1.0, 1_000.0);
    let app = process(&server.url(), rate, burst, FailMode::Closed);
    // Enough requests for the lease to grow to its largest, a tenth of the burst.
    for _ in 0..300 {
        assert_eq!(status(&app).await, 200);
    }
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query(&mut conn)
        .expect("CONFIG SET");
    let mut statuses = Vec::new();
    for _ in 0..200 {
        statuses.push(status(&app).await);
    }
    let admitted = statuses.iter().filter(|&&code| code == 200).count();
    let unavailable = statuses.iter().filter(|&&code| code == 503).count();
    assert!(admitted <= 100, "{admitted} admitted while Redis failed");
    assert_eq!(admitted + unavailable, 200, "{statuses:?}");
    assert!(unavailable >= 100);
    // Admitted first, while tokens were held; then only the fail mode.
    assert!(statuses[..admitted].iter().all(|&code| code == 200));
}

/// A request under a leased limit and one without lease: all or nothing. When the other limit refuses, the
/// leased one spends nothing; when the leased one refuses, what the other took goes back (TB.REFUND).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_limit_beside_another_is_all_or_nothing() {
    let server = Server::start();
    let mut conn = server.conn();
    let hot = Limit::new("hot", 0.001, 3.0).expect("a limit").lease(true);
    let user = Limit::new("user", 0.001, 2.0).expect("a limit");
    let layer = RateLimitLayer::builder(client(&server.url()), [hot, user])
        .key(GlobalKey)
        .build()
        .expect("a layer");
    let app: App = layer.layer(tower::service_fn(hello as fn(Request<()>) -> Ready));
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(status(&app).await);
    }
    // user's burst of 2 refuses the third and fourth; hot, leased, spent only for the two admitted.
    assert_eq!(statuses, [200, 200, 429, 429]);
    let remaining = |conn: &mut redis::Connection, key: &str, burst: f64| -> i64 {
        let reply: Vec<i64> = redis::cmd("TB.ACQUIRE")
            .arg(key)
            .arg(0.001)
            .arg(burst)
            .arg(0)
            .query(conn)
            .expect("TB.ACQUIRE");
        reply[1]
    };
    assert_eq!(remaining(&mut conn, "ratelimit:{global}:user", 2.0), 0);
    // Now hot refuses: empty it, give user its tokens again; user's token taken for a refused request returns.
    let () = redis::cmd("DEL")
        .arg("ratelimit:{global}:user")
        .query(&mut conn)
        .expect("DEL");
    let taken: Vec<i64> = redis::cmd("TB.ACQUIREATMOST")
        .arg("ratelimit:{global}:hot")
        .arg(0.001)
        .arg(3.0)
        .arg(3)
        .query(&mut conn)
        .expect("TB.ACQUIREATMOST");
    assert_eq!(taken[1], 0, "hot emptied");
    let mut refused = 0;
    for _ in 0..3 {
        if status(&app).await == 429 {
            refused += 1;
        }
    }
    // The lease may still hold a token from before; every request it cannot cover is refused and gives back.
    assert!(refused >= 2, "{refused} refused");
    assert_eq!(
        remaining(&mut conn, "ratelimit:{global}:user", 2.0),
        2 - (3 - refused)
    );
}

/// The request that sent a refill goes away mid-call (its client disconnected): the grant still reaches the
/// lease, and serves the requests after it without another call. Tokens Redis took are not lost with a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_request_went_away_still_serves_the_next_requests() {
    let server = Server::start();
    let mut conn = server.conn();
    // A tenth of the burst, 10, is the largest lease; 60 requests in a row grow it there.
    let app = process(&server.url(), 0.001, 100.0, FailMode::Local);
    for _ in 0..60 {
        assert_eq!(status(&app).await, 200);
    }
    let before = calls(&mut conn, "tb.acquireatmost");
    pause_writes(&mut conn, 400);
    // Spent what the lease held (each such request ends in microseconds); then one request sends a refill, which
    // Redis holds for the pause (shorter than the client's timeout), and goes away.
    let mut sender = None;
    for _ in 0..12 {
        let app = app.clone();
        let request = tokio::spawn(async move { status(&app).await });
        let waiting = Instant::now() + Duration::from_millis(100);
        while !request.is_finished() && Instant::now() < waiting {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if !request.is_finished() {
            sender = Some(request);
            break;
        }
        assert_eq!(request.await.expect("a task"), 200);
    }
    let sender = sender.expect("a request that waits on Redis");
    sender.abort();
    // The paused call is answered after the pause: poll until Redis counted it.
    let deadline = Instant::now() + Duration::from_secs(3);
    while calls(&mut conn, "tb.acquireatmost") == before {
        assert!(Instant::now() < deadline, "the refill never reached Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..5 {
        assert_eq!(status(&app).await, 200);
    }
    assert_eq!(
        calls(&mut conn, "tb.acquireatmost"),
        before + 1,
        "the grant of the request that went away served the next five"
    );
}

/// Two leased limits on one layer are refused when it is built (what one spent could not go back to its lease
/// when the other refuses), and so is a leased limit whose burst is below one whole token.
#[tokio::test]
async fn a_layer_takes_at_most_one_leased_limit_of_a_whole_token_at_least() {
    // Building connects to nothing.
    let url = "redis://127.0.0.1:9";
    let two = [
        Limit::new("a", 1.0, 10.0).expect("a limit").lease(true),
        Limit::new("b", 1.0, 10.0).expect("a limit").lease(true),
    ];
    let error = RateLimitLayer::builder(client(url), two)
        .build()
        .err()
        .expect("refused");
    assert!(
        error
            .to_string()
            .contains("at most one limit may be leased"),
        "{error}"
    );
    let small = Limit::new("half", 1.0, 0.5).expect("a limit").lease(true);
    let error = RateLimitLayer::builder(client(url), [small])
        .build()
        .err()
        .expect("refused");
    assert!(
        error.to_string().contains("a burst of at least 1"),
        "{error}"
    );
}
