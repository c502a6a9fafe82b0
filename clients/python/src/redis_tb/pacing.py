"""Pacing: reserve a slot with `TB.RESERVE`, wait for it, run the job, and give the tokens back if the job
fails. For work that must happen eventually at a shared pace (a partner API limited to 100 calls/s across all
workers), where a refusal would only make every worker retry at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .aio import AsyncTokenBucket
from .client import TokenBucket
from .errors import TokenBucketError

T = TypeVar("T")


class QueueTooLong(TokenBucketError):
    """The bucket is booked beyond `max_wait_ms`; nothing was taken. `wait_ms` is the wait a slot needs
    (-1: the cost exceeds the burst, never)."""

    def __init__(self, key: str, wait_ms: int) -> None:
        super().__init__(f"{key} is booked for the next {wait_ms} ms" if wait_ms >= 0 else f"{key}: cost > burst")
        self.key = key
        self.wait_ms = wait_ms


async def paced(
    limiter: AsyncTokenBucket,
    key: str,
    rate: float,
    burst: float,
    job: Callable[[], Awaitable[T]],
    *,
    cost: float = 1,
    max_wait_ms: int = 30_000,
) -> T:
    """Runs `await job()` when the bucket at `key` allows it, in the order callers asked, across every process
    and host. Raises `QueueTooLong` when the wait would exceed `max_wait_ms`. If the job raises (or is
    cancelled), the tokens go back (`TB.REFUND`; a no-op while later callers hold slots) and the error
    propagates."""
    reservation = await limiter.reserve(key, rate, burst, cost, max_wait_ms)
    if not reservation.granted:
        raise QueueTooLong(key, reservation.wait_ms)
    try:
        await asyncio.sleep(reservation.wait_ms / 1000)
        return await job()
    except BaseException:
        await limiter.refund(key, rate, burst, cost)
        raise


def paced_sync(
    limiter: TokenBucket,
    key: str,
    rate: float,
    burst: float,
    job: Callable[[], T],
    *,
    cost: float = 1,
    max_wait_ms: int = 30_000,
) -> T:
    """`paced` for threads and plain scripts: sleeps instead of awaiting."""
    reservation = limiter.reserve(key, rate, burst, cost, max_wait_ms)
    if not reservation.granted:
        raise QueueTooLong(key, reservation.wait_ms)
    try:
        time.sleep(reservation.wait_ms / 1000)
        return job()
    except BaseException:
        limiter.refund(key, rate, burst, cost)
        raise
