//! Reads the configuration from disk and keeps it current. The path is one YAML file, or a directory whose
//! `*.yaml`/`*.yml` files (sorted by name, dot files skipped) are one configuration together, like
//! envoyproxy/ratelimit's `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config`.
//!
//! Changes are found by polling: every interval the files are read again and, when their bytes differ from the
//! last ones seen, parsed. Polling also sees what file watchers miss (an editor's rename, a Kubernetes ConfigMap's
//! symlink swap), and reading a few small files a second costs nothing. A change that does not parse is logged
//! with its reason, and the last good configuration keeps serving.
//!
//! An empty configuration would turn every limit off, so it is refused at start and on a reload, and so is a
//! reload that loses domains because files vanished (a half-finished deploy, a wrong mount): the last good
//! configuration keeps serving. `--allow-empty-config` lets both through, for whoever means it.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::{Config, ConfigError};
use crate::metrics::Metrics;

/// The files' names and contents, as read.
pub type Sources = Vec<(String, String)>;

/// Reads the file, or every `*.yaml`/`*.yml` in the directory.
pub fn read_sources(path: &Path) -> Result<Sources, ConfigError> {
    let error = |message: String| ConfigError {
        file: path.display().to_string(),
        message,
    };
    let metadata = std::fs::metadata(path).map_err(|err| error(err.to_string()))?;
    let mut files: Vec<PathBuf> = if metadata.is_dir() {
        std::fs::read_dir(path)
            .map_err(|err| error(err.to_string()))?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|file| {
                let name = file
                    .file_name()
                    .and_then(|name| name.to_str())
                    .unwrap_or(".");
                !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"))
            })
            .collect()
    } else {
        vec![path.to_path_buf()]
    };
    files.sort();
    files
        .into_iter()
        .map(|file| {
            std::fs::read_to_string(&file)
                .map(|text| (file.display().to_string(), text))
                .map_err(|err| ConfigError {
                    file: file.display().to_string(),
                    message: err.to_string(),
                })
        })
        .collect()
}

/// How files become a configuration, and which changes are let through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`: files naming one domain are merged.
    pub merge_domains: bool,
    /// Accept a configuration with no domain, and a reload that drops the domains of files that vanished.
    pub allow_empty: bool,
}

/// Parses what `read_sources` read.
pub fn parse(sources: &Sources, policy: Policy) -> Result<Config, ConfigError> {
    Config::from_files_merging(
        sources
            .iter()
            .map(|(file, text)| (file.as_str(), text.as_str())),
        policy.merge_domains,
    )
}

/// Refuses a configuration with no domain (every request would pass unlimited) unless the policy allows it.
pub fn check_not_empty(config: &Config, path: &Path, policy: Policy) -> Result<(), String> {
    if config.domains().is_empty() && !policy.allow_empty {
        return Err(format!(
            "{}: no domain configured (no *.yaml or *.yml file): every request would pass unlimited; \
             --allow-empty-config (TB_RLS_ALLOW_EMPTY_CONFIG) allows it",
            path.display()
        ));
    }
    Ok(())
}

/// Refuses a reload that is empty, or that loses domains because files of the serving configuration vanished,
/// unless the policy allows it.
pub fn check_reload(
    serving: (&Sources, &Config),
    next: (&Sources, &Config),
    path: &Path,
    policy: Policy,
) -> Result<(), String> {
    check_not_empty(next.1, path, policy)?;
    if policy.allow_empty {
        return Ok(());
    }
    let vanished: Vec<&str> = serving
        .0
        .iter()
        .map(|(file, _)| file.as_str())
        .filter(|file| !next.0.iter().any(|(other, _)| other == file))
        .collect();
    let lost: Vec<&str> = serving
        .1
        .domains()
        .into_iter()
        .filter(|domain| !next.1.has_domain(domain))
        .collect();
    if !vanished.is_empty() && !lost.is_empty() {
        return Err(format!(
            "{} vanished, which would drop domain(s) {}: every request to them would pass unlimited; \
             --allow-empty-config (TB_RLS_ALLOW_EMPTY_CONFIG) allows it",
            vanished.join(", "),
            lost.join(", ")
        ));
    }
    Ok(())
}

/// The configuration in force, swapped whole on a good reload.
pub type Shared = Arc<RwLock<Arc<Config>>>;

/// Polls `path` every `interval`, replacing `shared` when the files change, parse and pass `check_reload`.
/// `serving` is what the configuration in force was read from.
pub async fn watch(
    path: PathBuf,
    serving: Sources,
    shared: Shared,
    interval: Duration,
    policy: Policy,
    metrics: Arc<Metrics>,
) {
    let mut serving = serving;
    // The last files seen, good or bad: a refused change is logged once, not at every poll.
    let mut last = serving.clone();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let sources = match read_sources(&path) {
            Ok(sources) => sources,
            Err(err) => {
                if !last.is_empty() {
                    tracing::error!(error = %err, "cannot read the configuration; keeping the last good one");
                    metrics.reload(false);
                    last.clear();
                }
                continue;
            }
        };
        if sources == last {
            continue;
        }
        let current = shared.read().map(|config| Arc::clone(&config));
        let outcome = parse(&sources, policy)
            .map_err(|err| err.to_string())
            .and_then(|config| match &current {
                Ok(current) => {
                    check_reload((&serving, current), (&sources, &config), &path, policy)
                        .map(|()| config)
                }
                Err(_) => Err("configuration lock poisoned".to_owned()),
            });
        match outcome {
            Ok(config) => {
                tracing::info!(domains = ?config.domains(), "configuration reloaded");
                if let Ok(mut current) = shared.write() {
                    *current = Arc::new(config);
                }
                metrics.reload(true);
                serving = sources.clone();
            }
            Err(err) => {
                tracing::error!(error = %err, "configuration change refused; keeping the last good one");
                metrics.reload(false);
            }
        }
        last = sources;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(files: &[(&str, &str)]) -> Sources {
        files
            .iter()
            .map(|&(file, text)| (file.to_owned(), text.to_owned()))
            .collect()
    }

    const A: (&str, &str) = ("a.yaml", "domain: a\n");
    const B: (&str, &str) = ("b.yaml", "domain: b\n");

    #[test]
    fn an_empty_configuration_is_refused_unless_allowed() {
        let empty = parse(&Vec::new(), Policy::default()).expect("parses");
        let path = Path::new("conf");
        let refused = check_not_empty(&empty, path, Policy::default()).expect_err("refused");
        assert!(refused.contains("no domain configured"), "{refused}");
        assert!(refused.contains("--allow-empty-config"), "{refused}");
        let allowed = Policy {
            allow_empty: true,
            ..Policy::default()
        };
        assert_eq!(check_not_empty(&empty, path, allowed), Ok(()));
    }

    #[test]
    fn a_reload_losing_domains_to_vanished_files_is_refused() {
        let path = Path::new("conf");
        let policy = Policy::default();
        let both = sources(&[A, B]);
        let serving = parse(&both, policy).expect("parses");
        let only_a = sources(&[A]);
        let next = parse(&only_a, policy).expect("parses");
        let refused =
            check_reload((&both, &serving), (&only_a, &next), path, policy).expect_err("refused");
        assert_eq!(
            refused,
            "b.yaml vanished, which would drop domain(s) b: every request to them would pass unlimited; \
             --allow-empty-config (TB_RLS_ALLOW_EMPTY_CONFIG) allows it"
        );
        // A file renamed with its domain kept, or a domain moved to another file, loses nothing.
        let renamed = sources(&[A, ("c.yaml", B.1)]);
        let next = parse(&renamed, policy).expect("parses");
        assert_eq!(
            check_reload((&both, &serving), (&renamed, &next), path, policy),
            Ok(())
        );
        // A domain renamed inside a file that is still there is an edit, not a vanished file.
        let edited = sources(&[A, ("b.yaml", "domain: c\n")]);
        let next = parse(&edited, policy).expect("parses");
        assert_eq!(
            check_reload((&both, &serving), (&edited, &next), path, policy),
            Ok(())
        );
        let allowed = Policy {
            allow_empty: true,
            ..Policy::default()
        };
        let next = parse(&only_a, policy).expect("parses");
        assert_eq!(
            check_reload((&both, &serving), (&only_a, &next), path, allowed),
            Ok(())
        );
    }
}
