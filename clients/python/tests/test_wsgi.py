"""The WSGI middleware in a real Flask app (Flask's test client), on both backends."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import Server
from flask import Flask
from redis.backoff import NoBackoff
from redis.retry import Retry

import redis_tb
from redis_tb import Limit, TokenBucket
from redis_tb._plan import LimitsSpec
from redis_tb.wsgi import RateLimitMiddleware, by_path

NO_RETRY = Retry(NoBackoff(), 0)


def make_app(conn: redis.Redis, limits: LimitsSpec, **options: Any) -> Flask:
    app = Flask(__name__)

    @app.get("/hello")
    def hello() -> dict[str, str]:
        return {"hello": "world"}

    @app.get("/health")
    def health() -> str:
        return "ok"

    app.wsgi_app = RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app,
        limiter=TokenBucket(conn),
        limits=limits,
        **options,
    )
    return app


def test_headers_then_429(server: Server, key: str) -> None:
    app = make_app(server.client(), [Limit("per-client", rate=1, burst=2)], prefix=f"{key}:")
    http = app.test_client()
    first = http.get("/hello")
    assert first.status_code == 200 and first.json == {"hello": "world"}
    assert first.headers["RateLimit-Policy"] == '"per-client";q=2;w=2'
    assert first.headers["RateLimit"] == '"per-client";r=1;t=1'
    assert first.headers["RateLimit-Remaining"] == "1"
    http.get("/hello")
    refused = http.get("/hello")
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1"
    assert refused.json is not None and refused.json["limit"] == "per-client"


def test_by_path_and_several_limits(server: Server, key: str) -> None:
    routes = {"/hello": [Limit("a", rate=1, burst=3), Limit("b", rate=1, burst=1)]}
    app = make_app(server.client(), by_path(routes), prefix=f"{key}:")
    http = app.test_client()
    assert http.get("/hello").headers["RateLimit"].startswith('"a";r=2;t=1, "b";r=0;t=')
    refused = http.get("/hello")
    assert refused.status_code == 429 and refused.json is not None and refused.json["limit"] == "b"
    health = http.get("/health")
    assert health.status_code == 200 and "RateLimit" not in health.headers


@pytest.mark.parametrize("fail", ["open", "closed"])
def test_redis_stopped(fail: str, key: str) -> None:
    stopped = Server(module=False)
    # No retries: a stopped Redis should cost one refused connect, not redis-py's default backoff.
    conn = redis.Redis(port=stopped.port, socket_connect_timeout=0.5, socket_timeout=0.5, retry=NO_RETRY)
    app = make_app(conn, [Limit("per-client", rate=1, burst=5)], prefix=f"{key}:", fail=fail)
    http = app.test_client()
    assert http.get("/hello").status_code == 200
    stopped.stop()
    response = http.get("/hello")
    if fail == "open":
        assert response.status_code == 200 and "RateLimit" not in response.headers
    else:
        assert response.status_code == 503 and response.json == {"error": "rate limiter unavailable"}


def test_no_peer_address_is_limited_under_the_anonymous_identity(server: Server, key: str) -> None:
    """A WSGI server on a Unix socket gives an empty REMOTE_ADDR: such requests share the anonymous bucket."""
    app = make_app(server.client(), [Limit("per-client", rate=0.01, burst=2)], prefix=f"{key}:")
    http = app.test_client()
    statuses = [http.get("/hello", environ_base={"REMOTE_ADDR": ""}).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert server.client().exists(f"{key}:{{%anonymous}}:per-client") == 1
    skipping = make_app(server.client(), [Limit("per-client", rate=1, burst=1)], key=lambda environ: redis_tb.SKIP)
    assert {skipping.test_client().get("/hello").status_code for _ in range(3)} == {200}
