//! Reads the configuration from disk and keeps it current. The path is one YAML file, or a directory whose
//! `*.yaml`/`*.yml` files (sorted by name, dot files skipped) are one configuration together, like
//! envoyproxy/ratelimit's `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config`.
//!
//! Changes are found by polling: every interval the files are read again and, when their bytes differ from the
//! last ones seen, parsed. Polling also sees what file watchers miss (an editor's rename, a Kubernetes ConfigMap's
//! symlink swap), and reading a few small files a second costs nothing. A change that does not parse is logged
//! with its reason, and the last good configuration keeps serving.
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

/// Parses what `read_sources` read.
pub fn parse(sources: &Sources) -> Result<Config, ConfigError> {
    Config::from_files(
        sources
            .iter()
            .map(|(file, text)| (file.as_str(), text.as_str())),
    )
}

/// The configuration in force, swapped whole on a good reload.
pub type Shared = Arc<RwLock<Arc<Config>>>;

/// Polls `path` every `interval`, replacing `shared` when the files change and parse.
pub async fn watch(
    path: PathBuf,
    mut last: Sources,
    shared: Shared,
    interval: Duration,
    metrics: Arc<Metrics>,
) {
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
        match parse(&sources) {
            Ok(config) => {
                tracing::info!(domains = ?config.domains(), "configuration reloaded");
                if let Ok(mut current) = shared.write() {
                    *current = Arc::new(config);
                }
                metrics.reload(true);
            }
            Err(err) => {
                tracing::error!(error = %err, "configuration change refused; keeping the last good one");
                metrics.reload(false);
            }
        }
        last = sources;
    }
}
