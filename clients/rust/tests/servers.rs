//! The client against real servers it spawns (the workspace's harness, `tests/common`): the module, a server
//! without it (the Functions library on Redis 7.0, the script when forced), a stopped server (SIGSTOP: every
//! call answered within its deadline, nothing charged later), and no server at all.
//!
//! `$REDIS_SERVER` (default Debian's `/usr/bin/redis-server`) and `$TB_MODULE` (default the workspace's
//! `target/release/libredis_tb.so`, which `make test` builds first) as for the module's own suites.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{Options, Server};
use redis_tb_client::{Backend, Bucket, BucketWithCost, Client, Error};

fn with_module() -> Server {
    Server::start()
}

fn without_module() -> Server {
    Server::start_with(Options {
        without_module: true,
        ..Options::default()
    })
}

fn client(server: &Server) -> Client {
    Client::builder(&server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a client")
}

/// Every command through one backend, from fresh keys: the replies the module's contract gives.
async fn every_command_answers(client: &Client, prefix: &str) {
    let key = format!("{prefix}:a");
    let first = client
        .acquire(&key, 1.0, 5.0, 2.0)
        .await
        .expect("TB.ACQUIRE");
    assert!(first.allowed);
    assert_eq!(first.remaining, 3);
    assert_eq!(first.retry_after_ms, 0);

    let never = client
        .acquire(&key, 1.0, 5.0, 6.0)
        .await
        .expect("TB.ACQUIRE");
    assert!(!never.allowed);
    assert_eq!(never.retry_after_ms, -1);

    let (b, c) = (format!("{prefix}:b"), format!("{prefix}:c"));
    let all = client
        .acquire_all(
            &[
                Bucket {
                    key: &b,
                    rate: 1.0,
                    burst: 10.0,
                },
                Bucket {
                    key: &c,
                    rate: 1.0,
                    burst: 3.0,
                },
            ],
            2.0,
        )
        .await
        .expect("TB.ACQUIREALL");
    assert!(all.allowed);
    assert_eq!((all.remaining, all.limiting_index), (1, 1));

    let each = client
        .acquire_each(&[
            BucketWithCost {
                key: &b,
                rate: 1.0,
                burst: 10.0,
                cost: 1.0,
            },
            BucketWithCost {
                key: &c,
                rate: 1.0,
                burst: 3.0,
                cost: 2.0,
            },
        ])
        .await
        .expect("TB.ACQUIREEACH");
    assert!(!each.allowed, "{each:?}");
    assert_eq!(each.limiting_index, 1);
    assert_eq!(each.buckets.len(), 2);
    assert!(each.buckets[0].fits && !each.buckets[1].fits);

    let at_most = client
        .acquire_at_most(&format!("{prefix}:d"), 1.0, 20.0, 15)
        .await
        .expect("TB.ACQUIREATMOST");
    assert_eq!((at_most.granted, at_most.remaining), (15, 5));

    let slot = format!("{prefix}:e");
    let now = client
        .reserve(&slot, 10.0, 1.0, 1.0, 1_000)
        .await
        .expect("TB.RESERVE");
    assert!(now.granted && now.wait_ms == 0, "{now:?}");
    let reserved = client
        .reserve(&slot, 10.0, 1.0, 1.0, 1_000)
        .await
        .expect("TB.RESERVE");
    assert!(reserved.granted);
    assert!((1..=100).contains(&reserved.wait_ms), "{reserved:?}");

    let refunded = client.refund(&key, 1.0, 5.0, 1.0).await.expect("TB.REFUND");
    assert!(refunded.refunded);

    let charged = client
        .charge(&format!("{prefix}:f"), 0.1, 5.0, 7.0)
        .await
        .expect("TB.CHARGE");
    assert_eq!(charged.remaining, 0);
    assert!(charged.retry_after_ms > 29_000, "{charged:?}");

    let blocked = client
        .block(&format!("{prefix}:g"), 1.0, 10.0, 60_000)
        .await
        .expect("TB.BLOCK");
    assert_eq!(blocked.remaining, 0);
    assert!(blocked.retry_after_ms > 60_000, "{blocked:?}");

    // TB.LOWER, the charge-back after a fault: a full bucket comes down to the floor; the same floor again, or a
    // higher one, changes nothing; a floor beyond a day of debt is refused.
    let lowered = format!("{prefix}:h");
    for floor in [3.5, 3.5, 8.0] {
        let reply = client
            .lower(&lowered, 0.001, 10.0, floor)
            .await
            .expect("TB.LOWER");
        assert_eq!(reply.remaining, 3, "{floor}: {reply:?}");
        assert!(reply.reset_after_ms > 6_400_000, "{floor}: {reply:?}");
    }
    let too_deep = client
        .lower(&lowered, 0.001, 10.0, -87.0)
        .await
        .expect_err("beyond a day of debt");
    assert!(
        too_deep
            .server_text()
            .is_some_and(|text| text.contains("tokens")),
        "{too_deep}"
    );

    let refused = client
        .acquire(&key, 0.0, 5.0, 1.0)
        .await
        .expect_err("rate 0");
    assert_eq!(
        refused.server_text().as_deref(),
        Some("ERR rate must be a positive number")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_runs_every_command() {
    let server = with_module();
    let client = client(&server);
    every_command_answers(&client, "module").await;
    assert_eq!(client.backend_in_use(), Backend::Module);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_module_gets_the_library_loaded_and_called() {
    let server = without_module();
    let client = client(&server);
    every_command_answers(&client, "library").await;
    if !has_functions(&server) {
        // Redis 6.2: no Functions, so the script answers.
        assert_eq!(client.backend_in_use(), Backend::Script);
        return;
    }
    assert_eq!(client.backend_in_use(), Backend::Function);
    let mut conn = server.conn();
    let libraries: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query(&mut conn)
        .expect("FUNCTION LIST");
    assert!(
        format!("{libraries:?}").contains("tb_0_5_0"),
        "{libraries:?}"
    );

    // A FUNCTION FLUSH (or a restart without persistence) loses the library: the next call loads it again.
    let () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut conn)
        .expect("FUNCTION FLUSH");
    let reply = client
        .acquire("library:after-flush", 1.0, 5.0, 1.0)
        .await
        .expect("reloaded");
    assert_eq!(reply.remaining, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_runs_where_forced_and_survives_a_script_flush() {
    let server = without_module();
    let client = Client::builder(&server.url())
        .backend(Backend::Script)
        .build()
        .expect("a client");
    every_command_answers(&client, "script").await;
    assert_eq!(client.backend_in_use(), Backend::Script);
    let mut conn = server.conn();
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut conn)
        .expect("SCRIPT FLUSH");
    let reply = client
        .acquire("script:after-flush", 1.0, 5.0, 1.0)
        .await
        .expect("EVAL after NOSCRIPT");
    assert_eq!(reply.remaining, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_and_the_module_keep_one_bucket() {
    // Buckets move between the backends without migration: the same hash, the same replies. Redis 6.2 has no
    // Functions: the script stands in for the library there.
    let server = with_module();
    let module = client(&server);
    let fallback = if has_functions(&server) {
        Backend::Function
    } else {
        Backend::Script
    };
    let library = Client::builder(&server.url())
        .backend(fallback)
        .build()
        .expect("a client");
    assert_eq!(
        module
            .acquire("shared", 0.001, 10.0, 4.0)
            .await
            .expect("module")
            .remaining,
        6
    );
    assert_eq!(
        library
            .acquire("shared", 0.001, 10.0, 4.0)
            .await
            .expect("library")
            .remaining,
        2
    );
    assert_eq!(
        module
            .acquire("shared", 0.001, 10.0, 0.0)
            .await
            .expect("module")
            .remaining,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_server_fails_every_call_at_once_after_the_first() {
    let port = common::free_port();
    let client = Client::builder(&format!("redis://127.0.0.1:{port}/"))
        .timeout(Duration::from_millis(500))
        .build()
        .expect("a client");
    let first = client
        .acquire("k", 1.0, 2.0, 1.0)
        .await
        .expect_err("nothing listens");
    assert!(first.stops_calls(), "{first:?}");
    assert_eq!(first.failure().row, "connection refused");
    assert!(!client.is_available());
    let started = Instant::now();
    for _ in 0..10 {
        let err = client
            .acquire("k", 1.0, 2.0, 1.0)
            .await
            .expect_err("still nothing");
        assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    }
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
}

fn signal(server: &Server, name: &str) {
    let status = std::process::Command::new("kill")
        .args([name, &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {name}");
}

/// Tokens left in a bucket of rate 0.001 (it does not refill during the test), read without taking any.
async fn peek(client: &Client, key: &str) -> i64 {
    client
        .acquire(key, 0.001, 100.0, 0.0)
        .await
        .expect("peek")
        .remaining
}

/// A server with the module and a client with `deadline` whose first call took a token of `key` (burst 100). The
/// client's connection is made and its backend found first, by peeks repeated until one answers: on a loaded
/// machine the first call's connection and backend probe can outlast a short deadline.
async fn used_once(deadline: Duration, key: &str) -> (Server, Client) {
    let server = with_module();
    let client = Client::builder(&server.url())
        .timeout(deadline)
        .build()
        .expect("a client");
    let connecting = Instant::now();
    while let Err(err) = client.acquire(key, 0.001, 100.0, 0.0).await {
        assert!(
            connecting.elapsed() < Duration::from_secs(10),
            "the client never reached the server: {err}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reply = client
        .acquire(key, 0.001, 100.0, 1.0)
        .await
        .expect("before");
    assert_eq!(reply.remaining, 99);
    (server, client)
}

/// The tokens left in `key` once a resumed server has run what was in its sockets: read until 98 (the first
/// call and the one out when the server stopped), for 5 s at most.
async fn left_once_resumed(server: &Server, key: &str) -> i64 {
    let observer = client_for(server);
    let resumed = Instant::now();
    let mut left = peek(&observer, key).await;
    while left != 98 && resumed.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        left = peek(&observer, key).await;
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_gets_answers_within_the_deadline_and_nothing_charged_later() {
    let deadline = Duration::from_millis(200);
    let key = "stall";
    let (server, client) = used_once(deadline, key).await;

    signal(&server, "-STOP");
    let mut took = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let err = client
            .acquire(key, 0.001, 100.0, 1.0)
            .await
            .expect_err("stopped");
        took.push(started.elapsed());
        assert!(err.stops_calls(), "{err:?}");
    }
    signal(&server, "-CONT");

    // Each call ends at its deadline at the latest (plus the scheduling a loaded machine adds); only the first
    // waits for it: the others find the connection dropped and fail at once.
    let longest = took.iter().max().copied().unwrap_or_default();
    assert!(longest < deadline * 4, "the longest call took {longest:?}");
    took.sort();
    assert!(
        took[10] < deadline / 2,
        "the median call took {:?}",
        took[10]
    );

    // The call written before the stop's first timeout runs when the server resumes; the 19 after it never
    // reached the server.
    let left = left_once_resumed(&server, key).await;
    assert!(
        (98..=99).contains(&left),
        "{left} tokens left: calls were charged after the stop"
    );
    // The client comes back by itself once a probe answers, and charges from then on.
    let back = Instant::now();
    loop {
        match client.acquire(key, 0.001, 100.0, 1.0).await {
            Ok(reply) => {
                assert_eq!(reply.remaining, left - 1);
                break;
            }
            Err(err) => {
                assert!(
                    back.elapsed() < Duration::from_secs(10),
                    "never came back: {err}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_once_a_call_has_waited_a_quarter_of_the_deadline_are_not_sent() {
    let deadline = Duration::from_millis(400);
    let key = "quarter";
    let (server, client) = used_once(deadline, key).await;
    signal(&server, "-STOP");
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.acquire(key, 0.001, 100.0, 1.0).await })
    };
    tokio::time::sleep(deadline / 2).await;
    let later: Vec<_> = (0..10)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.acquire(key, 0.001, 100.0, 1.0).await })
        })
        .collect();
    for call in later {
        assert!(
            call.await.expect("a task").is_err(),
            "answered while stopped"
        );
    }
    assert!(
        first.await.expect("a task").is_err(),
        "answered while stopped"
    );
    signal(&server, "-CONT");
    // Only the call sent before the stop showed runs when the server resumes.
    let left = left_once_resumed(&server, key).await;
    assert_eq!(
        left, 98,
        "{left} tokens left: calls made behind a stalled one were sent"
    );
}

fn client_for(server: &Server) -> Client {
    client(server)
}

/// Whether the server has Redis Functions (Redis 7.0+, Valkey); Redis 6.2 has none, nor an ACL rule for them.
fn has_functions(server: &Server) -> bool {
    redis::cmd("FUNCTION")
        .arg("LIST")
        .query::<redis::Value>(&mut server.conn())
        .is_ok()
}

/// An application user `limited` (password `pw`) with every command but those `refused` names.
fn limited_user(server: &Server, refused: &str) -> Client {
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "limited", "on", ">pw", "~*", "+@all", refused][..])
        .query(&mut server.conn())
        .expect("ACL SETUSER");
    Client::builder(&format!("redis://limited:pw@127.0.0.1:{}/", server.port))
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a client")
}

/// A burst of 3 granted, then refused: the bound holds whatever backend answers.
async fn burst_then_refused(client: &Client, key: &str) {
    for remaining in [2, 1, 0] {
        let reply = client
            .acquire(key, 0.001, 3.0, 1.0)
            .await
            .expect("TB.ACQUIRE");
        assert!(reply.allowed, "{reply:?}");
        assert_eq!(reply.remaining, remaining);
    }
    let refused = client
        .acquire(key, 0.001, 3.0, 1.0)
        .await
        .expect("TB.ACQUIRE");
    assert!(!refused.allowed, "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_function_or_fcall_falls_back_to_the_script() {
    for refused in ["-function", "-fcall"] {
        let server = without_module();
        if !has_functions(&server) {
            eprintln!("skipped: this server has no Redis Functions (Redis 6.2), so no ACL rule can refuse them");
            return;
        }
        let client = limited_user(&server, refused);
        burst_then_refused(&client, "acl:script").await;
        assert_eq!(client.backend_in_use(), Backend::Script, "{refused}");
        let libraries: redis::Value = redis::cmd("FUNCTION")
            .arg("LIST")
            .query(&mut server.conn())
            .expect("FUNCTION LIST");
        assert_eq!(libraries, redis::Value::Array(Vec::new()), "{refused}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_function_runs_a_library_an_administrator_loaded() {
    let server = without_module();
    if !has_functions(&server) {
        eprintln!("skipped: this server has no Redis Functions (Redis 6.2)");
        return;
    }
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(redis_tb_client::script::library())
        .query(&mut server.conn())
        .expect("FUNCTION LOAD as the administrator");
    let client = limited_user(&server, "-function");
    burst_then_refused(&client, "acl:library").await;
    assert_eq!(client.backend_in_use(), Backend::Function);
}
