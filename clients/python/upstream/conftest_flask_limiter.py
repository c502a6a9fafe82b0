"""redis-tb's adapter for the tests in the `Flask-Limiter` sdist: `run.py` keeps their conftest as
tests/upstream_conftest.py and puts this file in its place.

It changes only what the suite builds: every strategy Flask-Limiter can be configured with is redis-tb's
token-bucket strategy (so the suite's `memory://` apps, and the in-memory fallback, run on its in-memory buckets),
and the suite's Redis (a docker service on localhost:46379) is a redis-server with the module on a free port. The
tests themselves run unchanged.
"""

from __future__ import annotations

from typing import Any

import limits.strategies
import pytest
import redis
from limits.storage.redis import RedisStorage
from redis_tb_upstream import PORT, flushed, pytest_sessionfinish  # noqa: F401  (the hook stops the server)
from tests.upstream_conftest import *  # noqa: F403  (their fixtures, some overridden below)

from redis_tb.limits import TokenBucketRateLimiter

for name in ("fixed-window", "moving-window", "sliding-window-counter"):
    limits.strategies.STRATEGIES[name] = TokenBucketRateLimiter
for name in ("FixedWindowRateLimiter", "MovingWindowRateLimiter", "SlidingWindowCounterRateLimiter"):
    setattr(limits.strategies, name, TokenBucketRateLimiter)

UPSTREAM_REDIS = "localhost:46379"
upstream_init = RedisStorage.__init__


def init_on_our_server(self: RedisStorage, uri: str, *args: Any, **kwargs: Any) -> None:
    upstream_init(self, uri.replace(UPSTREAM_REDIS, f"127.0.0.1:{PORT}"), *args, **kwargs)


RedisStorage.__init__ = init_on_our_server  # type: ignore[method-assign]


@pytest.fixture
def redis_connection() -> redis.Redis:
    return flushed()
