"""The Lua fallback (`lua/tb.lua`) against the module: the same random sequences of calls at the same frozen
instants must give identical replies (errors included), identical stored hashes and identical expiries.

Both servers run under one controlled clock (tests/clock/), so every call of a step sees the same microsecond
on both. Commands the module under test does not have yet are left out of the comparison. The script runs in each
of its forms, each on its own keys of one server: EVALSHA, and where the server has FUNCTION the library generated
from the same file (FCALL), each on the server's clock (TIME) and on the caller's (`@<µs>`, the frozen instant;
there the clock never steps back: the module rebases a bucket on a step back, the caller's clock stands still).
Valkey's clock in a script cannot see the frozen instant: the comparison is skipped there.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import CLOCK_2030_US, Clock, Server, clock_preload, function_name, library_source

from redis_tb import SCRIPT

SEEDS = range(12)
STEPS = 250
KEYS = ["{d}:a", "{d}:b", "{d}:c", "{d}:d"]
# CL.THROTTLE's keys (strings); now and then it is sent a bucket's key, and refused with WRONGTYPE.
THROTTLE_KEYS = ["{d}:t", "{d}:u"]
# Parameters drawn per call: a few per key keep state carrying over; odd texts exercise the parser.
RATES = ["10", "0.5", "1000", "3.3", "7e-1", "25", "0.001", "123456.789"]
BURSTS = ["20", "1", "5.5", "100", "2", "0.5", "1e3", "33.3"]
COSTS = ["1", "0", "2.5", "0.1", "5", "20", "1e-3", "7", "100"]
# TB.LOWER's tokens: above and below the bursts, into debt, -0, and beyond a day of refill at the slowest rate.
FLOORS = ["1", "0", "-0", "2.5", "0.1", "5", "1e3", "-1", "-7.25", "-86.4", "-1e6"]
BAD_NUMBERS = [
    "abc",
    "0",
    "-1",
    "inf",
    "nan",
    "1e400",
    "0x10",
    " 1",
    "1 ",
    "",
    "-0",
    "+2.5e-3",
    ".5",
    "5.",
    "1E2",
]
COMMANDS = [
    "TB.ACQUIRE",
    "TB.ACQUIREALL",
    "TB.ACQUIREEACH",
    "TB.ACQUIREATMOST",
    "TB.RESERVE",
    "TB.REFUND",
    "TB.CHARGE",
    "TB.BLOCK",
    "TB.LOWER",
    "CL.THROTTLE",
]


@pytest.fixture(scope="module")
def clocked() -> Iterator[tuple[Clock, Server, Server, list[str], list[str]]]:
    preload = clock_preload()
    if preload is None:
        pytest.skip("no controlled clock (tests/clock/build.sh)")
    clock = Clock(CLOCK_2030_US)
    module_server = Server(module=True, args=("--jemalloc-bg-thread", "no"), env=clock.env(preload))
    script_server = Server(module=False, args=("--jemalloc-bg-thread", "no"), env=clock.env(preload))
    try:
        probe = module_server.client()
        probe.execute_command("TB.ACQUIRE", "probe", "1", "1")  # type: ignore[no-untyped-call]
        if probe.hget("probe", "ts") != str(CLOCK_2030_US).encode():
            pytest.skip("the module on this server does not follow the controlled clock")
        forms = ["eval", "eval@"]
        if command_known(probe, "FUNCTION"):
            script_server.client().execute_command("FUNCTION", "LOAD", "REPLACE", library_source())  # type: ignore[no-untyped-call]
            forms += ["fcall", "fcall@"]
        if "valkey_version" in probe.info("server"):
            # Valkey's own clock (TIME in a script) re-reads the wall clock at most once per millisecond and
            # adds monotonic time in between (tests/clock/README.md): the script cannot see the frozen instant,
            # and on the caller's clock its expiries are set relative to that clock (PEXPIRE).
            pytest.skip("Valkey's TIME is not exact under the controlled clock")
        probe.delete("probe")
        commands = [name for name in COMMANDS if command_known(probe, name)]
        yield clock, module_server, script_server, commands, forms
    finally:
        module_server.stop()
        script_server.stop()
        clock.remove()


def command_known(conn: redis.Redis, name: str) -> bool:
    """Whether the server knows `name`: called bare, a known command is refused for its arity."""
    try:
        conn.execute_command(name)  # type: ignore[no-untyped-call]
    except redis.ResponseError as error:
        return "unknown command" not in str(error).lower()
    return True


def run(conn: redis.Redis, sha: str, form: str, name: str, keys: list[str], args: list[str], now_us: int) -> Any:
    """One call: the module's command ("module"), or the script in one of its forms with the same keys and
    arguments. Errors are results."""
    clock = [f"@{now_us}"] if form.endswith("@") else []
    try:
        if form == "module":
            return conn.execute_command(name, *module_arguments(name, keys, args))  # type: ignore[no-untyped-call]
        if form.startswith("eval"):
            return conn.evalsha(sha, len(keys), *keys, *clock, name, *args)
        return conn.execute_command("FCALL", function_name(name), len(keys), *keys, *clock, *args)  # type: ignore[no-untyped-call]
    except redis.ResponseError as error:
        return ("error", str(error))


def module_arguments(name: str, keys: list[str], args: list[str]) -> list[str]:
    """The script's layout (keys apart) back to the command's own argument order."""
    if name == "TB.ACQUIREALL":
        out = [args[0]]
        for i, key in enumerate(keys):
            out += [key, args[1 + 2 * i], args[2 + 2 * i]]
        return out
    if name == "TB.ACQUIREEACH":
        out = []
        for i, key in enumerate(keys):
            out += [key, *args[3 * i : 3 * i + 3]]
        return out
    return [keys[0], *args]


def pick_number(rng: random.Random, choices: list[str]) -> str:
    return rng.choice(BAD_NUMBERS) if rng.random() < 0.03 else rng.choice(choices)


def random_call(
    rng: random.Random, commands: list[str], params: dict[str, tuple[str, str]]
) -> tuple[str, list[str], list[str]]:
    name = rng.choice(commands)

    def bucket_params(key: str) -> list[str]:
        if rng.random() < 0.1:  # a caller changes a bucket's parameters now and then
            params[key] = (rng.choice(RATES), rng.choice(BURSTS))
        rate, burst = params[key]
        if rng.random() < 0.03:
            return [pick_number(rng, RATES), pick_number(rng, BURSTS)]
        return [rate, burst]

    if name in ("TB.ACQUIREALL", "TB.ACQUIREEACH"):
        keys = rng.sample(KEYS, rng.randint(1, 3))
        if rng.random() < 0.02:
            keys.append(keys[0])  # a duplicate key is refused
        if name == "TB.ACQUIREALL":
            args = [pick_number(rng, COSTS)]
            for key in keys:
                args += bucket_params(key)
        else:
            args = []
            for key in keys:
                args += [*bucket_params(key), pick_number(rng, COSTS)]
        return name, keys, args
    if name == "CL.THROTTLE":
        throttle_key = rng.choice(THROTTLE_KEYS) if rng.random() < 0.95 else rng.choice(KEYS)
        throttle_args = [
            rng.choice(["0", "1", "4", "10", "100"]),
            rng.choice(["1", "3", "10", "1000", "1000000000"]),
            rng.choice(["1", "7", "60", "3600"]),
        ]
        if rng.random() < 0.03:
            throttle_args[rng.randrange(3)] = rng.choice(["-1", "0", "x", "9223372036854775807", "1.5"])
        if rng.random() < 0.7:
            throttle_args.append(rng.choice(["0", "1", "2", "5", "20", "-1"]))
        return name, [throttle_key], throttle_args
    key = rng.choice(KEYS)
    args = bucket_params(key)
    if name == "TB.ACQUIRE":
        if rng.random() < 0.8:
            args.append(pick_number(rng, COSTS))
    elif name == "TB.ACQUIREATMOST":
        args.append(rng.choice(["1", "2", "5", "100", "0", "9007199254740993", "1.5"]))
    elif name == "TB.RESERVE":
        max_wait = (
            rng.choice(["0", "100", "1000", "5000", "86400000"])
            if rng.random() < 0.95
            else rng.choice(["-1", "86400001", "5.5", "x"])
        )
        args += [pick_number(rng, COSTS), max_wait]
    elif name in ("TB.REFUND", "TB.CHARGE"):
        args.append(pick_number(rng, COSTS))
    elif name == "TB.BLOCK":
        args.append(rng.choice(["1", "250", "5000", "0", "86400001"]))
    elif name == "TB.LOWER":
        args.append(pick_number(rng, FLOORS))
    return name, [key], args


def advance_us(rng: random.Random) -> int:
    """Mostly small steps (state carries over), sometimes ms edges, now and then long enough to expire keys, and
    now and then a clock that steps back (up to an hour), where a bucket keeps its tokens and refills from the
    new reading."""
    roll = rng.random()
    if roll < 0.04:
        return -rng.choice([1, 1000, rng.randint(1, 5_000_000), 3_600_000_000])
    if roll < 0.15:
        return rng.choice([0, 1, 999, 1000, 1001])
    if roll < 0.85:
        return rng.randint(1, 200_000)
    if roll < 0.97:
        return rng.randint(1, 5_000_000)
    return rng.randint(1, 300_000_000)


def snapshot(conn: redis.Redis, keys: list[str], exact_expiry: bool, now_ms: int) -> list[Any]:
    """Each key's hash (a CL.THROTTLE key's string) and expiry: PEXPIRETIME, or on Redis 6.2 (which lacks it) PTTL,
    exact under a frozen clock. Two round trips (the types, then the values).

    A key whose expiry is the clock's own millisecond counts as gone: Redis reads it as live until that millisecond
    ends, but its background expiry cycle deletes it within that millisecond when it samples it, so whether it is
    still there depends on when the cycle ran."""
    kinds = conn.pipeline(transaction=False)
    for key in keys:
        kinds.type(key)
    pipe = conn.pipeline(transaction=False)
    for key, kind in zip(keys, kinds.execute(), strict=True):
        if kind == b"string":
            pipe.get(key)
        else:
            pipe.hgetall(key)
        if exact_expiry:
            pipe.pexpiretime(key)
        else:
            pipe.pttl(key)
    replies = pipe.execute()
    state = []
    for i in range(0, len(replies), 2):
        value, expiry = replies[i] or None, replies[i + 1]  # a missing key: None, whichever command read it
        at_its_end = 0 <= expiry <= now_ms if exact_expiry else expiry == 0
        if at_its_end:
            value, expiry = None, -2
        state.append((value, expiry))
    return state


@pytest.mark.parametrize("caller_clock", [False, True], ids=["server-clock", "caller-clock"])
@pytest.mark.parametrize("seed", SEEDS)
def test_script_matches_module_on_random_sequences(
    clocked: tuple[Clock, Server, Server, list[str], list[str]], seed: int, caller_clock: bool
) -> None:
    clock, module_server, script_server, commands, all_forms = clocked
    forms = [form for form in all_forms if form.endswith("@") == caller_clock]
    rng = random.Random(seed)
    module_conn, script_conn = module_server.client(), script_server.client()
    sha = script_conn.script_load(SCRIPT)
    exact = int(script_conn.info("server")["redis_version"].split(".")[0]) >= 7
    keys = [key.format(d=f"{seed}{'c' * caller_clock}") for key in KEYS + THROTTLE_KEYS]
    params = {key: (rng.choice(RATES), rng.choice(BURSTS)) for key in KEYS}
    # Every seed and clock starts on its own day, far from the others' buckets (and has its own keys).
    now_us = CLOCK_2030_US + seed * 10**12 + caller_clock * 10**11
    clock.set_us(now_us)
    for step in range(STEPS):
        step_us = advance_us(rng)
        if caller_clock and step_us < 0:
            step_us = 0  # the module rebases a bucket on a step back; on the caller's clock its time stands still
        now_us += step_us
        clock.set_us(now_us)
        name, call_keys, args = random_call(rng, commands, params)
        call_keys = [key.format(d=f"{seed}{'c' * caller_clock}") for key in call_keys]
        from_module = run(module_conn, sha, "module", name, call_keys, args, now_us)
        if isinstance(from_module, list) and name == "CL.THROTTLE":
            # i64::MAX (an interval under 1 µs makes `remaining` saturate) as the script sends it: the largest
            # double below 2^63 (documented in lua/tb.lua).
            from_module = [9223372036854774784 if value == 2**63 - 1 else value for value in from_module]
        module_state = snapshot(module_conn, keys, exact, now_us // 1000)
        for form in forms:
            # Each form on its own keys, in the same slot: the form's name before the hash tag.
            from_form = run(script_conn, sha, form, name, [form + key for key in call_keys], args, now_us)
            context = f"{form}: seed {seed} step {step} at {now_us}: {name} {call_keys} {args}"
            assert from_form == from_module, context
            assert snapshot(script_conn, [form + key for key in keys], exact, now_us // 1000) == module_state, context
