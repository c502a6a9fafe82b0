"""One FastAPI app for `bench/peers.py`, served by uvicorn in its own process: `VARIANT` picks the limiter (none,
redis-tb's ASGI middleware on the module, slowapi with its Redis storage and one of its strategies), `KEYING` its
key (the peer address, or the x-user header). Every limit is far above the load, so every request is allowed.

    VARIANT=redis-tb KEYING=peer REDIS_PORT=6379 uvicorn peer_app:app --port 8000
"""

from __future__ import annotations

import os
from typing import Any

import redis.asyncio
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from redis_tb import AsyncTokenBucket, Limit
from redis_tb.asgi import RateLimitMiddleware

VARIANT = os.environ.get("VARIANT", "bare")
BY_HEADER = os.environ.get("KEYING", "peer") == "header"
REDIS_PORT = int(os.environ.get("REDIS_PORT", "6379"))
# slowapi's name of each strategy of `limits` it offers (it has no token bucket).
SLOWAPI = {
    "slowapi-moving": "moving-window",
    "slowapi-fixed": "fixed-window",
    "slowapi-sliding": "sliding-window-counter",
}

app = FastAPI()


@app.get("/", response_class=PlainTextResponse)
async def hello() -> str:
    return "ok"


def header_key(scope: Any) -> str:
    for name, value in scope["headers"]:
        if name == b"x-user":
            return str(value.decode("latin-1"))
    return "none"


if VARIANT == "redis-tb":
    options: dict[str, Any] = {"key": header_key} if BY_HEADER else {}
    app.add_middleware(
        RateLimitMiddleware,
        limiter=AsyncTokenBucket(redis.asyncio.Redis(port=REDIS_PORT), backend="module"),
        limits=[Limit("api", rate=1e9, burst=1e9)],
        **options,
    )
elif VARIANT in SLOWAPI:
    from slowapi import Limiter
    from slowapi.middleware import SlowAPIASGIMiddleware
    from slowapi.util import get_remote_address

    def request_header_key(request: Request) -> str:
        return request.headers.get("x-user", "none")

    # slowapi's defaults otherwise: no rate-limit headers (with them, a second Redis call per request).
    app.state.limiter = Limiter(
        key_func=request_header_key if BY_HEADER else get_remote_address,
        default_limits=["1000000000/minute"],
        storage_uri=f"redis://127.0.0.1:{REDIS_PORT}",
        strategy=SLOWAPI[VARIANT],
        key_prefix=VARIANT,  # the strategies' keys differ in type: one prefix each
    )
    app.add_middleware(SlowAPIASGIMiddleware)
elif VARIANT != "bare":
    raise SystemExit(f"peer_app: unknown VARIANT {VARIANT!r}")
