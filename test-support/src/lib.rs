//! Test harness shared by the workspace's packages: what the module's suites, tb-rls's and the client crate's
//! would otherwise each write again. Each package spawns its servers with its own harness (they differ in what
//! they load and how they restart) on ports from here, polls with [`wait_until`], and joins servers into a
//! cluster with [`create_cluster`]. Their tests of the shared rules read `fixtures/*.json` with [`fixture`].
//!
//! `redis-cli` is `$REDIS_CLI` (default `/usr/bin/redis-cli`, Debian's), never looked up on the PATH, as the
//! packages' harnesses do for `redis-server`.
#![forbid(unsafe_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
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

/// The ports [`free_port`] and [`free_port_with_bus`] have handed out in this process (a bus port too): the OS may
/// give a released port again, and two tests running at once must not spawn their servers on one port.
static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// A port the OS just gave us, released for a server to take; never one handed out before in this process.
pub fn free_port() -> u16 {
    loop {
        let port = ephemeral_port();
        if hand_out(&[port]) {
            return port;
        }
    }
}

/// A port the OS just gave us, released.
fn ephemeral_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// Records `ports` as handed out, unless one of them already is (then nothing is recorded).
fn hand_out(ports: &[u16]) -> bool {
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if ports.iter().any(|port| handed_out.contains(port)) {
        return false;
    }
    handed_out.extend_from_slice(ports);
    true
}

/// Whether the server on loopback `port` is the process `pid` and ready ([`server_pid`]). A released port can
/// still be taken by a server of another process before ours binds it; ours then exits, and a check of PING alone
/// would take the other for ours.
pub fn answers_as(port: u16, pid: u32) -> bool {
    server_pid(port) == Some(pid)
}

/// The process id of the server on loopback `port` (`INFO server`'s `process_id`), once it answers PING (not
/// `LOADING`); `None` before.
pub fn server_pid(port: u16) -> Option<u32> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    redis::cmd("PING").query::<String>(&mut conn).ok()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|value| value.trim().parse().ok())
}

/// Offset of a cluster node's bus port from its client port.
const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// A free port whose cluster bus port (port + 10000) is free as well: Redis 6.2 cannot move the bus.
pub fn free_port_with_bus() -> u16 {
    for _ in 0..1_000 {
        let port = ephemeral_port();
        if let Some(bus) = port.checked_add(CLUSTER_BUS_OFFSET) {
            if TcpListener::bind(("127.0.0.1", bus)).is_ok() && hand_out(&[port, bus]) {
                return port;
            }
        }
    }
    panic!("no free port with a free cluster bus port");
}

/// Stands for a lone surrogate in a fixture's strings: JSON text may hold one (`"\ud800"`, as the packages' rules
/// must handle it), a Rust string cannot. A test skips the cases that hold it.
pub const LONE_SURROGATE: &str = "(lone surrogate)";

/// `fixtures/<name>` of the repository, parsed, each lone surrogate of its strings as [`LONE_SURROGATE`].
pub fn fixture(name: &str) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    serde_json::from_str(&without_lone_surrogates(&text))
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// A fixture's number: a JSON number, or `"NaN"`, `"Infinity"` or `"-Infinity"`, which JSON cannot write.
pub fn fixture_number(value: &serde_json::Value) -> f64 {
    value
        .as_f64()
        .or_else(|| value.as_str().and_then(|text| text.parse().ok()))
        .unwrap_or_else(|| panic!("a number, not {value}"))
}

/// `text` with each `\uD800`-`\uDFFF` escape that is not half of a pair replaced by [`LONE_SURROGATE`].
fn without_lone_surrogates(text: &str) -> String {
    let surrogate = |at: usize| -> Option<u16> {
        let escape = text.get(at..at + 6)?;
        let code = u16::from_str_radix(escape.strip_prefix("\\u")?, 16).ok()?;
        (0xD800..=0xDFFF).contains(&code).then_some(code)
    };
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(rest) = text.get(at..).filter(|rest| !rest.is_empty()) {
        if let Some(code) = surrogate(at) {
            let paired = (0xD800..=0xDBFF).contains(&code)
                && surrogate(at + 6).is_some_and(|low| (0xDC00..=0xDFFF).contains(&low));
            let width = if paired { 12 } else { 6 };
            out.push_str(if paired {
                &rest[..width]
            } else {
                LONE_SURROGATE
            });
            at += width;
            continue;
        }
        // Any other escape (`\\`, `\"`, `\n`, `\u0041`) is copied whole, so its backslash starts nothing.
        let width = if rest.starts_with('\\') { 2 } else { 1 };
        let taken: String = rest.chars().take(width).collect();
        out.push_str(&taken);
        at += taken.len();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lone_surrogates_are_marked_and_pairs_kept() {
        let parsed: serde_json::Value = serde_json::from_str(&without_lone_surrogates(
            r#"["\ud800x", "\ud83d\ude00", "\\ud800", "\udc00"]"#,
        ))
        .expect("parses");
        assert_eq!(
            parsed,
            serde_json::json!([
                format!("{LONE_SURROGATE}x"),
                "\u{1F600}",
                "\\ud800",
                LONE_SURROGATE
            ])
        );
    }
}
