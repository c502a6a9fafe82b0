"""`lua/tb.lua` in its two forms on every server: the EVAL form, and the function library generated from it (where
the server has FUNCTION), with the caller's clock (`@<µs>`). The random comparison with the module is
test_script_differential.py; this file checks what it cannot: that both forms answer alike on servers whose clock a
test cannot freeze (Valkey), that the caller's clock replaces TIME entirely, and how the caller's clock is read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import Server, function_name, library_source

from redis_tb import SCRIPT

T0 = 1_893_456_000_000_000  # 2030-01-01, in µs
# One call of each command: keys and the arguments after them, in the EVAL form's layout.
CALLS: list[tuple[str, list[str], list[str]]] = [
    ("TB.ACQUIRE", ["{k}:a"], ["10", "20", "3"]),
    ("TB.ACQUIREALL", ["{k}:a", "{k}:b"], ["2", "10", "20", "1", "5"]),
    ("TB.ACQUIREEACH", ["{k}:a", "{k}:c"], ["10", "20", "1", "0.5", "2", "2"]),
    ("TB.ACQUIREATMOST", ["{k}:d"], ["10", "5", "100"]),
    ("TB.RESERVE", ["{k}:c"], ["0.5", "2", "3", "10000"]),
    ("TB.REFUND", ["{k}:a"], ["10", "20", "1.5"]),
    ("TB.CHARGE", ["{k}:e"], ["10", "20", "25"]),
    ("TB.BLOCK", ["{k}:f"], ["10", "20", "250"]),
]


def has_functions(conn: redis.Redis) -> bool:
    try:
        conn.execute_command("FUNCTION", "LIST")  # type: ignore[no-untyped-call]
    except redis.ResponseError:
        return False
    return True


@pytest.fixture(scope="module")
def no_time() -> Iterator[redis.Redis]:
    """A server whose scripts cannot read its clock: TIME renamed away, as some managed services refuse it."""
    server = Server(module=False, args=("--rename-command", "TIME", ""))
    try:
        conn = server.client()
        if has_functions(conn):
            conn.execute_command("FUNCTION", "LOAD", "REPLACE", library_source())  # type: ignore[no-untyped-call]
        yield conn
    finally:
        server.stop()


def call(conn: redis.Redis, form: str, name: str, keys: list[str], args: list[str]) -> Any:
    try:
        if form == "eval":
            return conn.eval(SCRIPT, len(keys), *keys, *args[:1], name, *args[1:])
        return conn.execute_command("FCALL", function_name(name), len(keys), *keys, *args)  # type: ignore[no-untyped-call]
    except redis.ResponseError as error:
        return ("error", str(error))


def test_both_forms_answer_alike_on_the_callers_clock(no_time: redis.Redis) -> None:
    forms = ["eval", "fcall"] if has_functions(no_time) else ["eval"]
    state: dict[str, list[Any]] = {form: [] for form in forms}
    for step, (name, keys, args) in enumerate(CALLS * 3):
        at = f"@{T0 + step * 150_000}"
        for form in forms:
            form_keys = [form + key for key in keys]
            reply = call(no_time, form, name, form_keys, [at, *args])
            assert not isinstance(reply, tuple), (form, name, reply)
            state[form].append((reply, [no_time.hgetall(key) for key in form_keys]))
    assert state.get("fcall", state["eval"]) == state["eval"]


def test_an_earlier_reading_refills_nothing_and_keeps_ts(no_time: redis.Redis) -> None:
    key = "{t}:back"
    assert call(no_time, "eval", "TB.ACQUIRE", [key], [f"@{T0}", "10", "20", "15"])[:2] == [1, 5]
    assert call(no_time, "eval", "TB.ACQUIRE", [key], [f"@{T0 - 3_600_000_000}", "10", "20", "2"])[:2] == [1, 3]
    assert no_time.hgetall(key) == {b"tokens": b"3", b"ts": str(T0).encode()}
    # Full at T0 + 1.7 s, then up to 1 s of slack: relative to the bucket's time, whatever the caller's clock.
    assert 1_600 < no_time.pttl(key) <= 2_700


def test_without_the_callers_clock_the_script_reads_time(no_time: redis.Redis) -> None:
    for form in ["eval", "fcall"] if has_functions(no_time) else ["eval"]:
        reply = call(no_time, form, "TB.ACQUIRE", ["{t}:x"], ["10", "20"])
        assert reply[0] == "error" and "unknown" in reply[1].lower(), reply  # TIME, renamed away


@pytest.mark.parametrize(
    "clock", ["@", "@x", "@-1", "@1.5", "@ 1", "@1e6", "@9007199254740993", "@99999999999999999999"]
)
def test_a_bad_callers_clock_is_refused(no_time: redis.Redis, clock: str) -> None:
    want = (
        "error",
        "the caller clock must be @ then integer microseconds since the epoch, up to 9007199254740992",
    )
    for form in ["eval", "fcall"] if has_functions(no_time) else ["eval"]:
        assert call(no_time, form, "TB.ACQUIRE", ["{t}:bad"], [clock, "10", "20"]) == want


def test_callers_whose_clocks_differ_stay_within_the_bound(no_time: redis.Redis) -> None:
    """Two callers, one 2 s behind the other, take turns on one bucket: a reading earlier than the bucket's last
    one refills nothing (a rebase, as on a server clock's step back, would refill the 2 s on every turn: 400 of
    400 passed), so over t seconds at most burst + rate * (t + skew) calls pass."""
    rate, burst, skew_us, seconds = 10, 5, 2_000_000, 10
    granted = 0
    for step in range(seconds * 20):
        now = T0 + step * 50_000
        for at in (now, now - skew_us):
            reply = call(no_time, "eval", "TB.ACQUIRE", ["{t}:skew"], [f"@{at}", str(rate), str(burst)])
            granted += reply[0]
    assert burst + rate * (seconds - 1) <= granted <= burst + rate * (seconds + skew_us / 1e6)
