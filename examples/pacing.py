"""Pacing with TB.RESERVE from Python (redis-tb's `paced_sync`): many workers share one exact, fair pace (say a
partner API limited to 20 calls/s), first come first served, without polling. `make test` runs this file against
a spawned server; run it yourself with `python examples/pacing.py --port 6379`."""

# --- snippet: start -------------------------------------------------------------------------------------------
import math

from redis_tb import TokenBucket
from redis_tb.pacing import QueueTooLong, paced_sync


def call_partner(limiter: TokenBucket, send, request):
    """Sends `request` when the shared 20 calls/s allow it, in the order workers asked, across every process and
    host. If `send` raises, the tokens go back (a no-op while later workers hold slots) and the error propagates.
    Raises QueueTooLong, taking nothing, when the queue is longer than 30 s."""
    return paced_sync(limiter, "partner:api", rate=20, burst=1, job=lambda: send(request), max_wait_ms=30_000)


def retry_after_s(refused: QueueTooLong) -> int:
    """For an HTTP API that refuses instead of waiting: Retry-After from a refused reservation."""
    return math.ceil(refused.wait_ms / 1000)
# --- snippet: end ---------------------------------------------------------------------------------------------


def main() -> None:
    import argparse
    import os
    import threading
    import time

    import redis

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    pool = redis.ConnectionPool(host="127.0.0.1", port=port)
    # Keys of this run only, so that it can run again at once against the same server.
    prefix = f"example:pacing:{os.getpid()}:{time.time_ns()}"

    # 4 workers x 5 jobs at 20/s, burst 1: the jobs run one every 50 ms, in no worker's favour.
    acted: list[float] = []
    lock = threading.Lock()

    def job() -> None:
        with lock:
            acted.append(time.monotonic())

    def worker() -> None:
        limiter = TokenBucket(redis.Redis(connection_pool=pool))
        for _ in range(5):
            paced_sync(limiter, f"{prefix}:partner:api", rate=20, burst=1, job=job)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    start = time.monotonic()  # before the first reservation, which the server books at or after this instant
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    acted.sort()
    assert len(acted) == 20, acted
    # The server hands out slots 50 ms apart, the first at once, and a sleep never wakes early: the last job
    # cannot run before 19 x 50 ms after the first reservation (5 ms: the server's wall clock against this
    # monotonic one). It is measured from before that reservation, not from the first job: a busy machine runs
    # the first job late, as it wakes some sleepers late, so the gaps between jobs vary.
    earliest_ms = (acted[-1] - start) * 1000
    took_ms = (acted[-1] - acted[0]) * 1000
    assert earliest_ms >= 19 * 50 - 5 and took_ms < 19 * 50 * 3, (earliest_ms, took_ms)

    limiter = TokenBucket(redis.Redis(connection_pool=pool))
    sent: list[str] = []
    assert call_partner(limiter, lambda request: sent.append(request) or "sent", "hello") == "sent"
    # A queue longer than the caller will wait: refused, nothing taken.
    for _ in range(3):
        limiter.reserve(f"{prefix}:partner:slow", 1, 1, 1, 5_000)
    try:
        paced_sync(limiter, f"{prefix}:partner:slow", rate=1, burst=1, job=job, max_wait_ms=1_000)
        raise AssertionError("a 2 s queue was accepted with max_wait_ms 1000")
    except QueueTooLong as refused:
        assert "booked for the next" in str(refused), refused
        assert retry_after_s(refused) in (2, 3), refused.wait_ms

    # A job that fails gives its tokens back: the bucket is full again.
    def failing() -> None:
        raise RuntimeError("partner returned 503")

    try:
        paced_sync(limiter, f"{prefix}:partner:flaky", rate=1, burst=5, job=failing)
    except RuntimeError:
        pass
    assert limiter.acquire(f"{prefix}:partner:flaky", 1, 5, 0).remaining == 5
    print("python pacing example: ok")


if __name__ == "__main__":
    main()
