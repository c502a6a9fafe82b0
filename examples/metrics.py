"""A FastAPI app behind the redis-tb middleware, with its metrics at /metrics for Prometheus to scrape
(docs/operating.md, "Watching the middleware"; docs/python.md lists the options).

    pip install redis-tb[prometheus] fastapi uvicorn
    python examples/metrics.py --redis-port 6379 --port 8000

`make test` runs it on loopback against a server it spawned, and a Prometheus of its own scrapes it
(clients/python/tests/test_prometheus.py).
"""

# --- snippet: start -------------------------------------------------------------------------------------------------
from typing import Any

import prometheus_client
import redis.asyncio
from fastapi import FastAPI

from redis_tb import AsyncTokenBucket, Limit
from redis_tb.asgi import RateLimitMiddleware

api = FastAPI()


@api.get("/")
async def hello() -> dict[str, str]:
    return {"hello": "world"}


def build(redis_port: int) -> Any:
    """The app: /metrics served as is (a scrape is not limited), every other path through the middleware, which
    counts into prometheus_client's default registry."""
    limited = RateLimitMiddleware(
        api,
        limiter=AsyncTokenBucket(redis.asyncio.Redis(host="127.0.0.1", port=redis_port)),
        limits=[
            Limit("per-client", rate=5, burst=10),
            Limit("per-client-tighter", rate=1, burst=3, shadow=True),  # tried before it is enforced
        ],
        timeout=0.5,
    )
    scrape = prometheus_client.make_asgi_app()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            await scrape(scope, receive, send)
        else:
            await limited(scope, receive, send)

    return app
# --- snippet: end ---------------------------------------------------------------------------------------------------


import argparse  # noqa: E402 (the snippet above is what the docs show)

import uvicorn  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("--port", type=int, default=8000)
    options = parser.parse_args()
    uvicorn.run(build(options.redis_port), host="127.0.0.1", port=options.port, log_level="warning")


if __name__ == "__main__":
    main()
