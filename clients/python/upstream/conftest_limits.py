"""redis-tb's adapter for the tests in the `limits` sdist: `run.py` keeps their conftest as
tests/upstream_conftest.py and puts this file in its place.

It changes only what the suite builds: every strategy class the tests import is redis-tb's token-bucket strategy
(sync and asyncio), and the storages are the in-memory one and a redis-server with the module on a free port,
instead of the suite's docker services. The tests themselves run unchanged.
"""

from __future__ import annotations

import limits.aio.strategies
import limits.strategies
import pytest
import redis
from pytest_lazy_fixtures import lf
from redis_tb_upstream import PORT, flushed, pytest_sessionfinish  # noqa: F401  (the hook stops the server)
from tests.upstream_conftest import *  # noqa: F403  (their fixtures, some overridden below)

from redis_tb.limits import AsyncTokenBucketRateLimiter, TokenBucketRateLimiter
from tests import utils

for name in ("FixedWindowRateLimiter", "MovingWindowRateLimiter", "SlidingWindowCounterRateLimiter"):
    setattr(limits.strategies, name, TokenBucketRateLimiter)
    setattr(limits.aio.strategies, name, AsyncTokenBucketRateLimiter)

SYNC = pytest.mark.parametrize(
    "uri, args, fixture",
    [
        pytest.param("memory://", {}, None, id="in-memory"),
        pytest.param(f"redis://127.0.0.1:{PORT}", {}, lf("redis_basic"), id="redis_basic"),
    ],
)
ASYNC = pytest.mark.parametrize(
    "uri, args, fixture",
    [
        pytest.param("async+memory://", {}, None, id="in-memory"),
        pytest.param(f"async+redis://127.0.0.1:{PORT}", {"implementation": "redispy"}, lf("redis_basic"), id="redis"),
    ],
)
utils.all_storage = utils.moving_window_storage = utils.sliding_window_counter_storage = SYNC
utils.async_all_storage = utils.async_moving_window_storage = utils.async_sliding_window_counter_storage = ASYNC


@pytest.fixture
def redis_basic() -> redis.Redis:
    return flushed()
