//! `make run` must not outlive `make`: stopping make by its pid (SIGTERM, as `kill <pid>` sends, or SIGKILL) stops
//! the server it started and releases the port. Each test runs the real `make run PORT=<free port>` from the
//! repository, waits for the server to answer, stops make, and checks that the server is gone.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Building the module (a no-op after `make build`, a release build of the module alone otherwise) plus the
/// server's start.
const START_DEADLINE: Duration = Duration::from_secs(300);
const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// Whether process `pid` is `ancestor` or runs under it (its parents, read from /proc): the server make started,
/// not one another test started on the port meanwhile.
fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut current = pid;
    for _ in 0..64 {
        if current == ancestor {
            return true;
        }
        let status = std::fs::read_to_string(format!("/proc/{current}/status")).unwrap_or_default();
        let parent = status
            .lines()
            .find_map(|line| line.strip_prefix("PPid:"))
            .and_then(|value| value.trim().parse::<u32>().ok());
        match parent {
            Some(parent) if parent > 1 => current = parent,
            _ => return false,
        }
    }
    false
}

fn stops_with_make(signal: &str) {
    let port = common::free_port();
    let log = common::fresh_dir().with_extension("make-run.log");
    let mut make = Command::new("make")
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .args(["--no-print-directory", "run"])
        .arg(format!("PORT={port}"))
        .arg(format!("REDIS_SERVER={}", common::server_binary()))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).expect("create the make log"))
        .stderr(
            std::fs::File::options()
                .append(true)
                .open(&log)
                .expect("open the make log"),
        )
        .spawn()
        .expect("run make");
    let mut pid = None;
    let make_pid = make.id();
    let started = common::wait_until(START_DEADLINE, || {
        pid = tb_test_support::server_pid(port).filter(|&server| descends_from(server, make_pid));
        pid.is_some() || !matches!(make.try_wait(), Ok(None))
    });
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let Some(server) = pid.filter(|_| started) else {
        let _ = make.kill();
        let _ = make.wait();
        panic!("make run PORT={port} did not start a server:\n{output}");
    };
    assert!(
        output.contains(&format!(
            "connect from another terminal with: redis-cli -p {port}"
        )),
        "make run says how to connect:\n{output}"
    );

    let status = Command::new("kill")
        .args([signal, &make.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} make");
    let make_gone = common::wait_until(STOP_DEADLINE, || !matches!(make.try_wait(), Ok(None)));
    let server_gone = common::wait_until(STOP_DEADLINE, || {
        common::process_gone(server) && !common::port_answers(port)
    });
    if !server_gone {
        // Do not leave it behind for the next test.
        let _ = Command::new("kill")
            .args(["-KILL", &server.to_string()])
            .status();
    }
    assert!(make_gone, "make exited after kill {signal}");
    assert!(
        server_gone,
        "the server (pid {server}, port {port}) outlived make after kill {signal}"
    );
}

#[test]
fn killing_make_by_its_pid_stops_the_server() {
    stops_with_make("-TERM");
}

#[test]
fn killing_make_with_sigkill_stops_the_server_too() {
    stops_with_make("-KILL");
}
