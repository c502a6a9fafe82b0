//! A named limit (rate, burst, cost per request) and who a request counts against under it.
#![forbid(unsafe_code)]

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use crate::error::ConfigError;
use crate::extract::KeyExtractor;

/// Who a request counts against, as a [`KeyExtractor`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// Limited under this identity (an empty string counts as [`Identity::Anonymous`]).
    Key(String),
    /// Limited under this address's identity: IPv4 as it is, IPv4-mapped IPv6 as IPv4, other IPv6 by the
    /// layer's `ipv6_subnet` prefix ([`crate::keys::addr_identity`]).
    Ip(IpAddr),
    /// No identity found: limited under the one shared anonymous identity, with a warning once per process.
    Anonymous,
    /// Not limited: the only way to let a request through without a limit.
    Skip,
}

impl From<Option<String>> for Identity {
    fn from(identity: Option<String>) -> Identity {
        match identity {
            Some(text) if !text.is_empty() => Identity::Key(text),
            _ => Identity::Anonymous,
        }
    }
}

/// A key extractor as the layer keeps it.
pub(crate) type KeyFn = Arc<dyn KeyExtractor>;

/// One limit: `rate` tokens per second into a bucket of `burst`, `cost` taken per request, one bucket per
/// identity under the key `<prefix>{<identity>}:<name>`.
#[derive(Clone)]
pub struct Limit {
    pub(crate) name: String,
    pub(crate) rate: f64,
    pub(crate) burst: f64,
    pub(crate) cost: f64,
    pub(crate) key: Option<KeyFn>,
    pub(crate) shadow: bool,
    pub(crate) lease: bool,
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.name)
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .field("cost", &self.cost)
            .field("own_key", &self.key.is_some())
            .field("shadow", &self.shadow)
            .field("lease", &self.lease)
            .finish()
    }
}

impl Limit {
    /// A limit named `name` (it names the bucket keys and the header items): `rate` tokens per second, bursts
    /// of `burst`, each request costing 1. Refuses a name that is empty or holds a character outside `0x20` to
    /// `0x7E` (the header's sf-string holds no other), and a rate or burst that is not a finite number above 0.
    pub fn new(name: &str, rate: f64, burst: f64) -> Result<Limit, ConfigError> {
        if name.is_empty() || !name.bytes().all(|byte| (0x20..=0x7E).contains(&byte)) {
            return Err(ConfigError::new(format!(
                "a limit's name must be printable ASCII (0x20 to 0x7E), at least one character: {name:?}"
            )));
        }
        for (what, value) in [("rate", rate), ("burst", burst)] {
            if !(value.is_finite() && value > 0.0) {
                return Err(ConfigError::new(format!(
                    "limit {name:?}: {what} must be a finite number above 0, not {value}"
                )));
            }
        }
        Ok(Limit {
            name: name.to_owned(),
            rate,
            burst,
            cost: 1.0,
            key: None,
            shadow: false,
            lease: false,
        })
    }

    /// Tokens each request takes (default 1; 0 reports without taking). Refuses a cost that is not a finite
    /// number of at least 0.
    pub fn cost(mut self, cost: f64) -> Result<Limit, ConfigError> {
        if !(cost.is_finite() && cost >= 0.0) {
            return Err(ConfigError::new(format!(
                "limit {:?}: cost must be a finite number of at least 0, not {cost}",
                self.name
            )));
        }
        self.cost = cost;
        Ok(self)
    }

    /// This limit's own key (per tenant next to per client), instead of the layer's: a [`KeyExtractor`], such as a
    /// closure `Fn(&http::request::Parts) -> Identity`.
    pub fn key<K: KeyExtractor>(mut self, key: K) -> Limit {
        self.key = Some(Arc::new(key));
        self
    }

    /// [`key`](Self::key) for a closure, with its argument's type inferred: `.key_fn(|request| ...)`.
    pub fn key_fn<F>(self, key: F) -> Limit
    where
        F: Fn(&http::request::Parts) -> Identity + Send + Sync + 'static,
    {
        self.key(key)
    }

    /// Shadow mode for this limit (default off): its buckets are charged as usual, but a request it refuses is
    /// served (and logged at warning level, at most once a second per limit). It is decided after the enforced
    /// limits allow, in a call of its own, and appears in no header.
    pub fn shadow(mut self, shadow: bool) -> Limit {
        self.shadow = shadow;
        self
    }

    /// Leased tokens for a hot limit (default off): each process takes this limit's tokens from Redis in
    /// batches (`TB.ACQUIREATMOST`, sized from its own recent use, at most a tenth of the burst) and admits
    /// requests from them in memory, about one Redis call per process every few tens of milliseconds under steady
    /// load instead of one per request. The bound stays exact over every process: a request is admitted only with
    /// a token Redis granted, and held tokens lose their worth as the bucket refills (docs/clients.md, "How a
    /// leased limit decides"). What it costs: tokens held in processes, at most a tenth of the burst each.
    pub fn lease(mut self, lease: bool) -> Limit {
        self.lease = lease;
        self
    }

    /// The limit as the RateLimit fields describe it.
    pub(crate) fn policy(&self) -> crate::headers::Policy<'_> {
        crate::headers::Policy {
            name: &self.name,
            rate: self.rate,
            burst: self.burst,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn burst(&self) -> f64 {
        self.burst
    }
}
