//! The matching tree: one node per configured descriptor, and the lookup of a request descriptor in it, as
//! envoyproxy/ratelimit's `GetLimit` walks it (see `config`). Pure: no I/O, no clock.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;

use super::format::{composite_key, RawDescriptor};
use super::{Config, Limit, Matched};

/// One level of the tree: the descriptors under a parent, and the parent's own limit.
#[derive(Debug, Default)]
pub(super) struct Node {
    /// Children by `key` or `key_value`.
    children: HashMap<String, Node>,
    /// Children whose value has a `*`, as (`key_value`, the pattern split at `*`), in file order.
    wildcards: Vec<(String, Vec<String>)>,
    limit: Option<Arc<Limit>>,
    /// `share_threshold`: values this wildcard matches share one bucket, named by the pattern.
    share_threshold: bool,
}

impl Config {
    /// The limit for one request descriptor, given as its `(key, value)` entries; `None` when nothing matches.
    pub fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched> {
        let mut level = self.domains.get(domain)?;
        let mut bucket_entries = Vec::with_capacity(entries.len());
        for (index, &(key, value)) in entries.iter().enumerate() {
            let exact = format!("{key}_{value}");
            let (node, shared_value) = if let Some(node) = level.children.get(&exact) {
                (node, None)
            } else if let Some((node, pattern)) = level.wildcard(&exact) {
                (node, node.share_threshold.then_some(pattern))
            } else if let Some(node) = level.children.get(key) {
                (node, None)
            } else {
                return None;
            };
            let bucket_value = shared_value
                .and_then(|pattern| pattern.strip_prefix(&format!("{key}_")).map(str::to_owned))
                .unwrap_or_else(|| value.to_owned());
            bucket_entries.push((key.to_owned(), bucket_value));
            if index + 1 == entries.len() {
                return node.limit.clone().map(|limit| Matched {
                    limit,
                    bucket_entries,
                });
            }
            if node.children.is_empty() {
                return None;
            }
            level = node;
        }
        None
    }
}

impl Node {
    pub(super) fn load(
        &mut self,
        parent_path: &str,
        descriptors: Vec<RawDescriptor>,
    ) -> Result<(), String> {
        for raw in descriptors {
            let key = composite_key(&raw.key, &raw.value);
            let path = format!("{parent_path}.{key}");
            if self.children.contains_key(&key) {
                return Err(format!("duplicate descriptor composite key '{path}'"));
            }
            let limit = raw.rate_limit.map(|rate_limit| {
                Arc::new(Limit {
                    policy: rate_limit.policy,
                    name: rate_limit.name,
                    replaces: rate_limit.replaces,
                    shadow_mode: raw.shadow_mode,
                    quota_mode: raw.quota_mode,
                    path: path.clone(),
                })
            });
            let mut child = Node {
                limit,
                share_threshold: raw.share_threshold,
                ..Node::default()
            };
            child.load(&path, raw.descriptors)?;
            if key.contains('*') {
                let parts = key.split('*').map(str::to_owned).collect();
                self.wildcards.push((key.clone(), parts));
            }
            self.children.insert(key, child);
        }
        Ok(())
    }

    /// The first wildcard child (in file order) whose pattern matches `key_value`, with its pattern.
    fn wildcard(&self, key_value: &str) -> Option<(&Node, String)> {
        self.wildcards
            .iter()
            .find(|(_, parts)| wildcard_match(parts, key_value))
            .and_then(|(pattern, _)| {
                self.children
                    .get(pattern)
                    .map(|node| (node, pattern.clone()))
            })
    }
}

/// Whether `text` matches a pattern split at its `*`s; each `*` stands for any run of characters, empty included.
pub(super) fn wildcard_match(parts: &[String], text: &str) -> bool {
    let Some((first, rest)) = parts.split_first() else {
        return text.is_empty();
    };
    let Some((last, middle)) = rest.split_last() else {
        return text == first;
    };
    if text.len() < first.len() + last.len() || !text.starts_with(first.as_str()) {
        return false;
    }
    let Some(mut remaining) = text
        .get(first.len()..)
        .and_then(|tail| tail.strip_suffix(last.as_str()))
    else {
        return false;
    };
    for part in middle {
        match remaining.find(part.as_str()) {
            Some(at) => remaining = remaining.get(at + part.len()..).unwrap_or(""),
            None => return false,
        }
    }
    true
}
