//! Who a request counts against: the [`KeyExtractor`] trait and its implementations, as the layer's `key` option
//! and [`Limit::key`](crate::Limit::key) take them.
//!
//! ```text
//! PeerIp          the peer address (the default): axum's ConnectInfo<SocketAddr>, or a SocketAddr extension
//! TrustedProxies  the client behind proxies you run: X-Forwarded-For or Forwarded, read only from a peer that is
//!                 one of them, right to left, the first address that is not one of them; else the peer
//! GlobalKey       one bucket for every request
//! a closure       Fn(&Parts) -> Identity, or your own impl of the trait
//! ```
//!
//! An address becomes an identity by the shared rule (IPv6 by the layer's `ipv6_subnet`, IPv4-mapped IPv6 as
//! IPv4: [`crate::keys::ip_identity`]), applied by the layer to the [`Identity::Ip`] an extractor returns. A
//! header is never read from a peer outside the trusted proxies: anyone can write one.
#![forbid(unsafe_code)]

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::header::{HeaderName, FORWARDED};
use http::request::Parts;

use crate::error::ConfigError;
use crate::limit::Identity;

/// Finds the identity a request counts against, from its head (method, URI, headers, extensions).
///
/// Implemented by every `Fn(&Parts) -> Identity + Send + Sync + 'static`. Return [`Identity::Skip`] to let a
/// request through unlimited, [`Identity::Anonymous`] when there is no identity.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The identity of `request`.
    fn extract(&self, request: &Parts) -> Identity;

    /// Refuses a configuration that cannot work; called once, by the layer builder's `build()`.
    fn check(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Identity + Send + Sync + 'static,
{
    fn extract(&self, request: &Parts) -> Identity {
        self(request)
    }
}

/// The peer address of a request: axum's `ConnectInfo<SocketAddr>` (served with
/// `into_make_service_with_connect_info::<SocketAddr>()`, with the `axum` feature), else a `SocketAddr` in the
/// request's extensions (what a hyper or tower server of your own can insert).
pub fn peer_addr(request: &Parts) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(address)) = request
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(address.ip());
    }
    request
        .extensions
        .get::<SocketAddr>()
        .map(|address| address.ip())
}

/// The peer address (the default key): [`Identity::Ip`] of [`peer_addr`], [`Identity::Anonymous`] without one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerIp;

impl KeyExtractor for PeerIp {
    fn extract(&self, request: &Parts) -> Identity {
        match peer_addr(request) {
            Some(address) => Identity::Ip(address),
            None => Identity::Anonymous,
        }
    }
}

/// One bucket per limit for every request: the identity `global`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    fn extract(&self, _request: &Parts) -> Identity {
        Identity::Key("global".to_owned())
    }
}

/// The client behind proxies you run. Only when the peer is one of `proxies` (addresses or networks, `10.0.0.1`,
/// `10.0.0.0/8`, `fd00::/8`) are `X-Forwarded-For` (or, without it, `Forwarded`'s `for=`) read: right to left,
/// the first address that is not one of the proxies is the client. A peer outside the proxies is the client
/// itself, whatever it sends; a chain of proxies only is keyed by its left-most address; a header that names no
/// address there falls back to the peer.
///
/// A client can write any `X-Forwarded-For` it likes; each of your proxies appends the address it got the request
/// from, so the right-most addresses are the ones your proxies wrote, and the first not among them is the one
/// that connected to your first proxy.
#[derive(Clone)]
pub struct TrustedProxies {
    networks: Vec<Network>,
    /// The first entry that is no address or network, refused by `check` (so by the builder's `build()`).
    refused: Option<String>,
}

impl fmt::Debug for TrustedProxies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.networks).finish()
    }
}

/// An address and how many of its leading bits a match shares (32 or 128: the address alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Network {
    address: IpAddr,
    bits: u8,
}

impl Network {
    fn parse(text: &str) -> Option<Network> {
        let (address, bits) = match text.trim().split_once('/') {
            Some((address, bits)) => (address, Some(bits.parse::<u8>().ok()?)),
            None => (text.trim(), None),
        };
        let address = unmapped(address.parse::<IpAddr>().ok()?);
        let most = if address.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(most);
        (bits <= most).then_some(Network { address, bits })
    }

    fn contains(&self, address: IpAddr) -> bool {
        match (self.address, unmapped(address)) {
            (IpAddr::V4(network), IpAddr::V4(address)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(network) & mask == u32::from(address) & mask
            }
            (IpAddr::V6(network), IpAddr::V6(address)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                u128::from(network) & mask == u128::from(address) & mask
            }
            _ => false,
        }
    }
}

/// IPv4-mapped IPv6 as the IPv4 address it is.
fn unmapped(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

impl TrustedProxies {
    /// The proxies whose forwarding headers are believed. An entry that is no address or network is refused by
    /// the layer builder's `build()`.
    pub fn new<I, S>(proxies: I) -> TrustedProxies
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut networks = Vec::new();
        let mut refused = None;
        for proxy in proxies {
            let text = proxy.as_ref();
            match Network::parse(text) {
                Some(network) => networks.push(network),
                None => {
                    refused.get_or_insert_with(|| text.to_owned());
                }
            }
        }
        TrustedProxies { networks, refused }
    }

    fn trusts(&self, address: IpAddr) -> bool {
        self.networks
            .iter()
            .any(|network| network.contains(address))
    }

    /// The client's address for a request from the trusted proxy `peer`.
    fn client_of(&self, request: &Parts, peer: IpAddr) -> IpAddr {
        let headers = &request.headers;
        let mut hops: Vec<Option<IpAddr>> = Vec::new();
        if headers.contains_key(X_FORWARDED_FOR) {
            for value in headers.get_all(X_FORWARDED_FOR) {
                let Ok(text) = value.to_str() else {
                    hops.push(None);
                    continue;
                };
                hops.extend(text.split(',').map(hop_address));
            }
        } else {
            for value in headers.get_all(FORWARDED) {
                let Ok(text) = value.to_str() else {
                    hops.push(None);
                    continue;
                };
                hops.extend(text.split(',').map(forwarded_for));
            }
        }
        let mut leftmost = None;
        for hop in hops.iter().rev() {
            match hop {
                // Not an address: nothing to its left can be believed.
                None => return peer,
                Some(address) if !self.trusts(*address) => return *address,
                Some(address) => leftmost = Some(*address),
            }
        }
        leftmost.unwrap_or(peer)
    }
}

impl KeyExtractor for TrustedProxies {
    fn extract(&self, request: &Parts) -> Identity {
        match peer_addr(request) {
            Some(peer) if self.trusts(peer) => Identity::Ip(self.client_of(request, peer)),
            Some(peer) => Identity::Ip(peer),
            None => Identity::Anonymous,
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        match &self.refused {
            Some(text) => Err(ConfigError::new(format!(
                "key: trusted proxy {text:?} is not an IP address or network (10.0.0.1, 10.0.0.0/8, fd00::/8)"
            ))),
            None if self.networks.is_empty() => Err(ConfigError::new(
                "key: TrustedProxies needs at least one proxy address or network".to_owned(),
            )),
            None => Ok(()),
        }
    }
}

/// The address of one `X-Forwarded-For` entry: `192.0.2.1`, `2001:db8::1`, `[2001:db8::1]:443`, `192.0.2.1:80`.
fn hop_address(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    if let Ok(address) = entry.parse::<IpAddr>() {
        return Some(address);
    }
    if let Ok(address) = entry.parse::<SocketAddr>() {
        return Some(address.ip());
    }
    entry
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .and_then(|inner| inner.parse::<Ipv6Addr>().ok())
        .map(IpAddr::V6)
}

/// The address of one `Forwarded` element's `for=` (RFC 7239): `for=192.0.2.60`, `for="[2001:db8::17]:4711"`;
/// `None` for `unknown`, an obfuscated name, or no `for=`.
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("for") {
            return None;
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
            .unwrap_or(value);
        hop_address(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn request(peer: &str, headers: &[(&str, &str)]) -> Parts {
        let mut builder = Request::builder().uri("/");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let (mut parts, ()) = builder.body(()).expect("a request").into_parts();
        let peer: IpAddr = peer.parse().expect("an address");
        parts.extensions.insert(SocketAddr::new(peer, 5000));
        parts
    }

    fn ip(text: &str) -> Identity {
        Identity::Ip(text.parse().expect("an address"))
    }

    fn proxies() -> TrustedProxies {
        TrustedProxies::new(["10.0.0.0/8", "192.0.2.7"])
    }

    #[test]
    fn a_client_outside_the_proxies_is_keyed_by_its_own_address_whatever_it_sends() {
        let spoofed = request("203.0.113.9", &[("x-forwarded-for", "198.51.100.1")]);
        assert_eq!(proxies().extract(&spoofed), ip("203.0.113.9"));
        let forwarded = request("203.0.113.9", &[("forwarded", "for=198.51.100.1")]);
        assert_eq!(proxies().extract(&forwarded), ip("203.0.113.9"));
    }

    #[test]
    fn a_chain_with_a_spoofed_leftmost_entry_is_keyed_by_the_rightmost_untrusted() {
        // The client wrote 198.51.100.1; the first proxy appended the client's own address, 203.0.113.9, and the
        // second proxy (10.0.0.2) appended the first's.
        let chain = request(
            "10.0.0.3",
            &[("x-forwarded-for", "198.51.100.1, 203.0.113.9, 10.0.0.2")],
        );
        assert_eq!(proxies().extract(&chain), ip("203.0.113.9"));
        // The same over two header lines, and in Forwarded.
        let lines = request(
            "10.0.0.3",
            &[
                ("x-forwarded-for", "198.51.100.1"),
                ("x-forwarded-for", "203.0.113.9, 10.0.0.2"),
            ],
        );
        assert_eq!(proxies().extract(&lines), ip("203.0.113.9"));
        let forwarded = request(
            "192.0.2.7",
            &[(
                "forwarded",
                "for=198.51.100.1, for=\"[2001:db8::17]:4711\";proto=https, For=10.1.2.3",
            )],
        );
        assert_eq!(proxies().extract(&forwarded), ip("2001:db8::17"));
    }

    #[test]
    fn what_names_no_client_falls_back_to_the_peer() {
        let none = request("10.0.0.3", &[]);
        assert_eq!(proxies().extract(&none), ip("10.0.0.3"));
        let garbage = request("10.0.0.3", &[("x-forwarded-for", "203.0.113.9, nonsense")]);
        assert_eq!(proxies().extract(&garbage), ip("10.0.0.3"));
        let unknown = request("10.0.0.3", &[("forwarded", "for=unknown")]);
        assert_eq!(proxies().extract(&unknown), ip("10.0.0.3"));
        // Proxies only: the left-most of them.
        let inside = request("10.0.0.3", &[("x-forwarded-for", "10.9.9.9, 10.0.0.2")]);
        assert_eq!(proxies().extract(&inside), ip("10.9.9.9"));
        // X-Forwarded-For first: Forwarded is read only without it.
        let both = request(
            "10.0.0.3",
            &[
                ("x-forwarded-for", "203.0.113.9"),
                ("forwarded", "for=198.51.100.1"),
            ],
        );
        assert_eq!(proxies().extract(&both), ip("203.0.113.9"));
    }

    #[test]
    fn ipv4_mapped_addresses_match_ipv4_networks() {
        let mapped = request("::ffff:10.0.0.3", &[("x-forwarded-for", "203.0.113.9")]);
        assert_eq!(proxies().extract(&mapped), ip("203.0.113.9"));
        let v6 = TrustedProxies::new(["fd00::/8"]);
        let from_v6 = request("fd12::1", &[("x-forwarded-for", "2001:db8::1")]);
        assert_eq!(v6.extract(&from_v6), ip("2001:db8::1"));
    }

    #[test]
    fn proxies_that_are_not_addresses_are_refused_when_built() {
        for bad in ["10.0.0.0/33", "example.com", "fd00::/129", ""] {
            let err = TrustedProxies::new(["10.0.0.1", bad])
                .check()
                .expect_err("refused");
            assert!(err.to_string().contains("trusted proxy"), "{err}");
        }
        assert!(TrustedProxies::new(Vec::<String>::new()).check().is_err());
        assert!(proxies().check().is_ok());
    }

    #[test]
    fn the_peer_and_global_keys() {
        let parts = request("192.0.2.1", &[]);
        assert_eq!(PeerIp.extract(&parts), ip("192.0.2.1"));
        let (bare, ()) = Request::new(()).into_parts();
        assert_eq!(PeerIp.extract(&bare), Identity::Anonymous);
        assert_eq!(GlobalKey.extract(&bare), Identity::Key("global".to_owned()));
    }
}
