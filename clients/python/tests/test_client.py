"""Every method of both clients, on a server with the module and on one without (the Lua script), with the same
expectations: the backends are interchangeable."""

from __future__ import annotations

import math
import time

import pytest
import redis
from conftest import WITHOUT_MODULE, Server

import redis_tb
from redis_tb import AsyncTokenBucket, TokenBucket


class Stopwatch:
    """Real time since it started, in whole milliseconds rounded up: the most the server's clock can have moved
    between the calls made meanwhile. A wait computed from a bucket first touched after `start` is its value at
    that first call less at most `ms()`: the bound follows the machine's load instead of a fixed margin."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def ms(self) -> int:
        return math.ceil((time.monotonic() - self.start) * 1000)


def test_acquire_takes_and_refuses(server: Server, key: str) -> None:
    tb = TokenBucket(server.client())
    watch = Stopwatch()
    first = tb.acquire(key, 10, 20)
    assert first == redis_tb.Acquired(True, 19, 0, 100)
    assert tb.backend_in_use == ("module" if server.module else WITHOUT_MODULE)
    drained = tb.acquire(key, 10, 20, 19)
    assert drained.allowed and drained.remaining == 0
    refused = tb.acquire(key, 10, 20, 5)
    assert not refused.allowed and refused.remaining == 0
    assert 500 - watch.ms() <= refused.retry_after_ms <= 500  # less the refill since the first call
    assert tb.acquire(key, 10, 20, 21).retry_after_ms == -1  # cost > burst: never
    peek = tb.acquire(key, 10, 20, 0)
    assert peek.allowed and peek.retry_after_ms == 0


def test_acquire_all_is_all_or_nothing(server: Server, key: str) -> None:
    tb = TokenBucket(server.client())
    user, tenant = f"{{{key}}}:user", f"{{{key}}}:tenant"
    # The user bucket refills a token in 100 s: its exact count below holds however slowly the calls go.
    allowed = tb.acquire_all([(user, 0.01, 20), (tenant, 1, 2)], cost=2)
    assert allowed == redis_tb.AcquiredAll(True, 0, 0, 200_000, 1)
    refused = tb.acquire_all([(user, 0.01, 20), (tenant, 1, 2)], cost=2)
    assert not refused.allowed and refused.limiting_index == 1
    assert tb.acquire(user, 0.01, 20, 0).remaining == 18  # the refused call took nothing from the user bucket


def test_acquire_each_reports_every_bucket(server: Server, key: str) -> None:
    tb = TokenBucket(server.client())
    requests, model_tokens = f"{{{key}}}:rpm", f"{{{key}}}:tpm"
    watch = Stopwatch()
    each = tb.acquire_each([(requests, 1, 10, 1), (model_tokens, 100, 1000, 900)])
    assert each.allowed and [b.remaining for b in each.buckets] == [9, 100]
    assert each.limiting_index == 0 and each.retry_after_ms == 0  # the fewest tokens left
    refused = tb.acquire_each([(requests, 1, 10, 1), (model_tokens, 100, 1000, 500)])
    assert not refused.allowed and refused.limiting_index == 1
    assert refused.buckets[0].fits and not refused.buckets[1].fits
    assert refused.buckets[0].remaining == 9  # nothing taken
    assert 4000 - watch.ms() <= refused.retry_after_ms <= 4000


def test_acquire_at_most_grants_what_is_there(server: Server, key: str) -> None:
    tb = TokenBucket(server.client())
    watch = Stopwatch()
    assert tb.acquire_at_most(key, 1, 5, 3).granted == 3
    second = tb.acquire_at_most(key, 1, 5, 3)
    assert second.granted == 2 and second.remaining == 0
    empty = tb.acquire_at_most(key, 1, 5, 3)
    assert empty.granted == 0 and 1000 - watch.ms() <= empty.retry_after_ms <= 1000


def test_reserve_and_refund(server: Server, key: str) -> None:
    tb = TokenBucket(server.client())
    watch = Stopwatch()
    assert tb.reserve(key, 10, 1, 1, 1000) == redis_tb.Reservation(True, 0, 0, 100)
    waiting = tb.reserve(key, 10, 1, 1, 1000)
    assert waiting.granted and 100 - watch.ms() <= waiting.wait_ms <= 100
    too_long = tb.reserve(key, 10, 1, 1, 10)
    assert not too_long.granted and too_long.wait_ms > 10
    assert tb.refund(key, 10, 1, 1).refunded is False  # in debt: nothing comes back
    other = f"{key}:other"
    tb.acquire(other, 10, 20, 5)
    refunded = tb.refund(other, 10, 20, 5)
    assert refunded.refunded and refunded.remaining == 20 and refunded.reset_after_ms == 0
    assert server.client().exists(other) == 0  # full again: deleted


def test_charge_goes_into_debt_and_block_denies(server: Server, key: str) -> None:
    tb = TokenBucket(server.client())
    charged = tb.charge(key, 10, 20, 25)
    assert charged.remaining == 0 and charged.retry_after_ms == 600  # one call: one instant, nothing refilled
    assert not tb.acquire(key, 10, 20).allowed
    with pytest.raises(redis_tb.DebtLimitExceeded):
        tb.charge(key, 10, 20, 10 * 86400 + 100)
    blocked = f"{key}:blocked"
    result = tb.block(blocked, 10, 20, 5000)
    assert result.remaining == 0 and result.retry_after_ms == 5100  # the block, then one token at 10/s
    assert not tb.acquire(blocked, 10, 20).allowed


def test_lower_brings_a_bucket_down_and_never_raises_it(server: Server, key: str) -> None:
    tb = TokenBucket(server.client())
    assert tb.acquire(key, 0.001, 10, 2).remaining == 8
    assert tb.lower(key, 0.001, 10, 3.5).remaining == 3
    assert tb.lower(key, 0.001, 10, 5).remaining == 3  # never raised
    in_debt = tb.lower(key, 0.001, 10, -2)
    assert in_debt.remaining == 0 and 3_000_000 - 1000 < in_debt.retry_after_ms <= 3_000_000
    with pytest.raises(redis_tb.InvalidArgument, match=r"^ERR tokens "):
        tb.lower(key, 0.001, 10, -87)  # below a day of refill in debt (86.4)
    assert tb.lower(f"{key}:missing", 1, 10, 10).remaining == 10  # a missing bucket is full: nothing to lower


def test_errors_name_the_problem(server: Server, key: str) -> None:
    tb = TokenBucket(server.client())
    with pytest.raises(redis_tb.InvalidArgument, match="rate must be a positive number") as caught:
        tb.acquire(key, 0, 20)
    assert caught.value.server_message == "ERR rate must be a positive number"
    with pytest.raises(redis_tb.InvalidArgument, match="burst"):
        tb.acquire(key, 1, -1)
    with pytest.raises(redis_tb.InvalidArgument, match="cost"):
        tb.acquire(key, 1, 1, float("nan"))
    with pytest.raises(redis_tb.InvalidArgument, match="max_wait_ms"):
        tb.reserve(key, 1, 1, 1, 86_400_001)
    with pytest.raises(redis_tb.DuplicateKey):
        tb.acquire_all([(key, 1, 1), (key, 1, 1)])
    with pytest.raises(redis_tb.TooManyBuckets):
        tb.acquire_all([(f"{{t}}{i}", 1, 1) for i in range(1001)])
    server.client().set(f"{key}:string", "x")
    with pytest.raises(redis_tb.WrongType):
        tb.acquire(f"{key}:string", 1, 1)
    server.client().hset(f"{key}:hash", mapping={"tokens": "abc", "ts": "1"})
    with pytest.raises(redis_tb.NotABucket):
        tb.acquire(f"{key}:hash", 1, 1)
    with pytest.raises(TypeError):
        tb.acquire(key, "10", 20)  # type: ignore[arg-type]


def test_buckets_move_between_backends(module_server: Server, key: str) -> None:
    """The module, the library and the script share the bucket: each call continues where the other left off."""
    conn = module_server.client()
    by_module = TokenBucket(conn, backend="module")
    by_script = TokenBucket(conn, backend="script")
    assert by_module.acquire(key, 1, 10, 4).remaining == 6
    assert by_script.acquire(key, 1, 10, 4).remaining == 2
    assert by_module.acquire(key, 1, 10, 4).allowed is False
    assert by_script.backend_in_use == "script" and by_module.backend_in_use == "module"
    if WITHOUT_MODULE == "function":
        by_function = TokenBucket(conn, backend="function")
        assert by_function.acquire(key, 1, 10, 0).remaining == 2
        assert by_function.backend_in_use == "function"


def test_backend_module_refuses_to_fall_back(plain_server: Server, key: str) -> None:
    with pytest.raises(redis_tb.ModuleNotLoaded):
        TokenBucket(plain_server.client(), backend="module").acquire(key, 1, 1)


def test_detect_asks_once_and_writes_nothing(server: Server) -> None:
    conn = server.client()
    tb = TokenBucket(conn)
    assert tb.backend_in_use is None
    assert tb.detect() == ("module" if server.module else WITHOUT_MODULE)
    assert tb.backend_in_use == tb.detect()
    assert conn.exists("redis-tb:detect") == 0


def test_script_is_loaded_again_after_a_flush(plain_server: Server, key: str) -> None:
    """NOSCRIPT (a restart, a failover, SCRIPT FLUSH) costs one EVAL, which caches the script again."""
    conn = plain_server.client()
    tb = TokenBucket(conn, backend="script")
    tb.acquire(key, 1, 5)
    conn.script_flush()
    assert tb.acquire(key, 1, 5).allowed
    assert conn.script_exists(redis_tb.SCRIPT_SHA) == [True]


def calls(conn: redis.Redis, command: str) -> int:
    return int(conn.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_happy_path_is_one_round_trip(server: Server, key: str) -> None:
    """Once the backend is known, each call is one command: the module's, or one EVALSHA (no SCRIPT LOAD, no
    EVAL, no detection)."""
    conn = server.client()
    tb = TokenBucket(conn)
    tb.acquire(key, 1, 5)
    counted = ["tb.acquire", "fcall", "function|load", "evalsha", "eval", "script", "command"]
    before = {name: calls(conn, name) for name in counted}
    for _ in range(3):
        tb.acquire(key, 1, 5)
    after = {name: calls(conn, name) for name in counted}
    used = "tb.acquire" if server.module else {"function": "fcall", "script": "evalsha"}[WITHOUT_MODULE]
    assert {name: after[name] - before[name] for name in counted} == {
        name: (3 if name == used else 0) for name in counted
    }


def test_reset_deletes(server: Server, key: str) -> None:
    tb = TokenBucket(server.client())
    tb.acquire(key, 1, 5, 5)
    assert tb.reset(key) == 1
    assert tb.acquire(key, 1, 5, 0).remaining == 5


async def test_async_client_has_the_same_methods(server: Server, key: str) -> None:
    conn = server.async_client()
    tb = AsyncTokenBucket(conn)
    try:
        assert (await tb.acquire(key, 10, 20)).remaining == 19
        assert tb.backend_in_use == ("module" if server.module else WITHOUT_MODULE)
        assert (await tb.acquire_all([(f"{key}:a", 1, 2)], 2)).allowed
        each = await tb.acquire_each([(f"{{{key}}}:x", 1, 2, 1), (f"{{{key}}}:y", 1, 2, 3)])
        assert not each.allowed and each.buckets[1].retry_after_ms == -1
        assert (await tb.acquire_at_most(f"{key}:m", 1, 4, 10)).granted == 4
        assert (await tb.reserve(f"{key}:r", 10, 1, 1, 0)).granted
        assert not (await tb.refund(f"{key}:r", 10, 1, 0)).refunded
        assert (await tb.charge(f"{key}:c", 1, 1, 2)).remaining == 0
        assert (await tb.lower(f"{key}:l", 1, 4, 1.5)).remaining == 1
        assert (await tb.block(f"{key}:b", 1, 1, 1000)).retry_after_ms > 0
        with pytest.raises(redis_tb.InvalidArgument):
            await tb.acquire(key, -1, 1)
        assert await tb.reset(key) == 1
        assert await AsyncTokenBucket(conn).detect() == ("module" if server.module else WITHOUT_MODULE)
    finally:
        await conn.aclose()


def test_bad_backend_name_is_refused() -> None:
    with pytest.raises(ValueError, match="backend"):
        TokenBucket(redis.Redis(), backend="lua")  # type: ignore[arg-type]
