"""The asyncio client, over `redis.asyncio.Redis` or `redis.asyncio.cluster.RedisCluster`. Same methods and
backends as `TokenBucket`, awaited."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from . import _protocol as protocol
from .client import DETECT_KEY, Backend, Backends, Send, wall_clock_us
from .replies import (
    Acquired,
    AcquiredAll,
    AcquiredEach,
    Charged,
    PartialGrant,
    Refunded,
    Reservation,
    ThrottleReply,
)

T = TypeVar("T")
AsyncRedis = Redis | RedisCluster


class AsyncTokenBucket:
    """Token buckets in Redis for asyncio code: see `TokenBucket` for the backends and `now_us`."""

    def __init__(
        self, redis: AsyncRedis, *, backend: Backend = "auto", now_us: Callable[[], int] = wall_clock_us
    ) -> None:
        self.redis = redis
        self._backends = Backends(backend, now_us)

    @property
    def backend_in_use(self) -> str | None:
        return self._backends.in_use

    async def detect(self) -> str:
        """Finds the backend now rather than on the first call (loading the library if need be), and returns it.
        The question is a peek (`TB.ACQUIRE` with cost 0 on the key `redis-tb:detect`), which writes nothing."""
        await self._run(protocol.acquire(DETECT_KEY, 1, 1, 0))
        return self._backends.in_use or protocol.MODULE

    async def _send(self, send: Send) -> Any:
        if send.routed and isinstance(self.redis, RedisCluster):
            node = self.redis.get_node_from_key(send.key)
            return await self.redis.execute_command(*send.args, target_nodes=node)
        return await self.redis.execute_command(*send.args)

    async def _run(self, call: protocol.Call[T]) -> T:
        steps = self._backends.steps(call)
        try:
            send = next(steps)
            while True:
                try:
                    reply = await self._send(send)
                except RedisError as error:  # a cluster client's own command table raises a plain RedisError
                    send = steps.throw(error)
                else:
                    send = steps.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def acquire(self, key: str, rate: float, burst: float, cost: float = 1) -> Acquired:
        """`TB.ACQUIRE`: takes `cost` tokens if the bucket holds them."""
        return await self._run(protocol.acquire(key, rate, burst, cost))

    async def acquire_all(self, buckets: Sequence[protocol.Bucket], cost: float = 1) -> AcquiredAll:
        """`TB.ACQUIREALL`: takes `cost` from every `(key, rate, burst)` bucket, or from none."""
        return await self._run(protocol.acquire_all(buckets, cost))

    async def acquire_each(self, buckets: Sequence[protocol.BucketWithCost]) -> AcquiredEach:
        """`TB.ACQUIREEACH`: takes each `(key, rate, burst, cost)` bucket's own cost, from all or none."""
        return await self._run(protocol.acquire_each(buckets))

    async def acquire_at_most(self, key: str, rate: float, burst: float, max_tokens: int) -> PartialGrant:
        """`TB.ACQUIREATMOST`: takes up to `max_tokens` whole tokens, as many as are there."""
        return await self._run(protocol.acquire_at_most(key, rate, burst, max_tokens))

    async def reserve(self, key: str, rate: float, burst: float, cost: float, max_wait_ms: int) -> Reservation:
        """`TB.RESERVE`: takes `cost` now for the caller to act after `wait_ms` (at most `max_wait_ms`)."""
        return await self._run(protocol.reserve(key, rate, burst, cost, max_wait_ms))

    async def refund(self, key: str, rate: float, burst: float, amount: float) -> Refunded:
        """`TB.REFUND`: gives `amount` tokens back (nothing while the bucket is in debt)."""
        return await self._run(protocol.refund(key, rate, burst, amount))

    async def charge(self, key: str, rate: float, burst: float, cost: float) -> Charged:
        """`TB.CHARGE`: takes `cost` whether or not it is there (into debt, up to 24 hours of refill)."""
        return await self._run(protocol.charge(key, rate, burst, cost))

    async def lower(self, key: str, rate: float, burst: float, tokens: float) -> Charged:
        """`TB.LOWER`: brings the bucket down to `tokens` where it holds more (never raises it; `tokens` may be
        negative, down to a day of refill in debt)."""
        return await self._run(protocol.lower(key, rate, burst, tokens))

    async def block(self, key: str, rate: float, burst: float, ms: int) -> Charged:
        """`TB.BLOCK`: denies every cost above 0 for `ms`, then refills from empty."""
        return await self._run(protocol.block(key, rate, burst, ms))

    async def throttle(
        self, key: str, max_burst: int, count_per_period: int, period: int, quantity: int = 1
    ) -> ThrottleReply:
        """`CL.THROTTLE`: redis-cell's GCRA limit, `count_per_period` per `period` seconds and `max_burst + 1` at
        once, on a key of its own (a string; not a token bucket)."""
        return await self._run(protocol.throttle(key, max_burst, count_per_period, period, quantity))

    async def reset(self, *keys: str) -> int:
        """Deletes buckets (a missing bucket is a full one); returns how many existed."""
        deleted = 0
        for key in keys:
            deleted += int(await self.redis.delete(key))
        return deleted
