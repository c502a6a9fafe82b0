"""The "token-bucket" strategy: `limits`' own contract (hit, test, get_window_stats, clear), then Flask-Limiter
and slowapi selecting it by configuration alone, on both backends."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import flask_limiter
import httpx
import pytest
from conftest import Server
from fastapi import FastAPI, Request
from flask import Flask
from flask_limiter.util import get_remote_address
from limits import parse
from limits.errors import ConfigurationError
from limits.storage import MemoryStorage, storage_from_string
from limits.strategies import STRATEGIES
from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.util import get_remote_address as starlette_remote_address

import redis_tb  # noqa: F401  (importing the package registers the strategy)


def strategy_for(server: Server):  # type: ignore[no-untyped-def]
    return STRATEGIES["token-bucket"](storage_from_string(server.url()))


def test_hit_takes_until_the_burst_is_spent(server: Server, key: str) -> None:
    limiter = strategy_for(server)
    item = parse("3 per 3 seconds")  # burst 3, one token per second
    assert [limiter.hit(item, key) for _ in range(4)] == [True, True, True, False]
    assert limiter.hit(item, key, "other") is True  # identifiers make separate buckets


def test_test_peeks_without_taking(server: Server, key: str) -> None:
    limiter = strategy_for(server)
    item = parse("2/second")
    assert limiter.test(item, key) and limiter.test(item, key, cost=2)
    assert not limiter.test(item, key, cost=3)
    assert limiter.hit(item, key, cost=2)
    assert not limiter.test(item, key)


def test_window_stats(server: Server, key: str) -> None:
    limiter = strategy_for(server)
    item = parse("10/minute")  # burst 10, one token per 6 s
    before = time.time()
    full = limiter.get_window_stats(item, key)
    assert full.remaining == 10 and before <= full.reset_time <= time.time() + 0.01
    limiter.hit(item, key, cost=9)
    partial = limiter.get_window_stats(item, key)
    assert partial.remaining == 1 and 53.9 <= partial.reset_time - before <= 54.1  # full again in 54 s
    limiter.hit(item, key)
    empty = limiter.get_window_stats(item, key)
    assert empty.remaining == 0 and 5.9 <= empty.reset_time - before <= 6.1  # the next token in 6 s


def test_clear_refills(server: Server, key: str) -> None:
    limiter = strategy_for(server)
    item = parse("1/hour")
    assert limiter.hit(item, key) and not limiter.hit(item, key)
    limiter.clear(item, key)
    assert limiter.hit(item, key)


def test_needs_a_redis_storage() -> None:
    with pytest.raises(ConfigurationError, match="Redis storage"):
        STRATEGIES["token-bucket"](MemoryStorage())


def test_flask_limiter_by_configuration(server: Server, key: str) -> None:
    app = Flask(__name__)
    app.config.update(
        RATELIMIT_STORAGE_URI=server.url(),
        RATELIMIT_STRATEGY="token-bucket",
        RATELIMIT_DEFAULT="2 per 2 seconds",
        RATELIMIT_HEADERS_ENABLED=True,
        RATELIMIT_KEY_PREFIX=key,
    )
    flask_limiter.Limiter(get_remote_address, app=app)

    @app.get("/")
    def home() -> str:
        return "hello"

    http = app.test_client()
    assert [http.get("/").status_code for _ in range(3)] == [200, 200, 429]
    refused = http.get("/")
    assert refused.headers["Retry-After"] in ("1", "2")
    assert refused.headers["X-RateLimit-Remaining"] == "0"


async def test_slowapi_by_configuration(server: Server, key: str) -> None:
    limiter = Limiter(
        key_func=starlette_remote_address, storage_uri=server.url(), strategy="token-bucket", key_prefix=key
    )
    app = FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]

    @app.get("/")
    @limiter.limit("2 per 2 seconds")
    async def home(request: Request) -> dict[str, str]:
        return {"hello": "world"}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        assert [(await http.get("/")).status_code for _ in range(3)] == [200, 200, 429]


def test_installed_package_registers_without_an_import(server: Server, key: str) -> None:
    """`pip install redis-tb` is enough: a Flask-Limiter app that never imports redis_tb selects the strategy by
    configuration (redis-tb.pth registers it when `limits` loads)."""
    program = f"""
import sys
from flask import Flask
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address

app = Flask(__name__)
app.config.update(RATELIMIT_STORAGE_URI={server.url()!r}, RATELIMIT_STRATEGY="token-bucket",
                  RATELIMIT_DEFAULT="1 per 10 seconds", RATELIMIT_KEY_PREFIX={key!r})
Limiter(get_remote_address, app=app)
app.get("/")(lambda: "hello")
http = app.test_client()
print([http.get("/").status_code for _ in range(2)], "redis_tb" in sys.modules)
"""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[200, 429] True"
