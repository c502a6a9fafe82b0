"""Rate limiting an HTTP endpoint from Python with the redis-tb package (clients/python).

docs/clients.md shows `rate_limit` below; `make test` runs this file against a server it spawned
(`python examples/ratelimit.py --port N`), so the snippet cannot rot. The package uses the module where the
server has it and the Lua script otherwise, with the same replies.
"""

# --- snippet: start -------------------------------------------------------------------------------------------
import random

from redis_tb import Limit, TokenBucket
from redis_tb.headers import headers_for

PER_USER = Limit("per-user", rate=10, burst=20)


def rate_limit(limiter: TokenBucket, user: str, limit: Limit = PER_USER) -> tuple[int, list[tuple[str, str]]]:
    """Takes the limit's cost from the user's bucket. Returns (status, headers) for the HTTP response: the
    RateLimit fields of docs/headers.md, and Retry-After when refused."""
    reply = limiter.acquire(f"api:{limit.name}:{user}", limit.rate, limit.burst, limit.cost)
    return (200 if reply.allowed else 429), headers_for([limit], reply)


def retry_delay_s(retry_after_ms: int) -> float:
    """For a client that retries by itself: wait at least retry_after, plus up to 10% jitter so that many
    clients refused together do not come back in the same millisecond."""
    return retry_after_ms / 1000 * (1 + random.uniform(0, 0.1))
# --- snippet: end ---------------------------------------------------------------------------------------------


def main() -> None:
    import argparse
    import os
    import time

    import redis

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    limiter = TokenBucket(redis.Redis(host="127.0.0.1", port=port))
    # Users of this run only, so that it can run again at once against the same server.
    user = f"{os.getpid()}:{time.time_ns()}"

    # burst 3 at 1 token/s: three requests pass, the fourth gets 429 with Retry-After 1.
    small = Limit("user", rate=1, burst=3)
    statuses = [rate_limit(limiter, user, small)[0] for _ in range(4)]
    assert statuses == [200, 200, 200, 429], statuses
    status, header_list = rate_limit(limiter, user, small)
    headers = dict(header_list)
    assert status == 429 and headers["Retry-After"] == "1", headers
    assert headers["RateLimit-Policy"] == '"user";q=3;w=3', headers
    assert headers["RateLimit"] == '"user";r=0;t=3', headers

    # A cost above the burst can never pass: no Retry-After.
    status, header_list = rate_limit(limiter, user, Limit("huge", rate=1, burst=3, cost=5))
    assert status == 429 and "Retry-After" not in dict(header_list), header_list

    status, _ = rate_limit(limiter, user)
    assert status == 200
    delay = retry_delay_s(1000)
    assert 1.0 <= delay <= 1.1, delay
    print(f"python client example: ok ({limiter.backend_in_use})")


if __name__ == "__main__":
    main()
