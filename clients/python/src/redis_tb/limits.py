"""The "token-bucket" strategy for the `limits` package, which Flask-Limiter and slowapi are built on.

Importing `redis_tb` registers it in `limits.strategies.STRATEGIES` and `limits.aio.strategies.STRATEGIES`, so
all three select it by configuration: `RATELIMIT_STRATEGY = "token-bucket"` (Flask-Limiter),
`Limiter(..., strategy="token-bucket")` (slowapi), `STRATEGIES["token-bucket"](storage)` (limits, sync or
asyncio), with a Redis storage (`redis://`, `redis+cluster://`, `redis+sentinel://`; for asyncio
`async+redis://...` with `implementation="redispy"`) or the in-memory one (`memory://`, `async+memory://`: what
Flask-Limiter and slowapi fall back to while Redis is down).

A limit string `N per T` becomes a bucket of burst N refilled at N / T tokens per second: `10/second` is burst
10 at 10/s, and `600/minute` burst 600 at 10/s. For another burst at the same rate, scale the amount and the
window together: `50 per 5 seconds` is burst 50 at 10/s, `5 per 10 seconds` burst 5 at 0.5/s.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.cluster
from limits.aio import strategies as aio_strategies
from limits.aio.storage import MemoryStorage as AsyncMemoryStorage
from limits.errors import ConfigurationError, StorageError
from limits.limits import RateLimitItem
from limits.storage import MemoryStorage, Storage
from limits.strategies import STRATEGIES, RateLimiter
from limits.util import WindowStats

from ._local import Bucket, bucket_result, cost_fits
from .aio import AsyncTokenBucket
from .client import TokenBucket
from .replies import Acquired

#: The name Flask-Limiter, slowapi and limits configurations use.
STRATEGY_NAME = "token-bucket"
#: The in-memory buckets drop the expired entries of their storage once per this many writes.
SWEEP_EVERY = 4096
#: A reset this close before a whole second is reported at that second (see `window_stats`).
SECOND_SLACK = 0.001

T = TypeVar("T")
#: The clients the strategy runs over (redis-py's, sync and asyncio).
SUPPORTED_CLIENTS = (redis.Redis, redis.cluster.RedisCluster, redis.asyncio.Redis, redis.asyncio.RedisCluster)


class MemoryBuckets:
    """Token buckets in a `limits` in-memory storage (sync or asyncio): the middleware's in-memory bucket
    (`redis_tb._local.Bucket`, with `cost_fits` and `bucket_result`), so both decide with one arithmetic.

    A bucket is one entry of the storage, expiring when the bucket is full again (a missing bucket is a full one).
    The storage's `clear`, `reset` and expiry therefore apply to the buckets as to its own counters; nothing lives
    outside it. Its clock is `time.time()`, as the storage's expiry's is.
    """

    def __init__(self, storage: MemoryStorage | AsyncMemoryStorage) -> None:
        self.buckets: MutableMapping[str, Any] = storage.storage
        self.expirations: MutableMapping[str, float] = storage.expirations
        self.lock = threading.Lock()
        self.writes = 0

    def acquire(self, key: str, rate: float, burst: float, cost: float = 1) -> Acquired:
        """`TB.ACQUIRE` on the bucket `key`: the same reply fields, never a write unless `cost` is taken."""
        with self.lock:
            now = time.time()
            stored = self.buckets.get(key) if self.expirations.get(key, 0.0) > now else None
            held = min(burst, stored.held(now)) if isinstance(stored, Bucket) else burst
            fits = cost_fits(held, burst, cost)
            if fits and cost > 0:
                held -= cost
                self.buckets[key] = Bucket(held, now, rate, burst)
                self.expirations[key] = now + (burst - held) / rate
                self._sweep(now)
        result = bucket_result(held, rate, burst, cost, fits)
        return Acquired(fits, result.remaining, result.retry_after_ms, result.reset_after_ms)

    def _sweep(self, now: float) -> None:
        """Every `SWEEP_EVERY` writes, drops the storage's expired entries (full buckets), as its timer does."""
        self.writes += 1
        if self.writes % SWEEP_EVERY:
            return
        for key, at in list(self.expirations.items()):
            if at <= now:
                self.buckets.pop(key, None)
                self.expirations.pop(key, None)


def shape(item: RateLimitItem) -> tuple[float, float]:
    """(rate per second, burst) of a limit: burst = amount, rate = amount / window."""
    return item.amount / item.get_expiry(), float(item.amount)


def nothing_admitted(item: RateLimitItem, cost: float) -> Acquired:
    """The reply for a limit of 0 (`0/minute`), which admits nothing, as with the library's strategies: a
    refusal (a cost of 0 passes), its reset a window away. No bucket is touched (a rate of 0 is no bucket)."""
    return Acquired(cost <= 0, 0, -1, math.ceil(item.get_expiry() * 1000))


def window_stats(peek: Acquired, rate: float, burst: float) -> WindowStats:
    """`remaining` whole tokens; `reset_time` when the bucket is full again, or, when no token is left, when the
    next one arrives (what a refused client should wait for), now for a full bucket.

    The wait is rounded up to whole seconds, so that a client told to come back then is admitted: Flask-Limiter
    and slowapi compute `Retry-After` as `int(int(reset_time + 1) - time.time())` (and `int(1 + reset_time -
    time.time())`), which gives exactly the rounded-up wait. A reset that would fall within `SECOND_SLACK` before
    a whole second is reported at that second, so that their second clock reading, a moment after ours, cannot
    cross the second and make the answer one short."""
    seconds = peek.reset_after_ms / 1000
    if peek.remaining == 0 and burst > 0:
        seconds = max(0.0, seconds - (burst - 1) / rate)
    now = time.time()
    if seconds <= 0:
        return WindowStats(now, peek.remaining)
    reset = now + math.ceil(seconds)
    if math.ceil(reset) - reset < SECOND_SLACK:
        reset = float(math.ceil(reset))
    return WindowStats(reset, peek.remaining)


def redis_key(storage: Any, item: RateLimitItem, identifiers: tuple[str, ...]) -> str:
    """The bucket's key: the limit's own key under `tb/`, with the storage's `key_prefix` (Redis storages)."""
    key = f"tb/{item.key_for(*identifiers)}"
    prefixed = getattr(storage, "prefixed_key", None) or getattr(getattr(storage, "bridge", None), "prefixed_key", None)
    return str(prefixed(key)) if callable(prefixed) else key


def refused(storage: Any, what: str) -> ConfigurationError:
    """The error for a storage the strategy cannot run on, naming it: its scheme, or the client it holds when
    that is not redis-py's (`valkey://` storages hold the valkey client)."""
    client = getattr(storage, "storage", None) or getattr(getattr(storage, "bridge", None), "storage", None)
    if client is not None and not isinstance(client, SUPPORTED_CLIENTS):
        used = f"a {type(client).__module__}.{type(client).__name__} client (for a Valkey server, use a redis:// URI)"
    else:
        used = (getattr(storage, "STORAGE_SCHEME", None) or [type(storage).__name__])[0]
    return ConfigurationError(
        f"the token-bucket strategy needs a Redis storage (redis://, redis+cluster://, redis+sentinel://{what}) "
        f"or the in-memory one, not {used}"
    )


def wrapped(storage: Any, error: Exception) -> Exception:
    """The storage's `wrap_exceptions` option, as its own methods apply it: its errors become `StorageError`."""
    if getattr(storage, "wrap_exceptions", False) and isinstance(error, storage.base_exceptions):
        return StorageError(error)
    return error


class TokenBucketRateLimiter(RateLimiter):
    """`limits`' strategy contract (`hit`, `test`, `get_window_stats`, `clear`) on token buckets: in Redis (the
    module where the server has it, else the Lua script), or in the in-memory storage."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage)
        if isinstance(storage, MemoryStorage):
            self.buckets: TokenBucket | MemoryBuckets = MemoryBuckets(storage)
            return
        client = getattr(storage, "storage", None)
        if not isinstance(client, redis.Redis | redis.cluster.RedisCluster):
            raise refused(storage, "")
        self.buckets = TokenBucket(client)

    def _acquire(self, item: RateLimitItem, identifiers: tuple[str, ...], cost: float) -> Acquired:
        rate, burst = shape(item)
        if burst <= 0:
            return nothing_admitted(item, cost)
        try:
            return self.buckets.acquire(redis_key(self.storage, item, identifiers), rate, burst, cost)
        except Exception as error:
            raise wrapped(self.storage, error) from error

    def hit(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool:
        return self._acquire(item, identifiers, cost).allowed

    def test(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool:
        return self._acquire(item, identifiers, 0).remaining >= cost

    def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats:
        return window_stats(self._acquire(item, identifiers, 0), *shape(item))

    def clear(self, item: RateLimitItem, *identifiers: str) -> None:
        key = redis_key(self.storage, item, identifiers)
        if isinstance(self.buckets, MemoryBuckets):
            self.storage.clear(key)
            return
        try:
            self.buckets.reset(key)
        except Exception as error:
            raise wrapped(self.storage, error) from error


class AsyncTokenBucketRateLimiter(aio_strategies.RateLimiter):
    """The same strategy for `limits.aio`: over `async+redis://` (and `+cluster`, `+sentinel`) storages built
    with `implementation="redispy"`, or `async+memory://`."""

    def __init__(self, storage: Any) -> None:
        super().__init__(storage)
        self.memory: MemoryBuckets | None = None
        self.redis: AsyncTokenBucket | None = None
        if isinstance(storage, AsyncMemoryStorage):
            self.memory = MemoryBuckets(storage)
            return
        client = getattr(getattr(storage, "bridge", None), "storage", None)
        if not isinstance(client, redis.asyncio.Redis | redis.asyncio.RedisCluster):
            raise refused(storage, ', with implementation="redispy"')
        self.redis = AsyncTokenBucket(client)

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except Exception as error:
            raise wrapped(self.storage, error) from error

    async def _acquire(self, item: RateLimitItem, identifiers: tuple[str, ...], cost: float) -> Acquired:
        rate, burst = shape(item)
        if burst <= 0:
            return nothing_admitted(item, cost)
        key = redis_key(self.storage, item, identifiers)
        if self.redis is None:
            assert self.memory is not None
            return self.memory.acquire(key, rate, burst, cost)
        buckets = self.redis
        return await self._call(lambda: buckets.acquire(key, rate, burst, cost))

    async def hit(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool:
        return (await self._acquire(item, identifiers, cost)).allowed

    async def test(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool:
        return (await self._acquire(item, identifiers, 0)).remaining >= cost

    async def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats:
        return window_stats(await self._acquire(item, identifiers, 0), *shape(item))

    async def clear(self, item: RateLimitItem, *identifiers: str) -> None:
        key = redis_key(self.storage, item, identifiers)
        if self.redis is None:
            await self.storage.clear(key)
            return
        buckets = self.redis
        await self._call(lambda: buckets.reset(key))


def register() -> None:
    """Adds the strategies to `limits.strategies.STRATEGIES` and `limits.aio.strategies.STRATEGIES` (done on
    import)."""
    strategies: dict[str, Any] = STRATEGIES
    strategies[STRATEGY_NAME] = TokenBucketRateLimiter
    async_strategies: dict[str, Any] = aio_strategies.STRATEGIES
    async_strategies[STRATEGY_NAME] = AsyncTokenBucketRateLimiter


register()
