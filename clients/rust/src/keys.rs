//! Who a request counts against, and the bucket key that follows: the identity rule and the key layout that every
//! package of the project shares (docs/clients.md, "Identity and keys"; `fixtures/keys.json` holds the cases).
//!
//! - The default identity is the peer address through [`ip_identity`]: IPv4 as is, IPv4-mapped IPv6 as IPv4,
//!   other IPv6 grouped by a prefix (/56 by default), since one client holds a whole /64 or more.
//! - A bucket key is `<prefix>{<tag>}:<limit name>`, the tag being the identity escaped so that it never holds a
//!   brace: every bucket of one request shares one non-empty hash tag (one Cluster slot, whatever the identity),
//!   and two identities never share a tag. No identity has the tag `%anonymous`, which no escaped identity equals.
//!
//! Pure: no I/O, no clock.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};

use crate::error::ConfigError;

/// The tag of requests without an identity. Escaping never yields `%` followed by a non-hex digit, so no
/// identity can take this tag.
pub const ANONYMOUS_TAG: &str = "%anonymous";
/// The prefix of bucket keys unless one is set.
pub const DEFAULT_PREFIX: &str = "ratelimit:";

/// The prefix length IPv6 peers are grouped by: 1 to 64 (a client holds a /64 at least, so a longer prefix would
/// let it pick a fresh bucket per address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6Subnet(u8);

impl Ipv6Subnet {
    /// /56, as express-rate-limit and the project's other packages group IPv6 clients.
    pub const DEFAULT: Ipv6Subnet = Ipv6Subnet(56);

    /// The prefix length `bits`, refused unless it is 1 to 64.
    pub fn new(bits: u8) -> Result<Ipv6Subnet, ConfigError> {
        if (1..=64).contains(&bits) {
            Ok(Ipv6Subnet(bits))
        } else {
            Err(ConfigError::new(format!(
                "ipv6_subnet must be an integer from 1 to 64, not {bits}"
            )))
        }
    }

    /// The prefix length in bits.
    pub fn bits(self) -> u8 {
        self.0
    }
}

impl Default for Ipv6Subnet {
    fn default() -> Self {
        Ipv6Subnet::DEFAULT
    }
}

/// The identity of a peer address given as text: `127.0.0.1` as is; `::ffff:127.0.0.1` as `127.0.0.1`; any
/// other IPv6 address as its network (`2001:db8:1:2ff::1` -> `2001:db8:1:200::/56`), zone id dropped. `None` for
/// no address or for text that is not an IP address (a Unix socket path, `host:port`, IPv4 with a zone id).
pub fn ip_identity(address: Option<&str>, subnet: Ipv6Subnet) -> Option<String> {
    let text = address?;
    let parsed: IpAddr = match text.split_once('%') {
        // A zone id belongs to an IPv6 address only: `1.2.3.4%eth0` is no address.
        Some((address, _zone)) => IpAddr::V6(address.parse().ok()?),
        None => text.parse().ok()?,
    };
    Some(addr_identity(parsed, subnet))
}

/// The identity of a peer address (what axum's `ConnectInfo<SocketAddr>` holds), as [`ip_identity`] says.
pub fn addr_identity(address: IpAddr, subnet: Ipv6Subnet) -> String {
    match address {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let bits = u32::from(subnet.bits());
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                let network = Ipv6Addr::from(u128::from(v6) & mask);
                format!("{network}/{bits}")
            }
        },
    }
}

/// Whether a byte stands for itself in a tag: `!` to `~`, except `%`, `{` and `}`.
fn is_kept(byte: u8) -> bool {
    (0x21..=0x7E).contains(&byte) && !matches!(byte, b'%' | b'{' | b'}')
}

/// The hash tag of an identity: its UTF-8 bytes (a Rust string holds no lone surrogate, which the other packages
/// write as its WTF-8 bytes), with `%`, `{`, `}`, and every byte outside `!`..`~` written as
/// `%XX` (uppercase hex). Injective, never empty for a non-empty identity, never holds a brace.
pub fn escape(identity: &str) -> String {
    let mut tag = String::with_capacity(identity.len());
    for &byte in identity.as_bytes() {
        if is_kept(byte) {
            tag.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(tag, "%{byte:02X}");
        }
    }
    tag
}

/// The hash tag for an identity, the anonymous one for `None` or `""`.
pub fn tag_of(identity: Option<&str>) -> String {
    match identity {
        Some(text) if !text.is_empty() => escape(text),
        _ => ANONYMOUS_TAG.to_owned(),
    }
}

/// `<prefix>{<tag>}:<limit name>`, the key of `limit_name`'s bucket for `identity`.
pub fn bucket_key(prefix: &str, identity: Option<&str>, limit_name: &str) -> String {
    tagged_key(prefix, &tag_of(identity), limit_name)
}

/// The key of a bucket whose identity's tag is `tag`.
pub fn tagged_key(prefix: &str, tag: &str, limit_name: &str) -> String {
    format!("{prefix}{{{tag}}}:{limit_name}")
}

/// `prefix` unless it would empty the keys' hash tag (its first `{` directly followed by `}`), which would
/// scatter one request's buckets over a cluster.
pub fn check_prefix(prefix: &str) -> Result<&str, ConfigError> {
    if let Some(opening) = prefix.find('{') {
        if prefix.get(opening + 1..opening + 2) == Some("}") {
            return Err(ConfigError::new(format!(
                "prefix {prefix:?} holds an empty hash tag '{{}}': bucket keys would lose theirs"
            )));
        }
    }
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_client_is_grouped_by_its_prefix() {
        let address: IpAddr = "2001:db8:1:2ff:aaaa::1".parse().expect("an address");
        assert_eq!(
            addr_identity(address, Ipv6Subnet::DEFAULT),
            "2001:db8:1:200::/56"
        );
        let one = Ipv6Subnet::new(1).expect("1 is allowed");
        assert_eq!(addr_identity(address, one), "::/1");
    }

    #[test]
    fn a_prefix_with_an_empty_hash_tag_is_refused() {
        assert!(check_prefix("app{}:").is_err());
        assert!(check_prefix("app{x}:").is_ok());
        assert!(check_prefix("app}{").is_ok());
    }
}
