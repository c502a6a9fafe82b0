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
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
    let mut identity = String::with_capacity(24);
    push_addr_identity(&mut identity, address, subnet);
    identity
}

/// [`addr_identity`] written at the end of `out`.
fn push_addr_identity(out: &mut String, address: IpAddr, subnet: Ipv6Subnet) {
    match address {
        IpAddr::V4(v4) => push_ipv4(out, v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => push_ipv4(out, v4),
            None => {
                let bits = u32::from(subnet.bits());
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                let network = Ipv6Addr::from(u128::from(v6) & mask);
                // Writing to a String cannot fail.
                let _ = write!(out, "{network}/{bits}");
            }
        },
    }
}

/// `a.b.c.d`, as `Ipv4Addr`'s `Display` writes it, without the formatting machinery (the usual key's cost).
fn push_ipv4(out: &mut String, address: Ipv4Addr) {
    for (index, octet) in address.octets().into_iter().enumerate() {
        if index > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
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
    push_escaped(&mut tag, identity);
    tag
}

/// [`escape`] written at the end of `out`.
fn push_escaped(out: &mut String, identity: &str) {
    push_escaped_also(out, identity, &[]);
}

/// [`escape`] written at the end of `out`, with the bytes of `also` escaped too.
fn push_escaped_also(out: &mut String, identity: &str, also: &[u8]) {
    for &byte in identity.as_bytes() {
        if is_kept(byte) && !also.contains(&byte) {
            out.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{byte:02X}");
        }
    }
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
    let identity = identity.unwrap_or("");
    let mut key = start_key(prefix, identity.len(), limit_name);
    if identity.is_empty() {
        key.push_str(ANONYMOUS_TAG);
    } else {
        push_escaped(&mut key, identity);
    }
    end_key(key, limit_name)
}

/// [`bucket_key`] for the identity of the peer `address` ([`addr_identity`]), made in place: one allocation.
pub fn peer_key(prefix: &str, address: IpAddr, subnet: Ipv6Subnet, limit_name: &str) -> String {
    let mut key = start_key(prefix, 24, limit_name);
    let tag_start = key.len();
    push_addr_identity(&mut key, address, subnet);
    // An address's identity is all kept bytes, its own tag; escaped all the same should that ever change.
    if let Some(identity) = key.get(tag_start..) {
        if !identity.bytes().all(is_kept) {
            let identity = identity.to_owned();
            key.truncate(tag_start);
            push_escaped(&mut key, &identity);
        }
    }
    end_key(key, limit_name)
}

/// The key of a bucket whose identity's tag is `tag`.
pub fn tagged_key(prefix: &str, tag: &str, limit_name: &str) -> String {
    let mut key = start_key(prefix, tag.len(), limit_name);
    key.push_str(tag);
    end_key(key, limit_name)
}

/// The key of an Envoy rate limit descriptor's bucket (tb-rls): `<prefix>{<domain>}:<key>=<value>...`, one
/// `:<key>=<value>` per entry. Each part is escaped as [`escape`] escapes an identity, and `:` and `=` too, since
/// here they separate the entries of one key: distinct descriptors never share a key, and the hash tag is always
/// exactly the domain, so every bucket of one request lands in one Cluster slot.
pub fn descriptor_key(prefix: &str, domain: &str, entries: &[(String, String)]) -> String {
    const SEPARATORS: &[u8] = b":=";
    let mut key = String::with_capacity(prefix.len() + domain.len() + 16 * entries.len() + 2);
    key.push_str(prefix);
    key.push('{');
    push_escaped_also(&mut key, domain, SEPARATORS);
    key.push('}');
    for (name, value) in entries {
        key.push(':');
        push_escaped_also(&mut key, name, SEPARATORS);
        key.push('=');
        push_escaped_also(&mut key, value, SEPARATORS);
    }
    key
}

/// `<prefix>{`, with room for a tag of about `tag_len` bytes and the rest.
fn start_key(prefix: &str, tag_len: usize, limit_name: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + tag_len + limit_name.len() + 3);
    key.push_str(prefix);
    key.push('{');
    key
}

/// `}:<limit name>` after the tag.
fn end_key(mut key: String, limit_name: &str) -> String {
    key.push_str("}:");
    key.push_str(limit_name);
    key
}

/// `prefix` unless it holds a brace: the hash tag of every key is its identity's, and a brace in the prefix would
/// change the slot a bucket lands in (`{}` hashes the whole key, `{x}` puts every bucket in one slot).
pub fn check_prefix(prefix: &str) -> Result<&str, ConfigError> {
    if prefix.contains(['{', '}']) {
        return Err(ConfigError::new(format!(
            "prefix must be a string without \"{{\" or \"}}\" (the hash tag of every key is its identity's), not \
             {prefix:?}"
        )));
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
    fn an_ipv4_address_is_written_as_display_writes_it() {
        for octets in [
            [0, 0, 0, 0],
            [1, 9, 10, 99],
            [100, 199, 200, 255],
            [127, 0, 0, 1],
        ] {
            let address = Ipv4Addr::from(octets);
            let mut text = String::new();
            push_ipv4(&mut text, address);
            assert_eq!(text, address.to_string());
        }
    }

    /// The key made in place is the key of the address's identity.
    #[test]
    fn a_peer_key_is_the_bucket_key_of_its_identity() {
        for text in [
            "192.0.2.1",
            "::ffff:192.0.2.1",
            "2001:db8:1:2ff:aaaa::1",
            "::1",
        ] {
            let address: IpAddr = text.parse().expect("an address");
            for bits in [1, 56, 64] {
                let subnet = Ipv6Subnet::new(bits).expect("a subnet");
                assert_eq!(
                    peer_key("app:", address, subnet, "api"),
                    bucket_key("app:", Some(&addr_identity(address, subnet)), "api")
                );
            }
        }
        assert_eq!(bucket_key("p:", None, "x"), "p:{%anonymous}:x");
        assert_eq!(bucket_key("p:", Some(""), "x"), "p:{%anonymous}:x");
        assert_eq!(bucket_key("p:", Some("a{b}"), "x"), "p:{a%7Bb%7D}:x");
    }

    #[test]
    fn a_prefix_with_a_brace_is_refused() {
        for refused in ["app{}:", "app{x}:", "app}{", "{", "}"] {
            assert!(check_prefix(refused).is_err(), "{refused}");
        }
        assert!(check_prefix("app:").is_ok());
    }
}
