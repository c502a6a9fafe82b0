//! docs/gateway.md shows the Envoy and tb-rls configurations the end-to-end tests run: each file, whole, as one
//! of its `yaml` blocks, so the documented configuration is the tested one.

use std::path::Path;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
}

#[test]
fn the_docs_show_the_tested_configurations_verbatim() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = read(&crate_dir.join("../docs/gateway.md"));
    for fixture in ["tests/envoy/envoy.yaml", "tests/envoy/ratelimit.yaml"] {
        let text = read(&crate_dir.join(fixture));
        assert!(
            doc.contains(&format!("```yaml\n{text}```\n")),
            "docs/gateway.md does not show gateway/{fixture} as it is"
        );
    }
}

#[test]
fn every_flag_in_the_docs_exists() {
    let doc = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/gateway.md"));
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_tb-rls"))
        .arg("--help")
        .output()
        .expect("run tb-rls --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for line in doc.lines().filter(|line| line.starts_with("| `--")) {
        let flag = line
            .trim_start_matches("| `")
            .split('`')
            .next()
            .unwrap_or_default();
        assert!(
            help.contains(flag),
            "{flag} is documented but tb-rls --help does not list it"
        );
    }
}
