"""The FastAPI app `scripts/bench_python.py` serves with uvicorn: one route, with or without the rate-limit
middleware, configured by the environment:

    TB_BENCH_MODE        none | module | script (the middleware's backend)
    TB_BENCH_REDIS_PORT  the Redis server on 127.0.0.1
    TB_BENCH_RATE, TB_BENCH_BURST, TB_BENCH_KEY   the one limit, on one key for every request
"""

from __future__ import annotations

import os

import redis.asyncio
from fastapi import FastAPI

from redis_tb import AsyncTokenBucket, Limit
from redis_tb.asgi import RateLimitMiddleware

app = FastAPI()


@app.get("/")
async def hello() -> dict[str, str]:
    return {"hello": "world"}


mode = os.environ.get("TB_BENCH_MODE", "none")
if mode != "none":
    connection = redis.asyncio.Redis(port=int(os.environ["TB_BENCH_REDIS_PORT"]))
    app.add_middleware(
        RateLimitMiddleware,
        limiter=AsyncTokenBucket(connection, backend="module" if mode == "module" else "script"),
        limits=[Limit("bench", rate=float(os.environ["TB_BENCH_RATE"]), burst=float(os.environ["TB_BENCH_BURST"]))],
        key=lambda scope: os.environ.get("TB_BENCH_KEY", "one-key"),
    )
