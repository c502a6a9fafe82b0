"""The pacing helpers: reserve, wait for the slot, run the job, refund when it fails."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import Server

from redis_tb import AsyncTokenBucket, TokenBucket
from redis_tb.pacing import QueueTooLong, paced, paced_sync


async def test_paced_jobs_run_at_the_shared_rate(server: Server, key: str) -> None:
    conn = server.async_client()
    limiter = AsyncTokenBucket(conn)
    started: list[float] = []

    async def job() -> int:
        started.append(time.monotonic())
        return len(started)

    begin = time.monotonic()
    results = await asyncio.gather(*(paced(limiter, key, 20, 1, job) for _ in range(6)))
    assert sorted(results) == [1, 2, 3, 4, 5, 6]
    # Burst 1 at 20/s: the sixth job starts 250 ms after the first, never earlier.
    assert max(started) - begin >= 0.245
    await conn.aclose()


async def test_a_failed_job_gives_its_tokens_back(server: Server, key: str) -> None:
    conn = server.async_client()
    limiter = AsyncTokenBucket(conn)

    async def failing() -> None:
        raise RuntimeError("partner API down")

    with pytest.raises(RuntimeError):
        await paced(limiter, key, 1, 5, failing, cost=3)
    assert (await limiter.acquire(key, 1, 5, 0)).remaining == 5
    await conn.aclose()


def test_queue_too_long_takes_nothing(server: Server, key: str) -> None:
    limiter = TokenBucket(server.client())
    assert paced_sync(limiter, key, 1, 1, lambda: "now") == "now"
    with pytest.raises(QueueTooLong) as caught:
        paced_sync(limiter, key, 1, 1, lambda: "later", max_wait_ms=100)
    assert 900 <= caught.value.wait_ms <= 1000
    with pytest.raises(QueueTooLong) as never:
        paced_sync(limiter, key, 1, 1, lambda: "never", cost=2)
    assert never.value.wait_ms == -1
