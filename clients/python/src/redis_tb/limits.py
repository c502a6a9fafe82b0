"""The "token-bucket" strategy for the `limits` package, which Flask-Limiter and slowapi are built on.

Importing `redis_tb` registers it in `limits.strategies.STRATEGIES`, so both select it by configuration:
`RATELIMIT_STRATEGY = "token-bucket"` (Flask-Limiter), `Limiter(..., strategy="token-bucket")` (slowapi), with
a Redis storage URI (`redis://`, `redis+cluster://`, `redis+sentinel://`).

A limit string `N per T` becomes a bucket of burst N refilled at N / T tokens per second: `10/second` is burst
10 at 10/s, and `600/minute` burst 600 at 10/s. For another burst at the same rate, scale the amount and the
window together: `50 per 5 seconds` is burst 50 at 10/s, `5 per 10 seconds` burst 5 at 0.5/s.
"""

from __future__ import annotations

import time
from typing import Any

from limits.errors import ConfigurationError
from limits.limits import RateLimitItem
from limits.storage import Storage
from limits.strategies import STRATEGIES, RateLimiter
from limits.util import WindowStats

from .client import TokenBucket

#: The name Flask-Limiter and slowapi configurations use.
STRATEGY_NAME = "token-bucket"


class TokenBucketRateLimiter(RateLimiter):
    """`limits`' strategy contract (`hit`, `test`, `get_window_stats`, `clear`) on redis-tb buckets: the module
    where the server has it, else the Lua script."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage)
        client = getattr(storage, "storage", None)
        if client is None or not hasattr(client, "execute_command"):
            raise ConfigurationError(
                "the token-bucket strategy needs a Redis storage (redis://, redis+cluster://, redis+sentinel://)"
            )
        self.buckets = TokenBucket(client)

    def _key(self, item: RateLimitItem, identifiers: tuple[str, ...]) -> str:
        key = f"tb/{item.key_for(*identifiers)}"
        prefixed = getattr(self.storage, "prefixed_key", None)
        return str(prefixed(key)) if callable(prefixed) else key

    @staticmethod
    def _shape(item: RateLimitItem) -> tuple[float, float]:
        """(rate per second, burst) of a limit: burst = amount, rate = amount / window."""
        return item.amount / item.get_expiry(), float(item.amount)

    def hit(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool:
        rate, burst = self._shape(item)
        return self.buckets.acquire(self._key(item, identifiers), rate, burst, cost).allowed

    def test(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool:
        rate, burst = self._shape(item)
        peek = self.buckets.acquire(self._key(item, identifiers), rate, burst, 0)
        return peek.remaining >= cost

    def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats:
        """`remaining` whole tokens; `reset_time` when the bucket is full again, or, when no token is left, when
        the next one arrives (what a refused client should wait for)."""
        rate, burst = self._shape(item)
        peek = self.buckets.acquire(self._key(item, identifiers), rate, burst, 0)
        seconds = peek.reset_after_ms / 1000
        if peek.remaining == 0:
            seconds = max(0.0, seconds - (burst - 1) / rate)
        return WindowStats(time.time() + seconds, peek.remaining)

    def clear(self, item: RateLimitItem, *identifiers: str) -> None:
        self.buckets.reset(self._key(item, identifiers))


def register() -> None:
    """Adds the strategy to `limits.strategies.STRATEGIES` (done on import)."""
    strategies: dict[str, Any] = STRATEGIES
    strategies[STRATEGY_NAME] = TokenBucketRateLimiter


register()
