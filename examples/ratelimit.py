"""Rate limiting an HTTP endpoint with TB.ACQUIRE from Python (redis-py).

docs/clients.md shows `rate_limit` below; `make test` runs this file
against a server it spawned (`python examples/ratelimit.py --port N`), so the snippet cannot rot.
"""

# --- snippet: start -------------------------------------------------------------------------------------------
import math
import random

import redis


def rate_limit(r: redis.Redis, key: str, rate: float, burst: float, cost: float = 1, policy: str = "default"):
    """Takes `cost` tokens from the bucket at `key`. Returns (status, headers) for the HTTP response: the
    RateLimit-Policy and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-10 for the limit named `policy`
    (mapped as docs/headers.md says), and Retry-After when refused."""
    allowed, remaining, retry_after_ms, reset_after_ms = r.execute_command(
        "TB.ACQUIRE", key, rate, burst, cost
    )
    headers = {
        "RateLimit-Policy": f'"{policy}";q={math.floor(burst)};w={math.ceil(burst / rate)}',
        "RateLimit": f'"{policy}";r={remaining};t={math.ceil(reset_after_ms / 1000)}',
    }
    if allowed:
        return 200, headers
    if retry_after_ms >= 0:  # -1: cost > burst, retrying never helps
        headers["Retry-After"] = str(math.ceil(retry_after_ms / 1000))
    return 429, headers


def retry_delay_s(retry_after_ms: int) -> float:
    """For a client that retries by itself: wait at least retry_after, plus up to 10% jitter so that many
    clients refused together do not come back in the same millisecond."""
    return retry_after_ms / 1000 * (1 + random.uniform(0, 0.1))
# --- snippet: end ---------------------------------------------------------------------------------------------


def main() -> None:
    import argparse
    import os
    import time

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    r = redis.Redis(host="127.0.0.1", port=port)
    # Keys of this run only, so that it can run again at once against the same server.
    prefix = f"example:python:{os.getpid()}:{time.time_ns()}"

    # burst 3 at 1 token/s: three requests pass, the fourth gets 429 with Retry-After 1.
    statuses = [rate_limit(r, f"{prefix}:user:42", rate=1, burst=3)[0] for _ in range(4)]
    assert statuses == [200, 200, 200, 429], statuses
    status, headers = rate_limit(r, f"{prefix}:user:42", rate=1, burst=3, policy="user")
    assert status == 429 and headers["Retry-After"] == "1", headers
    assert headers["RateLimit-Policy"] == '"user";q=3;w=3', headers
    assert headers["RateLimit"] == '"user";r=0;t=3', headers

    # A cost above the burst can never pass: no Retry-After.
    status, headers = rate_limit(r, f"{prefix}:user:7", rate=1, burst=3, cost=5)
    assert status == 429 and "Retry-After" not in headers, headers

    delay = retry_delay_s(1000)
    assert 1.0 <= delay <= 1.1, delay
    print("python client example: ok")


if __name__ == "__main__":
    main()
