"""The script writes `tokens` as the module does (src/codec.rs): an integer literal when integral below 2^53,
else ryu's shortest round-trip text in ryu's layout. Python's `repr` picks the same digits (the shortest that
read back, closest to the value), so ryu's layout of `repr`'s digits is the reference here; the differential
test checks the real module's bytes."""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator

import pytest
import redis
from conftest import Server

from redis_tb import SCRIPT

ENCODER = SCRIPT.replace(
    "local ok, result = pcall(eval_form, KEYS, ARGV)\n  if ok then return result end\n  return failure(result)",
    "do return encode_tokens(tonumber(ARGV[1])) end",
)


def ryu_layout(value: float) -> str:
    """Rust's `ryu::Buffer::format` of a finite double, from `repr`'s shortest digits."""
    if value == 0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    sign = "-" if value < 0 else ""
    mantissa, _, exp_text = f"{abs(value)!r}".partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    exponent = int(exp_text or 0) + len(whole) - 1
    if whole == "0":  # 0.00123 -> digits 123, exponent -3
        exponent = -(len(fraction) - len(fraction.lstrip("0"))) - 1
    digits = digits.rstrip("0") or "0"
    length, kk = len(digits), exponent + 1
    k = kk - length
    if k >= 0 and kk <= 16:
        return sign + digits + "0" * k + ".0"
    if 0 < kk <= 16:
        return sign + digits[:kk] + "." + digits[kk:]
    if -5 < kk <= 0:
        return sign + "0." + "0" * -kk + digits
    if length == 1:
        return f"{sign}{digits}e{kk - 1}"
    return f"{sign}{digits[0]}.{digits[1:]}e{kk - 1}"


def codec(value: float) -> str:
    """src/codec.rs: integers below 2^53 as integer literals, everything else through ryu."""
    if value == int(value) and abs(value) < 2.0**53:
        return str(int(value))
    return ryu_layout(value)


def samples() -> Iterator[float]:
    rng = random.Random(7)
    fixed = [
        0.1,
        0.5,
        4.058710000000001,
        -1.85562,
        1e16,
        2.0**53,
        -(2.0**53),
        1e22,
        1e23,
        5e-324,
        2.2250738585072014e-308,
        1.7976931348623157e308,
        123456789012345680.0,
        0.001234,
        0.0001,
        1e-5,
        9007199254740993.0,
        1e15 + 0.5,
        2.0**-1074,
        2.0**-1022,
        2.0**1023,
        2.0**60,
        2.0**-20,
        1 / 3,
        2 / 3,
        100.25,
        12.34,
        1e21,
        1e-7,
    ]
    yield from fixed
    for _ in range(1500):
        bits = rng.getrandbits(64)
        value = struct.unpack("<d", struct.pack("<Q", bits))[0]
        if value == value and abs(value) != float("inf"):
            yield value
    for _ in range(1500):
        yield rng.uniform(-1000, 1000) * 10 ** rng.randint(-8, 18)
    for exponent in range(-1074, 1024, 7):  # powers of two: where the rounding interval is lopsided
        yield 2.0**exponent


@pytest.fixture(scope="module")
def conn() -> Iterator[redis.Redis]:
    server = Server(module=False)
    try:
        yield server.client()
    finally:
        server.stop()


def test_tokens_text_is_the_modules(conn: redis.Redis) -> None:
    sha = conn.script_load(ENCODER)
    mismatches = []
    for value in samples():
        text = conn.evalsha(sha, 0, repr(value)).decode()
        if text != codec(value):
            mismatches.append((value, text, codec(value)))
    assert mismatches == []


def test_reference_layout_matches_known_module_output() -> None:
    # Texts the module wrote in real sessions (README) and ryu's documented layouts.
    assert codec(4.058710000000001) == "4.058710000000001"
    assert codec(-1.85562) == "-1.85562"
    assert codec(19.0) == "19"
    assert ryu_layout(1e16) == "1e16"
    assert ryu_layout(1.234e33) == "1.234e33"
    assert ryu_layout(0.001234) == "0.001234"
    assert ryu_layout(1e-7) == "1e-7"
    assert ryu_layout(12340000000.0) == "12340000000.0"
    assert ryu_layout(2.0**53) == "9007199254740992.0"
