//! `make demo-gateway` works as docs/gateway.md says: it starts Redis with the module, tb-rls, Envoy and an
//! upstream in the foreground, prints curl lines; run as printed, they show a 200 and then a 429 with the
//! documented headers; stopping make (SIGTERM to its pid, as Ctrl-C or `kill` does) stops all four.
//!
//! Named `release_artifacts_...` so that `make test-compat`, which repeats the server-dependent suites once per
//! server, leaves it to `make test` (it needs tb-rls and Envoy, which only `make test` provides).

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn release_artifacts_demo_gateway_shows_a_429_with_the_headers_and_stops_with_make() {
    let ports: Vec<u16> = (0..6).map(|_| common::free_port()).collect();
    let [envoy, upstream, rls, admin, redis, metrics] =
        <[u16; 6]>::try_from(ports).expect("six ports");
    let log = common::fresh_dir().with_extension("demo-gateway.log");
    let mut make = Command::new("make")
        .current_dir(root())
        .args(["--no-print-directory", "demo-gateway"])
        .arg(format!("DEMO_PORT={envoy}"))
        .arg(format!("DEMO_UPSTREAM_PORT={upstream}"))
        .arg(format!("DEMO_RLS_PORT={rls}"))
        .arg(format!("DEMO_ADMIN_PORT={admin}"))
        .arg(format!("DEMO_REDIS_PORT={redis}"))
        .arg(format!("DEMO_METRICS_PORT={metrics}"))
        .arg(format!("REDIS_SERVER={}", common::server_binary()))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).expect("create the log"))
        .stderr(
            std::fs::File::options()
                .append(true)
                .open(&log)
                .expect("open the log"),
        )
        .spawn()
        .expect("run make demo-gateway");
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let ready = common::wait_until(Duration::from_secs(240), || {
        text().contains("demo-gateway: ready") || !matches!(make.try_wait(), Ok(None))
    });
    let output = text();
    let pids: Vec<u32> = output
        .lines()
        .filter_map(|line| line.split_once("(pid ")?.1.split_once(')')?.0.parse().ok())
        .collect();
    let outcome = std::panic::catch_unwind(|| {
        assert!(
            ready && output.contains("demo-gateway: ready"),
            "make demo-gateway:\n{output}"
        );
        assert_eq!(pids.len(), 4, "four processes started:\n{output}");
        // The printed lines, run as printed.
        let lines: Vec<&str> = output
            .lines()
            .map(str::trim)
            .filter(|line| line.starts_with("curl -s"))
            .collect();
        assert_eq!(lines.len(), 2, "two curl lines:\n{output}");
        let run = |line: &str| {
            let out = Command::new("bash")
                .args(["-c", line])
                .output()
                .expect("run a curl line");
            String::from_utf8_lossy(&out.stdout).replace('\r', "")
        };
        let first = run(lines[0]);
        assert!(first.starts_with("HTTP/1.1 200"), "{first}");
        for header in [
            "ratelimit-policy:",
            "ratelimit:",
            "x-ratelimit-limit:",
            "x-ratelimit-remaining:",
        ] {
            assert!(first.contains(header), "the 200 has {header}\n{first}");
        }
        let second = run(lines[1]);
        let (statuses, refusal) = second.split_once('\n').unwrap_or_default();
        assert!(
            statuses.starts_with("200 200 200 200 429"),
            "four requests of /export, then 429s: {statuses}"
        );
        assert!(refusal.starts_with("HTTP/1.1 429"), "{refusal}");
        for header in [
            "retry-after:",
            "ratelimit-policy:",
            "ratelimit:",
            "x-envoy-ratelimited: true",
            "x-ratelimit-remaining:",
        ] {
            assert!(refusal.contains(header), "the 429 has {header}\n{refusal}");
        }
    });

    let _ = Command::new("kill")
        .args(["-TERM", &make.id().to_string()])
        .status();
    let make_gone = common::wait_until(Duration::from_secs(20), || {
        !matches!(make.try_wait(), Ok(None))
    });
    let all_gone = common::wait_until(Duration::from_secs(20), || {
        pids.iter().all(|pid| common::process_gone(*pid))
            && [envoy, upstream, rls, redis]
                .iter()
                .all(|port| !common::port_answers(*port))
    });
    for pid in &pids {
        if !common::process_gone(*pid) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
    if !make_gone {
        let _ = make.kill();
        let _ = make.wait();
    }
    let output = text();
    let _ = std::fs::remove_file(&log);
    assert!(outcome.is_ok(), "make demo-gateway:\n{output}");
    assert!(
        make_gone && all_gone,
        "stopping make stopped all four:\n{output}"
    );
    assert!(output.contains("demo-gateway: stopped"), "{output}");
}
