"""`TokenBucket.throttle` through its fallback (a server without the module: the function library, or the script on
Redis 6.2) keeps the GCRA bound at every rate the arguments allow. Random limits up to 10^9 a second take calls in
tight loops (many at one instant) and at random sub-millisecond gaps on a controlled server clock, with now and then
a few idle milliseconds so that keys expire as Redis expires them; over every window between two allowed calls, the
requests allowed never exceed `L + t / T` (L = max_burst + 1, T = period / count_per_period truncated to the ns, so
at least `rate * t`)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from conftest import CLOCK_2030_US, Clock, Server, clock_preload

from redis_tb import TokenBucket

START_US = CLOCK_2030_US + 123_456  # 2030-01-01 00:00:00.123456 UTC
LIMITS = 16
CALLS = 300


@pytest.fixture
def frozen() -> Iterator[tuple[Clock, Server]]:
    preload = clock_preload()
    if preload is None:
        pytest.skip("no controlled clock (tests/clock/build.sh)")
    clock = Clock(START_US)
    server = Server(module=False, args=("--jemalloc-bg-thread", "no"), env=clock.env(preload))
    try:
        conn = server.client()
        conn.set("probe", "1", px=1000)
        # Valkey's TIME may run up to 1 ms off the controlled clock (tests/clock/README.md): the script's instants
        # would not be the ones the windows are counted over.
        if conn.pttl("probe") != 1000 or "valkey_version" in conn.info("server"):
            pytest.skip("this server's clock does not stand at the controlled instant")
        yield clock, server
    finally:
        server.stop()
        clock.remove()


def random_limit(rng: random.Random) -> tuple[int, int, int]:
    """max_burst, count_per_period, period: half where a key's state lasts under a few ms (max_burst 0-3, 1,000 to
    10^6 a second), the others anywhere (max_burst 0-19, over every order of magnitude up to 10^9 a second)."""
    period = rng.randint(1, 3)
    if rng.random() < 0.5:
        max_burst, magnitude = rng.randint(0, 3), rng.randint(3, 6)
    else:
        max_burst, magnitude = rng.randint(0, 19), rng.randint(0, 9)
    return max_burst, min(rng.randint(1, 9) * 10**magnitude, 10**9 * period), period


def gap_us(rng: random.Random, interval_ns: int) -> int:
    """None (a tight loop), up to the interval (capped at 1 ms), under a millisecond, now and then a few ms."""
    pick = rng.random()
    if pick < 0.3:
        return 0
    if pick < 0.7:
        return rng.randint(1, max(1, min(interval_ns, 1_000_000) // 1000))
    if pick < 0.9:
        return rng.randint(1, 1000)
    return rng.randint(1000, 5000)


def test_throttle_keeps_the_bound_at_any_rate(frozen: tuple[Clock, Server]) -> None:
    clock, server = frozen
    tb = TokenBucket(server.client())
    rng = random.Random(0xB00D)
    now_us = START_US
    for round_ in range(LIMITS):
        max_burst, count, period = random_limit(rng)
        key = f"bound:{round_}"
        interval = period * 10**9 // count
        tolerance = (max_burst + 1) * interval
        allowed: list[tuple[int, int]] = []
        for _ in range(CALLS):
            now_us += gap_us(rng, interval)
            clock.set_us(now_us)
            quantity = rng.choice([1] * 8 + [0, rng.randint(2, 3)])
            if not tb.throttle(key, max_burst, count, period, quantity).limited:
                allowed.append((now_us * 1000, quantity))
        for first, (start_ns, _) in enumerate(allowed):
            taken = 0
            for at_ns, quantity in allowed[first:]:
                taken += quantity
                window = at_ns - start_ns
                assert taken * interval <= tolerance + window, (
                    f"CL.THROTTLE {key} {max_burst} {count} {period}: {taken} allowed in {window} ns, "
                    f"more than {max_burst + 1} + t / {interval} ns"
                )
        now_us += 10_000_000
    assert tb.backend_in_use != "module"
