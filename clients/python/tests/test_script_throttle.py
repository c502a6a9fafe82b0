"""`CL.THROTTLE` in `lua/tb.lua` (both forms, the server's clock and the caller's): redis-cell's replies at frozen
instants, its key (decimal ns since the epoch, with an expiry), the module's error texts, and exact arithmetic on
nanoseconds past 2^53, which a Lua number cannot hold."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import CLOCK_2030_US, Clock, Server, clock_preload, function_name, library_source, server_version

from redis_tb import SCRIPT

START_US = CLOCK_2030_US + 123_456  # 2030-01-01 00:00:00.123456 UTC
FORMS = ["eval", "eval@", "fcall", "fcall@"]


@pytest.fixture(scope="module")
def frozen() -> Iterator[tuple[Clock, redis.Redis, list[str]]]:
    preload = clock_preload()
    if preload is None:
        pytest.skip("no controlled clock (tests/clock/build.sh)")
    clock = Clock(START_US)
    server = Server(module=False, args=("--jemalloc-bg-thread", "no"), env=clock.env(preload))
    try:
        conn = server.client()
        forms = ["eval", "eval@"]
        if server_version() >= (7, 0):
            conn.execute_command("FUNCTION", "LOAD", "REPLACE", library_source())  # type: ignore[no-untyped-call]
            forms += ["fcall", "fcall@"]
        conn.set("probe", "1", px=1000)
        if conn.pttl("probe") != 1000 or "valkey_version" in conn.info("server"):
            pytest.skip("this server's clock does not stand at the controlled instant")
        yield clock, conn, forms
    finally:
        server.stop()
        clock.remove()


def throttle(conn: redis.Redis, form: str, key: str, args: list[str], now_us: int) -> Any:
    clock = [f"@{now_us}"] if form.endswith("@") else []
    try:
        if form.startswith("eval"):
            return conn.eval(SCRIPT, 1, form + key, *clock, "CL.THROTTLE", *args)
        return conn.execute_command("FCALL", function_name("CL.THROTTLE"), 1, form + key, *clock, *args)  # type: ignore[no-untyped-call]
    except redis.ResponseError as error:
        return ("error", str(error))


def expiry_ms(conn: redis.Redis, key: str, now_us: int) -> int:
    """The key's expiry, Unix ms (PEXPIRETIME, or the frozen now plus PTTL where the server lacks it)."""
    if server_version() >= (7, 0):
        return int(conn.pexpiretime(key))
    return now_us // 1000 + int(conn.pttl(key))


@pytest.mark.parametrize("form", FORMS)
def test_answers_redis_cells_rate_limit_table(frozen: tuple[Clock, redis.Redis, list[str]], form: str) -> None:
    """redis-cell's own `it_rate_limits` cases (max_burst 4, 1 per second), replies in whole seconds, and the key
    its last allowed call stores: the TAT in ns, expiring at it rounded up to the millisecond."""
    clock, conn, forms = frozen
    if form not in forms:
        pytest.skip("no FUNCTION on this server")
    cases = [
        (0, "6", [1, 5, 5, -1, 0]),
        (0, "1", [0, 5, 4, -1, 1]),
        (0, "1", [0, 5, 3, -1, 2]),
        (0, "1", [0, 5, 2, -1, 3]),
        (0, "1", [0, 5, 1, -1, 4]),
        (0, "1", [0, 5, 0, -1, 5]),
        (0, "1", [1, 5, 0, 1, 5]),
        (3000, "1", [0, 5, 2, -1, 3]),
        (3100, "1", [0, 5, 1, -1, 4]),
        (4000, "1", [0, 5, 1, -1, 4]),
        (8000, "1", [0, 5, 4, -1, 1]),
        (9500, "1", [0, 5, 4, -1, 1]),
        (9500, "0", [0, 5, 4, -1, 1]),
        (9500, "2", [0, 5, 2, -1, 3]),
        (9500, "5", [1, 5, 2, 3, 3]),
    ]
    start_us = START_US + FORMS.index(form) * 10**9
    for case, (offset_ms, quantity, reply) in enumerate(cases):
        now_us = start_us + offset_ms * 1000
        clock.set_us(now_us)
        assert throttle(conn, form, "{cell}", ["4", "1", "1", quantity], now_us) == reply, case
    tat_ns = (start_us + 12_500_000) * 1000
    assert conn.get(form + "{cell}") == str(tat_ns).encode()
    # Expiring at the TAT rounded up to the millisecond: the key lasts until its TAT.
    assert expiry_ms(conn, form + "{cell}", start_us + 9_500_000) == -(-tat_ns // 10**6)


def test_nanoseconds_past_2_to_the_53_are_exact(frozen: tuple[Clock, redis.Redis, list[str]]) -> None:
    """3 per 7 s: T = 2,333,333,333 ns. Each allowed call moves the TAT by exactly T (a double would round it to a
    multiple of 256 ns); a TAT stored with odd digits is carried on to the last one."""
    clock, conn, forms = frozen
    start_us = START_US + 10 * 10**9
    clock.set_us(start_us)
    for form in forms:
        key = form + "{exact}"
        for n in range(1, 4):
            assert throttle(conn, form, "{exact}", ["2", "3", "7"], start_us)[0] == 0, (form, n)
            assert conn.get(key) == str(start_us * 1000 + n * 2_333_333_333).encode(), (form, n)
        odd = start_us * 1000 + 987_654_321
        conn.set(key, str(odd), px=60_000)
        assert throttle(conn, form, "{exact}", ["2", "3", "7"], start_us)[:3] == [0, 3, 1], form
        assert conn.get(key) == str(odd + 2_333_333_333).encode(), form


def test_arguments_and_keys_are_refused_as_the_module_refuses_them(
    frozen: tuple[Clock, redis.Redis, list[str]],
) -> None:
    """Each argument checked in the module's order, with its error text; a refusal writes nothing."""
    clock, conn, forms = frozen
    clock.set_us(START_US)
    max_burst = ("error", "max_burst must be an integer from 0 to 9223372036854775806")
    count = ("error", "count_per_period must be a positive integer")
    period = ("error", "period must be a positive integer (seconds)")
    quantity = ("error", "quantity must be a non-negative integer")
    cases: list[tuple[list[str], Any]] = [
        (["1", "1"], ("error", "wrong number of arguments for 'cl.throttle' command")),
        (["1", "1", "1", "1", "1"], ("error", "wrong number of arguments for 'cl.throttle' command")),
        (["x", "1", "1"], max_burst),
        (["-1", "1", "1"], max_burst),
        (["9223372036854775807", "1", "1"], max_burst),
        (["9223372036854775808", "1", "1"], max_burst),
        (["1.5", "1", "1"], max_burst),
        (["1", "0", "1"], count),
        (["1", "-5", "1"], count),
        (["1", "1", "0"], period),
        (["1", "1", " 1"], period),
        (["1", "1", "1", "-1"], quantity),
        (["-1", "1", "1", "-1"], quantity),  # every argument parsed and the quantity's sign first, then the limit
        (
            ["1", "2000000000", "1"],
            ("error", "count_per_period / period must be at most 1000000000 a second (requests at least 1 ns apart)"),
        ),
        (
            ["9223372036854775806", "1", "1"],
            ("error", "(max_burst + 1) * period / count_per_period must be under 2^63 ns (about 292 years)"),
        ),
        (
            ["1", "1", "9223372036854775807"],
            ("error", "(max_burst + 1) * period / count_per_period must be under 2^63 ns (about 292 years)"),
        ),
    ]
    for form in forms:
        for args, want in cases:
            assert throttle(conn, form, "{bad}", args, START_US) == want, (form, args)
        assert conn.exists(form + "{bad}") == 0
        conn.hset(form + "{hash}", "a", "1")
        wrongtype = ("error", "WRONGTYPE Operation against a key holding the wrong kind of value")
        assert throttle(conn, form, "{hash}", ["1", "1", "1"], START_US) == wrongtype, form
        for stored in ["abc", "1.5", "99999999999999999999", ""]:
            conn.set(form + "{corrupt}", stored)
            assert throttle(conn, form, "{corrupt}", ["1", "1", "1"], START_US) == (
                "error",
                "key does not hold a CL.THROTTLE state (expected a string of decimal nanoseconds since the epoch)",
            ), (form, stored)
            assert conn.get(form + "{corrupt}") == stored.encode(), form


def test_extremes_saturate_or_are_refused(frozen: tuple[Clock, redis.Redis, list[str]]) -> None:
    """A TAT that would pass 2^63 ns is refused and changes nothing; a quantity up to 2^63 - 1 is refused as more
    than the limit can ever hold (-1); an interval under 1 µs makes `remaining` the largest integer, as in the
    module (sent as the largest double below 2^63)."""
    clock, conn, forms = frozen
    clock.set_us(START_US)
    for form in forms:
        key = form + "{edge}"
        conn.set(key, "9223372036854000000", px=60_000)
        assert throttle(conn, form, "{edge}", ["9000000000", "1", "1"], START_US) == (
            "error",
            "the key's theoretical arrival time would pass 2^63 ns since the epoch (the year 2262)",
        ), form
        assert conn.get(key) == b"9223372036854000000", form
        conn.delete(key)
        reply = throttle(conn, form, "{edge}", ["5", "1", "1", "9223372036854775807"], START_US)
        assert reply == [1, 6, 6, -1, 0], form
        # T = 1 ns: tau - ttl = 5,000 ns is 5 µs over an interval of 0 µs.
        reply = throttle(conn, form, "{edge}", ["5000", "1000000000", "1"], START_US)
        assert reply == [0, 5001, 9223372036854774784, -1, 0], form


def test_a_tat_a_day_ahead_on_the_callers_clock_costs_a_wait_of_the_keys_own(
    frozen: tuple[Clock, redis.Redis, list[str]],
) -> None:
    """A TAT a day past the caller's reading (a clock a day ahead wrote it): refused, told the wait of a key as full
    as it can be (tau) plus the 10 s a clock may run ahead of the server, not a day."""
    clock, conn, forms = frozen
    clock.set_us(START_US)
    for form in [form for form in forms if form.endswith("@")]:
        key = form + "{ahead}"
        conn.set(key, str((START_US + 86_400_000_000) * 1000), px=5_000)
        reply = throttle(conn, form, "{ahead}", ["4", "1", "1"], START_US)
        assert reply[0] == 1 and 0 < reply[3] <= 11 and reply[4] <= 16, (form, reply)
