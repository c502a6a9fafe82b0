"""The app `scripts/bench_python.py` serves with uvicorn: one FastAPI route, with or without the rate-limit
middleware, configured by the environment:

    TB_BENCH_MODE        none | module | script (the middleware's backend)
    TB_BENCH_REDIS_PORT  the Redis server on 127.0.0.1
    TB_BENCH_RATE, TB_BENCH_BURST, TB_BENCH_KEY   the one limit, on one key for every request

`app` also times, for every request, how long the middleware took before the route's app was called (the Redis
round trip and the decision; 0 without middleware): `GET /__stats` returns the samples' percentiles in ms and
clears them. That figure is the middleware's added latency as the process itself saw it, which wrk's end-to-end
percentiles blur on a busy machine.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import redis.asyncio
from fastapi import FastAPI

from redis_tb import AsyncTokenBucket, Limit
from redis_tb.asgi import RateLimitMiddleware

api = FastAPI()


@api.get("/")
async def hello() -> dict[str, str]:
    return {"hello": "world"}


samples_ms: list[float] = []
started: dict[int, float] = {}


async def route_app(scope: Any, receive: Any, send: Any) -> None:
    """The route's app, noting when the middleware let the request through."""
    begun = started.pop(id(scope), None)
    if begun is not None:
        samples_ms.append((time.perf_counter() - begun) * 1000)
    await api(scope, receive, send)


limited: Any = route_app
mode = os.environ.get("TB_BENCH_MODE", "none")
if mode != "none":
    connection = redis.asyncio.Redis(port=int(os.environ["TB_BENCH_REDIS_PORT"]))
    limited = RateLimitMiddleware(
        route_app,
        limiter=AsyncTokenBucket(connection, backend="module" if mode == "module" else "script"),
        limits=[Limit("bench", rate=float(os.environ["TB_BENCH_RATE"]), burst=float(os.environ["TB_BENCH_BURST"]))],
        key=lambda scope: os.environ.get("TB_BENCH_KEY", "one-key"),
    )


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"] == "/__stats":
        ordered = sorted(samples_ms) or [0.0]
        stats = {
            "count": len(samples_ms),
            "p50": statistics.median(ordered),
            "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        }
        samples_ms.clear()
        body = json.dumps(stats).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if scope["type"] == "http":
        started[id(scope)] = time.perf_counter()
    await limited(scope, receive, send)
