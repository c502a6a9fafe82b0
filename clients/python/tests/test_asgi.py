"""The ASGI middleware in a real FastAPI app (served in-process through httpx's ASGI transport), on both
backends: headers on every response, 429 with Retry-After and a JSON body, several limits per route, and
fail-open / fail-closed with Redis stopped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import pytest
import redis.asyncio
from conftest import Server
from fastapi import FastAPI
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from redis_tb import AsyncTokenBucket, Limit
from redis_tb.asgi import RateLimitMiddleware, by_path

NO_RETRY = Retry(NoBackoff(), 0)


def make_app(conn: redis.asyncio.Redis, limits: Any, **options: Any) -> FastAPI:
    app = FastAPI()

    @app.get("/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    @app.get("/search")
    async def search() -> dict[str, str]:
        return {"results": "none"}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"ok": "yes"}

    app.add_middleware(RateLimitMiddleware, limiter=AsyncTokenBucket(conn), limits=limits, **options)
    return app


def client_for(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_headers_on_every_response_then_429(server: Server, key: str) -> None:
    conn = server.async_client()
    app = make_app(conn, [Limit("per-client", rate=1, burst=3)], prefix=f"{key}:")
    async with client_for(app) as http:
        statuses = []
        for _ in range(4):
            response = await http.get("/hello")
            statuses.append(response.status_code)
        assert statuses == [200, 200, 200, 429]
        first = await http.get("/hello")
        assert first.status_code == 429
        assert first.headers["retry-after"] == "1"
        assert first.headers["ratelimit-policy"] == '"per-client";q=3;w=3'
        assert first.headers["ratelimit"].startswith('"per-client";r=0;t=')
        assert first.headers["ratelimit-limit"] == "3"
        assert first.headers["ratelimit-remaining"] == "0"
        body = first.json()
        assert body["error"] == "rate limit exceeded" and body["limit"] == "per-client"
        assert 0 < body["retry_after_ms"] <= 1000
    await conn.aclose()


async def test_allowed_response_keeps_its_own_headers(server: Server, key: str) -> None:
    conn = server.async_client()
    app = make_app(conn, [Limit("per-client", rate=10, burst=20)], prefix=f"{key}:", standard="draft")
    async with client_for(app) as http:
        response = await http.get("/hello")
        assert response.status_code == 200 and response.json() == {"hello": "world"}
        assert response.headers["content-type"] == "application/json"
        assert response.headers["ratelimit"] == '"per-client";r=19;t=1'
        assert "ratelimit-limit" not in response.headers
    await conn.aclose()


async def test_several_limits_per_route(server: Server, key: str) -> None:
    conn = server.async_client()

    def tenant(request: Mapping[str, Any]) -> str:
        return "acme"

    routes: dict[str, Sequence[Limit]] = {
        "/search": [Limit("per-client", rate=10, burst=5), Limit("tenant", rate=1, burst=2, key=tenant)],
        "/hello": [Limit("per-client", rate=10, burst=5)],
    }
    app = make_app(conn, by_path(routes), prefix=f"{key}:")
    async with client_for(app) as http:
        first = await http.get("/search")
        assert first.headers["ratelimit-policy"] == '"per-client";q=5;w=1, "tenant";q=2;w=2'
        assert first.headers["ratelimit"].startswith('"per-client";r=4;t=1, "tenant";r=1;t=')
        await http.get("/search")
        refused = await http.get("/search")
        assert refused.status_code == 429 and refused.json()["limit"] == "tenant"
        assert refused.headers["ratelimit-limit"] == "2"  # legacy fields: the limiting bucket
        # The refused call took nothing: the per-client bucket still holds 3 for /hello's own limit.
        hello = await http.get("/hello")
        assert hello.headers["ratelimit-remaining"] == "2"
        health = await http.get("/health")  # no prefix matches: not limited, no headers
        assert health.status_code == 200 and "ratelimit" not in health.headers
    await conn.aclose()


async def test_key_function_none_skips_the_limit(server: Server, key: str) -> None:
    conn = server.async_client()
    app = make_app(conn, [Limit("per-user", rate=1, burst=1)], prefix=f"{key}:", key=lambda scope: None)
    async with client_for(app) as http:
        for _ in range(3):
            assert (await http.get("/hello")).status_code == 200
    await conn.aclose()


@pytest.mark.parametrize("fail", ["open", "closed"])
async def test_redis_stopped(fail: str, key: str) -> None:
    stopped = Server(module=False)
    # No retries: a stopped Redis should cost one refused connect, not redis-py's default backoff.
    conn = redis.asyncio.Redis(port=stopped.port, socket_connect_timeout=0.5, socket_timeout=0.5, retry=NO_RETRY)
    app = make_app(conn, [Limit("per-client", rate=1, burst=1)], prefix=f"{key}:", fail=fail)
    async with client_for(app) as http:
        assert (await http.get("/hello")).status_code == 200
        stopped.stop()
        response = await http.get("/hello")
        if fail == "open":
            assert response.status_code == 200 and response.json() == {"hello": "world"}
            assert "ratelimit" not in response.headers
        else:
            assert response.status_code == 503
            assert response.json() == {"error": "rate limiter unavailable"}
    await conn.aclose()
