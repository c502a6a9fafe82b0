"""`lua/tb.lua` in its two forms on every server: the EVAL form, and the function library generated from it (where
the server has FUNCTION), with the caller's clock (`@<µs>`). The random comparison with the module is
test_script_differential.py; this file checks what it cannot: that both forms answer alike on servers whose clock a
test cannot freeze (Valkey), that the caller's clock replaces TIME entirely, and how the caller's clock is read."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import CLOCK_2030_US, Clock, Server, clock_preload, function_name, library_source, server_version

from redis_tb import SCRIPT

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
    ("TB.LOWER", ["{k}:a"], ["10", "20", "-2.5"]),
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


def call(conn: redis.Redis, form: str, name: str, keys: list[str], args: list[str], at: str | None = None) -> Any:
    """One call in the EVAL or the function form, on the caller's clock `at` (`@<µs>`) if given."""
    clock = [at] if at else []
    try:
        if form == "eval":
            return conn.eval(SCRIPT, len(keys), *keys, *clock, name, *args)
        return conn.execute_command("FCALL", function_name(name), len(keys), *keys, *clock, *args)  # type: ignore[no-untyped-call]
    except redis.ResponseError as error:
        return ("error", str(error))


def real_now_us() -> int:
    """The caller's clock near the server's: a reading more than 10 s ahead of the server's clock (which the script
    reads from its keys' expiries) counts as 10 s ahead."""
    return time.time_ns() // 1000


def test_both_forms_answer_alike_on_the_callers_clock(no_time: redis.Redis) -> None:
    t0_us = real_now_us()
    forms = ["eval", "fcall"] if has_functions(no_time) else ["eval"]
    state: dict[str, list[Any]] = {form: [] for form in forms}
    for step, (name, keys, args) in enumerate(CALLS * 3):
        at = f"@{t0_us + step * 150_000}"
        for form in forms:
            form_keys = [form + key for key in keys]
            reply = call(no_time, form, name, form_keys, args, at)
            assert not isinstance(reply, tuple), (form, name, reply)
            state[form].append((reply, [no_time.hgetall(key) for key in form_keys]))
    assert state.get("fcall", state["eval"]) == state["eval"]


def test_an_earlier_reading_refills_nothing_and_keeps_ts(no_time: redis.Redis) -> None:
    t0_us = real_now_us()
    key = "{t}:back"
    assert call(no_time, "eval", "TB.ACQUIRE", [key], ["10", "20", "15"], f"@{t0_us}")[:2] == [1, 5]
    assert call(no_time, "eval", "TB.ACQUIRE", [key], ["10", "20", "2"], f"@{t0_us - 3_600_000_000}")[:2] == [1, 3]
    assert no_time.hgetall(key) == {b"tokens": b"3", b"ts": str(t0_us).encode()}
    # Full at t0_us + 1.7 s, then up to 1 s of slack: relative to the bucket's time, whatever the caller's clock.
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
        assert call(no_time, form, "TB.ACQUIRE", ["{t}:bad"], ["10", "20"], clock) == want


def test_callers_whose_clocks_differ_stay_within_the_bound(no_time: redis.Redis) -> None:
    """Two callers, one 2 s behind the other, take turns on one bucket: a reading earlier than the bucket's last
    one refills nothing (a rebase, as on a server clock's step back, would refill the 2 s on every turn: 400 of
    400 passed), so over t seconds at most burst + rate * (t + skew) calls pass."""
    rate, burst, skew_us, seconds = 10, 5, 2_000_000, 10
    t0_us = real_now_us()  # the later caller runs at most 9.95 s ahead of the server: within the 10 s it may
    granted = 0
    for step in range(seconds * 20):
        now = t0_us + step * 50_000
        for at in (now, now - skew_us):
            reply = call(no_time, "eval", "TB.ACQUIRE", ["{t}:skew"], [str(rate), str(burst)], f"@{at}")
            granted += reply[0]
    assert burst + rate * (seconds - 1) <= granted <= burst + rate * (seconds + skew_us / 1e6)


# ---------------------------------------------------------------------------------------------------------------
# A caller's clock far from the server's: the server's own clock (its keys' expiries) bounds what it can do. The
# server's clock is frozen (tests/clock/) and TIME renamed away, so each call happens at a chosen instant.
# ---------------------------------------------------------------------------------------------------------------

DAY_US = 86_400_000_000
TWO_POW_53 = 9_007_199_254_740_992


@pytest.fixture(scope="module")
def frozen() -> Iterator[tuple[Clock, redis.Redis, list[str], bool]]:
    """A server without TIME in scripts whose clock stands at the instant the test writes; the forms it offers and
    whether it has PEXPIRETIME (Redis 7.0+, Valkey), through which the script reads the server's clock."""
    preload = clock_preload()
    if preload is None:
        pytest.skip("no controlled clock (tests/clock/build.sh)")
    clock = Clock(CLOCK_2030_US)
    server = Server(
        module=False,
        args=("--jemalloc-bg-thread", "no", "--rename-command", "TIME", ""),
        env=clock.env(preload),
    )
    try:
        conn = server.client()
        forms = ["eval"]
        if has_functions(conn):
            conn.execute_command("FUNCTION", "LOAD", "REPLACE", library_source())  # type: ignore[no-untyped-call]
            forms.append("fcall")
        conn.set("probe", "1", px=1000)
        if conn.pttl("probe") != 1000:
            pytest.skip("this server's expiries do not follow the controlled clock")
        yield clock, conn, forms, server_version() >= (7, 0)
    finally:
        server.stop()
        clock.remove()


@pytest.mark.parametrize("bucket", ["existing", "new"])
def test_a_caller_a_day_ahead_holds_honest_callers_for_seconds_not_a_day(
    frozen: tuple[Clock, redis.Redis, list[str], bool], bucket: str
) -> None:
    """One caller whose clock is a day ahead empties a bucket of 120 at 1/s; then callers on the server's time
    call once a second for 120 s. Its reading counts as at most 10 s past the server's clock (an existing bucket),
    or its time is rebased at the next call, tokens kept (a new bucket, whose expiry could not yet tell the server's
    clock): so the honest callers wait at most 10 s more than an empty bucket makes them wait, and are told so.
    (Taken as it was, the reading held the bucket's time a day ahead: nothing admitted for the key's 1,320 s of
    life, and Retry-After 86,401 s.)"""
    clock, conn, forms, has_pexpiretime = frozen
    if not has_pexpiretime:
        pytest.skip("Redis 6.2 has no PEXPIRETIME: the script cannot read the server's clock there")
    rate, burst = "1", "120"
    start_us = CLOCK_2030_US + 10**12 + (bucket == "new") * 10**11
    for form in forms:
        key = f"{form}{{ahead}}:{bucket}"
        clock.set_us(start_us)
        if bucket == "existing":
            assert call(conn, form, "TB.ACQUIRE", [key], [rate, burst, "1"], f"@{start_us}")[:2] == [1, 119]
        taken = call(conn, form, "TB.ACQUIRE", [key], [rate, burst, burst], f"@{start_us + DAY_US}")
        assert taken[:2] == [1, 0], (form, taken)
        admitted, first_retry_ms = 0, None
        for second in range(1, 121):
            now_us = start_us + second * 1_000_000
            clock.set_us(now_us)
            reply = call(conn, form, "TB.ACQUIRE", [key], [rate, burst, "1"], f"@{now_us}")
            assert not isinstance(reply, tuple), (form, reply)
            admitted += reply[0]
            if not reply[0] and first_retry_ms is None:
                first_retry_ms = reply[2]
            assert reply[2] <= 11_000, (form, second, reply)  # never a day: at most 10 s + 1 s for the token
            assert conn.pttl(key) > 0, (form, second)
        # Within burst + rate * (t + skew), and at least what 1/s gives over the 110 s after the 10 s lead, less
        # the first token's 2 s.
        assert 108 <= admitted <= 120, (form, admitted)
        assert first_retry_ms is not None and first_retry_ms <= 11_000, (form, first_retry_ms)


@pytest.mark.parametrize("bucket", ["existing", "new"])
def test_a_caller_at_2_to_the_53_neither_deletes_nor_refills_the_bucket(
    frozen: tuple[Clock, redis.Redis, list[str], bool], bucket: str
) -> None:
    """A reading of 2^53 µs (the year 2255), the largest the script takes, takes 50 of a bucket of 100 at 1/s; then
    a caller on the server's time. The key keeps a positive expiry throughout and the honest caller is not handed
    a full bucket. (Taken as it was, the honest call computed the bucket's expiry from its own reading, 229 years
    before the bucket's time: a negative PEXPIRE, which deleted the key, and the next call found it full.)"""
    clock, conn, forms, _ = frozen
    rate, burst = "1", "100"
    start_us = CLOCK_2030_US + 2 * 10**12 + (bucket == "new") * 10**11
    for form in forms:
        key = f"{form}{{far}}:{bucket}"
        clock.set_us(start_us)
        if bucket == "existing":
            assert call(conn, form, "TB.ACQUIRE", [key], [rate, burst, "1"], f"@{start_us}")[:2] == [1, 99]
        far = call(conn, form, "TB.ACQUIRE", [key], [rate, burst, "50"], f"@{TWO_POW_53}")
        assert far[:2] == [1, 50], (form, far)
        assert 0 < conn.pttl(key) <= (100 + 1000) * 1000, (form, conn.pttl(key))
        for second in (1, 2):
            now_us = start_us + second * 1_000_000
            clock.set_us(now_us)
            reply = call(conn, form, "TB.ACQUIRE", [key], [rate, burst, "1"], f"@{now_us}")
            assert reply[0] == 1 and reply[1] <= 50, (form, second, reply)
            assert conn.exists(key) == 1, (form, second)
            assert 0 < conn.pttl(key) <= (100 + 1000) * 1000, (form, second, conn.pttl(key))


# ---------------------------------------------------------------------------------------------------------------
# What the module refuses, the script refuses with the same text; under maxmemory, the forms against the module.
# ---------------------------------------------------------------------------------------------------------------

BIG = "1" + "0" * 309  # all digits, beyond the largest double
NUMBERS = [BIG, "-" + BIG, "+" + BIG, BIG + ".0", "1e309", "0." + "0" * 400 + "1", "9" * 400, "1" * 16, "1" * 19]
# Each command's arguments after its keys (one key), every one of them a number.
VALID = {
    "TB.ACQUIRE": ["10", "20", "1"],
    "TB.ACQUIREALL": ["1", "10", "20"],
    "TB.ACQUIREEACH": ["10", "20", "1"],
    "TB.ACQUIREATMOST": ["10", "20", "5"],
    "TB.RESERVE": ["10", "20", "1", "100"],
    "TB.REFUND": ["10", "20", "1"],
    "TB.CHARGE": ["10", "20", "1"],
    "TB.BLOCK": ["10", "20", "100"],
    "TB.LOWER": ["10", "20", "1"],
    "CL.THROTTLE": ["4", "1", "1", "1"],
}


def module_call(conn: redis.Redis, name: str, key: str, args: list[str]) -> Any:
    """The module's command for the EVAL form's layout with one key."""
    layout = [args[0], key, *args[1:]] if name == "TB.ACQUIREALL" else [key, *args]
    try:
        return conn.execute_command(name, *layout)  # type: ignore[no-untyped-call]
    except redis.ResponseError as error:
        return ("error", str(error))


def saturated(reply: Any) -> Any:
    """A reply the module saturates at 2^63-1 as the script sends it (documented: Lua's doubles cannot hold it)."""
    if isinstance(reply, list):
        return [9223372036854774784 if value == 2**63 - 1 else value for value in reply]
    return reply


def script_forms(conn: redis.Redis) -> list[str]:
    if not has_functions(conn):
        return ["eval"]
    conn.execute_command("FUNCTION", "LOAD", "REPLACE", library_source())  # type: ignore[no-untyped-call]
    return ["eval", "fcall"]


def test_numbers_are_refused_as_the_module_refuses_them(module_server: Server, plain_server: Server) -> None:
    """Every argument of every command, with texts at the edges of a double: the same reply or error text."""
    module, plain = module_server.client(), plain_server.client()
    forms = script_forms(plain)
    mismatches = []
    for name, valid in VALID.items():
        for position in range(len(valid)):
            for number in NUMBERS:
                args = [*valid[:position], number, *valid[position + 1 :]]
                key = f"{{num}}:{name}:{position}:{number[:20]}:{len(number)}"
                want = saturated(module_call(module, name, key, args))
                for form in forms:
                    got = call(plain, form, name, [form + key], args)
                    if got != want:
                        mismatches.append((form, name, position, number[:12], len(number), got, want))
    assert mismatches == []


@pytest.mark.parametrize("tokens, ts", [(BIG, "1"), ("-" + BIG, "1"), ("1e309", "1"), ("1", BIG), ("1", "-1")])
def test_stored_fields_are_read_as_the_module_reads_them(
    module_server: Server, plain_server: Server, tokens: str, ts: str
) -> None:
    module, plain = module_server.client(), plain_server.client()
    key = f"{{stored}}:{tokens[:4]}:{len(tokens)}:{ts[:4]}:{len(ts)}"
    module.hset(key, mapping={"tokens": tokens, "ts": ts})
    want = module_call(module, "TB.ACQUIRE", key, ["10", "20", "1"])
    assert want == ("error", "key is not a valid token bucket (expected a hash with only the fields tokens and ts)")
    for form in script_forms(plain):
        plain.hset(form + key, mapping={"tokens": tokens, "ts": ts})
        assert call(plain, form, "TB.ACQUIRE", [form + key], ["10", "20", "1"]) == want, form


def test_out_of_memory_as_the_module_where_the_form_allows(plain_server: Server) -> None:
    """Above maxmemory the module answers a call that writes nothing (a peek, a refusal), refuses one that would
    write with Redis's OOM text and changes nothing, and performs TB.REFUND. The EVAL form does the same (Redis
    refuses a script's first write with that text; a CL.THROTTLE peek is answered without its write), but refuses
    a partial refund. The function form cannot tell a write before it runs: every function but TB.REFUND's is
    refused there, peeks and refusals too."""
    module_server = Server(module=True)
    oom = ("error", "command not allowed when used memory > 'maxmemory'.")
    try:
        module, plain = module_server.client(), plain_server.client()
        forms = script_forms(plain)
        servers = [("module", module), *[(form, plain) for form in forms]]
        throttle = ["0", "1", "3600"]
        for form, conn in servers:
            assert run_form(conn, form, "TB.ACQUIRE", ["10", "20", "5"]) == [1, 15, 0, 500]
            assert run_form(conn, form, "CL.THROTTLE", throttle, "{oom}t") == [0, 1, 0, -1, 3600]
        peek, take = ["10", "20", "0"], ["10", "20", "1"]
        for form, conn in servers:
            conn.config_set("maxmemory", "1")
            try:
                assert run_form(conn, form, "TB.ACQUIRE", take) == oom, form
                assert run_form(conn, form, "CL.THROTTLE", throttle, "{oom}new") == oom, form
                refunded = run_form(conn, form, "TB.REFUND", ["10", "20", "1"])
                answered = [
                    run_form(conn, form, "TB.ACQUIRE", peek),
                    run_form(conn, form, "CL.THROTTLE", throttle, "{oom}t"),
                    run_form(conn, form, "CL.THROTTLE", [*throttle, "0"], "{oom}new"),
                ]
                if form == "fcall":
                    assert answered == [oom, oom, oom], form
                else:
                    assert answered[0][0] == 1, form
                    assert answered[1:] == [[1, 1, 0, 3600, 3600], [0, 1, 1, -1, 0]], form
                assert conn.exists(form + "{oom}new") == 0, form
                if form == "eval":
                    assert refunded == oom
                else:
                    assert refunded[0] == 1, form
                assert run_form(conn, form, "TB.REFUND", ["10", "20", "20"])[0] == 1, form  # full: the key goes
                assert conn.exists(form + "{oom}") == 0, form
            finally:
                conn.config_set("maxmemory", "0")
    finally:
        module_server.stop()


def run_form(conn: redis.Redis, form: str, name: str, args: list[str], key: str = "{oom}") -> Any:
    key = form + key
    if form == "module":
        return module_call(conn, name, key, args)
    return call(conn, form, name, [key], args)


def test_a_caller_a_day_behind_is_told_the_buckets_wait_not_its_lag(
    frozen: tuple[Clock, redis.Redis, list[str], bool],
) -> None:
    """A bucket of 5 at 1/s emptied on the server's time, then a caller whose clock is a day behind: refused, with
    the second the bucket makes everyone wait, nothing written. (Counted from its own reading, the wait would be a
    day: Retry-After 86,401 s.)"""
    clock, conn, forms, _ = frozen
    start_us = CLOCK_2030_US + 3 * 10**12
    for form in forms:
        key = f"{form}{{behind}}"
        clock.set_us(start_us)
        assert call(conn, form, "TB.ACQUIRE", [key], ["1", "5", "5"], f"@{start_us}") == [1, 0, 0, 5000]
        stored = conn.hgetall(key)
        late = call(conn, form, "TB.ACQUIRE", [key], ["1", "5", "1"], f"@{start_us - DAY_US}")
        assert late == [0, 0, 1000, 5000], (form, late)
        assert conn.hgetall(key) == stored, form
