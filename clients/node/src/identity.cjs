"use strict";
// Whose bucket a request takes from, and the Redis key of that bucket: the identity rule and the key layout that
// the Python package shares (docs/clients.md; fixtures/keys.json at the repository root proves both write the same
// keys). Pure: no I/O, no clock.
//
//   identity  what a key function returns: a non-empty string; nothing (undefined, null, ""), which is limited
//             under the one shared anonymous identity; or SKIP, the only way to let a request through unlimited.
//   tag       the identity escaped so that any bytes make one non-empty hash tag: every bucket of one request lands
//             in one Cluster slot, and two identities never share a bucket.

const net = require("node:net");

const { TbArgumentError } = require("./errors.cjs");

/** What a key function returns to let a request through without limiting it. */
const SKIP = Symbol.for("redis-tb.skip");

/** The tag of a request without an identity: escape() never yields `%` before a non-hex character. */
const ANONYMOUS_TAG = "%anonymous";

const DEFAULT_IPV6_SUBNET = 56;

/** The `ipv6Subnet` option checked: an integer from 1 to 64 (a /64 is the smallest block a client is handed). */
function checkIpv6Subnet(value) {
  if (!Number.isInteger(value) || value < 1 || value > 64) {
    throw new TbArgumentError(`ipv6Subnet must be an integer from 1 to 64, got ${String(value)}`);
  }
  return value;
}

/** The 8 16-bit groups of an IPv6 address already checked by net.isIP (zone id removed). */
function ipv6Groups(address) {
  let text = address;
  const lastColon = text.lastIndexOf(":");
  const tail = text.slice(lastColon + 1);
  if (tail.includes(".")) {
    // An embedded IPv4 address (`::ffff:1.2.3.4`): its two groups in hex.
    const [a, b, c, d] = tail.split(".").map(Number);
    text = `${text.slice(0, lastColon + 1)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const parse = (part) => (part === "" ? [] : part.split(":").map((group) => parseInt(group, 16)));
  const halves = text.split("::");
  if (halves.length === 1) return parse(text);
  const head = parse(halves[0]);
  const rest = parse(halves[1]);
  return [...head, ...new Array(8 - head.length - rest.length).fill(0), ...rest];
}

/** RFC 5952 text of 8 groups: lowercase, no leading zeros, the longest run of 2+ zero groups (the first) as `::`. */
function ipv6Text(groups) {
  let bestStart = -1;
  let bestLength = 1;
  for (let start = 0; start < 8; ) {
    if (groups[start] !== 0) {
      start++;
      continue;
    }
    let end = start;
    while (end < 8 && groups[end] === 0) end++;
    if (end - start > bestLength) {
      bestStart = start;
      bestLength = end - start;
    }
    start = end;
  }
  const hex = groups.map((group) => group.toString(16));
  if (bestStart < 0) return hex.join(":");
  return `${hex.slice(0, bestStart).join(":")}::${hex.slice(bestStart + bestLength).join(":")}`;
}

/**
 * The identity of a peer address: IPv4 as is, an IPv4-mapped IPv6 address as its IPv4 form, any other IPv6
 * address as its /`ipv6Subnet` network (`2001:db8:1:200::/56`), so that a client rotating through its own block
 * stays in one bucket. undefined for anything that is not an IP address (no identity).
 */
function ipIdentity(address, { ipv6Subnet = DEFAULT_IPV6_SUBNET } = {}) {
  checkIpv6Subnet(ipv6Subnet);
  if (typeof address !== "string" || address === "") return undefined;
  const zone = address.indexOf("%");
  const bare = zone >= 0 ? address.slice(0, zone) : address;
  // The IPv4 peers of a dual-stack server, as Node reports them (`::ffff:1.2.3.4`): the dotted part, which
  // net.isIPv4 takes only as the general path below writes it (no leading zeros).
  if (bare.startsWith("::") && bare.slice(2, 7).toLowerCase() === "ffff:" && net.isIPv4(bare.slice(7))) {
    return bare.slice(7);
  }
  const family = net.isIP(bare);
  // A zone id belongs to IPv6 text only (RFC 4007): `1.2.3.4%eth0` is not an address.
  if (family === 4) return zone >= 0 ? undefined : bare;
  if (family !== 6) return undefined;
  const groups = ipv6Groups(bare.toLowerCase());
  if (groups.slice(0, 5).every((group) => group === 0) && groups[5] === 0xffff) {
    return `${groups[6] >> 8}.${groups[6] & 0xff}.${groups[7] >> 8}.${groups[7] & 0xff}`;
  }
  const network = groups.map((group, index) => {
    const kept = Math.max(0, Math.min(16, ipv6Subnet - index * 16));
    return kept === 0 ? 0 : group & ((0xffff << (16 - kept)) & 0xffff);
  });
  return `${ipv6Text(network)}/${ipv6Subnet}`;
}

/**
 * The WTF-8 bytes of a string: UTF-8, except that a lone surrogate (which Buffer.from would turn into U+FFFD, so
 * that "\ud800", "\udfff" and "\ufffd" shared a bucket) is written as the three bytes its code unit would take
 * (ED A0 80 for U+D800), as the Python package writes it. One string, one byte sequence, and back.
 */
function wtf8(identity) {
  if (identity.isWellFormed()) return Buffer.from(identity, "utf8");
  const parts = [];
  for (const char of identity) {
    // Iterating by code point: a pair comes as one character, a lone surrogate alone.
    const unit = char.charCodeAt(0);
    if (char.length === 1 && unit >= 0xd800 && unit <= 0xdfff) {
      parts.push(Buffer.from([0xe0 | (unit >> 12), 0x80 | ((unit >> 6) & 0x3f), 0x80 | (unit & 0x3f)]));
    } else {
      parts.push(Buffer.from(char, "utf8"));
    }
  }
  return Buffer.concat(parts);
}

/** An identity whose escape is itself: only the characters 0x21..0x7E other than `%` `{` `}`. */
const KEPT = /^[\x21-\x24\x26-\x7a\x7c\x7e]*$/;

/** The hash tag of an identity: of its WTF-8 bytes, 0x21..0x7E kept except `%` `{` `}`, every other byte as `%XX`. */
function escapeIdentity(identity) {
  if (KEPT.test(identity)) return identity; // every character one byte that is kept: the usual identity
  let out = "";
  for (const byte of wtf8(identity)) {
    const kept = byte >= 0x21 && byte <= 0x7e && byte !== 0x25 && byte !== 0x7b && byte !== 0x7d;
    out += kept ? String.fromCharCode(byte) : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

/** True when a key function's result means "no identity" (limited as the anonymous identity). */
function isAnonymous(identity) {
  return identity === undefined || identity === null || identity === "";
}

/** The Redis key of the bucket `limitName` of `identity` (a string, or nothing for the anonymous identity). */
function bucketKey(prefix, identity, limitName) {
  const tag = isAnonymous(identity) ? ANONYMOUS_TAG : escapeIdentity(identity);
  return `${prefix}{${tag}}:${limitName}`;
}

module.exports = {
  SKIP,
  ANONYMOUS_TAG,
  DEFAULT_IPV6_SUBNET,
  checkIpv6Subnet,
  ipIdentity,
  escapeIdentity,
  isAnonymous,
  bucketKey,
};
