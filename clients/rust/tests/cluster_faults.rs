//! Unplanned and planned failovers of a 3 primaries + 3 replicas cluster under load through the tower layer over
//! axum (docs/clients.md, "When Redis fails"), the scenarios the Python and Node middlewares are tested under: one
//! primary is killed, or stopped and started again (after its replica took over, or before), or hands its shard to
//! a replica without the module. Every identity must stay within `burst + rate * t` plus the calls in flight when
//! the fault begins, however long the shard is gone; and once the shard answers again each identity gets its rate
//! again: an admission charged twice (Redis's refill during the fault taken again, or one charge-back per
//! concurrent request) would lock it out for a while after the fault.
//!
//! Each test starts its own cluster (`cluster-node-timeout` 1000 ms: a replica takes over within a few seconds), so
//! the scenarios are independent. The load runs on its own Tokio runtime; the test's thread drives the cluster.
//!
//! `$REDIS_SERVER`, `$REDIS_CLI` and `$TB_MODULE` as for the other suites.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use common::{cli_binary, fresh_dir, module_path, server_binary, wait_until};
use http::Request;
use redis_tb_client::{Backend, Client, Identity, Limit, RateLimitLayer};
use tower::ServiceExt;

const RATE: f64 = 5.0;
const BURST: f64 = 10.0;
const IDENTITIES: usize = 20;
/// Twice the rate: every identity meets its limit, 200 requests/s in all.
const PER_IDENTITY_RPS: f64 = 10.0;
/// Tasks sending each identity's requests, each at its share of `PER_IDENTITY_RPS`: requests of one identity
/// meet at the recovery, where each may send a charge-back.
const TASKS_PER_IDENTITY: usize = 2;
/// One call per task in flight when the fault begins (Redis may have taken it while the layer, given no reply,
/// admits it in memory), and one answered by the primary but lost with it before it reached the replica.
const IN_FLIGHT: f64 = TASKS_PER_IDENTITY as f64 + 1.0;
/// How many admissions an identity may miss of its rate between two of its refusals once the shard answers again:
/// the fraction of a token left at the first, and a call of the other task in flight at each. An admission charged
/// twice after an outage longer than `burst / rate` costs up to a whole burst.
const RATE_SLACK: f64 = 3.0;
const NODE_ARGS: [&str; 4] = [
    "--cluster-node-timeout",
    "1000",
    "--repl-diskless-sync-delay",
    "0",
];
const DEADLINE: Duration = Duration::from_secs(30);
const STARTUP_ATTEMPTS: usize = 5;
const PREFIX: &str = "r:";

/// One cluster node on a fixed port and directory, so that it can be stopped and started again as itself.
struct Node {
    port: u16,
    dir: PathBuf,
    module: bool,
    args: Vec<String>,
    child: Option<Child>,
}

impl Node {
    /// A fresh node; a new port when the server exits at startup (someone else took the port meanwhile).
    fn start(module: bool, args: &[&str]) -> Node {
        let mut node = Node {
            port: tb_test_support::free_port_with_bus(),
            dir: fresh_dir(),
            module,
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            child: None,
        };
        std::fs::create_dir_all(&node.dir).expect("the node's directory");
        for _ in 0..STARTUP_ATTEMPTS {
            if node.try_spawn() {
                return node;
            }
            node.port = tb_test_support::free_port_with_bus();
        }
        panic!("a node never started; last log:\n{}", node.log());
    }

    /// Starts the node again on its port, over its directory.
    fn restart(&mut self) {
        assert!(
            self.try_spawn(),
            "node {} did not start again; log:\n{}",
            self.port,
            self.log()
        );
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Spawns the server and waits for its first PING; whether it answered (else it is stopped).
    fn try_spawn(&mut self) -> bool {
        let mut command = Command::new(server_binary());
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("server.log"))
            .args(&self.args);
        if self.module {
            command.arg("--loadmodule").arg(module_path());
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let ready = wait_until(DEADLINE, || {
            let exited = self
                .child
                .as_mut()
                .is_none_or(|child| !matches!(child.try_wait(), Ok(None)));
            exited
                || self
                    .child
                    .as_ref()
                    .is_some_and(|child| tb_test_support::answers_as(self.port, child.id()))
        });
        let running = self
            .child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)));
        if !(ready && running) {
            self.kill();
        }
        ready && running
    }

    fn conn(&self) -> redis::RedisResult<redis::Connection> {
        let conn = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?
            .get_connection_with_timeout(Duration::from_secs(1))?;
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        Ok(conn)
    }

    fn info(&self, section: &str) -> String {
        self.conn()
            .and_then(|mut conn| redis::cmd("INFO").arg(section).query(&mut conn))
            .unwrap_or_default()
    }

    fn field(&self, section: &str, name: &str) -> Option<String> {
        let prefix = format!("{name}:");
        self.info(section)
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .map(|value| value.trim().to_owned())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SHUTDOWN NOSAVE, and waits for the process to exit.
    fn shut_down(&mut self) {
        if let Ok(mut conn) = self.conn() {
            // The server closes the connection instead of replying.
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut conn);
        }
        let child = self.child.as_mut().expect("a running node");
        let exited = wait_until(DEADLINE, || !matches!(child.try_wait(), Ok(None)));
        assert!(exited, "node {} did not exit", self.port);
        self.child = None;
    }

    /// Whether the node is a primary and finds the cluster serving every slot.
    fn serves_as_primary(&self) -> bool {
        let state = self
            .conn()
            .and_then(|mut conn| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut conn))
            .unwrap_or_default();
        self.field("replication", "role").as_deref() == Some("master")
            && state.contains("cluster_state:ok")
    }

    fn replicates(&self, primary: &Node) -> bool {
        self.field("replication", "master_port") == Some(primary.port.to_string())
            && self.field("replication", "master_link_status").as_deref() == Some("up")
    }

    /// Whether the node serves `key` (the others answer MOVED).
    fn serves(&self, key: &str) -> bool {
        self.conn()
            .and_then(|mut conn| redis::cmd("EXISTS").arg(key).query::<i64>(&mut conn))
            .is_ok()
    }

    /// The limiter calls the node has served: TB.* commands, FCALL, EVAL and EVALSHA (INFO commandstats).
    fn limiter_calls(&self) -> u64 {
        self.info("commandstats")
            .lines()
            .filter_map(|line| line.strip_prefix("cmdstat_"))
            .filter(|line| {
                line.starts_with("tb.")
                    || line.starts_with("fcall:")
                    || line.starts_with("eval:")
                    || line.starts_with("evalsha:")
            })
            .filter_map(|line| {
                let calls = line.split_once("calls=")?.1;
                calls.split(',').next()?.parse::<u64>().ok()
            })
            .sum()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three primaries with the module and three replicas, with it or without.
struct Cluster {
    nodes: Vec<Node>,
}

impl Cluster {
    fn start(replica_module: bool, extra: &[&str]) -> Cluster {
        let args: Vec<&str> = NODE_ARGS.iter().chain(extra).copied().collect();
        let nodes: Vec<Node> = (0..6)
            .map(|index| Node::start(index < 3 || replica_module, &args))
            .collect();
        // With every node on one address, `redis-cli --cluster create` makes the first three the primaries.
        let output = Command::new(cli_binary())
            .args(["--cluster", "create"])
            .args(nodes.iter().map(|node| format!("127.0.0.1:{}", node.port)))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = Cluster { nodes };
        let ready = wait_until(DEADLINE, || {
            cluster.nodes[..3].iter().all(Node::serves_as_primary)
                && cluster.nodes[3..].iter().all(|node| {
                    node.field("replication", "master_link_status").as_deref() == Some("up")
                })
        });
        assert!(ready, "the cluster never came up with its replicas in sync");
        cluster
    }

    fn urls(&self) -> Vec<String> {
        self.nodes[..3]
            .iter()
            .map(|node| format!("redis://127.0.0.1:{}/", node.port))
            .collect()
    }

    /// The index of the replica of node 0.
    fn replica_of_first(&self) -> usize {
        let primary = self.nodes[0].port.to_string();
        let found: Vec<usize> = (1..self.nodes.len())
            .filter(|&index| {
                self.nodes[index].field("replication", "master_port") == Some(primary.clone())
            })
            .collect();
        assert_eq!(found.len(), 1, "replicas of node 0: {found:?}");
        found[0]
    }
}

fn wait_for(what: &str, condition: impl FnMut() -> bool) {
    assert!(wait_until(DEADLINE, condition), "never: {what}");
}

/// Waits until the layer's calls reach `node`, the shard's primary now (a new process, or a replica before, that
/// served none): the client found it.
fn reached(node: &Node) {
    wait_for("the layer's calls reach the shard's primary", || {
        node.limiter_calls() > 0
    });
}

/// What one identity was answered, and when its calls began and ended.
#[derive(Default)]
struct Record {
    /// (when the call began, when it was answered, its status) in order of their answers.
    calls: Vec<(Instant, Instant, u16)>,
    first: Option<Instant>,
    last: Option<Instant>,
}

/// Requests of `IDENTITIES` identities at `PER_IDENTITY_RPS` each through the layer over an axum app,
/// `TASKS_PER_IDENTITY` tasks per identity (one call of each in flight: a stalled call stalls no other identity),
/// until `stop()`.
struct Load {
    runtime: Option<tokio::runtime::Runtime>,
    client: Client,
    records: Arc<Vec<Mutex<Record>>>,
    stopping: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(cluster: &Cluster) -> Load {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let client = Client::cluster(cluster.urls()).expect("a cluster client");
        let limit = Limit::new("api", RATE, BURST).expect("a limit");
        // Fail mode: local.
        let layer = RateLimitLayer::builder(client.clone(), [limit])
            .key_fn(
                |parts| match parts.headers.get("x-user").and_then(|v| v.to_str().ok()) {
                    Some(user) => Identity::Key(user.to_owned()),
                    None => Identity::Anonymous,
                },
            )
            .prefix(PREFIX)
            .build()
            .expect("a layer");
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        let records: Arc<Vec<Mutex<Record>>> =
            Arc::new((0..IDENTITIES).map(|_| Mutex::default()).collect());
        let stopping = Arc::new(AtomicBool::new(false));
        let interval = Duration::from_secs_f64(TASKS_PER_IDENTITY as f64 / PER_IDENTITY_RPS);
        let tasks = (0..IDENTITIES * TASKS_PER_IDENTITY)
            .map(|task| {
                let index = task % IDENTITIES;
                let (app, records, stopping) = (app.clone(), records.clone(), stopping.clone());
                runtime.spawn(async move {
                    // Spread the tasks over the interval.
                    let mut due = Instant::now()
                        + interval.mul_f64(task as f64 / (IDENTITIES * TASKS_PER_IDENTITY) as f64);
                    while !stopping.load(Ordering::Relaxed) {
                        let now = Instant::now();
                        // A stalled task catches up for at most half a second.
                        due = (due + interval).max(now - Duration::from_millis(500));
                        tokio::time::sleep_until(due.into()).await;
                        let request = Request::builder()
                            .uri("/")
                            .header("x-user", format!("u{index}"))
                            .body(Body::empty())
                            .expect("a request");
                        let began = Instant::now();
                        let status = match app.clone().oneshot(request).await {
                            Ok(response) => response.status().as_u16(),
                            Err(never) => match never {},
                        };
                        let mut record = records[index].lock().expect("a record");
                        record.calls.push((began, Instant::now(), status));
                        record.first.get_or_insert(began);
                        record.last = Some(Instant::now());
                    }
                })
            })
            .collect();
        Load {
            runtime: Some(runtime),
            client,
            records,
            stopping,
            tasks,
        }
    }

    fn run_for(&self, time: Duration) {
        std::thread::sleep(time);
        assert!(
            self.tasks.iter().all(|task| !task.is_finished()),
            "a load task stopped"
        );
    }

    /// Runs the load 3 s more, and on until most identities were refused (429) in calls begun from then: their
    /// tokens were all spent after the fault, so a fresh burst would have been admitted. Returns when it began.
    fn run_until_limited(&self) -> Instant {
        let since = Instant::now();
        self.run_for(Duration::from_secs(3));
        wait_for("most identities meet their limit after the fault", || {
            let limited = self
                .records
                .iter()
                .filter(|record| {
                    let record = record.lock().expect("a record");
                    record
                        .calls
                        .iter()
                        .any(|&(began, _, status)| began >= since && status == 429)
                })
                .count();
            limited >= IDENTITIES / 2
        });
        since
    }

    fn stop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        if let Some(runtime) = self.runtime.as_ref() {
            for task in self.tasks.drain(..) {
                let joined = runtime.block_on(async { tokio::time::timeout(DEADLINE, task).await });
                assert!(
                    matches!(joined, Ok(Ok(()))),
                    "a load task did not end: {joined:?}"
                );
            }
        }
    }

    /// Every identity admitted at most `burst + rate * t + IN_FLIGHT` and was answered nothing but 200 or 429;
    /// identities on the faulted shard were among them. Between its refusals from `since` (the shard answering
    /// again) each identity was admitted its rate but `RATE_SLACK`: nothing was charged twice. Redis's buckets
    /// hold no debt: no charge-back took more than the in-memory buckets admitted.
    fn assert_bound_kept(&mut self, faulted: &Node, since: Instant) {
        let names: Vec<String> = (0..IDENTITIES).map(|index| format!("u{index}")).collect();
        let on_faulted = names
            .iter()
            .filter(|name| faulted.serves(&format!("{PREFIX}{{{name}}}:api")))
            .count();
        assert!(on_faulted > 0, "no identity on the faulted shard");
        let mut over = Vec::new();
        for (name, record) in names.iter().zip(self.records.iter()) {
            let record = record.lock().expect("a record");
            let (Some(first), Some(last)) = (record.first, record.last) else {
                panic!("{name}: no call");
            };
            let admitted = record.calls.iter().filter(|call| call.2 == 200).count() as f64;
            let seconds = last.duration_since(first).as_secs_f64();
            let bound = BURST + RATE * seconds + IN_FLIGHT;
            let shown = format!(
                "{name}: {admitted} admitted of {} in {seconds:.1} s",
                record.calls.len()
            );
            if admitted > bound {
                over.push(format!("{shown}, bound {bound:.1}"));
            }
            assert!(
                record.calls.iter().all(|call| matches!(call.2, 200 | 429)),
                "{shown}: {:?}",
                record.calls.iter().map(|call| call.2).collect::<Vec<_>>()
            );
            // Between two refusals the bucket went from under one token to under one token again: it refilled
            // `rate * t` and all of it was admitted, unless a charge took some twice. A demand that stalls meanwhile
            // (calls waiting out their deadline) leaves the tokens for the calls after it, unless the bucket fills.
            let refused: Vec<&(Instant, Instant, u16)> = record
                .calls
                .iter()
                .filter(|call| call.0 >= since && call.2 == 429)
                .collect();
            if let (Some(first_refused), Some(last_refused)) = (refused.first(), refused.last()) {
                // The first was decided by its answer, the last after it began.
                let window = last_refused
                    .0
                    .saturating_duration_since(first_refused.1)
                    .as_secs_f64();
                let admitted_between = record
                    .calls
                    .iter()
                    .filter(|call| {
                        call.2 == 200 && call.0 >= first_refused.0 && call.0 <= last_refused.1
                    })
                    .count() as f64;
                let expected = RATE * window - RATE_SLACK;
                if admitted_between < expected {
                    over.push(format!(
                        "{name}: {admitted_between} admitted in {window:.1} s between refusals after the fault, \
                         fewer than {expected:.1}: charged twice"
                    ));
                }
            }
        }
        assert!(over.is_empty(), "{}", over.join("\n"));
        let runtime = self.runtime.as_ref().expect("the load's runtime");
        for name in &names {
            let key = format!("{PREFIX}{{{name}}}:api");
            let look = runtime
                .block_on(self.client.acquire(&key, RATE, BURST, 0.0))
                .unwrap_or_else(|err| panic!("a look at {key}: {err}"));
            assert!(look.remaining >= 0, "{key} in debt: {look:?}");
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

#[test]
fn a_killed_primary_whose_replica_takes_over_keeps_every_identity_within_its_limit() {
    let mut cluster = Cluster::start(true, &[]);
    let replica = cluster.replica_of_first();
    let mut load = Load::start(&cluster);
    load.run_for(Duration::from_secs(2)); // Redis's buckets run low before the fault begins
    cluster.nodes[0].kill();
    wait_for("the replica takes over", || {
        cluster.nodes[replica].serves_as_primary()
    });
    reached(&cluster.nodes[replica]);
    let since = load.run_until_limited();
    load.stop();
    load.assert_bound_kept(&cluster.nodes[replica], since);
}

/// SHUTDOWN NOSAVE: the primary waits for its replica to catch up and exits; the replica takes the shard, and the
/// primary comes back empty as its replica.
#[test]
fn a_primary_shut_down_and_started_again_as_a_replica_keeps_every_identity_within_its_limit() {
    let mut cluster = Cluster::start(true, &[]);
    let replica = cluster.replica_of_first();
    let mut load = Load::start(&cluster);
    load.run_for(Duration::from_secs(2));
    cluster.nodes[0].shut_down();
    wait_for("the replica takes over", || {
        cluster.nodes[replica].serves_as_primary()
    });
    cluster.nodes[0].restart();
    wait_for("the restarted primary replicates the new one", || {
        cluster.nodes[0].replicates(&cluster.nodes[replica])
    });
    reached(&cluster.nodes[replica]);
    let since = load.run_until_limited();
    load.stop();
    load.assert_bound_kept(&cluster.nodes[replica], since);
}

/// SHUTDOWN NOSAVE with the AOF on, and replicas that may not take over (cluster-replica-no-failover): the primary
/// comes back on its port with its buckets and keeps its shard, whose calls fail while it is gone.
#[test]
fn a_primary_started_again_before_a_replica_takes_over_keeps_every_identity_within_its_limit() {
    let mut cluster = Cluster::start(
        true,
        &[
            "--appendonly",
            "yes",
            "--cluster-replica-no-failover",
            "yes",
        ],
    );
    let mut load = Load::start(&cluster);
    load.run_for(Duration::from_secs(2));
    cluster.nodes[0].shut_down();
    // The shard's calls fail meanwhile, longer than the burst lasts (`burst / rate`): Redis's bucket refills to the
    // full burst while the in-memory one admits its rate, so an outage charged twice would show after it.
    load.run_for(Duration::from_millis(2500));
    cluster.nodes[0].restart();
    wait_for("the restarted primary serves its shard", || {
        cluster.nodes[0].serves_as_primary()
    });
    reached(&cluster.nodes[0]); // a new process: its command counts start at 0
    let since = load.run_until_limited();
    load.stop();
    load.assert_bound_kept(&cluster.nodes[0], since);
}

/// The replicas lack the module: the new primary answers `unknown command`, the client switches to the function
/// library (the script on Redis 6.2), which finds the buckets the module left (its effects replicate as HSET and
/// PEXPIREAT).
#[test]
fn a_failover_to_a_replica_without_the_module_switches_backend_and_keeps_every_identity_within_its_limit(
) {
    let cluster = Cluster::start(false, &[]);
    let replica = cluster.replica_of_first();
    assert!(!cluster.nodes[replica].module);
    let mut load = Load::start(&cluster);
    load.run_for(Duration::from_secs(2));
    assert_eq!(load.client.backend_in_use(), Backend::Module);
    let mut conn = cluster.nodes[replica].conn().expect("the replica");
    let () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut conn)
        .expect("CLUSTER FAILOVER");
    wait_for("the replica takes over", || {
        cluster.nodes[replica].serves_as_primary()
    });
    wait_for("the client leaves the module", || {
        load.client.backend_in_use() != Backend::Module
    });
    reached(&cluster.nodes[replica]);
    let since = load.run_until_limited();
    load.stop();
    load.assert_bound_kept(&cluster.nodes[replica], since);
    assert!(
        matches!(
            load.client.backend_in_use(),
            Backend::Function | Backend::Script
        ),
        "{:?}",
        load.client.backend_in_use()
    );
}
