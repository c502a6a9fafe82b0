#!/usr/bin/env python3
"""One gRPC ShouldRateLimit call to a rate limit service (tb-rls), with nothing but the standard library and curl.

    python3 scripts/rls_call.py --port 8081 --domain edge user=alice generic_key=global
    -> OK (or OVER_LIMIT), the response's overall code; exit status 0 when the call was answered

Each KEY=VALUE argument is one descriptor of one entry. The request is encoded by hand (the few protobuf fields of
envoy.service.ratelimit.v3.RateLimitRequest), framed as gRPC and sent by `curl --http2-prior-knowledge`; used by
the release tests to check the tb-rls binary of the tarball and of the .deb without a gRPC toolchain.
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys

CODES = {0: "UNKNOWN", 1: "OK", 2: "OVER_LIMIT"}


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def request(domain: str, descriptors: list[tuple[str, str]], hits: int) -> bytes:
    body = field(1, domain.encode())
    for key, value in descriptors:
        entry = field(1, key.encode()) + field(2, value.encode())
        body += field(2, field(1, entry))
    if hits:
        body += varint(3 << 3) + varint(hits)
    return body


def overall_code(message: bytes) -> int:
    """Field 1 (varint) of a RateLimitResponse; 0 when absent."""
    at = 0
    while at < len(message):
        key, at = read_varint(message, at)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, at = read_varint(message, at)
            if number == 1:
                return value
        elif kind == 2:
            length, at = read_varint(message, at)
            at += length
        elif kind == 5:
            at += 4
        elif kind == 1:
            at += 8
        else:
            raise ValueError(f"unexpected wire type {kind}")
    return 0


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--domain", required=True)
    parser.add_argument("--hits", type=int, default=0, help="the request's hits_addend (0: unset, counts as 1)")
    parser.add_argument("descriptors", nargs="+", metavar="KEY=VALUE")
    args = parser.parse_args()
    pairs = [tuple(item.split("=", 1)) for item in args.descriptors]
    message = request(args.domain, [(key, value) for key, value in pairs], args.hits)
    framed = b"\x00" + struct.pack(">I", len(message)) + message
    url = f"http://{args.host}:{args.port}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    reply = subprocess.run(
        [
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--http2-prior-knowledge",
            "-X",
            "POST",
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "--data-binary",
            "@-",
            url,
        ],
        input=framed,
        capture_output=True,
        check=False,
    )
    if reply.returncode != 0:
        print(f"rls_call: curl failed: {reply.stderr.decode(errors='replace').strip()}", file=sys.stderr)
        return 1
    body = reply.stdout
    if len(body) < 5:
        print(f"rls_call: no gRPC message in the reply ({len(body)} bytes)", file=sys.stderr)
        return 1
    (length,) = struct.unpack(">I", body[1:5])
    print(CODES.get(overall_code(body[5 : 5 + length]), "UNKNOWN"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
