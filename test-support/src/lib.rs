//! Test harness shared by the workspace's packages: what the module's suites, tb-rls's and the client crate's
//! would otherwise each write again. Each package spawns its servers with its own harness (they differ in what
//! they load and how they restart) on ports from here, polls with [`wait_until`], and joins servers into a
//! cluster with [`create_cluster`].
//!
//! `redis-cli` is `$REDIS_CLI` (default `/usr/bin/redis-cli`, Debian's), never looked up on the PATH, as the
//! packages' harnesses do for `redis-server`.
#![forbid(unsafe_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the nodes may take to agree on the cluster after `redis-cli --cluster create`.
const CLUSTER_DEADLINE: Duration = Duration::from_secs(20);

/// Debian's `redis-cli`, unless `$REDIS_CLI` names another.
pub fn redis_cli() -> PathBuf {
    std::env::var_os("REDIS_CLI").map_or_else(|| PathBuf::from("/usr/bin/redis-cli"), PathBuf::from)
}

/// Joins the cluster-enabled, empty servers on loopback `ports` into one cluster of primaries without replicas,
/// slots split as `redis-cli --cluster create` splits them. Returns once every node says `cluster_state:ok` and
/// knows every node, so a client asking any of them for the slot map gets the whole of it; panics with
/// `redis-cli`'s output if the create fails, or naming the node that never saw the whole cluster.
pub fn create_cluster(ports: &[u16]) {
    let addresses: Vec<String> = ports
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    let output = Command::new(redis_cli())
        .args(["--cluster", "create"])
        .args(&addresses)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("run redis-cli --cluster create");
    assert!(
        output.status.success(),
        "redis-cli --cluster create failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    for port in ports {
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .expect("client")
            .get_connection()
            .expect("connect to a cluster node");
        let whole = wait_until(CLUSTER_DEADLINE, || {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut conn)
                .unwrap_or_default();
            let known: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut conn)
                .unwrap_or_default();
            info.contains("cluster_state:ok") && known.lines().count() == ports.len()
        });
        assert!(whole, "node {port} never saw the whole cluster");
    }
}

/// Polls `condition` every few milliseconds until it holds or `deadline` passes; returns whether it held.
pub fn wait_until(deadline: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if start.elapsed() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A port the OS just gave us, released for a server to take.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// Offset of a cluster node's bus port from its client port.
const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// A free port whose cluster bus port (port + 10000) is free as well: Redis 6.2 cannot move the bus.
pub fn free_port_with_bus() -> u16 {
    for _ in 0..1_000 {
        let port = free_port();
        if let Some(bus) = port.checked_add(CLUSTER_BUS_OFFSET) {
            if TcpListener::bind(("127.0.0.1", bus)).is_ok() {
                return port;
            }
        }
    }
    panic!("no free port with a free cluster bus port");
}
