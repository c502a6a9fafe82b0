//! One version for every part of a release: the module (Cargo.toml, which `MODULE LIST` reports), tb-rls
//! (gateway/Cargo.toml), the Rust client crate (clients/rust/Cargo.toml) and the token-bucket core it depends on
//! (core/Cargo.toml, and the version the client asks for), Cargo.lock, the Python package
//! (clients/python/pyproject.toml), the npm package (clients/node/package.json and package-lock.json), the newest
//! CHANGELOG heading, the artifact names the docs print, and the Lua function library's name (`tb_` + the
//! version with dots as underscores, which the packages derive from their own version). Any part left behind
//! fails here.

use std::path::PathBuf;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn read(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full)
        .unwrap_or_else(|error| panic!("read {}: {error}", full.display()))
}

/// The quoted value after the first `key` (e.g. `version = ` or `"version": `) at or after `start` in `text`.
fn quoted_after<'a>(text: &'a str, start: &str, key: &str) -> &'a str {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} is missing"));
    let rest = &text[from..];
    let at = rest
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} after {start:?} is missing"))
        + key.len();
    rest[at..]
        .trim_start()
        .trim_start_matches('"')
        .split('"')
        .next()
        .unwrap_or_default()
}

/// Every `a.b.c` (digits) that follows `prefix` in `text`, where `separator` is `.` or `_`.
fn versions_after(text: &str, prefix: &str, separator: char) -> Vec<String> {
    text.match_indices(prefix)
        .filter_map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == separator))
                .unwrap_or(rest.len());
            let candidate = rest[..end].trim_end_matches(separator);
            let parts: Vec<&str> = candidate.split(separator).collect();
            (parts.len() == 3 && parts.iter().all(|part| !part.is_empty())).then(|| parts.join("."))
        })
        .collect()
}

#[test]
fn every_part_has_the_module_version() {
    let lock = read("Cargo.lock");
    let package_lock = read("clients/node/package-lock.json");
    let parts = [
        (
            "gateway/Cargo.toml",
            quoted_after(&read("gateway/Cargo.toml"), "[package]", "version =").to_string(),
        ),
        (
            "Cargo.lock redis-tb",
            quoted_after(&lock, "name = \"redis-tb\"", "version =").to_string(),
        ),
        (
            "Cargo.lock tb-rls",
            quoted_after(&lock, "name = \"tb-rls\"", "version =").to_string(),
        ),
        (
            "clients/rust/Cargo.toml",
            quoted_after(&read("clients/rust/Cargo.toml"), "[package]", "version =").to_string(),
        ),
        (
            "Cargo.lock redis-tb-client",
            quoted_after(&lock, "name = \"redis-tb-client\"", "version =").to_string(),
        ),
        (
            "core/Cargo.toml",
            quoted_after(&read("core/Cargo.toml"), "[package]", "version =").to_string(),
        ),
        (
            "Cargo.lock redis-tb-core",
            quoted_after(&lock, "name = \"redis-tb-core\"", "version =").to_string(),
        ),
        (
            "clients/rust/Cargo.toml's redis-tb-core",
            quoted_after(
                &read("clients/rust/Cargo.toml"),
                "redis-tb-core = {",
                "version =",
            )
            .to_string(),
        ),
        (
            "clients/python/pyproject.toml",
            quoted_after(
                &read("clients/python/pyproject.toml"),
                "[project]",
                "version =",
            )
            .to_string(),
        ),
        (
            "clients/node/package.json",
            quoted_after(&read("clients/node/package.json"), "{", "\"version\":").to_string(),
        ),
        (
            "clients/node/package-lock.json",
            quoted_after(&package_lock, "{", "\"version\":").to_string(),
        ),
        (
            "clients/node/package-lock.json packages[\"\"]",
            quoted_after(&package_lock, "\"\": {", "\"version\":").to_string(),
        ),
    ];
    for (part, version) in parts {
        assert_eq!(
            version, VERSION,
            "{part} has version {version}, Cargo.toml {VERSION}"
        );
    }
    let changelog = read("CHANGELOG.md");
    // Above it, at most one section collects what the next release will change, "## <version> (unreleased)".
    let mut headings = changelog.lines().filter(|line| line.starts_with("## "));
    let mut newest = headings.next().expect("CHANGELOG.md has a release heading");
    if newest.ends_with(" (unreleased)") {
        newest = headings.next().expect("CHANGELOG.md has a release heading");
    }
    assert!(
        newest.starts_with(&format!("## {VERSION} (2")),
        "CHANGELOG.md's newest release heading is for {VERSION}, dated: {newest}"
    );
}

#[test]
fn docs_and_packages_name_the_module_version() {
    let mut texts: Vec<(String, String)> = [
        "README.md",
        "clients/python/README.md",
        "clients/node/README.md",
        "packaging/tb-rls/README.md",
    ]
    .iter()
    .map(|path| (path.to_string(), read(path)))
    .collect();
    for dir in [
        "docs",
        "lua",
        "clients/python/src/redis_tb",
        "clients/node/src",
        "scripts",
    ] {
        let full = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&full)
            .unwrap_or_else(|error| panic!("list {}: {error}", full.display()))
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.is_file())
            .collect();
        entries.sort();
        for path in entries {
            if let Ok(text) = std::fs::read_to_string(&path) {
                texts.push((path.display().to_string(), text));
            }
        }
    }
    let lib = format!("tb_{}", VERSION.replace('.', "_"));
    for (path, text) in &texts {
        // Release artifact names: the module's tarball and .deb, tb-rls's and the client packages'.
        for (prefix, separator) in [
            ("redis-tb-", '.'),
            ("redis-tb_", '.'),
            ("redis_tb-", '.'),
            ("tb-rls-", '.'),
            ("tb-rls_", '.'),
            ("tb_", '_'),
        ] {
            for found in versions_after(text, prefix, separator) {
                assert_eq!(
                    found, VERSION,
                    "{path} names {prefix}{found} (the Lua library is {lib}), the version is {VERSION}"
                );
            }
        }
    }
    let operating = read("docs/operating.md");
    let numeric: u32 = VERSION
        .split('.')
        .map(|part| part.parse::<u32>().expect("a numeric version"))
        .fold(0, |acc, part| acc * 100 + part);
    assert!(
        operating.contains(&format!("`{VERSION}` is\n`{numeric}`"))
            || operating.contains(&format!("`{VERSION}` is `{numeric}`")),
        "docs/operating.md says MODULE LIST shows {VERSION} as {numeric}"
    );
}
