"""The ASGI middleware in a real FastAPI app (served in-process through httpx's ASGI transport), on both
backends: headers on every response, 429 with Retry-After and a JSON body, several limits per route, and
fail-open / fail-closed with Redis stopped."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio
from conftest import Server, free_port
from fastapi import FastAPI
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import redis_tb
from redis_tb import AsyncTokenBucket, Limit, _plan
from redis_tb.asgi import RateLimitMiddleware, by_path

NO_RETRY = Retry(NoBackoff(), 0)
KEYS: list[dict[str, Any]] = json.loads((Path(__file__).resolve().parents[3] / "fixtures/keys.json").read_text())[
    "keys"
]


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

    # per-client refills a token in 100 s, so the exact counts below hold however slowly the requests go.
    routes: dict[str, Sequence[Limit]] = {
        "/search": [Limit("per-client", rate=0.01, burst=5), Limit("tenant", rate=1, burst=2, key=tenant)],
        "/hello": [Limit("per-client", rate=0.01, burst=5)],
    }
    app = make_app(conn, by_path(routes), prefix=f"{key}:")
    async with client_for(app) as http:
        first = await http.get("/search")
        assert first.headers["ratelimit-policy"] == '"per-client";q=5;w=500, "tenant";q=2;w=2'
        assert first.headers["ratelimit"].startswith('"per-client";r=4;t=100, "tenant";r=1;t=')
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


async def test_skip_is_the_only_way_to_skip_the_limit(server: Server, key: str) -> None:
    conn = server.async_client()
    app = make_app(conn, [Limit("per-user", rate=1, burst=1)], prefix=f"{key}:", key=lambda scope: redis_tb.SKIP)
    async with client_for(app) as http:
        for _ in range(3):
            response = await http.get("/hello")
            assert response.status_code == 200 and "ratelimit" not in response.headers
    assert await conn.keys(f"{key}:*") == []
    await conn.aclose()


@pytest.mark.parametrize("nothing", [None, ""])
async def test_no_identity_shares_the_anonymous_bucket_with_one_warning(
    nothing: str | None, server: Server, key: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request for which the key function finds no identity takes the shared anonymous bucket, never a pass."""
    monkeypatch.setattr(_plan, "_anonymous_warned", False)
    conn = server.async_client()
    app = make_app(conn, [Limit("per-user", rate=0.01, burst=2)], prefix=f"{key}:", key=lambda scope: nothing)
    with caplog.at_level(logging.WARNING, logger="redis_tb"):
        async with client_for(app) as http:
            statuses = [(await http.get("/hello")).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert await conn.exists(f"{key}:{{%anonymous}}:per-user") == 1
    assert [record.message for record in caplog.records].count(caplog.records[0].message) == 1
    assert "no identity" in caplog.records[0].message
    await conn.aclose()


async def test_ipv6_clients_of_one_slash_56_share_a_bucket(server: Server, key: str) -> None:
    """IPv6 clients are keyed by their /56: a client holding a /64 cannot take a fresh bucket per address."""
    conn = server.async_client()
    app = make_app(conn, [Limit("per-client", rate=0.01, burst=2)], prefix=f"{key}:")
    statuses = []
    for host in ["2001:db8:1:2ff::1", "2001:db8:1:2aa::2", "2001:db8:1:200:ffff::3"]:
        transport = httpx.ASGITransport(app=app, client=(host, 1234))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            statuses.append((await http.get("/hello")).status_code)
    assert statuses == [200, 200, 429]
    assert await conn.exists(f"{key}:{{2001:db8:1:200::/56}}:per-client") == 1
    wider = make_app(conn, [Limit("per-client", rate=1, burst=2)], prefix=f"{key}:64:", ipv6_subnet=64)
    transport = httpx.ASGITransport(app=wider, client=("2001:db8:1:2ff::1", 1234))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        assert (await http.get("/hello")).status_code == 200
    assert await conn.exists(f"{key}:64:{{2001:db8:1:2ff::/64}}:per-client") == 1
    await conn.aclose()


@pytest.mark.parametrize("row", [row for row in KEYS if row["prefix"] == "ratelimit:"][:12], ids=lambda r: r["key"])
async def test_the_middleware_writes_the_fixture_key(row: dict[str, Any], server: Server) -> None:
    """The middleware writes the keys Node writes too (fixtures/keys.json), escaped: never `ratelimit:{}x}:...`."""
    conn = server.async_client()
    app = make_app(conn, [Limit(row["limit"], rate=1, burst=5)], key=lambda scope: row["identity"])
    await conn.delete(row["key"])
    async with client_for(app) as http:
        assert (await http.get("/hello")).status_code == 200
    assert await conn.hget(row["key"], "tokens") == b"4"
    await conn.delete(row["key"])
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
            assert response.status_code == 503 and response.headers["retry-after"] == "1"
            assert response.json() == {"error": "rate limiter unavailable"}
    await conn.aclose()


UDS_APP = """
import os

import redis.asyncio
from fastapi import FastAPI

from redis_tb import AsyncTokenBucket, Limit
from redis_tb.asgi import RateLimitMiddleware

app = FastAPI()
app.add_middleware(
    RateLimitMiddleware,
    limiter=AsyncTokenBucket(redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])),
    limits=[Limit("per-client", rate=0.01, burst=2)],
    prefix=os.environ["PREFIX"],
)


@app.get("/")
async def hello() -> dict[str, str]:
    return {"hello": "world"}
"""


def test_uvicorn_on_a_unix_socket_is_limited(module_server: Server, key: str, tmp_path: Path) -> None:
    """Under `uvicorn --uds` the scope has no client: requests take the anonymous bucket, and its key is written."""
    (tmp_path / "uds_app.py").write_text(UDS_APP)
    path = str(tmp_path / "app.sock")
    env = dict(os.environ, REDIS_URL=module_server.url(), PREFIX=f"{key}:")
    command = [sys.executable, "-m", "uvicorn", "uds_app:app", "--uds", path, "--app-dir", str(tmp_path)]
    server = subprocess.Popen([*command, "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not _accepts(path):
            assert server.poll() is None and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://app") as http:
            statuses = [http.get("/").status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        assert module_server.client().exists(f"{key}:{{%anonymous}}:per-client") == 1
    finally:
        server.kill()
        _, log = server.communicate()
    assert log.count("no identity") == 1, log


def test_behind_a_local_proxy_uvicorns_defaults_believe_whatever_the_proxy_passes_on(
    module_server: Server, key: str, tmp_path: Path
) -> None:
    """uvicorn with its defaults (proxy headers on, 127.0.0.1 believed), requests from a proxy on the same host: one
    that passes the client's X-Forwarded-For through gives each request the address the client wrote, a fresh
    bucket each (12 of 12 served at burst 2); one that appends the address it saw gives the client its own bucket
    whatever it wrote (2 of 12). docs/python.md, "Behind a proxy"."""
    (tmp_path / "proxied_app.py").write_text(UDS_APP)
    port = free_port()
    env = {name: value for name, value in os.environ.items() if name != "FORWARDED_ALLOW_IPS"}
    env.update(REDIS_URL=module_server.url(), PREFIX=f"{key}:")
    command = [sys.executable, "-m", "uvicorn", "proxied_app:app", "--port", str(port), "--app-dir", str(tmp_path)]
    server = subprocess.Popen([*command, "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True)
    written = [f"198.51.100.{n}" for n in range(1, 13)]
    try:
        deadline = time.monotonic() + 20
        while not _listens(port):
            assert server.poll() is None and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
            passed_through = [http.get("/", headers={"X-Forwarded-For": xff}).status_code for xff in written]
            appended = [
                http.get("/", headers={"X-Forwarded-For": f"{xff}, 203.0.113.7"}).status_code for xff in written
            ]
    finally:
        server.kill()
        server.communicate()
    assert passed_through == [200] * 12
    assert appended == [200, 200] + [429] * 10
    assert module_server.client().exists(f"{key}:{{203.0.113.7}}:per-client") == 1


def _listens(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.connect(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
        return True


async def test_limits_of_extreme_numbers_answer_with_fifteen_digit_headers(server: Server, key: str) -> None:
    """A fill time that overflows (rate 1e-300, burst 1e300) and a burst of 1e21 are limits the server takes: the
    request is answered, with every header number within RFC 8941's 15 digits (docs/headers.md)."""
    conn = server.async_client()
    limits = [Limit("slow", rate=1e-300, burst=1e300), Limit("huge", rate=1, burst=1e21)]
    app = make_app(conn, limits, prefix=f"{key}:")
    async with client_for(app) as http:
        response = await http.get("/hello")
    assert response.status_code == 200
    most = "999999999999999"
    assert response.headers["ratelimit-policy"] == f'"slow";q={most};w={most}, "huge";q={most};w={most}'
    assert response.headers["ratelimit"] == f'"slow";r={most};t=0, "huge";r={most};t=0'
    await conn.aclose()


async def test_the_local_fallback_answers_limits_whose_waits_overflow(key: str) -> None:
    """Redis unreachable, fail="local": a bucket that takes longer than a double can count to refill (rate 1e-300,
    burst 1e10) is answered from memory like any other, its waits saturated, never an OverflowError."""
    conn = redis.asyncio.Redis(port=free_port(), socket_connect_timeout=0.5, socket_timeout=0.5, retry=NO_RETRY)
    app = make_app(conn, [Limit("drained", rate=1e-300, burst=1e10, cost=1e10)], prefix=f"{key}:")
    most = "999999999999999"
    async with client_for(app) as http:
        allowed = await http.get("/hello")
        refused = await http.get("/hello")
    assert allowed.status_code == 200
    assert allowed.headers["ratelimit"] == f'"drained";r=0;t={most}'
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == most
    await conn.aclose()


def test_limited_takes_the_middlewares_options_and_defaults() -> None:
    """`limited` passes its options on as they are, and leaves the rest to the middleware's defaults: `Options`
    names every option of the middleware after `limiter` and `limits`."""
    import inspect

    from redis_tb import _decide
    from redis_tb.asgi import limited

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    parameters = inspect.signature(_decide.Middleware.__init__).parameters
    assert list(_decide.Options.__annotations__) == [
        name for name in parameters if name not in ("self", "app", "limiter", "limits")
    ]
    limiter = AsyncTokenBucket(redis.asyncio.Redis())
    limits = [Limit("per-client", rate=1, burst=2)]
    by_default = limited(limiter, limits)(app)
    plain = RateLimitMiddleware(app, limiter=limiter, limits=limits, metrics=None)
    for name in ("prefix", "fail", "standard", "ipv6_subnet", "timeout", "shadow", "refusals", "on_error"):
        assert getattr(by_default, name) == getattr(plain, name), name
    assert by_default.local.capacity == plain.local.capacity
    chosen = limited(limiter, limits, prefix="api:", fail="closed", timeout=0.5, status_code=503, metrics=None)(app)
    assert (chosen.app, chosen.limiter, chosen.prefix, chosen.fail, chosen.timeout, chosen.refusals.status) == (
        app,
        limiter,
        "api:",
        "closed",
        0.5,
        503,
    )
    with pytest.raises(ValueError, match="fail must be"):
        limited(limiter, limits, fail="sideways")(app)  # type: ignore[arg-type]
