"""Who a request counts against, and the bucket key that follows: the identity rule and the key layout that the
Python and Node packages share (docs/clients.md, "Identity and keys"; `fixtures/keys.json` holds the cases both
suites check).

- A key function returns an identity (a non-empty string), no identity (None or ""), or `SKIP`. No identity is
  never a pass: such requests share the bucket of the anonymous identity, and the middleware logs a warning once.
- The default identity is the peer address through `ip_identity`: IPv4 as is, IPv4-mapped IPv6 as IPv4, other
  IPv6 grouped by a prefix (/56 by default), since one client holds a whole /64 or more.
- A bucket key is `<prefix>{<tag>}:<limit name>`, the tag being the identity escaped so that it never holds a
  brace: every bucket of one request shares one non-empty hash tag (one Cluster slot, whatever the identity), and
  two identities never share a tag.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import logging
import re
from typing import Literal

logger = logging.getLogger("redis_tb")


class _Skip(enum.Enum):
    SKIP = "skip"

    def __repr__(self) -> str:
        return "redis_tb.SKIP"


#: What a key function returns for a request that must not be limited: the only way to skip a limit.
SKIP: Literal[_Skip.SKIP] = _Skip.SKIP
#: The tag of requests without an identity. Escaping never yields `%` followed by a non-hex digit, so no identity
#: can take this tag.
ANONYMOUS_TAG = "%anonymous"
DEFAULT_IPV6_SUBNET = 56
_KEPT = frozenset(range(0x21, 0x7F)) - frozenset(b"%{}")
#: An identity made of kept characters only: its own tag.
_PLAIN = re.compile("[!-$&-z|~]*")


def check_ipv6_subnet(ipv6_subnet: object) -> int:
    """`ipv6_subnet` if it is an int from 1 to 64 (a client holds a /64 at least, so a longer prefix would let
    it pick a fresh bucket per address); else ValueError naming the option."""
    if isinstance(ipv6_subnet, bool) or not isinstance(ipv6_subnet, int) or not 1 <= ipv6_subnet <= 64:
        raise ValueError(f"ipv6_subnet must be an integer from 1 to 64, not {ipv6_subnet!r}")
    return ipv6_subnet


def ip_identity(address: str | None, ipv6_subnet: int = DEFAULT_IPV6_SUBNET) -> str | None:
    """The identity of a peer address: `127.0.0.1` as is; `::ffff:127.0.0.1` as `127.0.0.1`; any other IPv6
    address as its /`ipv6_subnet` network (`2001:db8:1:2ff::1` -> `2001:db8:1:200::/56`), zone id dropped.
    None for no address or for text that is not an IP address (a Unix socket path, IPv4 with a zone id)."""
    subnet = check_ipv6_subnet(ipv6_subnet)
    if not address:
        return None
    return _identity_of(address, subnet)


@functools.lru_cache(maxsize=4096)  # the same clients come again and again: parse each once
def _identity_of(address: str, subnet: int) -> str | None:
    bare, zone, _ = address.partition("%")
    try:
        parsed = ipaddress.ip_address(bare)
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv4Address):
        # A zone id belongs to IPv6 text only (RFC 4007): `1.2.3.4%eth0` is not an address.
        return None if zone else str(parsed)
    if parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)
    return str(ipaddress.IPv6Network((parsed, subnet), strict=False))


def escape(identity: str) -> str:
    """The hash tag of an identity: its WTF-8 bytes, with `%`, `{`, `}`, and every byte outside `!`..`~` written
    as `%XX` (uppercase hex). Injective, never empty for a non-empty identity, never holds a brace."""
    if _PLAIN.fullmatch(identity):
        return identity
    return "".join(chr(byte) if byte in _KEPT else f"%{byte:02X}" for byte in _wtf8(identity))


def _wtf8(identity: str) -> bytes:
    """UTF-8, except that a lone surrogate (which UTF-8 cannot hold) is written as the three bytes its code point
    would take (`\\ud800` -> ED A0 80): WTF-8, the bytes Node's package takes from the same UTF-16 text. A high and
    a low surrogate next to each other are the character they encode, as in JavaScript."""
    try:
        return identity.encode("utf-8")
    except UnicodeEncodeError:
        # Through UTF-16 and back: pairs become their character, lone surrogates stay, then are written as such.
        units = identity.encode("utf-16-le", "surrogatepass")
        return units.decode("utf-16-le", "surrogatepass").encode("utf-8", "surrogatepass")


def tag_of(identity: str | None) -> str:
    """The hash tag for an identity, the anonymous one for None or ""."""
    return escape(identity) if identity else ANONYMOUS_TAG


def bucket_key(prefix: str, identity: str | None, limit_name: str) -> str:
    """`<prefix>{<tag>}:<limit name>`."""
    return tagged_key(prefix, tag_of(identity), limit_name)


def tagged_key(prefix: str, tag: str, limit_name: str) -> str:
    """The key of a bucket whose identity's tag is `tag`."""
    return f"{prefix}{{{tag}}}:{limit_name}"


def check_prefix(prefix: object) -> str:
    """`prefix` if it is a string without a brace. The hash tag of every key is its identity's (every bucket of one
    identity in one slot, and identities spread over the cluster): a brace in the prefix would change the slot a
    bucket lands in (`{}` hashes the whole key, `{x}` puts every bucket in one slot)."""
    if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
        raise ValueError(
            'prefix must be a string without "{" or "}" (the hash tag of every key is its identity\'s), '
            f"not {prefix!r}"
        )
    return prefix
