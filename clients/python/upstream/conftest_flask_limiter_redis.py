"""redis-tb's adapter for the tests in the `Flask-Limiter` sdist, with its apps on Redis: `run.py` puts this file
in place of their conftest (kept as tests/upstream_conftest.py) and runs it with TB_UPSTREAM_CLOCK=1.

Everything `conftest_flask_limiter` does, and the `memory://` storage the suite's apps use becomes the
redis-server with the module (emptied before each test), whose clock follows the tests' clock: the suite
moves time with hiro (which patches
`time.time`), so before each call the strategy makes, the server's clock is set to `time.time()`. The in-memory
fallback stays in memory. The tests themselves run unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import flask_limiter._extension
import pytest
from conftest_flask_limiter import *  # noqa: F403  (the strategy everywhere, the suite's Redis on ours)
from redis_tb_upstream import CLOCK, PORT, flushed

from redis_tb.limits import TokenBucketRateLimiter

upstream_storage_from_string = flask_limiter._extension.storage_from_string


def storage_on_our_server(uri: str, **options: Any) -> Any:
    if uri.startswith("memory://"):
        uri = f"redis://127.0.0.1:{PORT}"
    return upstream_storage_from_string(uri, **options)


flask_limiter._extension.storage_from_string = storage_on_our_server


def following_the_tests_clock(method: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        CLOCK.set_us(int(time.time() * 1_000_000))
        return method(*args, **kwargs)

    return call


TokenBucketRateLimiter._acquire = following_the_tests_clock(TokenBucketRateLimiter._acquire)  # type: ignore[method-assign]
TokenBucketRateLimiter.clear = following_the_tests_clock(TokenBucketRateLimiter.clear)  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def empty_server() -> None:
    """Each test starts on an empty server, as it would on a fresh `memory://` storage."""
    flushed()
