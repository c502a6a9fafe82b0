"""`throttle` (`CL.THROTTLE`, redis-cell's command) on both clients: redis-cell's reply as a named tuple, errors as
the package's exceptions, and the library function the call goes to where the module is missing."""

from __future__ import annotations

import pytest
from conftest import Server

import redis_tb
from redis_tb import AsyncTokenBucket, ThrottleReply, TokenBucket
from redis_tb import _protocol as protocol


def needs_backend(server: Server) -> None:
    """The script has CL.THROTTLE only once lua/tb.lua does; until then the test runs on the module alone."""
    if not server.module and "CL.THROTTLE" not in protocol.SCRIPT:
        pytest.skip("lua/tb.lua has no CL.THROTTLE")


def test_throttle_replies_as_redis_cell(server: Server, key: str) -> None:
    needs_backend(server)
    tb = TokenBucket(server.client())
    # max_burst 4 (5 at once), one a minute: every wait is in whole minutes, far above the time the calls take.
    assert tb.throttle(key, 4, 1, 60) == ThrottleReply(False, 5, 4, -1, 60)
    assert tb.throttle(key, 4, 1, 60, quantity=4) == (False, 5, 0, -1, 300)
    limited, limit, remaining, retry_after, reset_after = tb.throttle(key, 4, 1, 60)
    assert (limited, limit, remaining, retry_after, reset_after) == (True, 5, 0, 60, 300)
    # More than the limit ever admits: -1.
    assert tb.throttle(key, 4, 1, 60, 6).retry_after == -1
    # A peek is allowed while nothing is due, and counts nothing.
    assert tb.throttle(f"{key}:peek", 4, 1, 60, 0) == ThrottleReply(False, 5, 5, -1, 0)


def test_throttle_errors_name_the_problem(server: Server, key: str) -> None:
    needs_backend(server)
    conn = server.client()
    tb = TokenBucket(conn)
    with pytest.raises(redis_tb.InvalidArgument, match="max_burst must be an integer"):
        tb.throttle(key, -1, 1, 60)
    with pytest.raises(redis_tb.InvalidArgument, match="count_per_period must be a positive integer"):
        tb.throttle(key, 1, 0, 60)
    with pytest.raises(redis_tb.InvalidArgument, match="quantity must be a non-negative integer"):
        tb.throttle(key, 1, 1, 60, -1)
    conn.set(f"{key}:text", "soon")
    with pytest.raises(redis_tb.NotABucket, match=r"does not hold a CL\.THROTTLE state"):
        tb.throttle(f"{key}:text", 1, 1, 60)
    tb.acquire(f"{key}:bucket", 1, 5)
    with pytest.raises(redis_tb.WrongType):
        tb.throttle(f"{key}:bucket", 1, 1, 60)


async def test_async_throttle(server: Server, key: str) -> None:
    needs_backend(server)
    conn = server.async_client()
    try:
        tb = AsyncTokenBucket(conn)
        assert await tb.throttle(key, 0, 1, 60) == ThrottleReply(False, 1, 0, -1, 60)
        assert (await tb.throttle(key, 0, 1, 60)).limited
        with pytest.raises(redis_tb.InvalidArgument, match="period must be a positive integer"):
            await tb.throttle(key, 0, 1, 0)
    finally:
        await conn.aclose()


def test_throttle_goes_to_the_librarys_cl_throttle() -> None:
    call = protocol.throttle("k", 4, 10, 60)
    assert call.module_args == ("k", "4", "10", "60", "1")
    assert call.eval_args() == ("k", "CL.THROTTLE", "4", "10", "60", "1")
    assert call.fcall_args() == ("FCALL", f"{protocol.LIBRARY_NAME}_cl_throttle", 1, "k", "4", "10", "60", "1")
    assert protocol.acquire("k", 1, 2).fcall_args()[1] == f"{protocol.LIBRARY_NAME}_acquire"
