"""Pacing with TB.RESERVE: many workers share one exact, fair pace (say a partner API limited to 20 calls/s),
first come first served, without polling. `make test` runs this file against a spawned server; run it yourself
with `python examples/pacing.py --port 6379`."""

# --- snippet: start -------------------------------------------------------------------------------------------
import math
import time

import redis


def paced(r: redis.Redis, key: str, rate: float, burst: float, job, cost: float = 1, max_wait_ms: int = 30_000):
    """Runs job() when the bucket at `key` allows it, in the order workers asked, across every process and host.
    Raises TimeoutError when the queue is longer than max_wait_ms (nothing is taken then)."""
    granted, wait_ms, _remaining, _reset_after_ms = r.execute_command(
        "TB.RESERVE", key, rate, burst, cost, max_wait_ms
    )
    if not granted:  # wait_ms: how long the queue is (-1: cost > burst, never)
        raise TimeoutError(f"{key} is booked for the next {wait_ms} ms")
    time.sleep(wait_ms / 1000)
    try:
        return job()
    except Exception:
        # The call did not happen: give the tokens back. A no-op while later callers hold slots (the bucket is
        # in debt): their slots stay where they are, and this one simply goes unused.
        r.execute_command("TB.REFUND", key, rate, burst, cost)
        raise


def retry_after_s(wait_ms: int) -> int:
    """For an HTTP API that refuses instead of waiting: Retry-After from a refused reservation's wait_ms."""
    return math.ceil(wait_ms / 1000)
# --- snippet: end ---------------------------------------------------------------------------------------------


def main() -> None:
    import argparse
    import os
    import threading

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
        r = redis.Redis(connection_pool=pool)
        for _ in range(5):
            paced(r, f"{prefix}:partner:api", rate=20, burst=1, job=job)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    acted.sort()
    assert len(acted) == 20, acted
    # The server hands out slots 50 ms apart, the first at once, and a sleep never wakes early: the last job
    # cannot run before 19 x 50 ms after the first. (A busy machine wakes some sleepers late, so single gaps vary.)
    took_ms = (acted[-1] - acted[0]) * 1000
    assert 19 * 50 - 5 <= took_ms < 19 * 50 * 3, took_ms

    r = redis.Redis(connection_pool=pool)
    # A queue longer than the caller will wait: refused, nothing taken.
    for _ in range(3):
        r.execute_command("TB.RESERVE", f"{prefix}:partner:slow", 1, 1, 1, 5_000)
    try:
        paced(r, f"{prefix}:partner:slow", rate=1, burst=1, job=job, max_wait_ms=1_000)
        raise AssertionError("a 2 s queue was accepted with max_wait_ms 1000")
    except TimeoutError as refused:
        assert "booked for the next" in str(refused), refused
    assert retry_after_s(1_999) == 2

    # A job that fails gives its tokens back: the bucket is full again.
    def failing() -> None:
        raise RuntimeError("partner returned 503")

    try:
        paced(r, f"{prefix}:partner:flaky", rate=1, burst=5, job=failing)
    except RuntimeError:
        pass
    assert r.execute_command("TB.ACQUIRE", f"{prefix}:partner:flaky", 1, 5, 0)[1] == 5
    print("python pacing example: ok")


if __name__ == "__main__":
    main()
