//! The client and the layer against a 3-primary Redis Cluster the test starts (`redis-cli --cluster create`):
//! with the module on every node, and without it (the Functions library on Redis 7.0+, the script on 6.2).
//! Keys in each primary's slot range, limits that hold (the burst granted, then refused), a call over several
//! slots refused unsent, a moved slot (MOVED) and a slot being migrated (ASK) followed without charging twice,
//! and the layer's limits of several identities (several slots) all or nothing, a refusal standing when a refund
//! fails.
//!
//! `$REDIS_SERVER`, `$REDIS_CLI` and `$TB_MODULE` as for the other suites.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use common::{cluster_node, Options, Server};
use http::{Request, StatusCode};
use redis_tb_client::cluster::key_slot;
use redis_tb_client::{
    Backend, Bucket, BucketWithCost, Client, FailMode, Identity, Limit, RateLimitLayer,
};
use tower::ServiceExt;

/// Three primaries, no replicas, slots split as `redis-cli --cluster create` splits them.
struct Cluster {
    nodes: Vec<Server>,
}

impl Cluster {
    fn start(with_module: bool) -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                Server::start_with(Options {
                    without_module: !with_module,
                    ..cluster_node()
                })
            })
            .collect();
        let ports: Vec<u16> = nodes.iter().map(|node| node.port).collect();
        tb_test_support::create_cluster(&ports);
        Cluster { nodes }
    }

    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    fn client(&self) -> Client {
        Client::cluster_builder(self.urls())
            .timeout(Duration::from_secs(2))
            .build()
            .expect("a cluster client")
    }

    /// The node serving `key`: the one that does not redirect a read of it.
    fn owner(&self, key: &str) -> usize {
        let owners: Vec<usize> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| {
                redis::cmd("EXISTS")
                    .arg(key)
                    .query::<i64>(&mut node.conn())
                    .is_ok()
            })
            .map(|(index, _)| index)
            .collect();
        assert_eq!(owners.len(), 1, "{key}: served by {owners:?}");
        owners[0]
    }

    fn exists_on(&self, node: usize, key: &str) -> bool {
        redis::cmd("EXISTS")
            .arg(key)
            .query::<i64>(&mut self.nodes[node].conn())
            .expect("EXISTS on the key's own node")
            == 1
    }

    fn node_id(&self, node: usize) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.nodes[node].conn())
            .expect("CLUSTER MYID")
    }
}

/// A hash tag in each of the three slot ranges `redis-cli --cluster create` gives three primaries.
fn tags_in_every_range() -> Vec<String> {
    [0..5461, 5461..10923, 10923..16384]
        .into_iter()
        .map(|range| {
            (0..)
                .map(|n| format!("user-{n}"))
                .find(|tag| range.contains(&key_slot(tag)))
                .expect("a tag in the range")
        })
        .collect()
}

/// Calls for keys in all three ranges: each limit grants its burst, then refuses; every bucket lives on its own
/// node, each node holds some; a multi-bucket call under one tag is one atomic call there.
async fn limits_hold_on_every_primary(cluster: &Cluster, client: &Client) {
    let mut owners = Vec::new();
    for tag in tags_in_every_range() {
        let key = format!("ratelimit:{{{tag}}}:api");
        for remaining in [2, 1, 0] {
            let reply = client
                .acquire(&key, 0.001, 3.0, 1.0)
                .await
                .expect("TB.ACQUIRE");
            assert!(reply.allowed, "{key}: {reply:?}");
            assert_eq!(reply.remaining, remaining, "{key}");
        }
        let refused = client
            .acquire(&key, 0.001, 3.0, 1.0)
            .await
            .expect("TB.ACQUIRE");
        assert!(!refused.allowed, "{key}: {refused:?}");
        assert!(refused.retry_after_ms > 0, "{refused:?}");
        let owner = cluster.owner(&key);
        assert!(cluster.exists_on(owner, &key), "{key} is not on its node");
        owners.push(owner);

        // TB.ACQUIREALL's first argument is its cost, not a key: it still goes where its keys are.
        let (a, b) = (
            format!("ratelimit:{{{tag}}}:a"),
            format!("ratelimit:{{{tag}}}:b"),
        );
        let all = client
            .acquire_all(
                &[
                    Bucket {
                        key: &a,
                        rate: 0.001,
                        burst: 4.0,
                    },
                    Bucket {
                        key: &b,
                        rate: 0.001,
                        burst: 2.0,
                    },
                ],
                2.0,
            )
            .await
            .expect("TB.ACQUIREALL");
        assert!(all.allowed && all.remaining == 0, "{all:?}");
        let each = client
            .acquire_each(&[
                BucketWithCost {
                    key: &a,
                    rate: 0.001,
                    burst: 4.0,
                    cost: 1.0,
                },
                BucketWithCost {
                    key: &b,
                    rate: 0.001,
                    burst: 2.0,
                    cost: 1.0,
                },
            ])
            .await
            .expect("TB.ACQUIREEACH");
        // b is empty: nothing is taken from a either.
        assert!(!each.allowed && each.limiting_index == 1, "{each:?}");
        assert_eq!(each.buckets[0].remaining, 2, "{each:?}");
    }
    owners.sort_unstable();
    assert_eq!(owners, [0, 1, 2], "one tag per primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_on_a_cluster_limits_keys_on_every_primary() {
    let cluster = Cluster::start(true);
    let client = cluster.client();
    assert!(client.is_cluster());
    limits_hold_on_every_primary(&cluster, &client).await;
    assert_eq!(client.backend_in_use(), Backend::Module);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_module_runs_the_library_or_the_script_on_every_primary() {
    let cluster = Cluster::start(false);
    let mut conn = cluster.nodes[0].conn();
    let functions = redis::cmd("FUNCTION")
        .arg("LIST")
        .query::<redis::Value>(&mut conn)
        .is_ok();
    let client = cluster.client();
    limits_hold_on_every_primary(&cluster, &client).await;
    if functions {
        // Each primary got the library on its own first call.
        assert_eq!(client.backend_in_use(), Backend::Function);
        for node in &cluster.nodes {
            let libraries: redis::Value = redis::cmd("FUNCTION")
                .arg("LIST")
                .query(&mut node.conn())
                .expect("FUNCTION LIST");
            assert!(
                format!("{libraries:?}").contains(redis_tb_client::script::library_name()),
                "node {}: {libraries:?}",
                node.port
            );
        }
    } else {
        // Redis 6.2: no Functions.
        assert_eq!(client.backend_in_use(), Backend::Script);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_several_slots_is_refused_before_it_is_sent() {
    let cluster = Cluster::start(true);
    let client = cluster.client();
    let tags = tags_in_every_range();
    let (a, b) = (
        format!("ratelimit:{{{}}}:x", tags[0]),
        format!("ratelimit:{{{}}}:x", tags[1]),
    );
    let err = client
        .acquire_each(&[
            BucketWithCost {
                key: &a,
                rate: 1.0,
                burst: 5.0,
                cost: 1.0,
            },
            BucketWithCost {
                key: &b,
                rate: 1.0,
                burst: 5.0,
                cost: 1.0,
            },
        ])
        .await
        .expect_err("two slots");
    assert_eq!(err.failure().class, "crossslot", "{err}");
    assert!(client.is_available(), "a refused call is no outage");
    for key in [&a, &b] {
        assert!(
            !cluster.exists_on(cluster.owner(key), key),
            "{key} was sent"
        );
    }
}

/// What a test that moves a slot starts from: a cluster with the module, a client that has learned the slot map
/// (a first call on a key of another range), and a key of the first range with its slot, its owner and the node
/// after it.
struct SlotToMove {
    cluster: Cluster,
    client: Client,
    key: String,
    slot: String,
    from: usize,
    to: usize,
}

impl SlotToMove {
    async fn start() -> SlotToMove {
        let cluster = Cluster::start(true);
        let client = cluster.client();
        let tags = tags_in_every_range();
        let key = format!("ratelimit:{{{}}}:api", tags[0]);
        let other = format!("ratelimit:{{{}}}:api", tags[1]);
        client
            .acquire(&other, 1.0, 5.0, 1.0)
            .await
            .expect("a first call");
        let from = cluster.owner(&key);
        SlotToMove {
            slot: key_slot(&tags[0]).to_string(),
            to: (from + 1) % 3,
            from,
            key,
            client,
            cluster,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_for_a_moved_slot_follows_moved_and_is_charged_once() {
    let SlotToMove {
        cluster,
        client,
        key,
        slot,
        to,
        ..
    } = SlotToMove::start().await;
    let target = cluster.node_id(to);
    // The slot is empty: hand it over on every node, so the old owner answers MOVED.
    for node in &cluster.nodes {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(&slot)
            .arg("NODE")
            .arg(&target)
            .query(&mut node.conn())
            .expect("CLUSTER SETSLOT NODE");
    }
    assert_eq!(cluster.owner(&key), to);
    let reply = client
        .acquire(&key, 0.001, 5.0, 1.0)
        .await
        .expect("TB.ACQUIRE after the move");
    assert!(reply.allowed);
    assert_eq!(reply.remaining, 4, "charged once: {reply:?}");
    let again = client
        .acquire(&key, 0.001, 5.0, 1.0)
        .await
        .expect("TB.ACQUIRE");
    assert_eq!(again.remaining, 3, "{again:?}");
}

/// A request's tenant and user, from headers: two identities, so two hash tags.
fn tenant_and_user_limits(tenant_burst: f64, user_burst: f64) -> [Limit; 2] {
    let header = |name: &'static str| {
        move |parts: &http::request::Parts| match parts.headers.get(name) {
            Some(value) => Identity::Key(value.to_str().unwrap_or_default().to_owned()),
            None => Identity::Anonymous,
        }
    };
    [
        Limit::new("tenant", 0.001, tenant_burst)
            .expect("a limit")
            .key(header("x-tenant")),
        Limit::new("user", 0.001, user_burst)
            .expect("a limit")
            .key(header("x-user")),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_splits_limits_of_several_slots_and_a_refusal_takes_nothing() {
    let cluster = Cluster::start(true);
    let client = cluster.client();
    let tags = tags_in_every_range();
    let (tenant, user) = (tags[0].clone(), tags[1].clone());
    // Fail mode closed: every answer below comes from Redis, none from the process's own buckets.
    let layer = RateLimitLayer::builder(client.clone(), tenant_and_user_limits(5.0, 2.0))
        .fail(FailMode::Closed)
        .build()
        .expect("a layer");
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer);
    let request = |user: &str| {
        Request::builder()
            .uri("/")
            .header("x-tenant", &tenant)
            .header("x-user", user)
            .body(Body::empty())
            .expect("a request")
    };
    for remaining in ["1", "0"] {
        let response = app
            .clone()
            .oneshot(request(&user))
            .await
            .expect("a response");
        assert_eq!(response.status(), StatusCode::OK);
        let header = response
            .headers()
            .get("ratelimit-remaining")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        assert_eq!(header.as_deref(), Some(remaining));
    }
    // The user's bucket is empty: refused, and the tenant's token goes back.
    let refused = app
        .clone()
        .oneshot(request(&user))
        .await
        .expect("a response");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let tenant_key = format!("ratelimit:{{{tenant}}}:tenant");
    let left = client
        .acquire(&tenant_key, 0.001, 5.0, 0.0)
        .await
        .expect("a look at the tenant's bucket");
    assert_eq!(
        left.remaining, 3,
        "two requests served, the refused one refunded"
    );
    // Other users of the tenant pass until the tenant's burst is gone; the user refused then keeps its tokens.
    for other in ["ann", "bob", "cy"] {
        let response = app
            .clone()
            .oneshot(request(other))
            .await
            .expect("a response");
        assert_eq!(response.status(), StatusCode::OK, "{other}");
    }
    let over = app
        .clone()
        .oneshot(request("dee"))
        .await
        .expect("a response");
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
    let dee = client
        .acquire("ratelimit:{dee}:user", 0.001, 2.0, 0.0)
        .await
        .expect("a look at the refused user's bucket");
    assert_eq!(
        dee.remaining, 2,
        "refused by the tenant: the user's token went back"
    );
}

/// What the test's tracing subscriber writes, for a test to read.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("the logs")).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("the logs").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A part refused, then the refund of the allowed part fails (NOPERM): the request is refused with the part's
/// reply and the failure logged, never handed to the fail mode (local, which has never seen the tenant's bucket
/// and would admit it). The Python and npm middlewares have the same test.
async fn a_refusal_stands_when_its_refund_fails(with_module: bool) {
    let cluster = Cluster::start(with_module);
    // A user that may take tokens but never give them back: TB.REFUND is denied, and so is DEL (the library's
    // and the script's refund delete a bucket it fills: the user's below, burst 5, after a request of 1).
    for node in &cluster.nodes {
        let mut rules = vec!["taker", "on", ">pw", "~*", "+@all", "-del"];
        if with_module {
            rules.push("-tb.refund");
        }
        let reply: String = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&rules)
            .query(&mut node.conn())
            .expect("ACL SETUSER");
        assert_eq!(reply, "OK");
    }
    let admin = cluster.client();
    let tags = tags_in_every_range();
    let (tenant, user) = (tags[0].clone(), tags[1].clone());
    let tenant_key = format!("ratelimit:{{{tenant}}}:tenant");
    let drained = admin
        .acquire(&tenant_key, 0.001, 2.0, 2.0)
        .await
        .expect("the tenant's bucket emptied from outside the layer");
    assert!(drained.allowed);
    let urls = cluster
        .nodes
        .iter()
        .map(|node| format!("redis://taker:pw@127.0.0.1:{}/", node.port))
        .collect::<Vec<_>>();
    let taker = Client::cluster_builder(urls)
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a cluster client");
    // Fail mode: local.
    let layer = RateLimitLayer::builder(taker, tenant_and_user_limits(2.0, 5.0))
        .build()
        .expect("a layer");
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer);
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let request = Request::builder()
        .uri("/")
        .header("x-tenant", &tenant)
        .header("x-user", &user)
        .body(Body::empty())
        .expect("a request");
    let refused = app.oneshot(request).await.expect("a response");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        logs.text()
            .contains("could not give back the tokens of a refused request"),
        "{}",
        logs.text()
    );
    let kept = admin
        .acquire(&format!("ratelimit:{{{user}}}:user"), 0.001, 5.0, 0.0)
        .await
        .expect("a look at the user's bucket");
    assert_eq!(
        kept.remaining, 4,
        "the refund failed: the user's bucket keeps the token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_module_a_refusal_stands_when_its_refund_fails() {
    a_refusal_stands_when_its_refund_fails(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_module_a_refusal_stands_when_its_refund_fails() {
    a_refusal_stands_when_its_refund_fails(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_for_a_slot_being_migrated_follows_ask_and_is_charged_once() {
    let SlotToMove {
        cluster,
        client,
        key,
        slot,
        from,
        to,
    } = SlotToMove::start().await;
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    // Migration under way: the old owner answers ASK for keys it does not hold, the new one serves them after
    // ASKING.
    let setslot = |node: usize, state: &str, id: &str| {
        let () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(&slot)
            .arg(state)
            .arg(id)
            .query(&mut cluster.nodes[node].conn())
            .expect("CLUSTER SETSLOT");
    };
    setslot(to, "IMPORTING", &from_id);
    setslot(from, "MIGRATING", &to_id);
    for remaining in [4, 3] {
        let reply = client
            .acquire(&key, 0.001, 5.0, 1.0)
            .await
            .expect("TB.ACQUIRE during the migration");
        assert_eq!(reply.remaining, remaining, "charged once: {reply:?}");
    }
    // The old owner does not hold the key: it still answers ASK for it.
    let asked = redis::cmd("EXISTS")
        .arg(&key)
        .query::<i64>(&mut cluster.nodes[from].conn())
        .expect_err("ASK from the old owner");
    assert_eq!(asked.kind(), redis::ErrorKind::Ask, "{asked}");
    let (_, exists): ((), i64) = redis::pipe()
        .cmd("ASKING")
        .cmd("EXISTS")
        .arg(&key)
        .query(&mut cluster.nodes[to].conn())
        .expect("ASKING EXISTS on the new owner");
    assert_eq!(exists, 1, "the key is not on the new owner");
}
